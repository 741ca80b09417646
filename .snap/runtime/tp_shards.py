"""Tensor-parallel pieces of W12 matrices (SPEC.md §12), independent of any serving framework.

    piece = rank_piece(m, rows=(n0, n1))            # a column-parallel (N-sharded) slice
    piece = rank_piece(m, cols=(k0, k1))            # a row-parallel (K-sharded) slice
    merged = concat_rows([q_piece, k_piece, v_piece])   # a merged layer's rank matrix (along N)

A slice at tile boundaries (rows at multiples of 128, columns at multiples of 64, or up to the matrix's
end) is a sub-array of the records, exponents and counts plus the escape runs of its records: no entry
is rewritten (`W12Matrix.slice_rows` / `slice_cols`). Any other slice is decoded, cut and re-encoded:
exact (the decoded bits are the same), but it costs a decode and an encode per rank at load time.
`W12_TP_UNALIGNED=error` in the environment refuses such slices instead, with an error that names the
matrix and the sizes.

`concat_rows` is what `W12Matrix` does not have: rows of several matrices with the same K stacked into
one (a QKV or gate/up layer's rank-local matrix). When every piece but the last has a multiple of 128
rows the records, exponents, counts and escape lists are simply concatenated (escapes are listed in
record order, and record order is row-tile-major); otherwise the pieces are decoded, stacked and
re-encoded (exact as well).
"""

from __future__ import annotations

import logging
import os

import torch

from w12.formats.layout import TK, TN
from w12.formats.matrix import W12Matrix

log = logging.getLogger(__name__)

UNALIGNED_ENV = "W12_TP_UNALIGNED"


class UnalignedShardError(ValueError):
    """A tensor-parallel slice that is not a union of whole tiles, with re-encoding disabled."""


def _unaligned_policy() -> str:
    policy = os.environ.get(UNALIGNED_ENV, "reencode").strip().lower()
    if policy not in ("reencode", "error"):
        raise ValueError(f"{UNALIGNED_ENV} must be 'reencode' or 'error', found {policy!r}")
    return policy


def aligned(start: int, stop: int, size: int, tile: int) -> bool:
    """Whether [start, stop) of an extent `size` is a union of whole tiles of `tile` (the last may be partial)."""
    return start % tile == 0 and (stop % tile == 0 or stop == size)


def rank_piece(m: W12Matrix, rows: tuple[int, int] | None = None, cols: tuple[int, int] | None = None,
               name: str = "W12 matrix") -> W12Matrix:
    """Rows [n0, n1) and/or columns [k0, k1) of `m` as a valid W12 matrix (zero-copy when tile-aligned)."""
    n, k = m.shape
    rows = None if rows is None or tuple(rows) == (0, n) else tuple(rows)
    cols = None if cols is None or tuple(cols) == (0, k) else tuple(cols)
    unaligned = []
    if rows is not None and not aligned(*rows, n, TN):
        unaligned.append(f"rows [{rows[0]}, {rows[1]}) of {n} (tiles of {TN} rows)")
    if cols is not None and not aligned(*cols, k, TK):
        unaligned.append(f"columns [{cols[0]}, {cols[1]}) of {k} (tiles of {TK} columns)")
    if unaligned:
        if _unaligned_policy() == "error":
            raise UnalignedShardError(
                f"{name} [{n}, {k}]: the tensor-parallel slice {' and '.join(unaligned)} is not a union of whole "
                f"W12 tiles, and {UNALIGNED_ENV}=error refuses to re-encode it; use a TP size that gives each rank "
                f"a multiple of {TN} output rows and {TK} input columns, or unset {UNALIGNED_ENV} to re-encode "
                "(exact, slower loading)")
        log.info("w12: %s [%d, %d]: %s not tile-aligned; decoding and re-encoding the slice (exact)",
                 name, n, k, " and ".join(unaligned))
        w = m.to_bf16()
        if rows is not None:
            w = w[rows[0]:rows[1]]
        if cols is not None:
            w = w[:, cols[0]:cols[1]]
        return W12Matrix.from_bf16(w.contiguous())
    if rows is not None:
        m = m.slice_rows(*rows)
    if cols is not None:
        m = m.slice_cols(*cols)
    return m


def concat_rows(mats: list[W12Matrix]) -> W12Matrix:
    """The matrices stacked along N (rows), all with the same K. Exact; zero re-encoding when aligned."""
    if not mats:
        raise ValueError("concat_rows: no matrices")
    k = mats[0].k
    if any(m.k != k for m in mats):
        raise ValueError(f"concat_rows: all matrices need the same K, found {[m.k for m in mats]}")
    if len(mats) == 1:
        return mats[0]
    n = sum(m.n for m in mats)
    if all(m.n % TN == 0 for m in mats[:-1]):
        return W12Matrix(torch.cat([m.records for m in mats]), torch.cat([m.exponents for m in mats]),
                         torch.cat([m.esc_counts for m in mats]), torch.cat([m.escapes for m in mats]), (n, k))
    return W12Matrix.from_bf16(torch.cat([m.to_bf16() for m in mats]))
