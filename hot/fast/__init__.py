"""The fast backend: Triton transform/quantize kernels and integer GEMMs for Ampere/Ada and Hopper.

Importing it registers its implementations of the operations of hot.common.ops:
    hq_quantize, hla_quantize, gy_quantize -> hot.fast.quantize (one pass of two Triton kernels)
    int_gemm_nt                            -> hot.fast.gemm (CUTLASS when built, else Triton)
    layer_backward                         -> hot.fast.backward (a whole layer in one C++ call)
and, behind hot.fast.quantize.run_pass (the one launch of a quantizer pass), the C++ pass launch
of hot.fast.native.
Kernels are compiled on first use, so importing this package never needs a GPU; why_unavailable
says in plain words why a device cannot run them.
"""

from __future__ import annotations

from ..common import ops
from ..common.backend import Backend, register_backend
from ..common.options import BackendName
from . import _ext, arch, backward, gemm, native, quantize

NAME = BackendName.FAST.value
why_unavailable = arch.why_unavailable
# None where csrc/'s CUTLASS extension loads, else why not (the GEMMs then run on Triton)
why_extension_unavailable = _ext.why_unavailable

for _op, _fn in (("hq_quantize", quantize.hq_quantize), ("hla_quantize", quantize.hla_quantize),
                 ("gy_quantize", quantize.gy_quantize), ("int_gemm_nt", gemm.int_gemm_nt),
                 ("layer_backward", backward.layer_backward)):
    ops.register(_op, NAME, _fn)
quantize.register_route(native.ROUTE)
register_backend(Backend(NAME, why_unavailable))
