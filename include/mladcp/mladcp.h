// Umbrella header.
#pragma once

#include "mladcp/attention.h"
#include "mladcp/backend.h"
#include "mladcp/comm.h"
#include "mladcp/config.h"
#include "mladcp/dcp.h"
#include "mladcp/decode.h"
#include "mladcp/dtype.h"
#include "mladcp/kv_cache.h"
#include "mladcp/merge.h"
#include "mladcp/sharding.h"
#include "mladcp/status.h"
#include "mladcp/version.h"
