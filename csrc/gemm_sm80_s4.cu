// INT4 x INT4 Ampere GEMM (mma.sync m16n8k64 on packed cutlass::int4b_t, low nibble = even
// element) with the dequantizing epilogue of gemm_sm80.cuh. Native on sm_80..sm_89; on sm_90 the
// s4 mma is emulated by ptxas (about 24x slower than int8 wgmma, kernel_tech.md 1.1): the
// dispatcher must not pick it there. Tiles: 128x256x128 per CTA, 64x64x128 per warp, 3 stages
// = 72 KiB of shared memory (fits sm_86/sm_89's 99 KiB).
#include "gemm_sm80.cuh"

namespace hot {
namespace {

template <typename ElementD>
using G = sm80::ScaledGemm<cutlass::int4b_t, cutlass::gemm::GemmShape<128, 256, 128>, cutlass::gemm::GemmShape<64, 64, 128>,
                           cutlass::gemm::GemmShape<16, 8, 64>, 3, ElementD>;

constexpr const char* kCan = "gemm_s4s4_sm80: CUTLASS can_implement rejected the problem (K must be a multiple of 32, N of 16)";
constexpr const char* kInit = "gemm_s4s4_sm80: CUTLASS initialize failed (shared-memory attribute)";
constexpr const char* kRun = "gemm_s4s4_sm80: CUTLASS run failed";

}  // namespace

size_t gemm_s4s4_sm80_workspace_size(const GemmArgs& g) {
  switch (g.out_type) {
    case OutType::kF32: return G<float>::workspace_size(g);
    case OutType::kBF16: return G<cutlass::bfloat16_t>::workspace_size(g);
    case OutType::kF16: return G<cutlass::half_t>::workspace_size(g);
  }
  return 0;
}

const char* gemm_s4s4_sm80(const GemmArgs& g) {
  switch (g.out_type) {
    case OutType::kF32: return G<float>::run(g, kCan, kInit, kRun);
    case OutType::kBF16: return G<cutlass::bfloat16_t>::run(g, kCan, kInit, kRun);
    case OutType::kF16: return G<cutlass::half_t>::run(g, kCan, kInit, kRun);
  }
  return "gemm_s4s4_sm80: unknown output type";
}

}  // namespace hot
