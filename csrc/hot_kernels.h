// Plain C++ interface of the hot CUDA kernels. No torch headers here or in any .cu file: the
// kernels take raw pointers, leading dimensions and a stream; csrc/binding.cpp owns all torch
// checks and allocation. Keeping torch out of the .cu files cuts the build time about 4x
// (kernel_tech.md section 5).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cuda_runtime.h>

namespace hot {

enum class OutType : int { kF32 = 0, kBF16 = 1, kF16 = 2 };

// One scaled integer GEMM, "NT": out[m, n] = cvt((float(sum_k a[m, k] * b[n, k]) * sa[m]) * sb[n]
// [+ bias[n]]). The int32 accumulation is exact while |sum| < 2^31 (the caller chunks K to
// guarantee it); the int32 -> fp32 conversion, the two fp32 products and the fp32 bias sum round
// to nearest, in this order, which is also the order of hot.reference.ops.int_gemm_nt; cvt rounds
// to nearest into the output type. Only gemm_s8s8_sm90 takes a bias (its epilogue adds it); the
// binding adds it after the other kernels, in float32 before the same final rounding.
struct GemmArgs {
  const void* a = nullptr;   // (M, K) row-major codes; int8, or packed int4 (two per byte)
  int64_t lda = 0;           // row stride of a, in elements (codes, not bytes)
  const void* b = nullptr;   // (N, K) row-major codes, i.e. K x N column-major
  int64_t ldb = 0;
  const float* sa = nullptr; // M values (one per row of a)
  const float* sb = nullptr; // N values (one per row of b)
  void* out = nullptr;       // (M, N) row-major, of out_type
  int64_t ldo = 0;           // row stride of out, in elements
  int m = 0, n = 0, k = 0;
  OutType out_type = OutType::kF32;
  const float* bias = nullptr; // N float32 values added before the final rounding (sm90 only), or null
  void* workspace = nullptr; // at least *_workspace_size(args) bytes on the device
  cudaStream_t stream = nullptr;
};

// Each GEMM returns nullptr on success, else a static message naming what failed. Callers must
// have checked the documented alignment: K a multiple of 16 (int8) or 32 (int4), lda/ldb/ldo
// and the base pointers 16-byte aligned, N a multiple of 16 (pad B, sb and the output row).
size_t gemm_s8s8_sm90_workspace_size(const GemmArgs& args);
const char* gemm_s8s8_sm90(const GemmArgs& args);   // wgmma, runs only on sm_90 / sm_90a
size_t gemm_s8s8_sm80_workspace_size(const GemmArgs& args);
const char* gemm_s8s8_sm80(const GemmArgs& args);   // mma.sync m16n8k32, sm_80 and later
size_t gemm_s4s4_sm80_workspace_size(const GemmArgs& args);
const char* gemm_s4s4_sm80(const GemmArgs& args);   // mma.sync m16n8k64, sm_80..sm_89 native

// packed[r, j] = (codes[r, 2j] & 0xF) | (codes[r, 2j+1] << 4), codes past k read as 0; i.e. the
// cutlass::int4b_t RowMajor order (low nibble = even element). packed has kpad/2 bytes per row
// (kpad even, >= k). Codes outside [-8, 7] set *bad_flag = 1 (bad_flag may be null).
const char* pack_int4(const int8_t* codes, int64_t rows, int64_t k, int64_t ld_codes,
                      uint8_t* packed, int64_t kpad, int* bad_flag, cudaStream_t stream);
// codes[r, j] = sign-extended nibble j of row r (the inverse of pack_int4), j < k.
const char* unpack_int4(const uint8_t* packed, int64_t rows, int64_t k, int64_t ld_packed_bytes,
                        int8_t* codes, cudaStream_t stream);

}  // namespace hot
