"""One step's g_W error of HLA's row selections on a small ViT's real layers (CPU, float64).

    python benchmarks/hla_estimator_variance.py [--steps 200] [--draws 24] [--out FILE]

Trains TinyViT (dim 128, depth 6) in FP32 on Fashion-MNIST for ``--steps`` steps (batch 64),
captures every Linear layer's x and g_y for one batch of 128 images, and for each selection at
rank 8 draws it ``--draws`` times: bias = ||mean - G|| / ||G|| and sd = the draws' spread / ||G||,
G = g_y^T x the batch's exact g_W, no quantization. "sgd" is the batch-sampling noise already in
the step (the spread of the per-image contributions, scaled to the batch), for scale. Selections:

    lowpass      the paper's fixed rows 0-7 (HOTConfig.paper())
    uniform      8 of 16 rows drawn per block, weight 2
    stratified   HOTConfig()'s drawn rows (hot.common.transforms.drawn_transform)
    oracle       8 rows per block by systematic sampling with p_k proportional to the batch's
                 own ||W16[k] g_y|| ||W16[k] x|| (capped at 1): the optimal inclusion
                 probabilities of rank-8 row sampling, unavailable to a real forward

The bias column of the drawn selections is their Monte-Carlo noise (about sd / sqrt(draws)).
"""

from __future__ import annotations

import argparse
import sys

import torch
import torch.nn as nn

from hot.common.transforms import drawn_transform
from hot.common.walsh import walsh

W16 = walsh(16)


def _capture(steps: int) -> dict:
    from hot.data.registry import load_dataset
    from hot.models.vit import TinyViT

    torch.manual_seed(0)
    data = load_dataset("fashion-mnist")
    xt, yt = data.normalize(torch.as_tensor(data.x_train)), torch.as_tensor(data.y_train).long()
    model = TinyViT(image_size=28, channels=1, classes=10, patch=4, dim=128, depth=6, heads=4,
                    mlp=256)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loss = lambda b: nn.functional.cross_entropy(model(xt[b]), yt[b])  # noqa: E731
    for _ in range(steps):
        opt.zero_grad()
        loss(torch.randint(0, len(xt), (64,))).backward()
        opt.step()
    store, hooks = {}, []
    for name, m in model.named_modules():
        if isinstance(m, nn.Linear):
            def hook(mod, inp, out, name=name):
                store[name] = {"x": inp[0].detach().reshape(-1, inp[0].shape[-1]).double()}
                out.register_hook(lambda g: store[name].__setitem__(
                    "g", g.detach().reshape(-1, g.shape[-1]).double()))
            hooks.append(m.register_forward_hook(hook))
    model.zero_grad()
    loss(torch.randint(0, len(xt), (128,))).backward()
    for h in hooks:
        h.remove()
    return store


def _blocks(t: torch.Tensor) -> torch.Tensor:
    pad = -t.shape[0] % 16
    return torch.nn.functional.pad(t, (0, 0, 0, pad)).reshape(-1, 16, t.shape[1])


def _weighted_rows(name: str, xb, gb, gen, seed):
    """(M (nb, 16) weights of the kept rows, 0 elsewhere) of one draw of ``name``."""
    nb = xb.shape[0]
    m = torch.zeros(nb, 16, dtype=torch.float64)
    if name == "lowpass":
        m[:, :8] = 1
    elif name == "uniform":
        m.scatter_(1, torch.argsort(torch.rand(nb, 16, generator=gen), 1)[:, :8], 2.0)
    elif name == "oracle":
        e = ((W16 @ xb).pow(2).sum((0, 2)) * (W16 @ gb).pow(2).sum((0, 2))).pow(0.25)
        p = e / e.sum() * 8
        for _ in range(16):  # cap at 1, spread the rest over the others
            over = p > 1
            if not over.any():
                break
            p[over] = 1
            p[~over] *= (8 - over.sum()) / p[~over].sum()
        perm = torch.argsort(torch.rand(nb, 16, generator=gen), 1)
        pp = p[perm]
        cum = pp.cumsum(1)
        u = torch.rand(nb, 1, generator=gen)
        hit = torch.floor(cum - u) > torch.floor(cum - pp - u)
        m.scatter_(1, perm, torch.where(hit, 1 / pp, torch.zeros_like(pp)))
    return m


def _estimate(name, x, g, xb, gb, gen, seed):
    if name == "stratified":
        return drawn_transform(g, 8, seed)[0] @ drawn_transform(x, 8, seed)[0].t()
    m = _weighted_rows(name, xb, gb, gen, seed)
    return torch.einsum("bn,bno,bni->oi", m, W16 @ gb, W16 @ xb)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--draws", type=int, default=24)
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    store = _capture(a.steps)
    names = ("lowpass", "uniform", "stratified", "oracle")
    gen = torch.Generator().manual_seed(1)
    lines = ["| layer | L | sgd | " + " | ".join(f"{n} bias / sd" for n in names) + " |",
             "|---|---:|---:|" + "---:|" * len(names)]
    for name, d in store.items():
        x, g = d["x"], d["g"]
        G = g.t() @ x
        n_img = 128
        per = x.shape[0] // n_img
        gi = torch.einsum("eto,eti->eoi", g[:n_img * per].reshape(n_img, per, -1),
                          x[:n_img * per].reshape(n_img, per, -1))
        sgd = float((gi - G / n_img).pow(2).sum().sqrt() / G.norm())
        xb, gb = _blocks(x), _blocks(g)
        cells = []
        for n in names:
            k = 1 if n == "lowpass" else a.draws
            est = torch.stack([_estimate(n, x, g, xb, gb, gen, 1000 + i) for i in range(k)])
            mean = est.mean(0)
            sd = float((est - mean).pow(2).sum((1, 2)).mean().sqrt() / G.norm()) if k > 1 else 0.0
            cells.append(f"{float((mean - G).norm() / G.norm()):.2f} / {sd:.2f}")
        lines.append(f"| {name} | {x.shape[0]} | {sgd:.2f} | " + " | ".join(cells) + " |")
        print(lines[-1], flush=True)
    text = "\n".join(lines)
    if a.out:
        open(a.out, "w").write(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
