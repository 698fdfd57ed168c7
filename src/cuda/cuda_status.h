// CUDA runtime errors as Status (host code of the CUDA part only).
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "mladcp/status.h"

namespace mladcp {

inline Status cuda_status(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return Status::Ok();
  return Status(StatusCode::kCudaError,
                std::string(what) + ": " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")");
}

}  // namespace mladcp

#define MLADCP_CUDA_RETURN_IF_ERROR(call) MLADCP_RETURN_IF_ERROR(::mladcp::cuda_status((call), #call))
