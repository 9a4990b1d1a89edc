"""hot.analysis.floor: the bytes of HOT's passes and the GEMMs' operations against hand counts,
and hot.analysis.shapes telling which layers read the same input."""

import pytest
import torch
import torch.nn as nn

from hot.analysis.floor import pass_bytes
from hot.analysis.shapes import LayerShape, layer_shapes


def one_layer(need_x=True, need_w=True, source=None, L=32, O=16, I=32):
    return LayerShape("l", "linear", L, O, I, trainable=need_w, input_requires_grad=need_x,
                      source=source)


def test_one_layer_by_hand():
    # L=32 tokens (2 blocks of 16), O=16, I=32, rank 8:
    # g_y pass: read 2*32*16 = 1024, HQ codes 32*16 = 512, HLA codes 16 * 2*8 = 256
    # ABC pass: read 2*32*32 = 2048, codes 32 * 2*8 = 512
    # W pass:   read 2*16*32 = 1024, HQ codes 32*16 = 512
    one = 1024 + 512 + 256 + 2048 + 512 + 1024 + 512
    pb = pass_bytes([one_layer()], rank=8, l2_bytes=0)
    assert pb.one_read == one == 5888
    assert pb.spec == one + 1024 + 2048 + 1024  # every input read a second time
    # The L2 holds 1500 bytes: only the part of a second read beyond it is charged.
    assert pass_bytes([one_layer()], 8, 1500).spec == one + (2048 - 1500)
    # g_x: 2 * 32 * 16 * 32; g_W: 2 * 16 * 32 * (2 * 8)
    assert pb.gemm_ops == 2 * 32 * 16 * 32 + 2 * 16 * 32 * 16


def test_quantized_forward_by_hand():
    # The one layer above with HOTConfig(forward="int8"): x's HQ codes 32*32 = 1024 written by
    # the ABC pass (no second read of x); W read again, 2*16*32 = 1024, its HQ codes 16*32 = 512;
    # the forward GEMM 2 * 32 * 16 * 32
    base = pass_bytes([one_layer()], 8, 0)
    pb = pass_bytes([one_layer()], 8, 0, qfwd=True)
    assert pb.one_read - base.one_read == 1024 + 1024 + 512
    assert pb.spec - base.spec == 1024 + 1024 + 512 + 1024  # W's second read
    assert pb.gemm_ops - base.gemm_ops == 2 * 32 * 16 * 32
    # three layers reading one x: shared, x is read once and its HQ codes written once
    q, k, v = (one_layer(source=0) for _ in range(3))
    pb = pass_bytes([q, k, v], 8, 0, qfwd=True)
    assert pb.one_read - pb.one_read_shared == 2 * 2048 + 2 * 1024
    # a frozen weight still has its forward x pass (HQ codes only)
    pb = pass_bytes([one_layer(need_w=False)], 8, 0, qfwd=True)
    assert pb.one_read == (1024 + 512 + 1024 + 512) + (2048 + 1024) + (1024 + 512)


def test_what_a_layer_needs_decides_its_passes():
    # No input gradient (a patch embedding on images): no HQ codes, no W pass, no g_x GEMM.
    pb = pass_bytes([one_layer(need_x=False)], 8, 0)
    assert pb.one_read == 1024 + 256 + 2048 + 512
    assert pb.gemm_ops == 2 * 16 * 32 * 16
    # A frozen weight (LoRA base): no HLA codes, no ABC pass, no g_W GEMM.
    pb = pass_bytes([one_layer(need_w=False)], 8, 0)
    assert pb.one_read == 1024 + 512 + 1024 + 512
    assert pb.gemm_ops == 2 * 32 * 16 * 32


def test_ragged_shapes_round_up_to_blocks_of_16():
    # L = 17 tokens: 2 blocks; O = 20 outputs: HQ rows padded to 32.
    pb = pass_bytes([one_layer(L=17, O=20, I=16)], 4, 0)
    lr = 2 * 4
    assert pb.one_read == (2 * 17 * 20 + 17 * 32 + 20 * lr) + (2 * 17 * 16 + 16 * lr) \
        + (2 * 20 * 16 + 16 * 32)


def test_shared_inputs_read_once_and_write_every_layers_codes():
    q, k, v = (one_layer(source=0) for _ in range(3))
    other = one_layer(source=1)
    pb = pass_bytes([q, k, v, other], 8, 0)
    # Four ABC passes of 2048 read + 512 codes each; shared: input 0 read once for three.
    assert pb.one_read - pb.one_read_shared == 2 * 2048
    assert pb.spec - pb.spec_shared == 2 * 2 * 2048
    # Unknown sources (None) are never merged.
    pb = pass_bytes([one_layer(), one_layer()], 8, 0)
    assert pb.one_read == pb.one_read_shared and pb.spec == pb.spec_shared


def test_floor_grows_with_tokens_linearly():
    a = pass_bytes([one_layer(L=16 * 64)], 8, 0)
    b = pass_bytes([one_layer(L=16 * 128)], 8, 0)
    w = 2 * 16 * 32 + 32 * 16  # the W pass does not grow with the tokens
    assert b.one_read - w == pytest.approx(2 * (a.one_read - w))


class QKV(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(8)
        self.q, self.k, self.v = nn.Linear(8, 8), nn.Linear(8, 4), nn.Linear(8, 4)
        self.o = nn.Linear(8, 8)

    def forward(self, x):
        h = self.norm(x)
        a = self.q(h) * torch.cat([self.k(h), self.v(h)], -1)
        return self.o(a) + x


@pytest.mark.parametrize("autocast", [False, True])
def test_layer_shapes_know_which_layers_read_one_input(autocast):
    m = nn.Sequential(QKV(), QKV())
    x = torch.randn(2, 5, 8)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        s = layer_shapes(m, lambda mm: mm(x))
    src = {layer.name: layer.source for layer in s}
    assert len(s) == 8 and all(v is not None for v in src.values())
    for b in ("0", "1"):
        assert src[f"{b}.q"] == src[f"{b}.k"] == src[f"{b}.v"]
        assert src[f"{b}.o"] != src[f"{b}.q"]
    # Every other input is its own: 2 blocks x (shared qkv input, o input).
    assert len(set(src.values())) == 4
    assert all(layer.L == 10 for layer in s)


class InPlace(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b, self.c = nn.Linear(8, 8), nn.Linear(8, 8), nn.Linear(8, 8)

    def forward(self, x):
        h = x * 2
        y = self.a(h)
        h.mul_(3)  # the same tensor, other values: b does not read what a read
        return y + self.b(h) + self.c(h)


def test_layer_shapes_count_an_input_changed_in_place_as_another():
    with torch.no_grad():
        s = layer_shapes(InPlace(), lambda mm: mm(torch.randn(3, 8)))
    src = {layer.name: layer.source for layer in s}
    assert src["a"] != src["b"] and src["b"] == src["c"]


def test_layer_shapes_of_a_vit_have_no_shared_input():
    # timm's ViT fuses q, k and v into one layer: every input is its own. Under autocast a
    # layer's float32 input may be freed once cast, and a later input of the same size could
    # take its address; the inputs are held while the forward runs, so none does.
    timm = pytest.importorskip("timm")
    m = timm.create_model("vit_small_patch16_224", pretrained=False, num_classes=10, depth=3)
    x = torch.randn(1, 3, 224, 224)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        s = layer_shapes(m, lambda mm: mm(x))
    assert len(s) == 14 and len({layer.source for layer in s}) == 14
