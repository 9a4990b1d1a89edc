#!/usr/bin/env bash
# The one script the GPU machine runs: build csrc (in the background, sm_90a only), run the GPU
# tests, the quantizer sweep, the benchmarks, and print a short table LAST.
# Usage: scripts/gpu_run.sh [tests|profile|breakdown|sweep|decomp|trace|bias|bench|e2e|ncu|diag|all]...
# Expects the nvidia-cutlass wheel under .whl/ (carried); writes logs and JSON under $OUT.
set -u
OUT=${OUT:-/tmp/hot_out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
what=${*:-all}
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
fi
export PYTHONPATH=$PWD:/tmp/site${PYTHONPATH:+:$PYTHONPATH}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
python3 -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__)"
build_pid=
# A prebuilt extension carried in .jit/ (from an earlier run's $OUT) is used only when it was
# built from the same csrc/ sources; otherwise build now and return the build for the next run.
srchash=$(cat csrc/* | sha1sum | cut -c1-16)
if [ -f .jit/hot_fast_C.so ] && [ "$(cat .jit/srchash 2>/dev/null)" = "$srchash" ]; then
  export HOT_EXT_SO=$PWD/.jit/hot_fast_C.so
  python3 -c "from hot.fast import _ext; m=_ext.load(); print('ext (carried):', _ext.why_unavailable('sm90') or 'sm90 ok', m and _ext.info())" > "$OUT/build.log" 2>&1
elif [ -d csrc ] && [ -f hot/fast/_ext.py ]; then
  export HOT_JIT_BUILD=1 HOT_JIT_CACHE=/tmp/hot_jit TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0a} MAX_JOBS=16
  ( t0=$(date +%s)
    python3 -c "from hot.fast import _ext; m=_ext.load(); print('ext:', _ext.why_unavailable('sm90') or 'sm90 ok', '|', _ext.why_unavailable('sm80') or 'sm80 ok', m and _ext.info())" > "$OUT/build.log" 2>&1
    echo "ext build $(( $(date +%s) - t0 )) s" >> "$OUT/build.log"
    so=$(ls /tmp/hot_jit/*/hot_fast_C.so 2>/dev/null | head -1)
    [ -n "$so" ] && cp "$so" "$OUT/hot_fast_C.so" && echo "$srchash" > "$OUT/srchash" ) &
  build_pid=$!
fi
tst() {  # each file in its own process: a crash in one (a segfault) must not hide the others
  echo "== $1" | tee -a "$OUT/gpu_tests.log"
  timeout "${2:-300}" python3 -m pytest -q -m gpu -p no:cacheprovider "$1" -rs -s 2>&1 | tee -a "$OUT/gpu_tests.log" \
    | grep -E "passed|failed|error|FAIL|flips|training|path|Fatal|Segmentation" | tail -14
}
diag_pid=
case " $what " in *" diag "*|*" all "*)
  # Which C++ operation crashes a JIT-built extension here (background; printed at the end).
  ( DIAG_DIR=/tmp/hot_diag_cxx timeout 400 python3 scripts/diag_cxx.py > "$OUT/diag_cxx.log" 2>&1 ) &
  diag_pid=$!
esac
case " $what " in *" tests "*|*" all "*)
  # These need no extension (the fast GEMM falls back to Triton until it is loaded).
  HOT_JIT_BUILD=0 tst tests/fast/test_gpu_launch.py 100
  HOT_JIT_BUILD=0 tst tests/fast/test_gpu_layer.py 200
esac
case " $what " in *" breakdown "*|*" all "*)
  HOT_JIT_BUILD=0 timeout 240 python3 benchmarks/gy_pass_breakdown.py 2>&1 | tee "$OUT/breakdown.log" | tail -9
esac
case " $what " in *" ncu "*)
  # Nsight Compute on one launch of each quantizer kernel (ViT-B qkv g_y, bf16), if installed.
  NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
  if [ -n "$NCU" ]; then
    HOT_JIT_BUILD=0 timeout 200 "$NCU" -k regex:"stats_kernel|quant_kernel" -s 3 -c 2 \
      --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
      python3 -c "
import torch; from hot.fast import quant as fq
g = torch.randn(25216, 2304, device='cuda', dtype=torch.bfloat16)
for _ in range(3): fq.gy_quantize(g, 4, 'row', True, 1, 8, 'lowpass', 8, 'row', True, 2)
torch.cuda.synchronize()" > /tmp/ncu.log 2>&1
    grep -E "quant_kernel|stats_kernel|Duration|Throughput|Registers Per|Achieved Occupancy|Theoretical Occupancy|Block Limit|Stall|Warp Cycles Per Issued|Local Memory|Dynamic Shared|Static Shared|Issued Ipc" /tmp/ncu.log | head -60 > "$OUT/ncu.log"
    cat "$OUT/ncu.log" | head -60
  else
    echo "ncu: not installed"
  fi
esac
case " $what " in *" sweep "*|*" all "*)
  HOT_FAST_AUTOTUNE=1 HOT_JIT_BUILD=0 timeout 150 python3 benchmarks/sweep_gy_pass.py 2>&1 | tee "$OUT/sweep.log" | tail -6
esac
[ -n "$build_pid" ] && wait "$build_pid"; cat "$OUT/build.log" 2>/dev/null | tail -3
case " $what " in *" tests "*|*" all "*)
  tst tests/fast/test_gpu_kernels.py 200
  tst tests/fast/test_csrc_gpu.py 200
  tst tests/fast/test_native_gpu.py 200
  tst tests/fast/test_abc_gpu.py 200
  # Not marked gpu (they run under the interpreter on CPU too): here compiled, NaN/Inf included.
  echo "== tests/fast/test_quant_variants.py" | tee -a "$OUT/gpu_tests.log"
  timeout 200 python3 -m pytest -q -m "not slow" -p no:cacheprovider tests/fast/test_quant_variants.py 2>&1 \
    | tee -a "$OUT/gpu_tests.log" | grep -E "passed|failed|error" | tail -3
esac
case " $what " in *" decomp "*|*" bench "*|*" all "*)
  timeout 120 python3 benchmarks/gemm_decomp.py 2>&1 | grep -v "^W1" | tee "$OUT/gemm_decomp.md" | tail -8
esac
case " $what " in *" profile "*|*" all "*)
  timeout 120 python3 benchmarks/host_breakdown.py --n 200 2>&1 | grep -vi warn > "$OUT/host_breakdown.log"
  grep -E "timeline|in sequence|HOTLinear|nn.Linear|no work|enqueue" "$OUT/host_breakdown.log"
esac
case " $what " in *" trace "*)
  timeout 150 python3 benchmarks/layer_trace.py 2>&1 | grep -v "^W1" | tee "$OUT/layer_trace.log" | head -80
esac
case " $what " in *" bias "*|*" bench "*|*" all "*)
  timeout 60 python3 benchmarks/bias_partials.py 2>&1 | tee "$OUT/bias_partials.log" | tail -6
esac
case " $what " in *" bench "*|*" all "*)
  HOT_FAST_AUTOTUNE=${HOT_FAST_AUTOTUNE:-0} timeout 300 python3 -m hot.bench.backward --json "$OUT/bench_backward.json" --md "$OUT/bench_backward.md" > /tmp/bench_backward.log 2>&1 || tail -30 /tmp/bench_backward.log
esac
case " $what " in *" e2e "*|*" all "*)
  timeout 300 python3 -m hot.bench.e2e --modes "${E2E_MODES:-bf16,bf16_compile,hot,hot_compile}" ${E2E_PROFILE:+--profile} --json "$OUT/e2e.json" 2>&1 \
    | tee /tmp/e2e.log | grep -v "^ " | python3 -c "
import sys, json
for l in sys.stdin:
    try: d = json.loads(l)
    except Exception: print(l.rstrip()[:300]); continue
    print(d.get('mode'), 'step_ms', round(d.get('step_ms', -1), 2), 'peak', round(d.get('peak_GiB', -1), 2), 'losses', d.get('losses'), d.get('error', ''))
    pr = d.get('profile')
    if pr:
        print('  GPU busy ms/step', round(pr['gpu_busy_ms'], 2))
        for k, v in pr['top_ms']: print('   ', v, k)"
esac
[ -n "$diag_pid" ] && wait "$diag_pid" && grep -v "^W1" "$OUT/diag_cxx.log" | tail -9
[ -f "$OUT/gpu_tests.log" ] && echo "== GPU test files:" && grep -E "^== |[0-9]+ (passed|failed)" "$OUT/gpu_tests.log"
[ -f "$OUT/bench_backward.md" ] && cat "$OUT/bench_backward.md"
exit 0
