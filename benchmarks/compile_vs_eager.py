"""Gradients of a HOT TinyViT (2 blocks, CPU) compiled with aot_eager and inductor against eager,
beside a plain model and eager with its input scaled by (1 + 2^-23): how far inductor's own
float rounding moves HOT's gradients (docs/api.md, torch.compile). Prints relative L2 distances.

    PYTHONPATH=. OMP_NUM_THREADS=1 python benchmarks/compile_vs_eager.py
"""
import copy, torch, torch._dynamo, hot
from hot.models.vit import TinyViT
torch.manual_seed(0)
base = TinyViT(image_size=16, channels=1, classes=10, patch=4, dim=64, depth=2, heads=2, mlp=128)
x = torch.randn(16, 1, 16, 16); y = torch.randint(0, 10, (16,))
def grads(model, fwd, xin=x):
    model.zero_grad()
    torch.nn.functional.cross_entropy(fwd(xin), y).backward()
    return torch.cat([p.grad.flatten() for p in model.parameters()])
def rel(a, b): return float((a - b).norm() / b.norm())
def run(cfg, backend, perturb=False):
    torch._dynamo.reset()
    me = copy.deepcopy(base); mc = copy.deepcopy(base)
    if cfg is not None:
        hot.convert(me, cfg, convert_head=True, backend="reference"); hot.convert(mc, cfg, convert_head=True, backend="reference")
    ge = grads(me, me)
    if backend is None:
        xin = x * (1 + 2 ** -23) if perturb else x
        gc = grads(mc, mc, xin)
    else:
        gc = grads(mc, torch.compile(mc, backend=backend))
    return rel(gc, ge)
for name, cfg in [("plain", None), ("hot exact", hot.HOTConfig.exact()), ("hot paper", hot.HOTConfig(seed=0)),
                  ("hot nearest", hot.HOTConfig(seed=0).replace(hq={"gy_rounding": "nearest", "w_rounding": "nearest"}, hla={"rounding": "nearest"}))]:
    print(name, "aot_eager", run(cfg, "aot_eager"), "inductor", run(cfg, "inductor"), "eager, x*(1+2^-23)", run(cfg, None, True), flush=True)
