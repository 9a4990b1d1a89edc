#!/usr/bin/env bash
# The one script the GPU machine runs: build csrc (in the background, sm_90a only), run the GPU
# tests, the quantizer sweep, the benchmarks, and print a short table LAST.
# Usage: scripts/gpu_run.sh [tests|bench|sweep|e2e|all]...
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
if [ -d csrc ] && [ -f hot/fast/_ext.py ]; then
  export HOT_JIT_BUILD=1 HOT_JIT_CACHE=/tmp/hot_jit TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0a} MAX_JOBS=16
  ( t0=$(date +%s)
    python3 -c "from hot.fast import _ext; m=_ext.load(); print('ext:', _ext.why_unavailable('sm90') or 'sm90 ok', '|', _ext.why_unavailable('sm80') or 'sm80 ok', m and _ext.info())" > "$OUT/build.log" 2>&1
    echo "ext build $(( $(date +%s) - t0 )) s" >> "$OUT/build.log" ) &
  build_pid=$!
fi
tst() {  # each file in its own process: a crash in one (a segfault) must not hide the others
  echo "== $1"
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
case " $what " in *" profile "*|*" all "*)
  HOT_JIT_BUILD=0 timeout 120 python3 benchmarks/profile_host.py 2>&1 | tee "$OUT/profile_host.log" | head -24
esac
case " $what " in *" breakdown "*|*" all "*)
  HOT_JIT_BUILD=0 timeout 240 python3 benchmarks/gy_pass_breakdown.py 2>&1 | tee "$OUT/breakdown.log" | tail -9
esac
case " $what " in *" sweep "*|*" all "*)
  HOT_FAST_AUTOTUNE=1 HOT_JIT_BUILD=0 timeout 150 python3 benchmarks/sweep_gy_pass.py 2>&1 | tee "$OUT/sweep.log" | tail -6
esac
[ -n "$build_pid" ] && wait "$build_pid"; cat "$OUT/build.log" 2>/dev/null | tail -3
case " $what " in *" tests "*|*" all "*)
  tst tests/fast/test_gpu_kernels.py 200
  tst tests/fast/test_csrc_gpu.py 200
  # Why the binding's own int4 range check crashed (the test now goes through the wrapper).
  timeout 60 python3 -X faulthandler -c "
import torch; from hot.fast import _ext; m = _ext.load()
c = torch.zeros(4, 32, dtype=torch.int8, device='cuda'); c[2, 5] = 8
try:
    out, err = m.pack_int4(c, True); print('pack_int4 binding check returned (no exception):', err[:120] or 'NO ERROR (wrong)')
except RuntimeError as e:
    print('pack_int4 binding check raised:', str(e)[:120])
" 2>&1 | tail -8 | tee "$OUT/pack_diag.log"
esac
case " $what " in *" bench "*|*" all "*)
  HOT_FAST_AUTOTUNE=${HOT_FAST_AUTOTUNE:-0} timeout 300 python3 -m hot.bench.backward --json "$OUT/bench_backward.json" --md "$OUT/bench_backward.md" > "$OUT/bench_backward.log" 2>&1 || tail -30 "$OUT/bench_backward.log"
esac
case " $what " in *" e2e "*|*" all "*)
  timeout 300 python3 -m hot.bench.e2e --modes "${E2E_MODES:-bf16,bf16_compile,hot,hot_ref,hot_exact}" --json "$OUT/e2e.json" 2>&1 \
    | tee "$OUT/e2e.log" | grep -v "^ " | python3 -c "
import sys, json
for l in sys.stdin:
    try: d = json.loads(l)
    except Exception: print(l.rstrip()[:300]); continue
    print(d.get('mode'), 'step_ms', round(d.get('step_ms', -1), 2), 'peak', round(d.get('peak_GiB', -1), 2), 'losses', d.get('losses'), d.get('error', ''))"
esac
[ -n "$diag_pid" ] && wait "$diag_pid" && grep -v "^W1" "$OUT/diag_cxx.log" | tail -9
[ -f "$OUT/bench_backward.md" ] && cat "$OUT/bench_backward.md"
exit 0
