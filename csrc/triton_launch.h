// Launching Triton-compiled kernels from C++ (no torch here): the fast backend's quantizer
// kernels are compiled and loaded by Triton (hot/fast/quantize.py); hot/fast/native.py registers
// each loaded kernel once (its CUfunction, block size, shared memory and parameter types), and
// csrc/binding.cpp then launches a whole layer backward (two quantizer passes and two CUTLASS
// GEMMs) in one call, without Python between the launches (host time: docs/performance.md).
//
// The parameter list of a Triton 3.x kernel is its non-constexpr arguments in signature order
// (pointers as 8-byte device addresses, i32 / i64 integers), then two pointers Triton appends
// (global scratch and profile scratch; both null for kernels that need no scratch). register_fn
// checks that against the cubin itself with cuFuncGetParamInfo, so a Triton version with a
// different calling convention is refused at registration instead of launched wrongly.
//
// The driver API is taken from libcuda.so.1 with dlopen, as Triton does: no link-time
// dependency on libcuda, so the extension still builds on machines without a driver.
#pragma once

#include <cuda.h>
#include <dlfcn.h>

#include <cstdint>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

namespace hot {
namespace triton_launch {

// One argument value as the caller gives it: a device address or an integer.
struct Arg {
  int64_t value;
};

// A registered kernel. kinds holds one letter per kernel argument (runtime and constexpr):
// 'p' pointer, 'i' int32, 'l' int64, 'c' constexpr (no parameter).
struct Fn {
  CUfunction fn = nullptr;
  unsigned block = 0;
  unsigned shared = 0;
  std::string kinds;
};

struct Driver {
  using LaunchFn = CUresult (*)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                                unsigned, CUstream, void**, void**);
  using ParamInfoFn = CUresult (*)(CUfunction, size_t, size_t*, size_t*);
  using ErrorStringFn = CUresult (*)(CUresult, const char**);
  LaunchFn launch = nullptr;
  ParamInfoFn param_info = nullptr;  // CUDA 12.4+ drivers
  ErrorStringFn error_string = nullptr;
  std::string error;  // why the driver API is unusable, empty when it is
};

inline const Driver& driver() {
  static Driver d = [] {
    Driver r;
    void* h = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);
    if (h == nullptr) {
      r.error = "cannot open libcuda.so.1";
      return r;
    }
    r.launch = reinterpret_cast<Driver::LaunchFn>(dlsym(h, "cuLaunchKernel"));
    r.param_info = reinterpret_cast<Driver::ParamInfoFn>(dlsym(h, "cuFuncGetParamInfo"));
    r.error_string = reinterpret_cast<Driver::ErrorStringFn>(dlsym(h, "cuGetErrorString"));
    if (r.launch == nullptr) r.error = "libcuda.so.1 has no cuLaunchKernel";
    else if (r.param_info == nullptr) r.error = "libcuda.so.1 has no cuFuncGetParamInfo (driver older than CUDA 12.4)";
    return r;
  }();
  return d;
}

inline std::string cu_error(CUresult st) {
  const char* s = nullptr;
  if (driver().error_string != nullptr) driver().error_string(st, &s);
  return std::string(s != nullptr ? s : "unknown CUDA driver error") + " (CUresult " + std::to_string(int(st)) + ")";
}

inline std::mutex& registry_mutex() {
  static std::mutex m;
  return m;
}

// Registered kernels, never removed (a handful per layer shape); ids index this vector.
inline std::vector<Fn>& registry() {
  static std::vector<Fn> r;
  return r;
}

inline size_t kind_size(char k) { return k == 'i' ? 4 : 8; }

// Registers a kernel that Triton has loaded; returns "" and sets *id, or an error string.
inline std::string register_fn(uint64_t function, unsigned block, unsigned shared, const std::string& kinds,
                               int64_t* id) {
  const Driver& d = driver();
  if (!d.error.empty()) return d.error;
  if (function == 0) return "the kernel is not loaded (null CUfunction)";
  for (char k : kinds) {
    if (k != 'p' && k != 'i' && k != 'l' && k != 'c') return std::string("unknown argument kind '") + k + "'";
  }
  CUfunction fn = reinterpret_cast<CUfunction>(function);
  // Expected parameters: the non-constexpr arguments, then the two scratch pointers.
  std::vector<size_t> want;
  for (char k : kinds) {
    if (k != 'c') want.push_back(kind_size(k));
  }
  want.push_back(8);
  want.push_back(8);
  for (size_t i = 0; i <= want.size(); ++i) {
    size_t off = 0, size = 0;
    CUresult st = d.param_info(fn, i, &off, &size);
    if (i == want.size()) {
      if (st == CUDA_SUCCESS)
        return "the kernel has more than the " + std::to_string(want.size()) +
               " parameters this Triton calling convention gives it";
      break;
    }
    if (st != CUDA_SUCCESS)
      return "the kernel has " + std::to_string(i) + " parameters, expected " + std::to_string(want.size()) + ": " +
             cu_error(st);
    if (size != want[i])
      return "parameter " + std::to_string(i) + " of the kernel is " + std::to_string(size) + " bytes, expected " +
             std::to_string(want[i]);
  }
  std::lock_guard<std::mutex> g(registry_mutex());
  registry().push_back(Fn{fn, block, shared, kinds});
  *id = int64_t(registry().size()) - 1;
  return std::string();
}

// Launches kernel `id` with the runtime arguments `args` (one per kernel argument up to the
// first constexpr-only tail; constexpr arguments among them are skipped). Returns "" or an error.
inline std::string launch(int64_t id, const unsigned grid[3], const std::vector<Arg>& args, CUstream stream) {
  Fn f;
  {
    std::lock_guard<std::mutex> g(registry_mutex());
    if (id < 0 || id >= int64_t(registry().size())) return "unknown kernel id " + std::to_string(id);
    f = registry()[size_t(id)];
  }
  if (args.size() > f.kinds.size()) return "more arguments than the kernel has";
  for (size_t i = args.size(); i < f.kinds.size(); ++i) {
    if (f.kinds[i] != 'c') return "argument " + std::to_string(i) + " is a runtime argument but was not given";
  }
  // Parameter storage: every value in an 8-byte slot (each slot aligned for its type).
  std::vector<uint64_t> slots(args.size() + 2, 0);
  std::vector<void*> params;
  params.reserve(args.size() + 2);
  for (size_t i = 0; i < args.size(); ++i) {
    const char k = f.kinds[i];
    if (k == 'c') continue;
    if (k == 'i') {
      if (args[i].value < INT32_MIN || args[i].value > INT32_MAX)
        return "argument " + std::to_string(i) + " = " + std::to_string(args[i].value) + " does not fit int32";
      const int32_t v = int32_t(args[i].value);
      std::memcpy(&slots[i], &v, sizeof v);
    } else {
      std::memcpy(&slots[i], &args[i].value, 8);
    }
    params.push_back(&slots[i]);
  }
  params.push_back(&slots[args.size()]);      // global scratch: null
  params.push_back(&slots[args.size() + 1]);  // profile scratch: null
  if (grid[0] == 0 || grid[1] == 0 || grid[2] == 0) return std::string();
  CUresult st = driver().launch(f.fn, grid[0], grid[1], grid[2], f.block, 1, 1, f.shared, stream, params.data(),
                                nullptr);
  if (st != CUDA_SUCCESS) return "cuLaunchKernel: " + cu_error(st);
  return std::string();
}

}  // namespace triton_launch
}  // namespace hot
