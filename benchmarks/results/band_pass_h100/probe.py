"""Probe: the one-read HQ band pass with the rows' absmax from the butterfly (no dot) and with
other tiles, against the two kernels (not a kept benchmark)."""
import dataclasses
import torch
from hot.bench.timing import bench, copy_bandwidth
from hot.common.ops import HQArgs, ScaleMode, pad_to
from hot.common.options import Tile, override
from hot.fast import passes
from hot.fast import quantize as fq
from hot.fast.launch import Meta

FORWARD = HQArgs(8, ScaleMode.ROW, False, 0)
bw = copy_bandwidth()
for tile in (Tile(64, 64, 4), Tile(32, 128, 4), Tile(64, 128, 4), Tile(16, 256, 4)):
  with override(tile=tile):
    passes.clear_plans()
    for r, c in [(32768, 2048), (32768, 8192), (25216, 768)]:
        xs = [torch.randn(r, c, device="cuda", dtype=torch.bfloat16) for _ in range(4)]
        p = passes.plan_for(xs[0], FORWARD, None)
        two = passes.plan_for(xs[0], FORWARD, None, band=False)
        nodot = dataclasses.replace(p, band=dataclasses.replace(p.band, onepass_meta=Meta(**{**p.band.onepass_meta.kw, "DOT_AMAX": False})), uid=p.uid + 100000)
        res = []
        for q in (two, p, nodot):
            res.append(bench(lambda x: fq.run_pass(x, q, FORWARD, None), [(x,) for x in xs]))
        a = fq.run_pass(xs[0], p, FORWARD, None); b = fq.run_pass(xs[0], nodot, FORWARD, None)
        flips = int((a.hq_q != b.hq_q).sum())
        floor = (r * c * 2 + r * pad_to(c)) / bw * 1e3
        print(f"tile {tile.rows}x{tile.cols} {r}x{c}: two {res[0]:.3f} band+dot {res[1]:.3f} band {res[2]:.3f} floor {floor:.3f} ms; fits {fq._BAND_FITS.get(p.uid)} {fq._BAND_FITS.get(nodot.uid)}; nodot flips {flips}")
