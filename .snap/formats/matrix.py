"""`W12Matrix`: one W12-encoded BF16 matrix in memory (SPEC.md §3–7, §9).

    m = W12Matrix.from_bf16(w)          # w: bf16 [N, K]
    assert torch.equal(m.to_bf16().view(torch.int16), w.view(torch.int16))
    q = m.view8_to_bf16()               # the 8-bit view, discarded bits at their midpoint
    shard = m.slice_rows(0, 2048)       # tensor-parallel shards are valid W12 matrices

The four tensors are kept exactly as stored in a file (records, exponents, esc_counts, escapes).
`validate()` checks every field of SPEC.md §9 before any data is used; the constructor runs it.
"""

from dataclasses import dataclass
from functools import cached_property

import torch

from . import reference
from .errors import (
    EscapeCountError,
    EscapePositionError,
    ExponentError,
    InputError,
    NonCanonicalError,
    ShapeError,
    SliceError,
    TensorLayoutError,
)
from .layout import E_HI, E_LO, MAX_DIM, REC_BYTES, TK, TN, TW, VIEW_BYTES, WIN, bits_per_weight, padded, tiles


def codec(backend: str):
    """The codec module for `backend`: "fast" (numba, parallel) or "reference" (plain torch)."""
    if backend == "reference":
        return reference
    if backend == "fast":
        from . import fast

        return fast
    raise ValueError(f"unknown codec backend {backend!r}: expected 'fast' or 'reference'")


def check_bf16(w: torch.Tensor) -> torch.Tensor:
    """A 2-D BF16 tensor -> its int16 bit patterns on the CPU, contiguous."""
    if not isinstance(w, torch.Tensor) or w.dtype != torch.bfloat16 or w.dim() != 2:
        found = f"{w.dtype} tensor of shape {tuple(w.shape)}" if isinstance(w, torch.Tensor) else type(w).__name__
        raise InputError(f"expected a 2-D torch.bfloat16 tensor, found a {found}; cast with .to(torch.bfloat16) "
                         "only if a lossy cast is what you want")
    if w.shape[0] < 1 or w.shape[1] < 1:
        raise InputError(f"expected a non-empty matrix, found shape {tuple(w.shape)}")
    return w.detach().to("cpu").contiguous().view(torch.int16)


@dataclass(frozen=True, eq=False)
class W12Matrix:
    records: torch.Tensor  # u8 [NB, KB, 12288]
    exponents: torch.Tensor  # u8 [N_PAD]
    esc_counts: torch.Tensor  # i32 [NB, KB]
    escapes: torch.Tensor  # i16 [nnz, 2]: (position in record, original bits)
    shape: tuple[int, int]  # (N, K)

    def __post_init__(self):
        self.validate()

    # ---- construction -------------------------------------------------------------------------
    @classmethod
    def from_bf16(cls, w: torch.Tensor, backend: str = "fast") -> "W12Matrix":
        bits = check_bf16(w)
        return cls._unchecked(*codec(backend).encode(bits), shape=tuple(bits.shape))

    @classmethod
    def _unchecked(cls, records, exponents, esc_counts, escapes, shape) -> "W12Matrix":
        """Skip validation: only for the encoders' own output, canonical by construction (the tests
        compare both encoders with each other and run validate() on their output)."""
        m = object.__new__(cls)
        for name, value in zip(("records", "exponents", "esc_counts", "escapes", "shape"),
                               (records, exponents, esc_counts, escapes, tuple(shape))):
            object.__setattr__(m, name, value)
        return m

    def to_bf16(self, backend: str = "fast") -> torch.Tensor:
        """The original BF16 matrix, bit for bit."""
        bits = codec(backend).decode(self.records, self.exponents, self.esc_counts, self.escapes, *self.shape)
        return bits.view(torch.bfloat16)

    def view8_to_bf16(self, backend: str = "fast") -> torch.Tensor:
        """The 8-bit view's approximation: low mantissa nibble = 8 (midpoint); escapes keep their code."""
        bits = codec(backend).decode(self.records, self.exponents, self.esc_counts, self.escapes, *self.shape,
                                     lo_fill=8)
        return bits.view(torch.bfloat16)

    # ---- sizes --------------------------------------------------------------------------------
    @property
    def n(self) -> int:
        return self.shape[0]

    @property
    def k(self) -> int:
        return self.shape[1]

    @property
    def nnz(self) -> int:
        return int(self.escapes.shape[0])

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.records, self.exponents, self.esc_counts, self.escapes))

    @property
    def bits_per_weight(self) -> float:
        return bits_per_weight(self.n, self.k, self.nnz)

    @property
    def escape_rate(self) -> float:
        return self.nnz / (self.n * self.k)

    @cached_property
    def escape_offsets(self) -> torch.Tensor:
        """int64 [NB·KB + 1]: entries of record r are escapes[offsets[r]:offsets[r+1]] (SPEC.md §6)."""
        flat = self.esc_counts.reshape(-1).to(torch.int64)
        return torch.cat([torch.zeros(1, dtype=torch.int64), flat.cumsum(0)])

    # ---- slicing (tensor-parallel shards) -----------------------------------------------------
    def slice_rows(self, n0: int, n1: int) -> "W12Matrix":
        """Rows [n0, n1). Zero-copy when n0 % 128 == 0 and (n1 % 128 == 0 or n1 == N); else re-encoded."""
        _check_range("rows", n0, n1, self.n)
        if n0 % TN or (n1 % TN and n1 != self.n):
            return W12Matrix.from_bf16(self.to_bf16()[n0:n1])
        nb0, nb1 = n0 // TN, -(-n1 // TN)
        kb = self.esc_counts.shape[1]
        off = self.escape_offsets
        return W12Matrix(self.records[nb0:nb1], self.exponents[nb0 * TN:nb1 * TN], self.esc_counts[nb0:nb1],
                         self.escapes[off[nb0 * kb]:off[nb1 * kb]], (n1 - n0, self.k))

    def slice_cols(self, k0: int, k1: int) -> "W12Matrix":
        """Columns [k0, k1). Keeps each row's window when k0 % 64 == 0 and (k1 % 64 == 0 or k1 == K)
        (SPEC.md §3); otherwise decoded, cut and re-encoded."""
        _check_range("columns", k0, k1, self.k)
        if k0 % TK or (k1 % TK and k1 != self.k):
            return W12Matrix.from_bf16(self.to_bf16()[:, k0:k1])
        kb0, kb1 = k0 // TK, -(-k1 // TK)
        nb, kb = self.esc_counts.shape
        off = self.escape_offsets.view(-1)
        starts, ends = off[:-1].view(nb, kb)[:, kb0], off[:-1].view(nb, kb)[:, kb1 - 1] + self.esc_counts[:, kb1 - 1]
        keep = torch.cat([torch.arange(int(a), int(b)) for a, b in zip(starts, ends)]) if nb else starts
        return W12Matrix(self.records[:, kb0:kb1].contiguous(), self.exponents, self.esc_counts[:, kb0:kb1].contiguous(),
                         self.escapes[keep.long()], (self.n, k1 - k0))

    # ---- validation (SPEC.md §9) --------------------------------------------------------------
    def validate(self) -> None:
        n, k = _check_shape(self.shape)
        nb, kb = tiles(n, k)
        n_pad, k_pad = padded(n, k)
        _check_tensor("records", self.records, torch.uint8, (nb, kb, REC_BYTES))
        _check_tensor("exponents", self.exponents, torch.uint8, (n_pad,))
        _check_tensor("esc_counts", self.esc_counts, torch.int32, (nb, kb))
        if not isinstance(self.escapes, torch.Tensor) or self.escapes.dim() != 2:
            raise TensorLayoutError(f"escapes: expected an int16 tensor [nnz, 2], found {_describe(self.escapes)}")

        exps = self.exponents.to(torch.int32)
        if exps.numel() and (int(exps.min()) < E_LO or int(exps.max()) > E_HI):
            bad = int(torch.nonzero((exps < E_LO) | (exps > E_HI))[0])
            raise ExponentError(f"row {bad}: top exponent must be in [{E_LO}, {E_HI}], found {int(exps[bad])}")
        if bool((exps[n:] != E_LO).any()):
            bad = n + int(torch.nonzero(exps[n:] != E_LO)[0])
            raise ExponentError(f"padded row {bad} (N = {n}): top exponent must be {E_LO}, found {int(exps[bad])}")

        counts = self.esc_counts.reshape(-1).to(torch.int64)
        if counts.numel() and (int(counts.min()) < 0 or int(counts.max()) > TW):
            bad = int(torch.nonzero((counts < 0) | (counts > TW))[0])
            raise EscapeCountError(f"record {divmod(bad, kb)}: escape count must be in [0, {TW}], "
                                   f"found {int(counts[bad])}")
        nnz = int(counts.sum())
        _check_tensor("escapes", self.escapes, torch.int16, (nnz, 2))
        if nnz:
            self._validate_escapes(counts, nb, kb, n, k)
        self._validate_padding(nb, kb, n, k)

    def _validate_escapes(self, counts, nb, kb, n, k):
        rec = torch.repeat_interleave(torch.arange(nb * kb), counts)
        pos = self.escapes[:, 0].to(torch.int64)
        if int(pos.min()) < 0 or int(pos.max()) >= TW:
            bad = int(torch.nonzero((pos < 0) | (pos >= TW))[0])
            raise EscapePositionError(f"escape {bad}: position must be in [0, {TW}), found {int(pos[bad])}")
        same = rec[1:] == rec[:-1]
        if bool((same & (pos[1:] <= pos[:-1])).any()):
            bad = int(torch.nonzero(same & (pos[1:] <= pos[:-1]))[0]) + 1
            raise EscapePositionError(f"escape {bad} in record {divmod(int(rec[bad]), kb)}: positions must be "
                                      f"strictly increasing, found {int(pos[bad - 1])} then {int(pos[bad])}")
        rows, cols = (rec // kb) * TN + pos // TK, (rec % kb) * TK + pos % TK
        if bool(((rows >= n) | (cols >= k)).any()):
            bad = int(torch.nonzero((rows >= n) | (cols >= k))[0])
            raise EscapePositionError(f"escape {bad} at row {int(rows[bad])}, column {int(cols[bad])} lies in the "
                                      f"padding of a {n}×{k} matrix")
        flat = self.records.view(nb * kb, REC_BYTES)
        r, c = pos // TK, pos % TK
        view = flat[rec, pos].to(torch.int32)
        nib = (flat[rec, VIEW_BYTES + r * (TK // 2) + c % (TK // 2)].to(torch.int32) >> (4 * (c // (TK // 2)))) & 0xF
        if bool(((view != 0) | (nib != 0)).any()):
            bad = int(torch.nonzero((view != 0) | (nib != 0))[0])
            raise NonCanonicalError(f"escape {bad} at row {int(rows[bad])}, column {int(cols[bad])}: its record "
                                    f"code must be 0, found view byte {int(view[bad])}, nibble {int(nib[bad])}")
        e = (self.escapes[:, 1].to(torch.int32) >> 7) & 0xFF
        top = self.exponents.to(torch.int32)[rows]
        in_window = (e >= 1) & (e <= 254) & (e >= top - (WIN - 1)) & (e <= top)
        if bool(in_window.any()):
            bad = int(torch.nonzero(in_window)[0])
            raise NonCanonicalError(f"escape {bad} at row {int(rows[bad])}, column {int(cols[bad])}: exponent "
                                    f"{int(e[bad])} lies in the row's window [{int(top[bad]) - 15}, {int(top[bad])}]; "
                                    "in-window weights must be coded, not escaped")

    def _validate_padding(self, nb, kb, n, k):
        n_pad, k_pad = padded(n, k)
        if n == n_pad and k == k_pad:
            return
        for rows, cols in ((slice(nb - 1, nb), slice(0, kb)), (slice(0, nb), slice(kb - 1, kb))):
            part = self.records[rows, cols]
            b, lo = reference.unpack_codes(part, part.shape[0] * TN, part.shape[1] * TK)
            r0, c0 = rows.start * TN, cols.start * TK
            pad = torch.zeros_like(b, dtype=torch.bool)
            pad[max(n - r0, 0):, :] = True
            pad[:, max(k - c0, 0):] = True
            if bool(((b != 0) | (lo != 0))[pad].any()):
                rr, cc = torch.nonzero(((b != 0) | (lo != 0)) & pad)[0].tolist()
                raise NonCanonicalError(f"padded weight at row {r0 + rr}, column {c0 + cc} of a {n}×{k} matrix "
                                        "must have code 0")


def _describe(t) -> str:
    return f"{t.dtype} {list(t.shape)}" if isinstance(t, torch.Tensor) else type(t).__name__


def _check_shape(shape) -> tuple[int, int]:
    ok = (isinstance(shape, (tuple, list)) and len(shape) == 2
          and all(isinstance(d, int) and not isinstance(d, bool) and 1 <= d <= MAX_DIM for d in shape))
    if not ok:
        raise ShapeError(f"expected a shape of two integers in [1, {MAX_DIM}], found {shape!r}")
    return int(shape[0]), int(shape[1])


def _check_tensor(name, t, dtype, shape) -> None:
    if not isinstance(t, torch.Tensor) or t.dtype != dtype or tuple(t.shape) != tuple(shape):
        raise TensorLayoutError(f"{name}: expected {dtype} {list(shape)}, found {_describe(t)}")


def _check_range(what, a, b, size) -> None:
    if not (isinstance(a, int) and isinstance(b, int) and 0 <= a < b <= size):
        raise SliceError(f"{what} slice [{a}, {b}) must be non-empty and within [0, {size})")
