// Standalone probe (no torch): the SM90 int8 GEMM of csrc/gemm_sm90_s8.cuh with other tile
// shapes, clusters and kernel schedules, and with a bias in its epilogue, timed on the forward and
// g_x GEMM shapes of a ViT-B/16 step (batch 128: 25216 token rows) and a Llama-1b step (16 x 2048
// rows). The epilogue is the extension's, out = bf16((acc * sa) * sb) [+ bias], except that the
// bias is added here by a plain + (the extension adds by __fadd_rn, which keeps the product and
// the sum two roundings); each variant's output is checked against variant A's (to 1e-2,
// relative) before it is timed. Results: benchmarks/results/gemm_schedule_h100/.
//
//   nvcc -O3 -DNDEBUG --expt-relaxed-constexpr -std=c++17 -gencode arch=compute_90a,code=sm_90a \
//        -I<cutlass>/include -I<cutlass>/tools/util/include gemm_schedule_probe.cu -o probe
//   ./probe            (an H100 or H200; prints a table: median us of 60 timed runs per shape)
//
// Operands rotate over 4 sets, more than the 50 MB L2 holds for every shape but the smallest, so
// the runs read them mostly from DRAM, as a step's GEMMs do.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

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

using namespace cute;

#define CK(x) do { cudaError_t err_ = (x); if (err_ != cudaSuccess) { \
  std::printf("CUDA error %s at %s:%d\n", cudaGetErrorString(err_), __FILE__, __LINE__); std::exit(1); } } while (0)

struct Problem {
  int m, n, k;
  const int8_t* a; const int8_t* b; const float* sa; const float* sb;
  const cutlass::bfloat16_t* bias;  // nullptr: no bias
  cutlass::bfloat16_t* out;
};

template <class TileShape, class ClusterShape, class MainSchedule, class EpiSchedule, bool Bias>
struct Variant {
  using ElementD = cutlass::bfloat16_t;
  static constexpr int kAlignD = 8;
  static constexpr auto kRound = cutlass::FloatRoundStyle::round_to_nearest;
  using Acc = cutlass::epilogue::fusion::Sm90AccFetch;
  using ScaleA = cutlass::epilogue::fusion::Sm90ColBroadcast<0, TileShape, float, float, Stride<_1, _0, _0>>;
  using ScaleB = cutlass::epilogue::fusion::Sm90RowBroadcast<0, TileShape, float, float, Stride<_0, _1, _0>>;
  using MulA = cutlass::epilogue::fusion::Sm90Compute<cutlass::multiplies, float, float, kRound>;
  using Scaled = cutlass::epilogue::fusion::Sm90EVT<MulA, Acc, ScaleA>;
  using BiasRow = cutlass::epilogue::fusion::Sm90RowBroadcast<0, TileShape, ElementD, float, Stride<_0, _1, _0>>;
  using MulBD = cutlass::epilogue::fusion::Sm90Compute<cutlass::multiplies, ElementD, float, kRound>;
  using MulBF = cutlass::epilogue::fusion::Sm90Compute<cutlass::multiplies, float, float, kRound>;
  using AddD = cutlass::epilogue::fusion::Sm90Compute<cutlass::plus, ElementD, float, kRound>;
  using NoBias = cutlass::epilogue::fusion::Sm90EVT<MulBD, Scaled, ScaleB>;
  using WithBias = cutlass::epilogue::fusion::Sm90EVT<AddD, cutlass::epilogue::fusion::Sm90EVT<MulBF, Scaled, ScaleB>, BiasRow>;
  using Tree = std::conditional_t<Bias, WithBias, NoBias>;

  using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, int32_t, float,
      void, cutlass::layout::RowMajor, kAlignD, ElementD, cutlass::layout::RowMajor, kAlignD,
      EpiSchedule, Tree>::CollectiveOp;
  using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp,
      int8_t, cutlass::layout::RowMajor, 16, int8_t, cutlass::layout::ColumnMajor, 16,
      int32_t, TileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(sizeof(typename Epilogue::SharedStorage))>,
      MainSchedule>::CollectiveOp;
  using Kernel = cutlass::gemm::kernel::GemmUniversal<Shape<int, int, int, int>, Mainloop, Epilogue,
                                                      cutlass::gemm::PersistentScheduler>;
  using Device = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;

  Device gemm;
  void* ws = nullptr;

  bool setup(const Problem& p, int sms) {
    using StrideA = typename Kernel::StrideA;
    using StrideB = typename Kernel::StrideB;
    using StrideD = typename Kernel::StrideD;
    typename Device::Arguments args{};
    args.mode = cutlass::gemm::GemmUniversalMode::kGemm;
    args.problem_shape = {p.m, p.n, p.k, 1};
    args.mainloop = {p.a, cutlass::make_cute_packed_stride(StrideA{}, make_shape(p.m, p.k, 1)),
                     p.b, cutlass::make_cute_packed_stride(StrideB{}, make_shape(p.n, p.k, 1))};
    StrideD sD = cutlass::make_cute_packed_stride(StrideD{}, make_shape(p.m, p.n, 1));
    args.epilogue.ptr_C = nullptr;
    args.epilogue.dC = sD;
    args.epilogue.ptr_D = p.out;
    args.epilogue.dD = sD;
    if constexpr (Bias) {
      args.epilogue.thread = {{{{}, {p.sa, 0.0f, {}}, {}}, {p.sb, 0.0f, {}}, {}},
                              {p.bias, ElementD(0), {}}, {}};
    } else {
      args.epilogue.thread = {{{}, {p.sa, 0.0f, {}}, {}}, {p.sb, 0.0f, {}}, {}};
    }
    args.hw_info.device_id = 0;
    args.hw_info.sm_count = sms;
    if (gemm.can_implement(args) != cutlass::Status::kSuccess) return false;
    size_t n = Device::get_workspace_size(args);
    if (ws) cudaFree(ws);
    ws = nullptr;
    if (n) CK(cudaMalloc(&ws, n));
    return gemm.initialize(args, ws) == cutlass::Status::kSuccess;
  }
  bool run() { return gemm.run() == cutlass::Status::kSuccess; }
};

using Coop = cutlass::gemm::KernelTmaWarpSpecializedCooperative;
using CoopE = cutlass::epilogue::TmaWarpSpecializedCooperative;
using Ping = cutlass::gemm::KernelTmaWarpSpecializedPingpong;
using PingE = cutlass::epilogue::TmaWarpSpecialized;

// A: the extension's kernel today. B..E: other tiles, clusters and the ping-pong schedule (two
// consumer warp groups on two output tiles, one's epilogue under the other's main loop). F, G:
// A and D with a bias in the epilogue.
using VA = Variant<Shape<_128, _256, _128>, Shape<_2, _1, _1>, Coop, CoopE, false>;
using VB = Variant<Shape<_128, _128, _128>, Shape<_2, _1, _1>, Ping, PingE, false>;
using VC = Variant<Shape<_128, _128, _128>, Shape<_1, _2, _1>, Ping, PingE, false>;
using VD = Variant<Shape<_128, _128, _128>, Shape<_1, _1, _1>, Ping, PingE, false>;
using VE = Variant<Shape<_128, _256, _128>, Shape<_1, _1, _1>, Coop, CoopE, false>;
using VF = Variant<Shape<_128, _256, _128>, Shape<_2, _1, _1>, Coop, CoopE, true>;
using VG = Variant<Shape<_128, _128, _128>, Shape<_1, _1, _1>, Ping, PingE, true>;

__global__ void fill_i8(int8_t* p, size_t n, unsigned seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    unsigned h = unsigned(i) * 2654435761u ^ seed;
    h ^= h >> 15; h *= 2246822519u; h ^= h >> 13;
    p[i] = int8_t(int(h % 255u) - 127);
  }
}
__global__ void fill_f(float* p, size_t n, float base) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    p[i] = base * (1.0f + float(i % 7) / 8.0f);
}
__global__ void fill_bias(cutlass::bfloat16_t* p, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    p[i] = cutlass::bfloat16_t(float(int(i % 13)) - 6.0f);
}
__global__ void maxdiff(const cutlass::bfloat16_t* x, const cutlass::bfloat16_t* y, size_t n, float* out) {
  float m = 0.f;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    m = fmaxf(m, fabsf(float(x[i]) - float(y[i])) / (1.0f + fabsf(float(x[i]))));
  atomicMax(reinterpret_cast<int*>(out), __float_as_int(m));
}

constexpr int kSets = 4;  // rotating operand sets

template <class V>
float time_variant(const char* name, std::vector<Problem>& ps, int sms, const cutlass::bfloat16_t* ref,
                   float* dmax) {
  V v;
  if (!v.setup(ps[0], sms)) { std::printf("  %s: cannot implement\n", name); return -1.f; }
  if (!v.run()) { std::printf("  %s: run failed\n", name); return -1.f; }
  CK(cudaDeviceSynchronize());
  if (ref) {
    CK(cudaMemset(dmax, 0, 4));
    size_t n = size_t(ps[0].m) * ps[0].n;
    maxdiff<<<264, 256>>>(ref, ps[0].out, n, dmax);
    float d = 0; CK(cudaMemcpy(&d, dmax, 4, cudaMemcpyDeviceToHost));
    if (!(d <= 1e-2f)) std::printf("  %s: differs from A by %g (relative)\n", name, d);
  }
  std::vector<V> vs(kSets);
  for (int s = 0; s < kSets; ++s) vs[s].setup(ps[s], sms);
  for (int i = 0; i < 10; ++i) vs[i % kSets].run();
  const int n = 60;
  std::vector<cudaEvent_t> ev(n + 1);
  for (auto& e : ev) CK(cudaEventCreate(&e));
  CK(cudaEventRecord(ev[0]));
  for (int i = 0; i < n; ++i) { vs[i % kSets].run(); CK(cudaEventRecord(ev[i + 1])); }
  CK(cudaEventSynchronize(ev[n]));
  std::vector<float> t(n);
  for (int i = 0; i < n; ++i) CK(cudaEventElapsedTime(&t[i], ev[i], ev[i + 1]));
  for (auto& e : ev) cudaEventDestroy(e);
  for (auto& x : vs) if (x.ws) cudaFree(x.ws);
  if (v.ws) cudaFree(v.ws);
  std::sort(t.begin(), t.end());
  return t[n / 2] * 1000.f;
}

int main() {
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  cudaDeviceProp prop; CK(cudaGetDeviceProperties(&prop, 0));
  std::printf("%s, %d SMs\n", prop.name, sms);
  const int L = 25216;
  struct Shape3 { const char* name; int m, n, k; };
  // forward y = x W^T: (L, O) from K = I; g_x = g_y W: (L, I) from K = O.
  const int T = 32768;  // Llama-1b, 16 x 2048 tokens
  const Shape3 all[] = {
      {"fwd qkv", L, 2304, 768}, {"fwd proj", L, 768, 768}, {"fwd fc1", L, 3072, 768}, {"fwd fc2", L, 768, 3072},
      {"gx qkv", L, 768, 2304}, {"gx proj", L, 768, 768}, {"gx fc1", L, 768, 3072}, {"gx fc2", L, 3072, 768},
      {"L fwd q", T, 2048, 2048}, {"L fwd kv", T, 1024, 2048}, {"L fwd gu", T, 8192, 2048}, {"L fwd dn", T, 2048, 8192},
      {"L fwd hd", T, 32000, 2048}, {"L gx kv", T, 2048, 1024}, {"L gx gu", T, 2048, 8192}, {"L gx dn", T, 8192, 2048}};
  const int n_vit = 8, n_all = sizeof(all) / sizeof(all[0]);
  double tot_l[7] = {0};
  std::printf("%-9s %6s %6s %6s | %8s %8s | %8s %8s %8s %8s %8s | %8s %8s\n", "shape", "M", "N", "K",
              "ops us", "bytes us", "A coop", "B ping21", "C ping12", "D ping11", "E coop11", "F A+bias", "G D+bias");
  float* dmax; CK(cudaMalloc(&dmax, 4));
  double tot[7] = {0};
  for (int si = 0; si < n_all; ++si) {
    const Shape3& s = all[si];
    if (si == n_vit)
      std::printf("%-30s | %17s | %8.1f %8.1f %8.1f %8.1f %8.1f | %8.1f %8.1f\n", "ViT-B: sum of the 8 (us)", "",
                  tot[0], tot[1], tot[2], tot[3], tot[4], tot[5], tot[6]);
    std::vector<Problem> ps(kSets);
    std::vector<void*> allocs;
    for (int i = 0; i < kSets; ++i) {
      int8_t *a, *b; float *sa, *sb; cutlass::bfloat16_t *bias, *out;
      CK(cudaMalloc(&a, size_t(s.m) * s.k)); CK(cudaMalloc(&b, size_t(s.n) * s.k));
      CK(cudaMalloc(&sa, s.m * 4)); CK(cudaMalloc(&sb, s.n * 4));
      CK(cudaMalloc(&bias, s.n * 2)); CK(cudaMalloc(&out, size_t(s.m) * s.n * 2));
      fill_i8<<<1024, 256>>>(a, size_t(s.m) * s.k, 17 + i); fill_i8<<<1024, 256>>>(b, size_t(s.n) * s.k, 91 + i);
      fill_f<<<64, 256>>>(sa, s.m, 1e-3f); fill_f<<<64, 256>>>(sb, s.n, 2e-3f); fill_bias<<<16, 256>>>(bias, s.n);
      ps[i] = {s.m, s.n, s.k, a, b, sa, sb, nullptr, out};
      for (void* p : {(void*)a, (void*)b, (void*)sa, (void*)sb, (void*)bias, (void*)out}) allocs.push_back(p);
    }
    cutlass::bfloat16_t* ref; CK(cudaMalloc(&ref, size_t(s.m) * s.n * 2));
    CK(cudaDeviceSynchronize());
    double ops_us = 2.0 * s.m * s.n * s.k / 1414e12 * 1e6;
    double bytes_us = (double(s.m) * s.k + double(s.n) * s.k + 2.0 * s.m * s.n) / 3.0e12 * 1e6;
    float r[7];
    r[0] = time_variant<VA>("A", ps, sms, nullptr, dmax);
    CK(cudaMemcpy(ref, ps[0].out, size_t(s.m) * s.n * 2, cudaMemcpyDeviceToDevice));
    r[1] = time_variant<VB>("B", ps, sms, ref, dmax);
    r[2] = time_variant<VC>("C", ps, sms, ref, dmax);
    r[3] = time_variant<VD>("D", ps, sms, ref, dmax);
    r[4] = time_variant<VE>("E", ps, sms, ref, dmax);
    std::vector<Problem> pb = ps;
    for (int i = 0; i < kSets; ++i) pb[i].bias = reinterpret_cast<cutlass::bfloat16_t*>(allocs[6 * i + 4]);
    r[5] = time_variant<VF>("F", pb, sms, nullptr, dmax);
    CK(cudaMemcpy(ref, pb[0].out, size_t(s.m) * s.n * 2, cudaMemcpyDeviceToDevice));
    r[6] = time_variant<VG>("G", pb, sms, ref, dmax);
    std::printf("%-9s %6d %6d %6d | %8.1f %8.1f | %8.1f %8.1f %8.1f %8.1f %8.1f | %8.1f %8.1f\n", s.name, s.m, s.n,
                s.k, ops_us, bytes_us, r[0], r[1], r[2], r[3], r[4], r[5], r[6]);
    for (int j = 0; j < 7; ++j) (si < n_vit ? tot : tot_l)[j] += r[j];
    for (void* p : allocs) cudaFree(p);
    cudaFree(ref);
  }
  std::printf("%-30s | %17s | %8.1f %8.1f %8.1f %8.1f %8.1f | %8.1f %8.1f\n", "Llama-1b: sum (us)", "", tot_l[0],
              tot_l[1], tot_l[2], tot_l[3], tot_l[4], tot_l[5], tot_l[6]);
  return 0;
}
