// The Hopper INT8 GEMM (gemm_sm90_s8.cuh) with a bias in its epilogue: the quantized forward's
// y = x W^T + b, so that no pass over y adds b afterwards.
#include "gemm_sm90_s8.cuh"

namespace hot {
namespace sm90 {

size_t dispatch_bias(const GemmArgs& g, Kernel k, bool want_ws, const char** err) {
  switch (k) {
    case Kernel::kCoopWide: return dispatch_type<CoopWide, cutlass::gemm::PersistentScheduler, true>(g, want_ws, err);
    case Kernel::kPingRows: return dispatch_type<PingRows, cutlass::gemm::PersistentScheduler, true>(g, want_ws, err);
    case Kernel::kPingCols: return dispatch_type<PingCols, cutlass::gemm::PersistentScheduler, true>(g, want_ws, err);
    case Kernel::kStreamK: break;
  }
  *err = "gemm_s8s8_sm90: no stream-K kernel with a bias";
  return 0;
}

}  // namespace sm90
}  // namespace hot
