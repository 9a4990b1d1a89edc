// INT8 x INT8 -> INT32 GEMM on Hopper (wgmma + TMA, warp-specialized cooperative, CUTLASS 3.x
// CollectiveBuilder) with a dequantizing epilogue visitor tree:
//   out[m, n] = cvt((float(acc[m, n]) * sa[m]) * sb[n]).
// Device code exists only for sm_90a (CUTLASS stubs the kernel body on other targets); the
// binding refuses to launch it on anything but compute capability 9.0.
#include <cstdio>
#include <type_traits>

#include "cutlass/cutlass.h"
#include "cutlass/numeric_types.h"
#include "cute/tensor.hpp"
#include "cutlass/gemm/dispatch_policy.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/epilogue/fusion/sm90_callbacks_tma_warpspecialized.hpp"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/util/packed_stride.hpp"

#include "hot_kernels.h"
#include "launch_util.h"

namespace hot {
namespace {

using namespace cute;

// 128x256x128 with a 2x1x1 cluster measured 1410 TOPS at 8192^3 on an H200 (kernel_tech.md 1.4).
using TileShape = Shape<_128, _256, _128>;
using ClusterShape = Shape<_2, _1, _1>;
using MainSchedule = cutlass::gemm::KernelTmaWarpSpecializedCooperative;
using EpiSchedule = cutlass::epilogue::TmaWarpSpecializedCooperative;

// Scheduler: cutlass::gemm::PersistentScheduler (data-parallel: one output tile per CTA at a
// time) or cutlass::gemm::StreamKScheduler (CTAs also split the K loop of a tile and add their
// int32 partial accumulators in a workspace before the epilogue: exact in any order, since
// integer addition is associative, so the peers may add in arrival order). The choice for an
// output of fewer 128x256 tiles than SMs and a long K (HOT's g_W GEMMs at ViT sizes and Llama's
// narrow ones), from the variants timed on an H100 (benchmarks/results/gemm_decomp_h100/):
//   at least 4 SMs a tile   stream-K (ViT-B proj, 18 tiles: 0.034 ms; split-K in 7 parts 0.036)
//   2 or 3 SMs a tile       split-K in that many parts (54 and 64 tiles: 7-9% faster than stream-K)
//   fewer, below 90% of SMs stream-K (72 tiles: split-K in 1 part, i.e. data-parallel, 20% slower)
//   at least 90% of SMs     data-parallel: one wave (128 tiles: 7% faster than stream-K)
struct Decomposition {
  cutlass::gemm::kernel::detail::DecompositionMode mode;
  int splits;
};

inline int64_t output_tiles(const GemmArgs& g) {
  constexpr int kM = cute::size<0>(TileShape{}), kN = cute::size<1>(TileShape{});
  return int64_t((g.m + kM - 1) / kM) * ((g.n + kN - 1) / kN);
}

inline Decomposition decomposition(const GemmArgs& g) {
  using Mode = cutlass::gemm::kernel::detail::DecompositionMode;
  const int64_t per_tile = current_hw_info().sm_count / output_tiles(g);
  if (per_tile == 2 || per_tile == 3) return {Mode::SplitK, int(per_tile)};
  return {Mode::StreamK, 1};
}

template <typename ElementD, typename Scheduler>
struct Sm90S8Gemm {
  static constexpr int kAlignD = 128 / cutlass::sizeof_bits<ElementD>::value;
  static constexpr auto kRound = cutlass::FloatRoundStyle::round_to_nearest;

  // Leaves of the tree: the int32 accumulator, sa as a column vector (one value per row m,
  // broadcast along n), sb as a row vector (one value per column n, broadcast along m).
  using Acc = cutlass::epilogue::fusion::Sm90AccFetch;
  using ScaleA = cutlass::epilogue::fusion::Sm90ColBroadcast<0, TileShape, float, float, Stride<_1, _0, _0>>;
  using ScaleB = cutlass::epilogue::fusion::Sm90RowBroadcast<0, TileShape, float, float, Stride<_0, _1, _0>>;
  using MulA = cutlass::epilogue::fusion::Sm90Compute<cutlass::multiplies, float, float, kRound>;
  using MulB = cutlass::epilogue::fusion::Sm90Compute<cutlass::multiplies, ElementD, float, kRound>;
  // (acc * sa) * sb, the same association as the reference backend.
  using Tree = cutlass::epilogue::fusion::Sm90EVT<MulB, cutlass::epilogue::fusion::Sm90EVT<MulA, Acc, ScaleA>, ScaleB>;

  using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, int32_t, float,
      void, cutlass::layout::RowMajor, kAlignD,          // no source operand C
      ElementD, cutlass::layout::RowMajor, kAlignD,
      EpiSchedule, Tree>::CollectiveOp;

  using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp,
      int8_t, cutlass::layout::RowMajor, 16, int8_t, cutlass::layout::ColumnMajor, 16,
      int32_t, TileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(sizeof(typename Epilogue::SharedStorage))>,
      MainSchedule>::CollectiveOp;

  using Kernel = cutlass::gemm::kernel::GemmUniversal<Shape<int, int, int, int>, Mainloop, Epilogue, Scheduler>;
  using Device = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;

  static typename Device::Arguments make_args(const GemmArgs& g) {
    using StrideA = typename Kernel::StrideA;
    using StrideB = typename Kernel::StrideB;
    using StrideD = typename Kernel::StrideD;
    StrideA sA = cutlass::make_cute_packed_stride(StrideA{}, make_shape(g.m, g.k, 1));
    StrideB sB = cutlass::make_cute_packed_stride(StrideB{}, make_shape(g.n, g.k, 1));
    StrideD sD = cutlass::make_cute_packed_stride(StrideD{}, make_shape(g.m, g.n, 1));
    get<0>(sA) = g.lda;  // chunked calls pass a column slice of a wider matrix
    get<0>(sB) = g.ldb;
    get<0>(sD) = g.ldo;

    typename Device::Arguments args{};
    args.mode = cutlass::gemm::GemmUniversalMode::kGemm;
    args.problem_shape = {g.m, g.n, g.k, 1};
    args.mainloop = {static_cast<const int8_t*>(g.a), sA, static_cast<const int8_t*>(g.b), sB};
    args.epilogue.ptr_C = nullptr;
    args.epilogue.dC = sD;
    args.epilogue.ptr_D = static_cast<ElementD*>(g.out);
    args.epilogue.dD = sD;
    // Tree arguments nest as {child0, child1, node}.
    args.epilogue.thread = {
        {{}, {g.sa, 0.0f, {}}, {}},  // acc * sa
        {g.sb, 0.0f, {}},            // * sb
        {}};
    args.hw_info = current_hw_info();
    if constexpr (std::is_same_v<Scheduler, cutlass::gemm::StreamKScheduler>) {
      const Decomposition d = decomposition(g);
      args.scheduler.decomposition_mode = d.mode;
      args.scheduler.splits = d.splits;
      args.scheduler.reduction_mode = decltype(args.scheduler.reduction_mode)::Nondeterministic;
    }
    return args;
  }

  static size_t workspace_size(const GemmArgs& g) { return Device::get_workspace_size(make_args(g)); }

  static const char* run(const GemmArgs& g) {
    auto args = make_args(g);
    Device gemm;
    cutlass::Status st = gemm.can_implement(args);
    if (st != cutlass::Status::kSuccess) return "gemm_s8s8_sm90: CUTLASS can_implement rejected the problem (alignment of K, strides or N)";
    st = gemm.initialize(args, g.workspace, g.stream);
    if (st != cutlass::Status::kSuccess) return "gemm_s8s8_sm90: CUTLASS initialize failed (workspace or shared-memory attribute)";
    st = gemm.run(g.stream);
    if (st != cutlass::Status::kSuccess) return "gemm_s8s8_sm90: CUTLASS run failed";
    return last_launch_error();
  }
};

template <typename S>
const char* run_as(const GemmArgs& g) {
  switch (g.out_type) {
    case OutType::kF32: return Sm90S8Gemm<float, S>::run(g);
    case OutType::kBF16: return Sm90S8Gemm<cutlass::bfloat16_t, S>::run(g);
    case OutType::kF16: return Sm90S8Gemm<cutlass::half_t, S>::run(g);
  }
  return "unknown output type";
}

template <typename S>
size_t ws_as(const GemmArgs& g) {
  switch (g.out_type) {
    case OutType::kF32: return Sm90S8Gemm<float, S>::workspace_size(g);
    case OutType::kBF16: return Sm90S8Gemm<cutlass::bfloat16_t, S>::workspace_size(g);
    case OutType::kF16: return Sm90S8Gemm<cutlass::half_t, S>::workspace_size(g);
  }
  return 0;
}

// Fewer output tiles than 90% of the SMs and a K loop long enough to share (at least 8
// k-blocks of 128).
bool use_stream_k(const GemmArgs& g) {
  return output_tiles(g) * 10 < int64_t(current_hw_info().sm_count) * 9 && g.k >= 8 * 128;
}

}  // namespace

size_t gemm_s8s8_sm90_workspace_size(const GemmArgs& g) {
  return use_stream_k(g) ? ws_as<cutlass::gemm::StreamKScheduler>(g) : ws_as<cutlass::gemm::PersistentScheduler>(g);
}
const char* gemm_s8s8_sm90(const GemmArgs& g) {
  return use_stream_k(g) ? run_as<cutlass::gemm::StreamKScheduler>(g) : run_as<cutlass::gemm::PersistentScheduler>(g);
}

}  // namespace hot
