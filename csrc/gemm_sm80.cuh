// CUTLASS 2.x Ampere GEMM (mma.sync, cp.async multistage) on integer codes with a dequantizing
// epilogue visitor tree (Sm80 EVT):  out[m, n] = cvt((float(acc[m, n]) * sa[m]) * sb[n]).
// Shared by gemm_sm80_s8.cu and gemm_sm80_s4.cu, which only choose the element and the tiles.
#pragma once

#include "cutlass/cutlass.h"
#include "cutlass/numeric_types.h"
#include "cute/tensor.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/kernel/default_gemm_universal_with_visitor.h"
#include "cutlass/epilogue/threadblock/fusion/visitors.hpp"

#include "hot_kernels.h"
#include "launch_util.h"

namespace hot {
namespace sm80 {

using namespace cute;

template <typename ElementIn, typename TB, typename Warp, typename Inst, int Stages, typename ElementD>
struct ScaledGemm {
  static constexpr int kAlignIn = 128 / cutlass::sizeof_bits<ElementIn>::value;  // 16 B loads
  static constexpr int kAlignD = 128 / cutlass::sizeof_bits<ElementD>::value;
  static constexpr auto kRound = cutlass::FloatRoundStyle::round_to_nearest;

  using ThreadMap = cutlass::epilogue::threadblock::OutputTileThreadLayout<TB, Warp, ElementD, kAlignD, 1>;
  using Acc = cutlass::epilogue::threadblock::VisitorAccFetch;
  // sa: one value per row m (a column vector), sb: one value per column n (a row vector).
  using ScaleA = cutlass::epilogue::threadblock::VisitorColBroadcast<ThreadMap, float, Stride<_1, _0, int32_t>>;
  using ScaleB = cutlass::epilogue::threadblock::VisitorRowBroadcast<ThreadMap, float, Stride<_0, _1, int32_t>>;
  using MulA = cutlass::epilogue::threadblock::VisitorCompute<cutlass::multiplies, float, float, kRound>;
  using MulB = cutlass::epilogue::threadblock::VisitorCompute<cutlass::multiplies, ElementD, float, kRound>;
  using Store = cutlass::epilogue::threadblock::VisitorAuxStore<ThreadMap, ElementD, kRound, Stride<int64_t, _1, int64_t>>;
  // Store((acc * sa) * sb): the association of the reference backend.
  using Tree = cutlass::epilogue::threadblock::Sm80EVT<
      Store, cutlass::epilogue::threadblock::Sm80EVT<
                 MulB, cutlass::epilogue::threadblock::Sm80EVT<MulA, Acc, ScaleA>, ScaleB>>;

  // Integer mma.sync exists only in its saturating form; K chunking keeps sums below 2^31, so
  // saturation never triggers.
  using Kernel = typename cutlass::gemm::kernel::DefaultGemmWithVisitor<
      ElementIn, cutlass::layout::RowMajor, cutlass::ComplexTransform::kNone, kAlignIn,
      ElementIn, cutlass::layout::ColumnMajor, cutlass::ComplexTransform::kNone, kAlignIn,
      ElementD, cutlass::layout::RowMajor, kAlignD, int32_t, float,
      cutlass::arch::OpClassTensorOp, cutlass::arch::Sm80, TB, Warp, Inst, Tree,
      cutlass::gemm::threadblock::GemmIdentityThreadblockSwizzle<>, Stages,
      cutlass::arch::OpMultiplyAddSaturate, 1>::GemmKernel;
  using Device = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;

  static typename Device::Arguments make_args(const GemmArgs& g) {
    typename Tree::Arguments tree{
        {                                                   // MulB
            {                                               // MulA
                {},                                         // acc
                {g.sa, 0.0f, {_1{}, _0{}, int32_t(g.m)}},   // sa
                {}},
            {g.sb, 0.0f, {_0{}, _1{}, int32_t(g.n)}},       // sb
            {}},
        {static_cast<ElementD*>(g.out), {g.ldo, _1{}, int64_t(g.m) * g.ldo}}};  // store
    return typename Device::Arguments(
        cutlass::gemm::GemmUniversalMode::kGemm, {g.m, g.n, g.k}, /*batch_count=*/1, tree,
        g.a, g.b, nullptr, nullptr,
        int64_t(g.m) * g.lda, int64_t(g.n) * g.ldb, 0, 0,
        g.lda, g.ldb, 0, 0);
  }

  static size_t workspace_size(const GemmArgs& g) { return Device::get_workspace_size(make_args(g)); }

  static const char* run(const GemmArgs& g, const char* name_can, const char* name_init, const char* name_run) {
    auto args = make_args(g);
    Device gemm;
    if (gemm.can_implement(args) != cutlass::Status::kSuccess) return name_can;
    if (gemm.initialize(args, g.workspace, g.stream) != cutlass::Status::kSuccess) return name_init;
    if (gemm.run(g.stream) != cutlass::Status::kSuccess) return name_run;
    return last_launch_error();
  }
};

}  // namespace sm80
}  // namespace hot
