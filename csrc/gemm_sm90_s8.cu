// The Hopper INT8 GEMM (gemm_sm90_s8.cuh): which kernel runs a GEMM, and the kernels without a
// bias.
#include "gemm_sm90_s8.cuh"

namespace hot {
namespace sm90 {

size_t dispatch_plain(const GemmArgs& g, Kernel k, bool want_ws, const char** err) {
  return dispatch_kernel<false>(g, k, want_ws, err);
}

namespace {

// Fewer output tiles than 90% of the SMs and a K loop long enough to share (at least 8
// k-blocks of 128).
bool use_stream_k(const GemmArgs& g) {
  return output_tiles(g) * 10 < int64_t(current_hw_info().sm_count) * 9 && g.k >= 8 * 128;
}

// The table in gemm_sm90_s8.cuh. A GEMM with a bias (the quantized forward) takes a
// data-parallel kernel even where stream-K would share the K loop: its epilogue runs once per
// tile, after the peers' partial sums are in.
Kernel pick(const GemmArgs& g) {
  if (g.bias == nullptr && use_stream_k(g)) return Kernel::kStreamK;
  if (g.n <= 1024) return Kernel::kPingCols;
  if (g.k <= 1024) return Kernel::kPingRows;
  return Kernel::kCoopWide;
}

size_t dispatch(const GemmArgs& g, bool want_ws, const char** err) {
  const Kernel k = pick(g);
  return g.bias != nullptr ? dispatch_bias(g, k, want_ws, err) : dispatch_plain(g, k, want_ws, err);
}

}  // namespace
}  // namespace sm90

size_t gemm_s8s8_sm90_workspace_size(const GemmArgs& g) {
  const char* err = nullptr;
  return sm90::dispatch(g, true, &err);
}

const char* gemm_s8s8_sm90(const GemmArgs& g) {
  const char* err = nullptr;
  sm90::dispatch(g, false, &err);
  return err;
}

}  // namespace hot
