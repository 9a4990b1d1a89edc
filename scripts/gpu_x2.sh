#!/usr/bin/env bash
# One call on a 2-GPU machine: build csrc/, run the multi-GPU benchmark (hot.bench.distributed),
# then the GPU tests that cover the fast backend's launch paths, and the host profile of one
# layer backward. Logs under $OUT (at most 8 files).
set -u
OUT=${OUT:-/tmp/hot_out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
export PYTHONPATH=$PWD:/tmp/site HOT_JIT_BUILD=1 HOT_JIT_CACHE=/tmp/hot_jit TORCH_CUDA_ARCH_LIST=9.0a MAX_JOBS=16
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
srchash=$(cat csrc/* | sha1sum | cut -c1-16)
if [ -f .jit/hot_fast_C.so ] && [ "$(cat .jit/srchash 2>/dev/null)" = "$srchash" ]; then
  export HOT_EXT_SO=$PWD/.jit/hot_fast_C.so; echo "ext: carried build"  # as in gpu_run.sh
else
  t0=$(date +%s)
  python3 -c "from hot.fast import _ext; _ext.load(); print('ext:', _ext.why_unavailable('sm90') or 'sm90 ok')" > "$OUT/build.log" 2>&1
  echo "build $(( $(date +%s) - t0 )) s" >> "$OUT/build.log"; cat "$OUT/build.log" | tail -2
  so=$(ls /tmp/hot_jit/*/hot_fast_C.so 2>/dev/null | head -1)
  [ -n "$so" ] && cp "$so" "$OUT/hot_fast_C.so" && echo "$srchash" > "$OUT/srchash"
fi
# DIST_ARGS: more options for hot.bench.distributed, e.g. --data-root DIR (Fashion-MNIST IDX files)
timeout ${DIST_TIMEOUT:-330} python3 -m hot.bench.distributed --json "$OUT/dist.json" --budget ${DIST_BUDGET:-300} \
  ${DIST_ARGS:-} > "$OUT/dist.log" 2>&1; echo "dist rc $?"
for f in test_cuda_graphs_gpu test_native_gpu test_gpu_layer; do
  echo "== $f" >> "$OUT/tests.log"
  timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider tests/fast/$f.py -x 2>&1 | tail -25 >> "$OUT/tests.log"
done
timeout 60 python3 benchmarks/host_profile.py --n 200 --top 18 > "$OUT/host_profile.log" 2>&1
grep -E "^== |passed|failed" "$OUT/tests.log"
head -3 "$OUT/host_profile.log"
tail -45 "$OUT/dist.log"
