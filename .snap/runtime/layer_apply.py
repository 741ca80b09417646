"""The forward of a layer holding one rank-local W12 matrix, for serving frameworks (SGLang's W12 method).

A layer here is any `nn.Module` with the four W12 tensors as attributes `weight` (records),
`weight_exponents`, `weight_esc_counts`, `weight_escapes` and `w12_shape = (N, K)`. `w12_matmul` is the
one dispatch point:

* CUDA, `w12.kernels` importable, BF16 activations: the fused GEMM `torch.ops.w12.gemm`, with the escape
  tables `prepare` built once after loading (`w12.kernels.gemm.prepare_escapes`);
* CUDA otherwise: an exact decode in torch ops (no host sync) + `F.linear`;
* anything else (the reference path): the exact decode of the numba codec (what `W12Matrix.to_bf16`
  runs, as the opaque custom op `w12_runtime::decode`) + `F.linear` in BF16.

Every path uses the exact BF16 weight; on the CPU the output is bit-identical to `F.linear` with the
original weight. No SGLang import here.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from . import w12_linear as _rt

_PREPARED = ("w12_esc_offsets", "w12_esc_cols", "w12_esc_index", "w12_esc_bits")


def clear_prepared(layer) -> None:
    for name in _PREPARED:
        layer._buffers.pop(name, None)


def prepare(layer) -> None:
    """Per-matrix escape tables for the CUDA paths, built once after loading (host syncs happen here, not
    in `apply`, which SGLang captures in CUDA graphs). A no-op on the CPU."""
    clear_prepared(layer)
    if layer.weight.device.type != "cuda":
        return
    n, k = layer.w12_shape
    backend = _rt.kernel_backend()
    if backend is not None:
        offs, cols = backend[0](layer.weight_esc_counts, layer.weight_escapes)
        layer.register_buffer("w12_esc_offsets", offs, persistent=False)
        layer.register_buffer("w12_esc_cols", cols, persistent=False)
    idx, bits = _rt.escape_index(layer.weight_esc_counts, layer.weight_escapes, n, k)
    layer.register_buffer("w12_esc_index", idx, persistent=False)
    layer.register_buffer("w12_esc_bits", bits, persistent=False)


def w12_matmul(x: torch.Tensor, layer, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """y = x · Wᵀ + bias for the layer's rank-local W12 matrix W [N, K] (exact W on every path)."""
    n, k = layer.w12_shape
    if x.is_cuda:
        if "w12_esc_index" not in layer._buffers:
            if torch.compiler.is_compiling():
                name = getattr(layer, "w12_prefix", "a W12 layer")
                raise RuntimeError(f"w12: {name} was not prepared before compilation")
            prepare(layer)
        if "w12_esc_offsets" in layer._buffers and x.dtype == torch.bfloat16:
            x2 = x.reshape(-1, k)
            if x2.stride(-1) != 1:
                x2 = x2.contiguous()
            y = torch.ops.w12.gemm(x2, layer.weight, layer.weight_exponents, layer.weight_escapes,
                                   layer.w12_esc_offsets, layer.w12_esc_cols, n).reshape(*x.shape[:-1], n)
            return y + bias if bias is not None else y
        w = _rt.decode_torch(layer.weight, layer.weight_exponents, layer.w12_esc_index, layer.w12_esc_bits, n, k)
    else:  # reference path: exact decode (numba codec) + F.linear
        w = _rt.decode_op(layer.weight, layer.weight_exponents, layer.weight_esc_counts, layer.weight_escapes, n, k)
    if w.dtype != x.dtype:
        w = w.to(x.dtype)
    if bias is not None and bias.dtype != x.dtype:
        bias = bias.to(x.dtype)
    return F.linear(x, w, bias)
