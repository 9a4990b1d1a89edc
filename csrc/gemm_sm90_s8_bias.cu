// The Hopper INT8 GEMM (gemm_sm90_s8.cuh) with a bias in its epilogue: the quantized forward's
// y = x W^T + b, so that no pass over y adds b afterwards.
#include "gemm_sm90_s8.cuh"

namespace hot {
namespace sm90 {

size_t dispatch_bias(const GemmArgs& g, Kernel k, bool want_ws, const char** err) {
  return dispatch_kernel<true>(g, k, want_ws, err);
}

}  // namespace sm90
}  // namespace hot
