// INT8 x INT8 Ampere GEMM (mma.sync m16n8k32) with the dequantizing epilogue of gemm_sm80.cuh.
// Tiles: 128x256x64 per CTA, 64x64x64 per warp, 3 stages = 72 KiB of shared memory, which fits
// the 99 KiB limit of sm_86/sm_89 as well as sm_80/sm_90.
#include "gemm_sm80.cuh"

namespace hot {
namespace {

template <typename ElementD>
using G = sm80::ScaledGemm<int8_t, cutlass::gemm::GemmShape<128, 256, 64>, cutlass::gemm::GemmShape<64, 64, 64>,
                           cutlass::gemm::GemmShape<16, 8, 32>, 3, ElementD>;

constexpr const char* kCan = "gemm_s8s8_sm80: CUTLASS can_implement rejected the problem (K must be a multiple of 16, N of 16)";
constexpr const char* kInit = "gemm_s8s8_sm80: CUTLASS initialize failed (shared-memory attribute)";
constexpr const char* kRun = "gemm_s8s8_sm80: CUTLASS run failed";

}  // namespace

size_t gemm_s8s8_sm80_workspace_size(const GemmArgs& g) {
  switch (g.out_type) {
    case OutType::kF32: return G<float>::workspace_size(g);
    case OutType::kBF16: return G<cutlass::bfloat16_t>::workspace_size(g);
    case OutType::kF16: return G<cutlass::half_t>::workspace_size(g);
  }
  return 0;
}

const char* gemm_s8s8_sm80(const GemmArgs& g) {
  switch (g.out_type) {
    case OutType::kF32: return G<float>::run(g, kCan, kInit, kRun);
    case OutType::kBF16: return G<cutlass::bfloat16_t>::run(g, kCan, kInit, kRun);
    case OutType::kF16: return G<cutlass::half_t>::run(g, kCan, kInit, kRun);
  }
  return "gemm_s8s8_sm80: unknown output type";
}

}  // namespace hot
