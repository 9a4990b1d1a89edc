#!/usr/bin/env bash
# The one script the GPU machine runs: build csrc (if present), run the GPU tests, run the
# benchmarks, and print a short table LAST. Usage: scripts/gpu_run.sh [tests|bench|e2e|all]...
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
if [ -d csrc ] && [ -f hot/fast/_ext.py ]; then
  export HOT_JIT_BUILD=1 HOT_JIT_CACHE=/tmp/hot_jit TORCH_CUDA_ARCH_LIST="8.0;9.0a" MAX_JOBS=16
  t0=$(date +%s)
  python3 -c "from hot.fast import _ext; m=_ext.load(); print('ext:', _ext.why_unavailable('sm90') or 'sm90 ok', '|', _ext.why_unavailable('sm80') or 'sm80 ok', m and _ext.info())" 2>&1 | tail -5 | tee "$OUT/build.log"
  echo "ext build $(( $(date +%s) - t0 )) s"
fi
case " $what " in *" tests "*|*" all "*)
  # Each file in its own process: a crash in one (a segfault) must not hide the others.
  for f in tests/fast/test_gpu_*.py tests/fast/test_csrc*.py; do
    [ -f "$f" ] || continue
    echo "== $f"
    python3 -m pytest -q -m gpu -p no:cacheprovider "$f" -rs -s 2>&1 | tee -a "$OUT/gpu_tests.log" | grep -E "passed|failed|error|FAIL|flips|path|Fatal|Segmentation" | tail -12
  done
esac
case " $what " in *" bench "*|*" all "*)
  python3 -m hot.bench.backward --json "$OUT/bench_backward.json" --md "$OUT/bench_backward.md" > "$OUT/bench_backward.log" 2>&1 || tail -30 "$OUT/bench_backward.log"
esac
case " $what " in *" sweep "*|*" all "*)
  python3 benchmarks/sweep_gy_pass.py 2>&1 | tee "$OUT/sweep.log" | tail -5
esac
case " $what " in *" e2e "*|*" all "*)
  python3 -m hot.bench.e2e --json "$OUT/e2e.json" 2>&1 | tee "$OUT/e2e.log" | grep -v "^ " | tail -12
esac
[ -f "$OUT/bench_backward.md" ] && cat "$OUT/bench_backward.md"
exit 0
