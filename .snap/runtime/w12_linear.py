"""`W12Linear`: an `nn.Linear` replacement that holds a W12 matrix (SPEC.md §7) and no BF16 copy.

    layer = W12Linear.from_linear(nn.Linear(4096, 4096, dtype=torch.bfloat16))   # encode
    y = layer(x)                                # == F.linear(x, W, b) with the exact BF16 W
    w = layer.dequantize()                      # the original BF16 weight, bit for bit

The module's buffers carry exactly the checkpoint's names, dtypes and shapes, so a state dict loads
and saves without any conversion:

    weight               u8  [NB, KB, 12288]   records (the name of the original weight, on purpose)
    weight_exponents     u8  [N_PAD]
    weight_esc_counts    i32 [NB, KB]
    weight_escapes       i16 [nnz, 2]
    bias                 bf16 [N] (a Parameter, as in nn.Linear), optional

Forward goes through one dispatch function, `w12_linear(x, module)`:

* CUDA, with `w12.kernels` importable: the fused GEMM `torch.ops.w12.gemm_packed` on ONE int32 tensor
  `_w12_packed` = records + exponents, escapes and the kernels' escape tables, built once per module by
  `prepare`, which re-points `weight` at the records part (the bytes live once). A compiled model
  re-checks every tensor a layer reads on every call, so the layer reads one, like an nn.Linear.
  Nothing but the W12 bytes and those small tables live on the GPU.
  Sibling projections (q/k/v, gate/up) of one parent run ONE GEMM per group after `prepare(model)`
  (runtime/fused.py; on by default on CUDA, off with `prepare(model, fuse=False)` or env `W12_FUSE=0`).
* CUDA without kernels: an exact decode in plain torch ops on the GPU (no host sync, graph safe),
  then `F.linear`. Correct, but it materialises the BF16 matrix transiently.
* CPU (and everything else): an exact decode (the numba codec, wrapped as the custom op
  `w12_runtime::decode` so torch.compile sees one opaque node) + `F.linear` in BF16. Since the decoded
  weight is bit-identical to the original and `F.linear` is the op `nn.Linear` calls, outputs are
  bit-identical to the BF16 model's on the CPU.

`set_cpu_gemm_op(True)` routes CPU layers through `torch.ops.w12.gemm_packed` too (its CPU reference: decode +
fp32 matmul, not bit-identical to F.linear in BF16); a test switch for the CUDA code path, off by default.

The CPU path decodes on every call. An optional LRU of decoded weights (`set_cpu_decode_cache`) trades
memory for speed in eager CPU runs; it is OFF by default and never used under torch.compile.
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections import OrderedDict

import torch
import torch.nn.functional as F
from torch import nn

from w12.formats.layout import REC_BYTES, TK, TN, WIN, padded, tiles

log = logging.getLogger(__name__)

BUFFER_NAMES = ("weight", "weight_exponents", "weight_esc_counts", "weight_escapes")
PREPARED_NAMES = ("_w12_packed", "_esc_offsets", "_esc_cols", "_esc_index", "_esc_bits")  # prepare(), never saved


# ---------------------------------------------------------------------------------------------
# Exact decode, CPU: the numba codec as an opaque custom op (torch.compile-friendly).
# ---------------------------------------------------------------------------------------------
@torch.library.custom_op("w12_runtime::decode", mutates_args=())
def decode_op(records: torch.Tensor, exponents: torch.Tensor, esc_counts: torch.Tensor, escapes: torch.Tensor,
              n: int, k: int) -> torch.Tensor:
    """The exact BF16 matrix [n, k] of a W12 matrix (CPU: numba codec; other devices: torch ops)."""
    if records.device.type == "cpu":
        from w12.formats import fast

        return fast.decode(records, exponents, esc_counts, escapes, n, k).view(torch.bfloat16)
    idx, bits = escape_index(esc_counts, escapes, n, k)
    return decode_torch(records, exponents, idx, bits, n, k)


@decode_op.register_fake
def _(records, exponents, esc_counts, escapes, n, k):
    return records.new_empty((n, k), dtype=torch.bfloat16)


# ---------------------------------------------------------------------------------------------
# Exact decode in plain torch (any device, no host sync once the escape index is built).
# ---------------------------------------------------------------------------------------------
def escape_index(esc_counts: torch.Tensor, escapes: torch.Tensor, n: int, k: int):
    """(flat index into the padded [N_PAD, K_PAD] matrix as int64 [nnz], original bits as int32 [nnz]).
    Load-time helper (it syncs with the host: repeat_interleave has a data-dependent size)."""
    nb, kb = tiles(n, k)
    _, k_pad = padded(n, k)
    dev = esc_counts.device
    rec = torch.repeat_interleave(torch.arange(nb * kb, device=dev), esc_counts.reshape(-1).long(),
                                  output_size=escapes.shape[0])
    pos = escapes[:, 0].long()
    rows = (rec // kb) * TN + pos // TK
    cols = (rec % kb) * TK + pos % TK
    return rows * k_pad + cols, escapes[:, 1].to(torch.int32) & 0xFFFF


def decode_torch(records: torch.Tensor, exponents: torch.Tensor, esc_index: torch.Tensor, esc_bits: torch.Tensor,
                 n: int, k: int) -> torch.Tensor:
    """SPEC.md §4–6 in torch ops: records + exponents + escapes (as `escape_index` gives them) -> bf16 [n, k]."""
    nb, kb = records.shape[0], records.shape[1]
    n_pad, k_pad = nb * TN, kb * TK
    r = records.to(torch.int32)
    b = r[:, :, :TN * TK].reshape(nb, kb, TN, TK).permute(0, 2, 1, 3).reshape(n_pad, k_pad)
    nib = r[:, :, TN * TK:REC_BYTES].reshape(nb, kb, TN, TK // 2)
    lo = torch.cat([nib & 0xF, nib >> 4], dim=3).permute(0, 2, 1, 3).reshape(n_pad, k_pad)
    top = exponents.to(torch.int32)[:, None]
    h = ((b >> 7) << 15) | ((top - (WIN - 1) + ((b >> 3) & 0xF)) << 7) | ((b & 7) << 4) | lo
    h = h.reshape(-1).index_put((esc_index,), esc_bits).reshape(n_pad, k_pad)[:n, :k]
    h = torch.where(h > 32767, h - 65536, h).to(torch.int16)
    return h.contiguous().view(torch.bfloat16)


# ---------------------------------------------------------------------------------------------
# The fused CUDA kernels (another layer, w12.kernels). Only these published entry points are used:
#   w12.kernels.gemm.prepare_escapes(counts, escapes) -> (esc_offsets, esc_cols)   (load time)
#   w12.kernels.ops.pack_matrix(records, exponents, escapes, esc_offsets, esc_cols) -> packed (load time)
#   w12.kernels.ops.packed_records(packed, nb, kb) -> the records part of it, a view
#   torch.ops.w12.gemm_packed(x2d_bf16, packed, n, nnz) -> bf16 [M, n]
#   torch.ops.w12.gemm(x2d_bf16, records, exponents, escapes, esc_offsets, esc_cols, n) -> bf16 [M, n]
# If one is missing or raises on import, CUDA falls back to decode_torch + F.linear.
# ---------------------------------------------------------------------------------------------
_KERNELS: dict = {}
_KERNELS_LOCK = threading.Lock()


def kernel_backend():
    """The CUDA kernel entry points as (prepare_escapes, gemm op), or None when w12.kernels is unusable."""
    with _KERNELS_LOCK:
        if "backend" not in _KERNELS:
            try:
                from w12.kernels import gemm as _gemm
                from w12.kernels import ops as _ops  # noqa: F401  (registers torch.ops.w12.*)

                _KERNELS["backend"] = (_gemm.prepare_escapes, torch.ops.w12.gemm)
            except Exception as e:  # ImportError, no triton, an API change: decode instead, loudly once
                log.warning("w12: fused kernels unavailable (%s: %s); CUDA layers decode to BF16 per call",
                            type(e).__name__, e)
                _KERNELS["backend"] = None
        return _KERNELS["backend"]


# CPU switch: run the GEMM op (its CPU reference) instead of decode + F.linear. Tests only.
_CPU_GEMM_OP = False


def set_cpu_gemm_op(on: bool) -> None:
    """True: CPU W12Linear layers (and projection groups) call `torch.ops.w12.gemm` like CUDA layers do,
    with escape tables prepared on the CPU (call `prepare(model)` after switching). Default False."""
    global _CPU_GEMM_OP
    _CPU_GEMM_OP = bool(on)


def gemm_device(device: torch.device) -> bool:
    """Whether layers on `device` run the GEMM op (CUDA; the CPU while `set_cpu_gemm_op(True)`)."""
    return device.type == "cuda" or (device.type == "cpu" and _CPU_GEMM_OP)


def _rows(x: torch.Tensor) -> torch.Tensor:
    """x [..., K] as a 2-D [M, K] with unit column stride (what the GEMM ops take)."""
    x2 = x.reshape(-1, x.shape[-1])
    return x2 if x2.stride(-1) == 1 else x2.contiguous()


def gemm_rows(x: torch.Tensor, packed: torch.Tensor, n: int, nnz: int) -> torch.Tensor:
    """x bf16 [..., K] -> [..., n] through `torch.ops.w12.gemm_packed`; `packed` from `packed_matrix`,
    nnz = the matrix's escape count."""
    return torch.ops.w12.gemm_packed(_rows(x), packed, n, nnz).reshape(*x.shape[:-1], n)


def packed_matrix(records, exponents, counts, escapes) -> tuple:
    """Load time: (packed, its records part as a u8 [NB, KB, 12288] view) of one matrix: records, exponents,
    escapes and the kernels' escape tables in one int32 tensor (w12.kernels.ops.pack_matrix)."""
    from w12.kernels.ops import pack_matrix, packed_records

    offs, cols = kernel_backend()[0](counts, escapes)
    packed = pack_matrix(records, exponents, escapes, offs, cols)
    return packed, packed_records(packed, *records.shape[:2])


def own_gemm(x: torch.Tensor, module) -> torch.Tensor:
    """`torch.ops.w12.gemm` on a layer's own four buffers and its `prepare_tables` (no bias)."""
    y = torch.ops.w12.gemm(_rows(x), module.weight, module.weight_exponents, module.weight_escapes,
                           module._esc_offsets, module._esc_cols, module.out_features)
    return y.reshape(*x.shape[:-1], module.out_features)


# ---------------------------------------------------------------------------------------------
# Projection groups' forward (groups are made and dissolved in fused.py).
# ---------------------------------------------------------------------------------------------
_STASH: dict = {}  # group id -> (input, fused output) of the leader's last call, until the last member takes its slice


def fused_forward(x: torch.Tensor, module: W12Linear, slot: tuple):
    """Member `slot[1]`'s output from its group's fused GEMM, or None: the caller runs the member's own GEMM.
    The leader (index 0) runs the GEMM and stashes (x, y); a later member called with the SAME input tensor
    object takes its columns; the last member clears the stash."""
    gid, i, lo, hi, last, n, nnz = slot
    if i == 0:
        _STASH.pop(gid, None)
        packed = module._buffers.get("_fused_packed")
        if packed is None or packed.device != x.device or x.dtype != torch.bfloat16 or not gemm_device(x.device):
            return None
        y = gemm_rows(x, packed, n, nnz)
        _STASH[gid] = (x, y)
    else:
        stashed = _STASH.get(gid)
        if stashed is None or stashed[0] is not x:
            return None
        y = stashed[1]
    if i == last:
        _STASH.pop(gid, None)
    y = y[..., lo:hi]
    bias = module.bias
    return y + bias if bias is not None else y


# ---------------------------------------------------------------------------------------------
# Optional CPU LRU of decoded weights (OFF by default).
# ---------------------------------------------------------------------------------------------
class _DecodeCache:
    """LRU of decoded BF16 weights keyed by module, at most `max_bytes` in total. Eager CPU only."""

    def __init__(self):
        self.max_bytes = 0
        self.items: OrderedDict[int, tuple] = OrderedDict()
        self.bytes = 0
        self.lock = threading.Lock()

    def get(self, module: "W12Linear"):
        with self.lock:
            item = self.items.get(id(module))
            if item is None:
                return None
            ref, version, w = item
            if ref() is not module or version != module.weight._version:
                self._drop(id(module))
                return None
            self.items.move_to_end(id(module))
            return w

    def put(self, module: "W12Linear", w: torch.Tensor) -> None:
        size = w.numel() * w.element_size()
        with self.lock:
            if size > self.max_bytes:
                return
            self._drop(id(module))
            while self.items and self.bytes + size > self.max_bytes:
                self._drop(next(iter(self.items)))
            self.items[id(module)] = (weakref.ref(module), module.weight._version, w)
            self.bytes += size

    def _drop(self, key) -> None:
        item = self.items.pop(key, None)
        if item is not None:
            self.bytes -= item[2].numel() * item[2].element_size()

    def clear(self) -> None:
        with self.lock:
            self.items.clear()
            self.bytes = 0


_CACHE = _DecodeCache()


def set_cpu_decode_cache(max_bytes: int) -> None:
    """Keep up to `max_bytes` of decoded BF16 weights of CPU W12Linear layers (LRU), 0 = off (default).
    Only eager CPU forwards use it; it holds plain BF16 copies, so it gives back what W12 saves."""
    _CACHE.max_bytes = int(max_bytes)
    if not max_bytes:
        _CACHE.clear()


# ---------------------------------------------------------------------------------------------
# The module and its dispatch.
# ---------------------------------------------------------------------------------------------
class W12Linear(nn.Module):
    """y = x · Wᵀ + b with W stored as a W12 matrix (four buffers) and b in BF16."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, nnz: int = 0,
                 device=None, bias_dtype: torch.dtype = torch.bfloat16):
        super().__init__()
        self.in_features, self.out_features = int(in_features), int(out_features)
        nb, kb = tiles(self.out_features, self.in_features)
        n_pad, _ = padded(self.out_features, self.in_features)
        self.register_buffer("weight", torch.zeros(nb, kb, REC_BYTES, dtype=torch.uint8, device=device))
        self.register_buffer("weight_exponents", torch.full((n_pad,), 16, dtype=torch.uint8, device=device))
        self.register_buffer("weight_esc_counts", torch.zeros(nb, kb, dtype=torch.int32, device=device))
        self.register_buffer("weight_escapes", torch.zeros(int(nnz), 2, dtype=torch.int16, device=device))
        if bias:
            self.bias = nn.Parameter(torch.zeros(self.out_features, dtype=bias_dtype, device=device))
        else:
            self.register_parameter("bias", None)
        self.w12_sha256: str | None = None  # SHA-256 of the original BF16 bytes, when known (SPEC.md §7)
        self.w12_view8 = False  # True inside view8_mode: forward on the 8-bit view (SPEC.md §4), an approximation
        self.w12_group = None  # a fused.ProjectionGroup when this layer shares one GEMM with its siblings
        self.w12_slot = None  # then: what its forward needs of the group, plain ints (fused.ProjectionGroup.slot)

    # ---- construction -------------------------------------------------------------------------
    @classmethod
    def from_matrix(cls, m, bias: torch.Tensor | None = None, sha256: str | None = None) -> "W12Linear":
        """From a `W12Matrix` (validated) and an optional bias."""
        n, k = m.shape
        layer = cls(k, n, bias=bias is not None, nnz=m.nnz, device="meta")
        layer.load_matrix(m)
        if bias is not None:
            layer.bias = nn.Parameter(bias.detach().clone(), requires_grad=False)
        layer.w12_sha256 = sha256
        return layer

    @classmethod
    def from_linear(cls, linear: nn.Linear) -> "W12Linear":
        """Encode an nn.Linear with a BF16 weight (exact). The result lives on the linear's device."""
        from w12.convert.convert import hash_tensor
        from w12.formats.matrix import W12Matrix

        w = linear.weight.detach()
        m = W12Matrix.from_bf16(w)
        layer = cls.from_matrix(m, linear.bias, hash_tensor(w.cpu()))
        return layer.to(w.device)

    def load_matrix(self, m) -> None:
        """Replace the four buffers by a `W12Matrix`'s tensors (shape must match)."""
        if tuple(m.shape) != (self.out_features, self.in_features):
            raise ValueError(f"W12 matrix of shape {list(m.shape)} for a layer of shape "
                             f"[{self.out_features}, {self.in_features}]")
        self.weight, self.weight_exponents = m.records, m.exponents
        self.weight_esc_counts, self.weight_escapes = m.esc_counts, m.escapes
        self._clear_prepared()

    def matrix(self):
        """The four buffers as a validated `W12Matrix` on the CPU (runs the checks of SPEC.md §9)."""
        from w12.formats.matrix import W12Matrix

        return W12Matrix(self.weight.cpu(), self.weight_exponents.cpu(), self.weight_esc_counts.cpu(),
                         self.weight_escapes.cpu(), (self.out_features, self.in_features))

    # ---- device preparation (CUDA) ----------------------------------------------------------
    def _clear_prepared(self) -> None:
        if getattr(self, "w12_group", None) is not None:  # its group's fused copy may no longer match: dissolve it
            from .fused import dissolve

            dissolve(self)
        for name in PREPARED_NAMES:
            self._buffers.pop(name, None)
            self.__dict__.pop(name, None)

    def prepare(self) -> None:
        """Build what the CUDA paths read, once, on the buffers' device: with the kernels, `_w12_packed`
        (records + tables in one int32 tensor; `weight` becomes a view of its records part, so the bytes
        live once) — or, for a layer with an accelerate hook (it may swap `weight` per call), only the
        small escape tables `_esc_offsets`, `_esc_cols`; without the kernels, the decode index.
        Non-persistent buffers: they follow .to() but are never saved (moving the layer copies `weight` and
        `_w12_packed` apart — same bytes, twice the memory — until prepare() runs again). A no-op on the CPU
        (unless `set_cpu_gemm_op(True)`). Dissolves this layer's projection group, if any."""
        self._clear_prepared()
        if self.weight.device.type == "meta" or not gemm_device(self.weight.device):
            return
        backend = kernel_backend()
        self.w12_nnz = int(self.weight_escapes.shape[0])
        if backend is not None and not hasattr(self, "_hf_hook"):
            # ONE tensor: torch.compile re-checks every tensor a layer reads on every call
            packed, records = packed_matrix(self.weight, self.weight_exponents, self.weight_esc_counts,
                                            self.weight_escapes)
            self.register_buffer("_w12_packed", packed, persistent=False)
            self._buffers["weight"] = records
        elif backend is not None:
            self.prepare_tables()
        else:
            idx, bits = escape_index(self.weight_esc_counts, self.weight_escapes, self.out_features, self.in_features)
            self.register_buffer("_esc_index", idx, persistent=False)
            self.register_buffer("_esc_bits", bits, persistent=False)

    def prepare_tables(self) -> None:
        """The kernels' escape tables alone (`_esc_offsets`, `_esc_cols`) for `torch.ops.w12.gemm` on the
        layer's own buffers: accelerate-hooked layers and members of a projection group (fused.py)."""
        offs, cols = kernel_backend()[0](self.weight_esc_counts, self.weight_escapes)
        self.register_buffer("_esc_offsets", offs, persistent=False)
        self.register_buffer("_esc_cols", cols, persistent=False)

    def _prepared_for(self, device: torch.device) -> bool:
        t = next((self._buffers[b] for b in ("_w12_packed", "_esc_offsets", "_esc_index") if b in self._buffers), None)
        return t is not None and t.device == device

    # ---- use ----------------------------------------------------------------------------------
    def dequantize(self) -> torch.Tensor:
        """The original BF16 weight [N, K], bit for bit, on the buffers' device."""
        return decode_op(self.weight, self.weight_exponents, self.weight_esc_counts, self.weight_escapes,
                         self.out_features, self.in_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return w12_linear(x, self)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}, escapes={self.weight_escapes.shape[0]}")


# Number of open view8_mode blocks. Read first, so that outside them (always, in plain decoding) a compiled
# model guards this one global instead of every layer's `w12_view8`.
_VIEW8_BLOCKS = 0


def w12_linear(x: torch.Tensor, module: W12Linear) -> torch.Tensor:
    """The one dispatch point: fused kernel on CUDA when available, else exact decode + F.linear."""
    bias = module.bias
    if _VIEW8_BLOCKS and module.w12_view8:
        return _view8_linear(x, module)
    slot = module.w12_slot
    if slot is not None:  # fused q/k/v or gate/up: the leader's GEMM serves all (fused.py)
        y = fused_forward(x, module, slot)
        if y is not None:
            return y
    if x.is_cuda or (_CPU_GEMM_OP and x.device.type == "cpu"):
        # the common case first, reading as little as possible (torch.compile guards each read, per call)
        packed = module._buffers.get("_w12_packed")
        if packed is not None and x.dtype == torch.bfloat16 and packed.device == x.device:
            y = gemm_rows(x, packed, module.out_features, module.w12_nnz)
            return y + bias if bias is not None else y
        if not module._prepared_for(module.weight.device):
            if torch.compiler.is_compiling():
                raise RuntimeError("W12Linear on CUDA was not prepared before torch.compile; call "
                                   "w12.runtime.prepare(model) after moving the model")
            module.prepare()
        if x.dtype == torch.bfloat16 and "_w12_packed" in module._buffers:
            y = gemm_rows(x, module._w12_packed, module.out_features, module.w12_nnz)
            return y + bias if bias is not None else y
        if x.dtype == torch.bfloat16 and "_esc_offsets" in module._buffers:
            y = own_gemm(x, module)
            return y + bias if bias is not None else y
        if "_esc_index" not in module._buffers:  # kernels present but x not bf16: build the decode index
            idx, bits = escape_index(module.weight_esc_counts, module.weight_escapes, module.out_features,
                                     module.in_features)
            module.register_buffer("_esc_index", idx, persistent=False)
            module.register_buffer("_esc_bits", bits, persistent=False)
        w = decode_torch(module.weight, module.weight_exponents, module._esc_index, module._esc_bits,
                         module.out_features, module.in_features)
    else:
        w = None
        use_cache = _CACHE.max_bytes > 0 and not torch.compiler.is_compiling()
        if use_cache:
            w = _CACHE.get(module)
        if w is None:
            w = decode_op(module.weight, module.weight_exponents, module.weight_esc_counts, module.weight_escapes,
                          module.out_features, module.in_features)
            if use_cache:
                _CACHE.put(module, w)
    if w.dtype != x.dtype:  # e.g. fp32 activations: the exact BF16 weight, cast like a BF16 model would need
        w = w.to(x.dtype)
    return F.linear(x, w, bias if bias is None or bias.dtype == x.dtype else bias.to(x.dtype))


# ---------------------------------------------------------------------------------------------
# View mode: the 8-bit view only (first 8 KB of each record, low nibble = 8, escapes keep their code).
# An APPROXIMATION for TLV's Q pass (specdec/tlv.py); never the default.
# ---------------------------------------------------------------------------------------------
def decode_view_torch(records: torch.Tensor, exponents: torch.Tensor, n: int, k: int) -> torch.Tensor:
    """The 8-bit view's BF16 matrix [n, k] in torch ops (= W12Matrix.view8_to_bf16(); reads view bytes only)."""
    nb, kb = records.shape[0], records.shape[1]
    b = records[:, :, :TN * TK].to(torch.int32).reshape(nb, kb, TN, TK).permute(0, 2, 1, 3).reshape(nb * TN, kb * TK)
    top = exponents.to(torch.int32)[:, None]
    h = (((b >> 7) << 15) | ((top - (WIN - 1) + ((b >> 3) & 0xF)) << 7) | ((b & 7) << 4) | 8)[:n, :k]
    h = torch.where(h > 32767, h - 65536, h).to(torch.int16)
    return h.contiguous().view(torch.bfloat16)


def _view8_linear(x: torch.Tensor, module: W12Linear) -> torch.Tensor:
    bias = module.bias
    if x.is_cuda and x.dtype == torch.bfloat16 and kernel_backend() is not None:
        x2 = x.reshape(-1, x.shape[-1])
        if x2.stride(-1) != 1:
            x2 = x2.contiguous()
        y = torch.ops.w12.view_gemm(x2, module.weight, module.weight_exponents, module.out_features)
        y = y.reshape(*x.shape[:-1], module.out_features)
        return y + bias if bias is not None else y
    w = module.__dict__.get("_view8_w")   # decoded once per module (CPU / non-bf16 fallback), dropped on exit
    if w is None or w.device != x.device:
        if module.weight.device.type == "cpu":
            from w12.formats import fast

            w = fast.decode(module.weight, module.weight_exponents, module.weight_esc_counts, module.weight_escapes,
                            module.out_features, module.in_features, lo_fill=8).view(torch.bfloat16)
        else:
            w = decode_view_torch(module.weight, module.weight_exponents, module.out_features, module.in_features)
        module.__dict__["_view8_w"] = w = w.to(x.device)
    if w.dtype != x.dtype:
        w = w.to(x.dtype)
    return F.linear(x, w, bias if bias is None or bias.dtype == x.dtype else bias.to(x.dtype))


class view8_mode:
    """Context manager: every W12Linear of `model` computes on its 8-bit view inside the block.

        with view8_mode(model) as n:     # n = number of W12Linear modules switched (0: nothing to do)
            logits = model(...)          # approximate (SPEC.md §4 "8-bit view")

    `keep_decoded=True` keeps the CPU view decode on each module between blocks (memory for speed)."""

    def __init__(self, model: nn.Module, keep_decoded: bool = False):
        self.modules = [m for m in model.modules() if isinstance(m, W12Linear)]
        self.keep = keep_decoded

    def __enter__(self) -> int:
        global _VIEW8_BLOCKS
        for m in self.modules:
            m.w12_view8 = True
        _VIEW8_BLOCKS += 1
        return len(self.modules)

    def __exit__(self, *exc) -> None:
        global _VIEW8_BLOCKS
        _VIEW8_BLOCKS -= 1
        for m in self.modules:
            m.w12_view8 = False
            if not self.keep:
                m.__dict__.pop("_view8_w", None)


def prepare(model: nn.Module, fuse: bool | None = None) -> nn.Module:
    """Prepare every W12Linear of `model` for its current device (call after moving a model to CUDA), then
    fuse sibling projections (q/k/v, gate/up: one GEMM each, fused.py) where the GEMM op runs.
    `fuse`: None = env W12_FUSE ("0" off, else on), False = leave every layer on its own GEMM."""
    from .fused import fuse_enabled, fuse_projections

    on = fuse_enabled(fuse)
    for m in model.modules():
        if isinstance(m, W12Linear):
            m.prepare()  # also dissolves earlier groups
    if on:
        fuse_projections(model)
    return model
