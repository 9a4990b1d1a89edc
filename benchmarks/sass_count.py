"""Static instruction counts of the quantizer pass's kernels, compiled for sm_90 without a GPU:
how many SASS instructions each thread issues per element of its tile, by opcode, and the layout
conversions and correctly rounded divisions behind them (MUFU: the special-function unit's
instructions, here the divisions' reciprocals). A proxy for kernels that are bound by
instruction issue (docs/performance.md: the passes take as long on an H100 as on an H200); it
needs only the triton wheel (its ptxas and nvdisasm), not a GPU, so a kernel change can be
weighed before a GPU run times it.

    python benchmarks/sass_count.py [--tile 64,64,4] [--dtype bf16|fp32]

The counts are static (every 16-point transform and join is unrolled, so the fast path runs
each instruction once per thread; slow paths behind branches, such as a division's, are counted
but rarely run). The triton version decides the code: say which one with the numbers.
"""
import argparse
import collections
import os
import re
import subprocess
import sys
import tempfile

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from hot.common.ops import HLAArgs, HQArgs, ScaleMode
from hot.common.options import Tile, override
from hot.fast import passes

_PTR = {"x_ptr": None, "hq_amax_ptr": "*i32", "hla_amax_ptr": "*i32", "bsum_ptr": "*fp32",
        "hq_q_ptr": "*i8", "hq_s_ptr": "*fp32", "hla_q_ptr": "*i8", "hla_s_ptr": "*fp32",
        "step_ptr": "*i64"}
_OPCODE = re.compile(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)")


def compile_kernel(fn, meta, x_type: str):
    """fn compiled for sm_90 with meta's constexprs and options, and the specializations
    Triton's launcher gives a contiguous 4096 x 4096 input: the column stride 1 as a constant,
    every pointer and every other runtime integer (the hash keys excepted, which the kernel
    exempts) divisible by 16. Without them the loads and stores are not vectorized and the
    counts describe a kernel the GPU never runs."""
    names = list(fn.arg_names)
    kw = dict(meta.kw)
    opts = {k: kw.pop(k) for k in ("num_warps", "enable_fp_fusion") if k in kw}
    sig, const, attrs = {}, {}, {}
    for i, n in enumerate(names):
        if n in kw:
            sig[n] = "constexpr"
            const[(i,)] = kw[n]
        elif n == "sxc":
            sig[n] = "constexpr"
            const[(i,)] = 1
        elif n in _PTR:
            sig[n] = _PTR[n] or x_type
            attrs[(i,)] = [["tt.divisibility", 16]]
        else:
            sig[n] = "i32"
            if not n.endswith("_key"):
                attrs[(i,)] = [["tt.divisibility", 16]]
    return triton.compile(ASTSource(fn=fn, signature=sig, constexprs=const, attrs=attrs),
                          target=GPUTarget("cuda", 90, 32), options=opts)


def counts(k) -> collections.Counter:
    d = tempfile.mkdtemp()
    cubin = os.path.join(d, "k.cubin")
    with open(cubin, "wb") as f:
        f.write(k.asm["cubin"])
    tool = os.path.join(os.path.dirname(triton.backends.nvidia.__file__), "bin", "nvdisasm")
    out = subprocess.run([tool, "-c", cubin], capture_output=True, text=True, check=True).stdout
    return collections.Counter(m.group(1) for m in map(_OPCODE.search, out.splitlines()) if m)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tile", default="64,64,4", help="rows,cols,warps (default 64,64,4)")
    ap.add_argument("--dtype", choices=("bf16", "fp32"), default="bf16")
    a = ap.parse_args(argv)
    tile = Tile(*(int(v) for v in a.tile.split(",")))
    dtype = torch.bfloat16 if a.dtype == "bf16" else torch.float32
    hq = (4, ScaleMode.ROW, True)
    hla = (8, "lowpass", 8, ScaleMode.ROW, True)
    # What HOTConfig.quantized() runs on Hopper: 8-bit HQ, drawn HLA rows; g_y's codes
    # stochastic, the forward's x (and W) codes rounded to nearest.
    hq8_sr, hq8_rn = (8, ScaleMode.ROW, True), (8, ScaleMode.ROW, False)
    hla_drawn = (8, "stratified", 8, ScaleMode.ROW, True)
    per_thread = tile.rows * tile.cols / (32 * tile.warps)
    print(f"triton {triton.__version__}, sm_90, tile {a.tile}, {a.dtype} input, "
          f"{per_thread:.0f} elements per thread")
    with override(tile=tile, autotune=False):
        for name, h, l in (("HQ", hq, None), ("HLA", None, hla), ("HQ + HLA", hq, hla),
                           ("g_y 8/drawn", hq8_sr, hla_drawn), ("x 8 nearest", hq8_rn, None),
                           ("x + ABC", hq8_rn, hla_drawn)):
            p = passes._plan(4096, 4096, (4096, 1), dtype, torch.device("cuda"), h, l, False,
                             True, whole_rows=False)
            for kname, fn, meta in (("stats", passes._launchers()[0].fn, p.stats_meta),
                                    ("quantize", passes._launchers()[1].fn, p.quantize_meta)):
                k = compile_kernel(fn, meta, "*" + a.dtype)
                c = counts(k)
                conv = k.asm["ttgir"].count("ttg.convert_layout")
                top = ", ".join(f"{o} {n}" for o, n in c.most_common(8))
                print(f"{name:12s} {kname:8s}: {sum(c.values()) / per_thread:6.1f} per element "
                      f"({sum(c.values())} in all); layout conversions {conv}, MUFU "
                      f"{c['MUFU']}, shared memory {c['LDS'] + c['STS']}, barriers {c['BAR']}; "
                      f"{top}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
