// An in-process Communicator over host memory: W communicators sharing one group, each driven by
// its own thread. Collectives are executed at wait(): the ranks meet at a barrier, each copies (or
// sums, in rank order) what it receives straight from its peers' send buffers, then meets them again
// so no send buffer is released early. Deadline-aware: a rank that does not arrive in time makes the
// waiting ones return kTimeout and breaks the group, so later arrivals get kRemoteError at once.
// Used to test the DCP step logic (both merge modes, validation agreement, faults) in one process.
// With Device::kCuda the buffers are device memory of the current device (every rank on one GPU):
// a rank synchronizes the device before its peers read its send buffers, copies device to device and
// sums through host memory. That runs the step of a device backend for any W on a single GPU.
#pragma once

#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "mladcp/comm.h"

namespace mladcp::test {

class ThreadGroup;

// One communicator per rank of a new group of `world` ranks.
std::vector<std::unique_ptr<Communicator>> make_thread_communicators(int world, Device memory = Device::kHost);

}  // namespace mladcp::test
