// Small host helpers shared by the kernel files (no torch).
#pragma once

#include <cuda_runtime.h>

#include "cutlass/kernel_hardware_info.h"

namespace hot {

// The current device and its SM count, queried once per device: CUTLASS's persistent Hopper
// scheduler sizes its grid from it, and a default-constructed KernelHardwareInfo means device 0.
inline cutlass::KernelHardwareInfo current_hw_info() {
  static int sm_counts[64] = {0};
  cutlass::KernelHardwareInfo info;
  int dev = 0;
  cudaGetDevice(&dev);
  info.device_id = dev;
  if (dev >= 0 && dev < 64) {
    if (sm_counts[dev] == 0) cudaDeviceGetAttribute(&sm_counts[dev], cudaDevAttrMultiProcessorCount, dev);
    info.sm_count = sm_counts[dev];
  }
  return info;
}

// A launch error, as a static string (nullptr when the launch succeeded).
inline const char* last_launch_error() {
  cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? nullptr : cudaGetErrorString(e);
}

}  // namespace hot
