// Several ranks of one NCCL communicator in one process, one GPU each (like nccl-tests' -g): for the
// tests and the tool's single-process mode. Not part of the public API.
#pragma once

#include <memory>
#include <vector>

#include "mladcp/nccl.h"

namespace mladcp {

// One communicator per device of `devices` (rank i on devices[i]), all in this process, each with its
// own stream (options.stream and options.device are ignored).
Status create_nccl_communicators_single_process(const std::vector<int>& devices, const NcclOptions& options,
                                                std::vector<std::unique_ptr<NcclCommunicator>>* out);

// Destroys communicators of one process (e.g. from create_nccl_communicators_single_process) all at
// once, one thread each: NCCL's orderly teardown of a rank may wait for its peers' teardown.
void destroy_nccl_communicators(std::vector<std::unique_ptr<NcclCommunicator>>* comms);

}  // namespace mladcp
