"""Triton kernels of the fast backend, one file per role: ``quantize`` (the transform + quantizer
pass) and ``gemm`` (the int8 GEMM with the dequantizing epilogue). Only kernels live here; the
wrappers that check inputs, allocate and launch are hot.fast.quantize and hot.fast.gemm."""
