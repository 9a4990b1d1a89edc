// INT8 x INT8 -> INT32 GEMM on Hopper (wgmma + TMA, warp-specialized, CUTLASS 3.x
// CollectiveBuilder) with a dequantizing epilogue visitor tree:
//   out[m, n] = cvt((float(acc[m, n]) * sa[m]) * sb[n])            (Bias = false)
//   out[m, n] = cvt(((float(acc[m, n]) * sa[m]) * sb[n]) + bias[n]) (Bias = true)
// Shared by gemm_sm90_s8.cu (the dispatch and the kernels without a bias) and
// gemm_sm90_s8_bias.cu (with one), two translation units so that they compile in parallel.
// Device code exists only for sm_90a (CUTLASS stubs the kernel body on other targets); the
// binding refuses to launch it on anything but compute capability 9.0.
#pragma once

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
namespace sm90 {

using namespace cute;

// The kernels, and which GEMMs take each (timed on an H100 over a ViT-B/16 and a Llama-1b step's
// forward and g_x shapes: benchmarks/gemm_schedule_probe.cu, benchmarks/results/gemm_schedule_h100/):
//   kCoopWide  128x256x128 tile, 2x1x1 cluster, cooperative (both consumer warp groups on one
//              tile): the widest tile, the best on long K and wide outputs (1410 TOPS at 8192^3
//              on an H200, kernel_tech.md 1.4); also the stream-K kernel.
//   kPingRows  128x128x128, 2x1x1, ping-pong (each consumer warp group on its own tile, one's
//              epilogue under the other's main loop): outputs wider than 1024 with K <= 1024,
//              where the epilogue's store is as long as the main loop (ViT-B fc1's forward:
//              104 against 116 us).
//   kPingCols  128x128x128, 1x2x1, ping-pong: outputs of at most 1024 columns, where 128x256
//              tiles leave the last wave half empty (ViT-B's 768-wide GEMMs: 33-87 against
//              39-98 us; Llama-1b's k/v forward 100 against 117 us).
enum class Kernel { kStreamK, kCoopWide, kPingRows, kPingCols };

struct CoopWide {
  using Tile = Shape<_128, _256, _128>;
  using Cluster = Shape<_2, _1, _1>;
  using Main = cutlass::gemm::KernelTmaWarpSpecializedCooperative;
  using Epi = cutlass::epilogue::TmaWarpSpecializedCooperative;
};
struct PingRows {
  using Tile = Shape<_128, _128, _128>;
  using Cluster = Shape<_2, _1, _1>;
  using Main = cutlass::gemm::KernelTmaWarpSpecializedPingpong;
  using Epi = cutlass::epilogue::TmaWarpSpecialized;
};
struct PingCols {
  using Tile = Shape<_128, _128, _128>;
  using Cluster = Shape<_1, _2, _1>;
  using Main = cutlass::gemm::KernelTmaWarpSpecializedPingpong;
  using Epi = cutlass::epilogue::TmaWarpSpecialized;
};

// Output tiles of the widest kernel (the stream-K decision counts these).
inline int64_t output_tiles(const GemmArgs& g) {
  constexpr int kM = cute::size<0>(CoopWide::Tile{}), kN = cute::size<1>(CoopWide::Tile{});
  return int64_t((g.m + kM - 1) / kM) * ((g.n + kN - 1) / kN);
}

// Stream-K's scheduler: CTAs also split the K loop of a tile and add their int32 partial
// accumulators in a workspace before the epilogue (exact in any order: integer addition is
// associative, so the peers may add in arrival order). For an output of fewer 128x256 tiles than
// SMs and a long K (HOT's g_W GEMMs at ViT sizes and Llama's narrow ones), from the variants
// timed on an H100 (benchmarks/results/gemm_decomp_h100/):
//   at least 4 SMs a tile   stream-K (ViT-B proj, 18 tiles: 0.034 ms; split-K in 7 parts 0.036)
//   2 or 3 SMs a tile       split-K in that many parts (54 and 64 tiles: 7-9% faster than stream-K)
//   fewer, below 90% of SMs stream-K (72 tiles: split-K in 1 part, i.e. data-parallel, 20% slower)
//   at least 90% of SMs     data-parallel: one wave (128 tiles: 7% faster than stream-K)
struct Decomposition {
  cutlass::gemm::kernel::detail::DecompositionMode mode;
  int splits;
};

inline Decomposition decomposition(const GemmArgs& g) {
  using Mode = cutlass::gemm::kernel::detail::DecompositionMode;
  const int64_t per_tile = current_hw_info().sm_count / output_tiles(g);
  if (per_tile == 2 || per_tile == 3) return {Mode::SplitK, int(per_tile)};
  return {Mode::StreamK, 1};
}

// a + b rounded to nearest by __fadd_rn, which the compiler never contracts with the product
// before it into an FMA (one rounding where the reference has two: it rounds (acc * sa) * sb,
// then the sum with the bias; a plain + contracts and moves the last bit of some outputs).
template <class T>
struct AddRn {
  CUTLASS_DEVICE T operator()(T const& a, T const& b) const { return __fadd_rn(a, b); }
};
template <int N>
struct AddRn<cutlass::Array<float, N>> {
  CUTLASS_DEVICE cutlass::Array<float, N> operator()(cutlass::Array<float, N> const& a,
                                                     cutlass::Array<float, N> const& b) const {
    cutlass::Array<float, N> r;
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < N; ++i) r[i] = __fadd_rn(a[i], b[i]);
    return r;
  }
};

template <typename ElementD, typename Cfg, typename Scheduler, bool Bias>
struct Gemm {
  using TileShape = typename Cfg::Tile;
  static constexpr int kAlignD = 128 / cutlass::sizeof_bits<ElementD>::value;
  static constexpr auto kRound = cutlass::FloatRoundStyle::round_to_nearest;

  // Leaves of the tree: the int32 accumulator, sa as a column vector (one value per row m,
  // broadcast along n), sb and the bias as row vectors (one value per column n, broadcast along m).
  using Acc = cutlass::epilogue::fusion::Sm90AccFetch;
  using ScaleA = cutlass::epilogue::fusion::Sm90ColBroadcast<0, TileShape, float, float, Stride<_1, _0, _0>>;
  using ScaleB = cutlass::epilogue::fusion::Sm90RowBroadcast<0, TileShape, float, float, Stride<_0, _1, _0>>;
  using BiasRow = cutlass::epilogue::fusion::Sm90RowBroadcast<0, TileShape, float, float, Stride<_0, _1, _0>>;
  using MulA = cutlass::epilogue::fusion::Sm90Compute<cutlass::multiplies, float, float, kRound>;
  using Scaled = cutlass::epilogue::fusion::Sm90EVT<MulA, Acc, ScaleA>;
  // (acc * sa) * sb [+ bias], the same association as the reference backend; the last node
  // rounds once into ElementD.
  using PlainTree = cutlass::epilogue::fusion::Sm90EVT<
      cutlass::epilogue::fusion::Sm90Compute<cutlass::multiplies, ElementD, float, kRound>, Scaled, ScaleB>;
  using BiasTree = cutlass::epilogue::fusion::Sm90EVT<
      cutlass::epilogue::fusion::Sm90Compute<AddRn, ElementD, float, kRound>,
      cutlass::epilogue::fusion::Sm90EVT<
          cutlass::epilogue::fusion::Sm90Compute<cutlass::multiplies, float, float, kRound>, Scaled, ScaleB>,
      BiasRow>;
  using Tree = std::conditional_t<Bias, BiasTree, PlainTree>;

  using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, typename Cfg::Cluster,
      cutlass::epilogue::collective::EpilogueTileAuto, int32_t, float,
      void, cutlass::layout::RowMajor, kAlignD,          // no source operand C
      ElementD, cutlass::layout::RowMajor, kAlignD,
      typename Cfg::Epi, Tree>::CollectiveOp;

  using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp,
      int8_t, cutlass::layout::RowMajor, 16, int8_t, cutlass::layout::ColumnMajor, 16,
      int32_t, TileShape, typename Cfg::Cluster,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(sizeof(typename Epilogue::SharedStorage))>,
      typename Cfg::Main>::CollectiveOp;

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
    if constexpr (Bias) {
      args.epilogue.thread = {
          {{{}, {g.sa, 0.0f, {}}, {}},  // acc * sa
           {g.sb, 0.0f, {}},            // * sb
           {}},
          {g.bias, 0.0f, {}},           // + bias
          {}};
    } else {
      args.epilogue.thread = {
          {{}, {g.sa, 0.0f, {}}, {}},  // acc * sa
          {g.sb, 0.0f, {}},            // * sb
          {}};
    }
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

// Kernel k of GEMM g for each output type: run (want_ws = false) or its workspace size.
template <typename Cfg, typename Scheduler, bool Bias>
inline size_t dispatch_type(const GemmArgs& g, bool want_ws, const char** err) {
  switch (g.out_type) {
    case OutType::kF32:
      if (want_ws) return Gemm<float, Cfg, Scheduler, Bias>::workspace_size(g);
      *err = Gemm<float, Cfg, Scheduler, Bias>::run(g); return 0;
    case OutType::kBF16:
      if (want_ws) return Gemm<cutlass::bfloat16_t, Cfg, Scheduler, Bias>::workspace_size(g);
      *err = Gemm<cutlass::bfloat16_t, Cfg, Scheduler, Bias>::run(g); return 0;
    case OutType::kF16:
      if (want_ws) return Gemm<cutlass::half_t, Cfg, Scheduler, Bias>::workspace_size(g);
      *err = Gemm<cutlass::half_t, Cfg, Scheduler, Bias>::run(g); return 0;
  }
  *err = "unknown output type";
  return 0;
}

// Kernel k with or without a bias; there is no stream-K kernel with a bias (the dispatch never
// picks one). Instantiated once per translation unit: without a bias in gemm_sm90_s8.cu, with
// one in gemm_sm90_s8_bias.cu.
template <bool Bias>
size_t dispatch_kernel(const GemmArgs& g, Kernel k, bool want_ws, const char** err) {
  using Persistent = cutlass::gemm::PersistentScheduler;
  switch (k) {
    case Kernel::kStreamK:
      if constexpr (!Bias) return dispatch_type<CoopWide, cutlass::gemm::StreamKScheduler, false>(g, want_ws, err);
      break;
    case Kernel::kCoopWide: return dispatch_type<CoopWide, Persistent, Bias>(g, want_ws, err);
    case Kernel::kPingRows: return dispatch_type<PingRows, Persistent, Bias>(g, want_ws, err);
    case Kernel::kPingCols: return dispatch_type<PingCols, Persistent, Bias>(g, want_ws, err);
  }
  *err = "gemm_s8s8_sm90: no such kernel";
  return 0;
}

size_t dispatch_plain(const GemmArgs& g, Kernel k, bool want_ws, const char** err);  // gemm_sm90_s8.cu
size_t dispatch_bias(const GemmArgs& g, Kernel k, bool want_ws, const char** err);   // gemm_sm90_s8_bias.cu

}  // namespace sm90
}  // namespace hot
