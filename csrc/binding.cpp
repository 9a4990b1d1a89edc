// Python binding of the hot CUDA kernels (module hot.fast._C). This is the only translation unit
// that includes torch: it checks every input, pads awkward shapes, chunks long K, allocates the
// outputs and hands raw pointers to the kernels in the .cu files. It also launches the Triton
// quantizer kernels that hot/fast/native.py registers (csrc/triton_launch.h), so that a layer
// backward is one call from Python.
//
// Error convention: no C++ exception leaves this module. On the H200 machine (torch 2.11, JIT
// build) every exception thrown out of a binding function crashed the interpreter with SIGSEGV
// instead of becoming a Python exception (docs/kernels.md, "The pack_int4 segfault"). So the
// checks below build error strings instead of throwing, every exported function returns
// (result, err) with err empty on success, and a try/catch around each body turns whatever a
// torch call throws (allocation failures) into an err as well. err starts with the Python class
// the wrapper raises: "ValueError: " (a bad argument), "RuntimeError: " (wrong GPU, build,
// kernel failure) or "OutOfMemoryError: "; hot/fast/_ext.py unpacks it and raises.
//
// c10/cuda/CUDAStream.h rather than ATen/cuda/CUDAContext.h: the latter pulls cuBLAS/cuSPARSE
// headers that a bare CUDA toolkit may lack (kernel_tech.md section 5).
#include <torch/extension.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <cuda_runtime.h>

#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "cutlass/version.h"
#include "hot_kernels.h"
#include "triton_launch.h"

#define HOT_STR2(x) #x
#define HOT_STR(x) HOT_STR2(x)
#ifndef HOT_CUDA_ARCHS
#define HOT_CUDA_ARCHS unknown
#endif

namespace {

// Largest K per GEMM call for which no int32 partial sum can overflow: int8 codes lie in
// [-128, 127], so |sum| <= K * 128^2 <= 2^31 - 1 needs K <= 131071; int4 codes lie in [-8, 7], so
// K * 64 <= 2^31 - 1 needs K <= 33554431. Both are rounded down to a multiple of 256 so every
// chunk start keeps the operand pointers 16-byte aligned.
constexpr int64_t kMaxKInt8 = 130816;
constexpr int64_t kMaxKInt4 = 33554176;
constexpr int64_t kScalePad = 256;  // scale vectors are padded so vector loads never leave them

// What every exported function returns: the result (undefined on error, None in Python) and an
// error string, empty on success.
using Result = std::tuple<torch::Tensor, std::string>;

Result ok(torch::Tensor t) { return Result(std::move(t), std::string()); }
Result fail(std::string err) { return Result(torch::Tensor(), std::move(err)); }

// Error strings are built by std::string concatenation only, never std::ostringstream (so never
// c10::str or TORCH_CHECK): on the H200 machine (torch 2.11, g++ 13.3 JIT build) any
// std::ostringstream instantiated in a JIT-built extension crashes the process with SIGSEGV,
// while concatenation, a local throw/catch and returning strings work (scripts/diag_cxx.py,
// docs/kernels.md). The formats match what c10::str printed.
void append(std::string& s, const std::string& v) { s += v; }
void append(std::string& s, const char* v) { s += v; }
void append(std::string& s, char v) { s += v; }
template <typename T, typename = std::enable_if_t<std::is_integral_v<T>>>
void append(std::string& s, T v) { s += std::to_string(v); }
void append(std::string& s, c10::IntArrayRef v) {
  s += '[';
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  s += ']';
}
void append(std::string& s, const torch::Device& d) {
  s += c10::DeviceTypeName(d.type(), /*lower_case=*/true);
  if (d.has_index()) s += ":" + std::to_string(d.index());
}
void append(std::string& s, torch::ScalarType t) { s += c10::toString(t); }

template <typename... Args>
std::string cat(const Args&... args) {
  std::string s;
  (append(s, args), ...);
  return s;
}

// Error strings, prefixed with the Python class _ext.py raises.
template <typename... Args>
std::string value_error(const Args&... args) { return cat("ValueError: ", args...); }
template <typename... Args>
std::string runtime_error(const Args&... args) { return cat("RuntimeError: ", args...); }

// A check that returns its error string instead of throwing; used inside functions returning
// std::string (empty = ok).
#define HOT_REQUIRE(cond, ...) \
  do { if (!(cond)) return value_error(__VA_ARGS__); } while (0)
// Propagates a non-empty error string out of a function returning Result.
#define HOT_PROPAGATE(expr) \
  do { std::string hot_err_ = (expr); if (!hot_err_.empty()) return fail(std::move(hot_err_)); } while (0)

// Runs `body` (returning an error string, empty on success) and turns anything it throws into an
// error string as well: torch calls inside (allocation, copies, .item()) may throw, and catching
// here, inside the same shared object, keeps the exception from crossing the module boundary. c10::Error's
// what_without_backtrace() drops the C++ stack trace torch appends to what().
template <typename F>
std::string catching(const char* fn, F&& body) {
  try {
    return body();
  } catch (const c10::OutOfMemoryError& e) {
    return cat("OutOfMemoryError: hot.fast._C.", fn, ": ", e.what_without_backtrace());
  } catch (const c10::Error& e) {
    return runtime_error("hot.fast._C.", fn, ": ", e.what_without_backtrace());
  } catch (const std::exception& e) {
    return runtime_error("hot.fast._C.", fn, ": ", e.what());
  } catch (...) {
    return runtime_error("hot.fast._C.", fn, ": unknown C++ exception");
  }
}

// catching() for a body that returns a Result.
template <typename F>
Result guarded(const char* fn, F&& body) {
  Result r;
  std::string err = catching(fn, [&] {
    r = body();
    return std::string();
  });
  return err.empty() ? r : fail(std::move(err));
}

enum class Kind { kS8Sm90, kS8Sm80, kS4Sm80 };

const char* kind_name(Kind k) {
  switch (k) {
    case Kind::kS8Sm90: return "gemm_s8s8_sm90";
    case Kind::kS8Sm80: return "gemm_s8s8_sm80";
    case Kind::kS4Sm80: return "gemm_s4s4_sm80";
  }
  return "?";
}

int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

std::string arch_list() { return HOT_STR(HOT_CUDA_ARCHS); }  // e.g. "sm80_sm86_sm90a"

// The targets this module carries SASS for, as (major, minor, arch-specific 'a').
struct Target { int major, minor; bool specific; };
std::vector<Target> targets() {
  std::vector<Target> out;
  const std::string s = arch_list();
  size_t i = 0;
  while ((i = s.find("sm", i)) != std::string::npos) {
    size_t j = i + 2;
    while (j < s.size() && isdigit(static_cast<unsigned char>(s[j]))) ++j;
    if (j - i >= 4) {
      int v = std::stoi(s.substr(i + 2, j - i - 2));
      out.push_back({v / 10, v % 10, j < s.size() && s[j] == 'a'});
    }
    i = j;
  }
  return out;
}

bool sm90a_built() {
  for (auto t : targets()) if (t.major == 9 && t.minor == 0 && t.specific) return true;
  return false;
}

// SASS for sm_XY runs on devices of the same major version with minor >= Y; an arch-specific
// target (sm_90a) runs only on exactly that version.
bool runs_on(int major, int minor) {
  for (auto t : targets()) {
    if (t.major != major) continue;
    if (t.specific ? t.minor == minor : t.minor <= minor) return true;
  }
  return false;
}

// The device and the build, not the arguments, are at fault here: RuntimeError.
std::string check_device(Kind kind, const torch::Device& dev) {
  const std::string where = std::string("hot.fast._C.") + kind_name(kind) + ": ";
  int major = 0, minor = 0;
  cudaError_t st = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev.index());
  if (st == cudaSuccess) st = cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev.index());
  if (st != cudaSuccess) {
    return runtime_error(where, "cannot read the compute capability of ", dev, ": ", cudaGetErrorString(st));
  }
  if (kind == Kind::kS8Sm90) {
    if (!sm90a_built())
      return runtime_error(where, "this build has no sm_90a code (archs: ", arch_list(),
                           "); rebuild with TORCH_CUDA_ARCH_LIST containing 9.0a, or use gemm_s8s8_sm80");
    if (!(major == 9 && minor == 0))
      return runtime_error(where, "needs a Hopper GPU (compute capability 9.0), got ", major, ".", minor,
                           " on ", dev, "; use gemm_s8s8_sm80 there");
  } else {
    if (major < 8)
      return runtime_error(where, "needs compute capability >= 8.0 (Ampere), got ", major, ".", minor,
                           " on ", dev, "; use backend='reference'");
    if (!runs_on(major, minor))
      return runtime_error(where, "this build has no code for compute capability ", major, ".", minor,
                           " (archs: ", arch_list(), "); rebuild with it in TORCH_CUDA_ARCH_LIST");
  }
  return std::string();
}

// An operand: 2-D, on `dev`, of `dtype`, K contiguous, rows 16-byte aligned.
std::string check_operand(Kind kind, const char* name, const torch::Tensor& t, torch::ScalarType dtype,
                          const std::optional<torch::Device>& dev, int64_t per_byte, int64_t align) {
  const std::string where = std::string("hot.fast._C.") + kind_name(kind) + ": ";
  HOT_REQUIRE(t.is_cuda(), where, name, " must be a CUDA tensor, got one on ", t.device(),
              "; move the operands to the GPU or use backend='reference'");
  if (dev) HOT_REQUIRE(t.device() == *dev, where, name, " is on ", t.device(), " but a is on ", *dev);
  HOT_REQUIRE(t.scalar_type() == dtype, where, name, " must be ",
              dtype == torch::kUInt8 ? "uint8 (packed int4, see pack_int4)" : "int8", ", got ", t.scalar_type());
  HOT_REQUIRE(t.dim() == 2, where, name, " must be 2-D, got shape ", t.sizes());
  HOT_REQUIRE(t.size(1) * per_byte % align == 0, where, "K = ", t.size(1) * per_byte, " (", name,
              ") is not a multiple of ", align, "; pad both operands with zero codes along K",
              per_byte == 2 ? " (pack_int4 pads to 32)" : "");
  HOT_REQUIRE(t.size(1) <= 1 || t.stride(1) == 1, where, name,
              " must be contiguous along K (stride(1) == 1), got strides ", t.strides(), "; call .contiguous()");
  HOT_REQUIRE(t.size(0) <= 1 || t.size(1) == 0 || t.stride(0) % 16 == 0, where, name, " row stride ", t.stride(0),
              " bytes is not a multiple of 16; call .contiguous() after padding K");
  HOT_REQUIRE(reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0, where, name,
              " data pointer is not 16-byte aligned; call .clone()");
  HOT_REQUIRE(t.size(0) < (int64_t(1) << 31), where, name, " has ", t.size(0), " rows; at most 2^31 - 1");
  return std::string();
}

// A scale: fp32 of shape (rows, 1) or (1, 1) on `dev`.
std::string check_scale(Kind kind, const char* name, const torch::Tensor& s, int64_t rows,
                        const torch::Device& dev) {
  const std::string where = std::string("hot.fast._C.") + kind_name(kind) + ": ";
  HOT_REQUIRE(s.device() == dev, where, name, " is on ", s.device(), ", the operands on ", dev);
  HOT_REQUIRE(s.scalar_type() == torch::kFloat32, where, name, " must be float32, got ", s.scalar_type());
  HOT_REQUIRE(s.dim() == 2 && s.size(1) == 1 && (s.size(0) == rows || s.size(0) == 1), where, name,
              " must have shape (", rows, ", 1) or (1, 1), got ", s.sizes());
  return std::string();
}

// A bias: fp32 of shape (N,) on `dev`.
std::string check_bias(Kind kind, const torch::Tensor& b, int64_t n, const torch::Device& dev) {
  const std::string where = std::string("hot.fast._C.") + kind_name(kind) + ": ";
  HOT_REQUIRE(b.device() == dev, where, "bias is on ", b.device(), ", the operands on ", dev);
  HOT_REQUIRE(b.scalar_type() == torch::kFloat32, where, "bias must be float32, got ", b.scalar_type(),
              "; pass bias.float()");
  HOT_REQUIRE(b.dim() == 1 && b.size(0) == n, where, "bias must have shape (", n, ",), got ", b.sizes());
  return std::string();
}

// A checked bias as the epilogue reads it, `cols` (the padded N) values: `b` itself when it holds
// that many, else a copy padded with zeros (the row broadcast's loads are predicated on the
// problem's N, so nothing past `cols` is read; the padded columns are cut off afterwards).
torch::Tensor bias_vector(const torch::Tensor& b, int64_t cols) {
  if (b.size(0) >= cols && b.is_contiguous()) return b;
  torch::Tensor v = torch::zeros({cols}, b.options());
  v.narrow(0, 0, b.size(0)).copy_(b);
  return v;
}

// A checked scale as a contiguous vector whose storage extends to a multiple of kScalePad
// floats (the epilogue's vector loads may read that far): `s` itself when it holds one value per
// row, starts 16-byte aligned and its storage has that room (hot.fast.passes allocates its scales
// so: no copy, no launch), else one copy. Entries past `rows` only ever meet output rows or columns that are not stored
// (or are cut off by the narrow below), so their values do not matter.
torch::Tensor scale_vector(const torch::Tensor& s, int64_t rows) {
  const int64_t padded = round_up(std::max<int64_t>(rows, 1), kScalePad);
  if (s.size(0) == rows && s.is_contiguous() && reinterpret_cast<uintptr_t>(s.data_ptr()) % 16 == 0 &&
      s.storage().nbytes() >= static_cast<size_t>(s.storage_offset() + padded) * sizeof(float)) {
    return s.reshape({-1});
  }
  torch::Tensor v = torch::empty({padded}, s.options());
  if (s.size(0) == rows) {
    v.narrow(0, 0, rows).copy_(s.reshape({-1}));
  } else {
    v.copy_(s.reshape({1}).expand({padded}));
  }
  return v;
}

std::string out_scalar_type(const std::string& name, hot::OutType* t, torch::ScalarType* dt) {
  if (name == "float32") { *t = hot::OutType::kF32; *dt = torch::kFloat32; return std::string(); }
  if (name == "bfloat16") { *t = hot::OutType::kBF16; *dt = torch::kBFloat16; return std::string(); }
  if (name == "float16") { *t = hot::OutType::kF16; *dt = torch::kFloat16; return std::string(); }
  return value_error("hot.fast._C: out_dtype must be 'float32', 'bfloat16' or 'float16', got '", name, "'");
}

const char* launch(Kind kind, hot::GemmArgs& g, const torch::TensorOptions& opts) {
  size_t ws = 0;
  switch (kind) {
    case Kind::kS8Sm90: ws = hot::gemm_s8s8_sm90_workspace_size(g); break;
    case Kind::kS8Sm80: ws = hot::gemm_s8s8_sm80_workspace_size(g); break;
    case Kind::kS4Sm80: ws = hot::gemm_s4s4_sm80_workspace_size(g); break;
  }
  torch::Tensor workspace;
  if (ws > 0) {
    workspace = torch::empty({int64_t(ws)}, opts.dtype(torch::kUInt8));
    g.workspace = workspace.data_ptr();
  }
  switch (kind) {
    case Kind::kS8Sm90: return hot::gemm_s8s8_sm90(g);
    case Kind::kS8Sm80: return hot::gemm_s8s8_sm80(g);
    case Kind::kS4Sm80: return hot::gemm_s4s4_sm80(g);
  }
  return "unknown kernel";
}

// out = (a @ b^T) * sa * sb^T for codes a (M, K) and b (N, K); see hot/fast/_ext.py for the
// exact rounding. K is split into chunks of at most max_k (0: the overflow bound) whose
// dequantized fp32 partials are summed in order. Call it inside guarded(): torch calls throw.
Result scaled_gemm(Kind kind, const torch::Tensor& a, const torch::Tensor& b, const torch::Tensor& sa,
                   const torch::Tensor& sb, const std::string& out_dtype, int64_t max_k,
                   const c10::optional<torch::Tensor>& bias) {
  const bool int4 = kind == Kind::kS4Sm80;
  const auto in_dtype = int4 ? torch::kUInt8 : torch::kInt8;
  const int64_t per_byte = int4 ? 2 : 1;
  const int64_t align = int4 ? 32 : 16;
  const std::string where = std::string("hot.fast._C.") + kind_name(kind) + ": ";

  HOT_PROPAGATE(check_operand(kind, "a", a, in_dtype, std::nullopt, per_byte, align));
  const torch::Device dev = a.device();
  HOT_PROPAGATE(check_operand(kind, "b", b, in_dtype, dev, per_byte, align));
  hot::OutType otype;
  torch::ScalarType odt;
  HOT_PROPAGATE(out_scalar_type(out_dtype, &otype, &odt));
  const int64_t M = a.size(0), N = b.size(0), K = a.size(1) * per_byte;
  if (b.size(1) * per_byte != K) {
    return fail(value_error(where, "a is (", M, ", ", K, ") and b is (", N, ", ", b.size(1) * per_byte,
                            ") codes: the K dimensions differ"));
  }
  HOT_PROPAGATE(check_scale(kind, "sa", sa, M, dev));
  HOT_PROPAGATE(check_scale(kind, "sb", sb, N, dev));
  const bool has_bias = bias.has_value() && bias->defined();
  if (has_bias) HOT_PROPAGATE(check_bias(kind, *bias, N, dev));
  int64_t kc = max_k > 0 ? std::min(max_k, int4 ? kMaxKInt4 : kMaxKInt8) : (int4 ? kMaxKInt4 : kMaxKInt8);
  kc = kc / align * align;
  if (kc < align) return fail(value_error(where, "max_k = ", max_k, " is below the K alignment ", align));

  c10::cuda::CUDAGuard guard(dev);
  HOT_PROPAGATE(check_device(kind, dev));
  auto fopts = torch::TensorOptions().device(dev).dtype(torch::kFloat32);
  torch::Tensor sa_v = scale_vector(sa, M);
  torch::Tensor sb_v = scale_vector(sb, N);
  if (M == 0 || N == 0 || K == 0) {
    // No products: the sum is exactly 0, still scaled so NaN/Inf scales propagate as in the reference.
    auto z = torch::zeros({M, N}, fopts) * sa_v.narrow(0, 0, M).unsqueeze(1) * sb_v.narrow(0, 0, N).unsqueeze(0);
    if (has_bias) z.add_(bias->unsqueeze(0));
    return ok(z.to(odt));
  }

  // The kernels want N (the output row) a multiple of 16: pad b with zero rows.
  const int64_t Np = round_up(N, 16);
  torch::Tensor bp = b;
  if (Np != N) {
    bp = torch::zeros({Np, b.size(1)}, b.options());
    bp.narrow(0, 0, N).copy_(b);
  }
  const int64_t nchunks = (K + kc - 1) / kc;
  // The bias goes into the epilogue of a one-pass sm90 GEMM; elsewhere the kernels write float32
  // and the bias is added below, in float32 before the one rounding into out_dtype: the same
  // function either way.
  const bool bias_inside = has_bias && kind == Kind::kS8Sm90 && nchunks == 1;
  const bool f32_out = nchunks > 1 || (has_bias && !bias_inside);
  torch::Tensor bias_v;
  if (bias_inside) bias_v = bias_vector(*bias, Np);

  hot::GemmArgs g;
  g.lda = a.size(0) > 1 ? a.stride(0) * per_byte : K;
  g.ldb = bp.size(0) > 1 ? bp.stride(0) * per_byte : K;
  g.sa = sa_v.data_ptr<float>();
  g.sb = sb_v.data_ptr<float>();
  g.m = int(M);
  g.n = int(Np);
  g.ldo = Np;
  g.bias = bias_inside ? bias_v.data_ptr<float>() : nullptr;
  g.stream = c10::cuda::getCurrentCUDAStream(dev.index()).stream();

  torch::Tensor out = torch::empty({M, Np}, fopts.dtype(f32_out ? torch::kFloat32 : odt));
  torch::Tensor part;
  for (int64_t c = 0; c < nchunks; ++c) {
    const int64_t k0 = c * kc;
    const int64_t kl = std::min(kc, K - k0);
    g.a = static_cast<const uint8_t*>(a.data_ptr()) + k0 / per_byte;
    g.b = static_cast<const uint8_t*>(bp.data_ptr()) + k0 / per_byte;
    g.k = int(kl);
    if (c == 0) {
      g.out = out.data_ptr();
      g.out_type = f32_out ? hot::OutType::kF32 : otype;
    } else {
      if (!part.defined()) part = torch::empty({M, Np}, fopts);
      g.out = part.data_ptr();
      g.out_type = hot::OutType::kF32;
    }
    const char* err = launch(kind, g, fopts);
    if (err != nullptr) {
      return fail(runtime_error(where, err, " (M=", M, ", N=", N, ", K=", K, ", chunk K=", kl, ")"));
    }
    if (c > 0) out.add_(part);
  }
  if (has_bias && !bias_inside) out.narrow(1, 0, N).add_(bias->unsqueeze(0));
  if (f32_out) out = out.to(odt);
  if (Np != N) out = out.narrow(1, 0, N).contiguous();
  return ok(out);
}

Result gemm_s8s8_sm90(torch::Tensor a, torch::Tensor b, torch::Tensor sa, torch::Tensor sb,
                      std::string out_dtype, int64_t max_k, c10::optional<torch::Tensor> bias) {
  return guarded("gemm_s8s8_sm90", [&] { return scaled_gemm(Kind::kS8Sm90, a, b, sa, sb, out_dtype, max_k, bias); });
}
Result gemm_s8s8_sm80(torch::Tensor a, torch::Tensor b, torch::Tensor sa, torch::Tensor sb,
                      std::string out_dtype, int64_t max_k, c10::optional<torch::Tensor> bias) {
  return guarded("gemm_s8s8_sm80", [&] { return scaled_gemm(Kind::kS8Sm80, a, b, sa, sb, out_dtype, max_k, bias); });
}
Result gemm_s4s4_sm80(torch::Tensor a, torch::Tensor b, torch::Tensor sa, torch::Tensor sb,
                      std::string out_dtype, int64_t max_k, c10::optional<torch::Tensor> bias) {
  return guarded("gemm_s4s4_sm80", [&] { return scaled_gemm(Kind::kS4Sm80, a, b, sa, sb, out_dtype, max_k, bias); });
}

// codes (R, K) int8 in [-8, 7] -> (R, ceil(K / 32) * 16) uint8, zero codes past K.
Result pack_int4_impl(const torch::Tensor& codes, bool check) {
  const std::string where = "hot.fast._C.pack_int4: ";
  if (!codes.is_cuda())
    return fail(value_error(where, "codes must be a CUDA tensor, got one on ", codes.device()));
  if (codes.scalar_type() != torch::kInt8)
    return fail(value_error(where, "codes must be int8, got ", codes.scalar_type()));
  if (codes.dim() != 2) return fail(value_error(where, "codes must be 2-D (rows, K), got shape ", codes.sizes()));
  if (!(codes.size(1) <= 1 || codes.stride(1) == 1))
    return fail(value_error(where, "codes must be contiguous along K; call .contiguous()"));
  c10::cuda::CUDAGuard guard(codes.device());
  const int64_t R = codes.size(0), K = codes.size(1), Kp = round_up(K, 32);
  auto packed = torch::empty({R, Kp / 2}, codes.options().dtype(torch::kUInt8));
  torch::Tensor flag;
  if (check) flag = torch::zeros({1}, codes.options().dtype(torch::kInt32));
  auto stream = c10::cuda::getCurrentCUDAStream(codes.device().index()).stream();
  const char* err = hot::pack_int4(codes.data_ptr<int8_t>(), R, K, R > 1 ? codes.stride(0) : K,
                                   packed.data_ptr<uint8_t>(), Kp, check ? flag.data_ptr<int>() : nullptr, stream);
  if (err != nullptr) return fail(runtime_error(where, err));
  // .item() syncs the device (the reason check=False exists) and may throw: guarded() catches.
  if (check && flag.item<int>() != 0) {
    return fail(value_error(where, "codes outside the int4 range [-8, 7] (a ", R, "x", K,
                            " tensor); quantize to 4 bits first, or use the int8 GEMM"));
  }
  return ok(packed);
}

Result pack_int4(torch::Tensor codes, bool check) {
  return guarded("pack_int4", [&] { return pack_int4_impl(codes, check); });
}

// packed (R, B) uint8 -> codes (R, k) int8, k <= 2 B.
Result unpack_int4_impl(const torch::Tensor& packed, int64_t k) {
  const std::string where = "hot.fast._C.unpack_int4: ";
  if (!packed.is_cuda())
    return fail(value_error(where, "packed must be a CUDA tensor, got one on ", packed.device()));
  if (packed.scalar_type() != torch::kUInt8)
    return fail(value_error(where, "packed must be uint8, got ", packed.scalar_type()));
  if (packed.dim() != 2) return fail(value_error(where, "packed must be 2-D, got shape ", packed.sizes()));
  if (!(packed.size(1) <= 1 || packed.stride(1) == 1))
    return fail(value_error(where, "packed must be contiguous along its columns"));
  if (!(k >= 0 && k <= 2 * packed.size(1)))
    return fail(value_error(where, "k = ", k, " must lie in [0, ", 2 * packed.size(1), "]"));
  c10::cuda::CUDAGuard guard(packed.device());
  const int64_t R = packed.size(0);
  auto codes = torch::empty({R, k}, packed.options().dtype(torch::kInt8));
  auto stream = c10::cuda::getCurrentCUDAStream(packed.device().index()).stream();
  const char* err = hot::unpack_int4(packed.data_ptr<uint8_t>(), R, k, R > 1 ? packed.stride(0) : packed.size(1),
                                     codes.data_ptr<int8_t>(), stream);
  if (err != nullptr) return fail(runtime_error(where, err));
  return ok(codes);
}

Result unpack_int4(torch::Tensor packed, int64_t k) {
  return guarded("unpack_int4", [&] { return unpack_int4_impl(packed, k); });
}

// ---- Native launches of the Triton quantizer kernels (csrc/triton_launch.h, hot/fast/native.py).

std::tuple<int64_t, std::string> register_triton(int64_t function, int64_t block, int64_t shared,
                                                 std::string kinds) {
  int64_t id = -1;
  std::string err = catching("register_triton", [&] {
    std::string e = hot::triton_launch::register_fn(uint64_t(function), unsigned(block), unsigned(shared), kinds, &id);
    return e.empty() ? e : runtime_error("hot.fast._C.register_triton: ", e);
  });
  return {id, err};
}

// A quantizer pass plan from hot/fast/native.py (NativePlan: the same fields in the same order).
enum PassField {
  kStatsId, kQuantId, kGrid0, kGrid1, kGrid2, kR, kC, kC16, kLR, kNBlk, kNh, kNl, kHqSPad, kHlaSPad,
  kDoHq, kDoHla, kDoBsum, kPassFields
};

// bsum: x's column sums in float32 (the bias gradient), from the stats kernel's per-row-of-tiles
// partial sums (kDoBsum plans only).
struct PassOut { torch::Tensor hq_q, hq_s, hla_q, hla_s, bsum; };

int64_t addr(const torch::Tensor& t) { return int64_t(reinterpret_cast<uintptr_t>(t.data_ptr())); }

// One pass (stats kernel, then quantize kernel) over x: the outputs and the arguments of
// hot.fast.passes.pass_args (StatsArgs and QuantizeArgs name them, in the kernels' parameter
// order; tests/fast/test_native_gpu.py checks both paths give the same codes and scales).
// step: the step counter the seeds follow (USE_STEP kernels read it), or undefined.
// amax: a zeroed int32 vector of >= nh + nl entries for the stats kernel's maxima.
std::string run_pass(const std::vector<int64_t>& p, const torch::Tensor& x, const torch::Tensor& amax,
                     int64_t hq_key, int64_t hla_key, int64_t hla_draw,
                     const std::optional<torch::Tensor>& step, PassOut* out) {
  const std::string where = "hot.fast._C.quant_pass: ";
  HOT_REQUIRE(p.size() == kPassFields, where, "the plan has ", int64_t(p.size()), " fields, expected ",
              int64_t(kPassFields));
  HOT_REQUIRE(x.is_cuda() && x.dim() == 2 && x.size(0) == p[kR] && x.size(1) == p[kC], where,
              "x must be a 2-D CUDA tensor of the plan's shape (", p[kR], ", ", p[kC], "), got ", x.sizes(),
              " on ", x.device());
  // A plan without a stats kernel (kStatsId -1: hot.fast.passes' rows plans, whose one kernel
  // holds whole rows) reads no workspace; its pointer only fills the unused arguments.
  const bool one_kernel = p[kStatsId] < 0;
  const int64_t ws_need = one_kernel ? 0 : std::max<int64_t>(p[kNh] + p[kNl], 1);
  HOT_REQUIRE(amax.is_cuda() && amax.scalar_type() == torch::kInt32 && amax.is_contiguous() &&
                  amax.numel() >= ws_need && amax.device() == x.device(),
              where, "the absmax workspace must be a contiguous int32 tensor of >= ", ws_need,
              " entries on ", x.device());
  HOT_REQUIRE(!step || (step->device() == x.device() && step->scalar_type() == torch::kInt64 &&
                        step->numel() == 1), where, "the step counter must be one int64 on ", x.device());
  const auto dev = x.device();
  auto i8 = x.options().dtype(torch::kInt8);
  auto f32 = x.options().dtype(torch::kFloat32);
  // Scales padded to SCALE_PAD floats (hot.fast.passes): the GEMMs read them in place.
  if (p[kDoHq]) {
    out->hq_q = torch::empty({p[kR], p[kC16]}, i8);
    out->hq_s = torch::empty({p[kHqSPad]}, f32).as_strided({p[kNh], 1}, {1, 1});
  }
  if (p[kDoHla]) {
    out->hla_q = torch::empty({p[kC], p[kLR]}, i8);
    out->hla_s = torch::empty({p[kHlaSPad]}, f32).as_strided({p[kNl], 1}, {1, 1});
  }
  using hot::triton_launch::Arg;
  const int64_t ws = addr(amax);
  const int64_t ws_l = p[kNh] ? ws + p[kNh] * int64_t(sizeof(int32_t)) : ws;
  torch::Tensor partial;
  if (p[kDoBsum]) partial = torch::empty({p[kC], p[kGrid0]}, f32);  // column-major: an inner-axis sum
  // StatsArgs: x, sxr, sxc, R, C, hq_amax, hla_amax, bsum.
  const std::vector<Arg> stats = {{addr(x)}, {x.stride(0)}, {x.stride(1)}, {p[kR]}, {p[kC]},
                                  {ws}, {ws_l}, {p[kDoBsum] ? addr(partial) : ws}};
  // QuantizeArgs: x, sxr, sxc, R, C, hq_amax, hla_amax, hq_q, hq_s, C16, hq_key, hla_q, hla_s, LR,
  // NBLK, hla_key, hla_draw, step.
  const std::vector<Arg> quant = {
      {addr(x)}, {x.stride(0)}, {x.stride(1)}, {p[kR]}, {p[kC]}, {ws}, {ws_l},
      {p[kDoHq] ? addr(out->hq_q) : ws}, {p[kDoHq] ? addr(out->hq_s) : ws}, {p[kC16]}, {hq_key},
      {p[kDoHla] ? addr(out->hla_q) : ws}, {p[kDoHla] ? addr(out->hla_s) : ws}, {p[kLR]}, {p[kNBlk]},
      {hla_key}, {hla_draw}, {step ? addr(*step) : ws}};
  const unsigned grid[3] = {unsigned(p[kGrid0]), unsigned(p[kGrid1]), unsigned(p[kGrid2])};
  c10::cuda::CUDAGuard guard(dev);
  CUstream stream = reinterpret_cast<CUstream>(c10::cuda::getCurrentCUDAStream(dev.index()).stream());
  std::string e = one_kernel ? std::string() : hot::triton_launch::launch(p[kStatsId], grid, stats, stream);
  if (e.empty()) e = hot::triton_launch::launch(p[kQuantId], grid, quant, stream);
  if (!e.empty()) return runtime_error(where, e);
  if (p[kDoBsum]) out->bsum = partial.sum(1);
  return e;
}

using Tensors = std::tuple<std::vector<torch::Tensor>, std::string>;

Tensors quant_pass(std::vector<int64_t> plan, torch::Tensor x, torch::Tensor amax, int64_t hq_key,
                   int64_t hla_key, int64_t hla_draw, std::optional<torch::Tensor> step) {
  PassOut o;
  std::string err = catching("quant_pass", [&] {
    return run_pass(plan, x, amax, hq_key, hla_key, hla_draw, step, &o);
  });
  if (!err.empty()) return Tensors(std::vector<torch::Tensor>(), err);
  return {{o.hq_q, o.hq_s, o.hla_q, o.hla_s, o.bsum}, std::string()};
}

// The HOT backward of one layer in one call (hot.common.ops, layer_backward):
//   g_y pass over gy -> (q_gy, s_gy) for HQ and (q_hla, s_hla) for HLA; HQ pass over W^T -> (q_w, s_w);
//   g_x = int_gemm_nt(q_gy, q_w, s_gy, s_w), g_W = int_gemm_nt(q_hla, q_x, s_hla, s_x);
//   with a kDoBsum g_y plan also g_b = the column sums of gy, in gy's dtype (else undefined).
// gemm_kind: 0 = gemm_s8s8_sm90, 1 = gemm_s8s8_sm80 (what hot.fast.gemm.gemm_path picks for these
// operands; the caller decided).
Tensors layer_backward(std::vector<int64_t> gplan, std::vector<int64_t> wplan, torch::Tensor gy, torch::Tensor wt,
                       torch::Tensor qx, torch::Tensor sx, torch::Tensor amax_g, torch::Tensor amax_w,
                       int64_t key_gy, int64_t key_hla, int64_t draw_hla, int64_t key_w,
                       std::optional<torch::Tensor> step,
                       int64_t gemm_kind, std::string gx_dtype, std::string gw_dtype) {
  torch::Tensor gx, gw, gb;
  std::string err = catching("layer_backward", [&] {
    HOT_REQUIRE(gemm_kind == 0 || gemm_kind == 1, "hot.fast._C.layer_backward: gemm_kind must be 0 or 1, got ",
                gemm_kind);
    HOT_REQUIRE(gplan.size() == kPassFields && gplan[kDoHq] && gplan[kDoHla] && wplan.size() == kPassFields &&
                    wplan[kDoHq] && !wplan[kDoHla], "hot.fast._C.layer_backward: the g_y plan must do HQ and HLA, "
                    "the W plan HQ only");
    PassOut g, w;
    std::string e = run_pass(gplan, gy, amax_g, key_gy, key_hla, draw_hla, step, &g);
    if (e.empty()) e = run_pass(wplan, wt, amax_w, key_w, 0, 0, step, &w);
    if (!e.empty()) return e;
    const Kind kind = gemm_kind == 0 ? Kind::kS8Sm90 : Kind::kS8Sm80;
    Result r = scaled_gemm(kind, g.hq_q, w.hq_q, g.hq_s, w.hq_s, gx_dtype, 0, c10::nullopt);
    if (!std::get<1>(r).empty()) return std::get<1>(r);
    gx = std::get<0>(r);
    r = scaled_gemm(kind, g.hla_q, qx, g.hla_s, sx, gw_dtype, 0, c10::nullopt);
    if (!std::get<1>(r).empty()) return std::get<1>(r);
    gw = std::get<0>(r);
    if (g.bsum.defined()) gb = g.bsum.to(gy.scalar_type());
    return std::string();
  });
  if (!err.empty()) return Tensors(std::vector<torch::Tensor>(), err);
  return {{gx, gw, gb}, std::string()};
}

// (dict, err) like the other entry points: building the dict allocates Python objects, which
// pybind11 reports by throwing.
std::tuple<pybind11::object, std::string> info() {
  try {
    pybind11::dict d;
    d["archs"] = arch_list();
    d["sm90a"] = sm90a_built();
    d["max_k_int8"] = kMaxKInt8;
    d["max_k_int4"] = kMaxKInt4;
    d["cutlass_version"] = std::to_string(CUTLASS_MAJOR) + "." + std::to_string(CUTLASS_MINOR) + "." +
                           std::to_string(CUTLASS_PATCH);
    return {std::move(d), std::string()};
  } catch (const std::exception& e) {
    return {pybind11::none(), runtime_error("hot.fast._C.info: ", e.what())};
  } catch (...) {
    return {pybind11::none(), runtime_error("hot.fast._C.info: unknown C++ exception")};
  }
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "hot CUDA kernels: CUTLASS integer GEMMs with dequantizing epilogues, int4 packing. "
            "Every function returns (result, err): err is '' on success, else 'ValueError: ...', "
            "'RuntimeError: ...' or 'OutOfMemoryError: ...' and result is None; hot.fast._ext raises it.";
  m.def("gemm_s8s8_sm90", &gemm_s8s8_sm90, "int8 wgmma GEMM (sm_90a) with row/column scales -> (out, err)",
        pybind11::arg("a"), pybind11::arg("b"), pybind11::arg("sa"), pybind11::arg("sb"),
        pybind11::arg("out_dtype"), pybind11::arg("max_k") = 0, pybind11::arg("bias") = pybind11::none());
  m.def("gemm_s8s8_sm80", &gemm_s8s8_sm80, "int8 mma.sync GEMM (sm_80+) with row/column scales -> (out, err)",
        pybind11::arg("a"), pybind11::arg("b"), pybind11::arg("sa"), pybind11::arg("sb"),
        pybind11::arg("out_dtype"), pybind11::arg("max_k") = 0, pybind11::arg("bias") = pybind11::none());
  m.def("gemm_s4s4_sm80", &gemm_s4s4_sm80, "packed int4 mma.sync GEMM (sm_80+) with row/column scales -> (out, err)",
        pybind11::arg("a"), pybind11::arg("b"), pybind11::arg("sa"), pybind11::arg("sb"),
        pybind11::arg("out_dtype"), pybind11::arg("max_k") = 0, pybind11::arg("bias") = pybind11::none());
  m.def("pack_int4", &pack_int4, "int8 codes -> (packed int4, err)", pybind11::arg("codes"),
        pybind11::arg("check") = true);
  m.def("unpack_int4", &unpack_int4, "packed int4 -> (int8 codes, err)", pybind11::arg("packed"), pybind11::arg("k"));
  m.def("register_triton", &register_triton,
        "register a Triton-loaded kernel (CUfunction, block, shared bytes, argument kinds) -> (id, err)",
        pybind11::arg("function"), pybind11::arg("block"), pybind11::arg("shared"), pybind11::arg("kinds"));
  m.def("quant_pass", &quant_pass, "one quantizer pass (stats + quantize) -> ([hq_q, hq_s, hla_q, hla_s, bsum], err)",
        pybind11::arg("plan"), pybind11::arg("x"), pybind11::arg("amax"), pybind11::arg("hq_key"),
        pybind11::arg("hla_key"), pybind11::arg("hla_draw"),
        pybind11::arg("step") = pybind11::none());
  m.def("layer_backward", &layer_backward, "g_y pass, W pass and both GEMMs of one layer -> ([g_x, g_W, g_b], err)");
  // run_pass launches a plan with kStatsId -1 as its one kernel (hot.fast.native checks this
  // before it registers such a plan: an older build would reject the id).
  m.attr("one_kernel_passes") = true;
  m.def("info", &info, "(build facts: archs, sm90a, max_k_int8, max_k_int4, cutlass_version; err)");
}
