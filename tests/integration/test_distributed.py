"""HOT under torch.distributed (2 CPU processes, gloo): DDP stays in sync, LQS decides alike on
every rank, and ranks draw different rounding noise (so it averages out in the all-reduce)."""

import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn

import hot


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, world: int, port: int, out: dict):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.set_num_threads(1)
    try:
        torch.manual_seed(0)  # same weights and same torch RNG state on both ranks
        net = nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 8))
        hot.convert(net, backend="reference")
        # Rank-dependent data: rank 1's g_y has planted token outliers, rank 0's has none.
        gen = torch.Generator().manual_seed(100 + rank)
        x = torch.randn(64, 32, generator=gen)
        if rank == 1:
            x[::9] *= 50.0
        # 1) local gradients (no DDP yet): the same seed on both ranks, yet different rounding
        y = net(x)
        y.backward(torch.ones_like(y))
        g = net[0].weight.grad.clone()
        gathered = [torch.empty_like(g) for _ in range(world)]
        dist.all_gather(gathered, g)
        lqs = torch.tensor([m.hot_lqs_value() for _, m in hot.hot_layers(net)])
        lqs_all = [torch.empty_like(lqs) for _ in range(world)]
        dist.all_gather(lqs_all, lqs)
        # 2) DDP training steps keep parameters identical across ranks
        ddp = nn.parallel.DistributedDataParallel(net)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
        for _ in range(3):
            opt.zero_grad()
            ddp(x).square().mean().backward()
            opt.step()
        flat = torch.cat([p.detach().flatten() for p in net.parameters()])
        flats = [torch.empty_like(flat) for _ in range(world)]
        dist.all_gather(flats, flat)
        if rank == 0:
            out["grads_differ"] = not torch.equal(gathered[0], gathered[1])
            out["lqs_equal"] = all(torch.equal(lqs_all[0], t) for t in lqs_all)
            out["params_equal"] = all(torch.equal(flats[0], t) for t in flats)
            out["finite"] = bool(torch.isfinite(flat).all())
    finally:
        dist.destroy_process_group()


@pytest.mark.timeout(180)
def test_ddp_two_ranks():
    if not dist.is_available():
        pytest.skip("torch.distributed is not available in this build")
    with mp.Manager() as manager:
        out = manager.dict()
        mp.spawn(_worker, args=(2, _free_port(), out), nprocs=2, join=True)
        res = dict(out)
    assert res["grads_differ"], "ranks drew identical rounding noise"
    assert res["lqs_equal"], "LQS decided differently on different ranks"
    assert res["params_equal"] and res["finite"]
