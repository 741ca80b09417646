"""Fast W12 encoder and decoder (numba, parallel).

Same signatures and byte-identical outputs as `formats.reference` (tests/test_fast_codec.py compares
the two). Differences from the reference, on inputs the reference does not check:

* `encode` raises `InputError` when `bits` is not a 2-D int16 tensor with N, K >= 1, or when forced
  `exponents` are not integers in [16, 254] of length N (length N_PAD is accepted too when its
  padded rows hold 16, e.g. the exponents of an earlier encode).
* `decode` raises a `W12Error` subclass instead of reading or writing out of bounds when the tensors
  do not have the shapes of SPEC.md §7 for (n, k), a count is negative or the counts do not add up
  to the escape entries, or an escape position is outside [0, 8192) or in a padded row or column.
  It does not run the other checks of SPEC.md §9 (that is the loader's job); like the reference it
  decodes whatever codes it is given.

How it works (SPEC.md §3–6):

encode, pass 1 (parallel over groups of 8 rows): per row, a 256-bin histogram of the exponent
field (eight sub-histograms), a sliding 16-wide window sum over [16, 254] for E_n (the lowest
argmax), then the row's view bytes and nibble bytes go into its 64-byte and 32-byte slots of each
record, and the number of escapes of each 64-column row segment is kept (`seg[n, kb]`, <= 64).
Between passes (numpy): per-record counts (sum of `seg` over the 128 rows of the tile) and their
exclusive cumulative sum, the offset of each record's first escape entry.
encode, pass 2 (parallel over tile rows): each record's escapes are written from its offset on in
increasing position p = r·64 + c; only row segments with `seg > 0` are scanned again.

decode (one parallel region over (tile row, chunk of records) items): per weight,
h = sign << 8 | ((b & 0x7F) + 8·(E_n − 15)) << 4 | lo in 16-bit arithmetic (the reference's formula,
bit for bit), then, unless lo_fill is given, the escapes of the item's records are patched in.

The per-weight loops keep values in 16 bits and index with uint64 (numba adds a negative-index
wraparound select to signed indices, which stops LLVM's vectorizer): they compile to AVX-512/AVX2
code with 16-bit lanes. Slicing arrays inside the kernels is avoided (each slice costs an atomic
reference count update shared by all threads).

Every byte of the outputs is written by the kernels (padding included), so outputs are allocated
with np.empty and handed to torch without a copy.
"""

import functools

import numpy as np
import torch
from numba import njit, prange

from .errors import EscapeCountError, EscapePositionError, InputError, TensorLayoutError
from .layout import E_HI, E_LO, REC_BYTES, TK, TN, TW, VIEW_BYTES, WIN, padded, tiles

_ROW_GROUP = 8  # rows per encode work item (keeps per-item scratch allocation negligible)
_DECODE_ITEMS = 64  # decode work items to aim for (tile rows x column chunks)
_U32 = np.uint64(TK // 2)  # uint64 loop bound: unsigned indices vectorize (see _encode_segment)


def check_bits(bits) -> None:
    """Raise InputError unless `bits` is a 2-D int16 torch tensor with N, K >= 1."""
    if not isinstance(bits, torch.Tensor):
        raise InputError(f"expected a torch.Tensor of int16 BF16 bit patterns, found {type(bits).__name__}")
    if bits.dtype != torch.int16:
        hint = " (use t.view(torch.int16) for a bfloat16 tensor)" if bits.dtype == torch.bfloat16 else ""
        raise InputError(f"expected dtype torch.int16 (BF16 bit patterns), found {bits.dtype}{hint}")
    if bits.dim() != 2:
        raise InputError(f"expected a 2-D matrix [N, K], found shape {tuple(bits.shape)}")
    n, k = bits.shape
    if n < 1 or k < 1:
        raise InputError(f"expected N >= 1 and K >= 1, found shape {tuple(bits.shape)}")


def _as_numpy(t: torch.Tensor) -> np.ndarray:
    """C-contiguous numpy view of a CPU tensor (a copy only when it is not contiguous or not on CPU)."""
    return t.detach().cpu().contiguous().numpy()


def _forced_exponents(exponents, n: int, n_pad: int) -> np.ndarray:
    if not isinstance(exponents, torch.Tensor):
        exponents = torch.as_tensor(exponents)
    if exponents.dtype.is_floating_point or exponents.dtype.is_complex or exponents.dtype == torch.bool:
        raise InputError(f"forced exponents must be integers, found dtype {exponents.dtype}")
    if exponents.dim() != 1 or exponents.shape[0] not in (n, n_pad):
        raise InputError(f"forced exponents must have shape [{n}] (or [{n_pad}]), found {tuple(exponents.shape)}")
    e = exponents.detach().cpu().to(torch.int64)
    if e.shape[0] > n and bool((e[n:] != E_LO).any()):
        raise InputError(f"forced exponents of padded rows {n}..{n_pad - 1} must be {E_LO}")
    e = e[:n]
    lo, hi = int(e.min()), int(e.max())
    if lo < E_LO or hi > E_HI:
        raise InputError(f"forced exponents must lie in [{E_LO}, {E_HI}], found values in [{lo}, {hi}]")
    return e.to(torch.int32).numpy()


# ---------------------------------------------------------------------------------------------
# kernels


@njit(cache=True, inline="always")
def _top_exponent(h, i0, k, ebuf, hist):
    """E_n of the row h[i0 : i0 + k] (uint16 patterns) per SPEC.md §3.
    Scratch: ebuf uint8 [>= k] (the row's exponent fields), hist uint32 [8 * 256]."""
    for i in range(np.uint64(k)):  # vectorizes
        ebuf[i] = np.uint8(h[i0 + i] >> np.uint16(7))
    hist[:] = 0
    k8 = np.uint64(k - (k & 7))
    # eight sub-histograms break the store-to-load chains of runs of equal exponents
    for i in range(np.uint64(0), k8, np.uint64(8)):
        for s in range(np.uint64(8)):
            hist[s * np.uint64(256) + np.uint64(ebuf[i + s])] += np.uint32(1)
    for i in range(k8, np.uint64(k)):
        hist[np.uint64(ebuf[i])] += np.uint32(1)
    for e in range(256):
        c = hist[e]
        for s in range(1, 8):
            c += hist[s * 256 + e]
        hist[e] = c
    # the window of E covers e in [E - 15, E] ⊂ [1, 254]: zeros/denormals (e = 0) and inf/NaN
    # (e = 255) never fall in a window with E in [16, 254], so they need no masking.
    w = np.int64(0)
    for e in range(E_LO - (WIN - 1), E_LO + 1):
        w += hist[e]
    best = w
    best_e = E_LO
    for top in range(E_LO + 1, E_HI + 1):
        w += np.int64(hist[top]) - np.int64(hist[top - WIN])
        if w > best:  # strictly greater: the lowest E wins ties
            best = w
            best_e = top
    return best_e


@njit(cache=True, inline="always")
def _encode_segment(h, i0, width, lo8, rec, v0, n0):
    """Codes of the 16-bit patterns h[i0 : i0 + width] (width <= 64) into one record row: 64 view
    bytes at rec[v0:] and 32 nibble bytes at rec[n0:] (SPEC.md §5); columns past width are padding
    (code 0). Returns the number of escapes.

    The full-width path keeps every value in 16 bits and indexes with uint64 (numba adds no
    negative-index wraparound for unsigned indices), so LLVM vectorizes it with 16-bit lanes."""
    if width == TK:
        acc = np.uint16(0)  # a 16-bit counter keeps the reduction in 16-bit lanes too
        for j in range(_U32):
            h0 = h[i0 + j]
            h1 = h[i0 + j + _U32]
            # t = 8·e + (m >> 4) − 8·(E_n − 15) = 8·u + (m >> 4); in window iff 0 <= t < 128 (as E_n is
            # in [16, 254], that also means 1 <= e <= 254: no separate test for normal weights)
            t0 = np.uint16(np.uint16(np.uint16(h0 >> np.uint16(4)) & np.uint16(0x7FF)) - lo8)
            t1 = np.uint16(np.uint16(np.uint16(h1 >> np.uint16(4)) & np.uint16(0x7FF)) - lo8)
            in0 = t0 < np.uint16(128)
            in1 = t1 < np.uint16(128)
            b0 = np.uint16(h0 >> np.uint16(8)) & np.uint16(0x80) | t0
            b1 = np.uint16(h1 >> np.uint16(8)) & np.uint16(0x80) | t1
            rec[v0 + j] = np.uint8(b0) if in0 else np.uint8(0)
            rec[v0 + j + _U32] = np.uint8(b1) if in1 else np.uint8(0)
            l0 = np.uint8(h0 & np.uint16(0xF)) if in0 else np.uint8(0)
            l1 = np.uint8(h1 & np.uint16(0xF)) if in1 else np.uint8(0)
            rec[n0 + j] = np.uint8(l0 | np.uint8(l1 << np.uint8(4)))
            acc = np.uint16(acc + np.uint16(np.uint16(not in0) + np.uint16(not in1)))
        return np.int64(acc)
    else:
        esc = 0
        for j in range(TK // 2):
            l0 = 0
            l1 = 0
            b0 = 0
            b1 = 0
            if j < width:
                hh = np.int32(h[i0 + np.uint64(j)])
                t = ((hh >> 4) & 0x7FF) - np.int32(lo8)
                if np.uint32(t) < np.uint32(128):
                    b0 = ((hh >> 8) & 0x80) | t
                    l0 = hh & 0xF
                else:
                    esc += 1
            if j + TK // 2 < width:
                hh = np.int32(h[i0 + np.uint64(j + TK // 2)])
                t = ((hh >> 4) & 0x7FF) - np.int32(lo8)
                if np.uint32(t) < np.uint32(128):
                    b1 = ((hh >> 8) & 0x80) | t
                    l1 = hh & 0xF
                else:
                    esc += 1
            rec[v0 + np.uint64(j)] = np.uint8(b0)
            rec[v0 + np.uint64(j + TK // 2)] = np.uint8(b1)
            rec[n0 + np.uint64(j)] = np.uint8(l0 | (l1 << 4))
    return esc


@njit(parallel=True, cache=True, nogil=True)
def _encode_pass1(bits, n, k, forced, use_forced, records, exps, seg):
    """Per row: E_n, codes into the records, escapes per 64-column segment. Padded rows too.
    bits: uint16 [N*K] flat; records: uint8 [NB*KB*REC_BYTES] flat; seg: uint8 [N_PAD*KB] flat."""
    n_pad = exps.shape[0]
    kb_n = (k + TK - 1) // TK
    groups = (n_pad + _ROW_GROUP - 1) // _ROW_GROUP
    for g in prange(groups):
        hist = np.empty(8 * 256, dtype=np.uint32)
        ebuf = np.empty(k, dtype=np.uint8)
        for row_i in range(g * _ROW_GROUP, min((g + 1) * _ROW_GROUP, n_pad)):
            nb = row_i // TN
            r = row_i - nb * TN
            if row_i >= n:  # padded row: E_n = 16, code 0, no escapes
                exps[row_i] = E_LO
                for kb in range(kb_n):
                    base = (nb * kb_n + kb) * REC_BYTES
                    records[base + r * TK : base + (r + 1) * TK] = 0
                    records[base + VIEW_BYTES + r * (TK // 2) : base + VIEW_BYTES + (r + 1) * (TK // 2)] = 0
                    seg[row_i * kb_n + kb] = 0
                continue
            if use_forced:
                top = np.int64(forced[row_i])
            else:
                top = _top_exponent(bits, np.uint64(row_i * k), k, ebuf, hist)
            exps[row_i] = top
            lo8 = np.uint16((top - (WIN - 1)) * 8)
            for kb in range(kb_n):
                col0 = kb * TK
                base = (nb * kb_n + kb) * REC_BYTES
                seg[row_i * kb_n + kb] = _encode_segment(
                    bits,
                    np.uint64(row_i * k + col0),
                    min(TK, k - col0),
                    lo8,
                    records,
                    np.uint64(base + r * TK),
                    np.uint64(base + VIEW_BYTES + r * (TK // 2)),
                )


@njit(parallel=True, cache=True, nogil=True)
def _encode_pass2(bits, exps, seg, offsets, escapes):
    """Escape entries (p, h) of each record, from its offset on, in increasing p."""
    n, k = bits.shape
    nb_n = (n + TN - 1) // TN
    kb_n = seg.shape[1]
    for nb in prange(nb_n):
        for kb in range(kb_n):
            o = offsets[nb * kb_n + kb]
            col0 = kb * TK
            width = min(TK, k - col0)
            for r in range(min(TN, n - nb * TN)):
                row_i = nb * TN + r
                if seg[row_i, kb] == 0:
                    continue
                lo8 = np.int32((np.int32(exps[row_i]) - (WIN - 1)) * 8)
                for c in range(width):
                    h = bits[row_i, col0 + c]
                    t = ((np.int32(h) >> 4) & 0x7FF) - lo8
                    if np.uint32(t) >= np.uint32(128):
                        escapes[o, 0] = np.int16(r * TK + c)
                        escapes[o, 1] = np.int16(h)
                        o += 1


@njit(parallel=True, cache=True, nogil=True)
def _decode_kernel(records, exps, counts, offsets, escapes, n, k, kc, lo_mask, lo_fill, patch, out):
    """Codes -> 16-bit patterns, then (if patch) each escape's bits at its position.

    One work item = one tile row nb and a chunk of kc records (columns); it writes out[rows of nb,
    columns of the chunk] and patches the escapes of exactly those records, so items never touch the
    same bytes and one parallel region does everything. The low nibble is (nibble & lo_mask) | lo_fill:
    (0xF, 0) decodes, (0, fill) gives the 8-bit view. uint64 indices and 16-bit values: the inner
    loop vectorizes (see _encode_segment). Returns the number of escape entries outside [0, 8192) or
    in padding (skipped; the caller raises).
    records: uint8 [NB*KB*REC_BYTES] flat; out: uint16 [N*K] flat."""
    nb_n, kb_n = counts.shape
    chunks = (kb_n + kc - 1) // kc
    m = np.uint16(lo_mask)
    f = np.uint16(lo_fill)
    bad = np.zeros(nb_n * chunks, dtype=np.int64)
    for item in prange(nb_n * chunks):
        nb = item // chunks
        kb0 = (item - nb * chunks) * kc
        kb1 = min(kb0 + kc, kb_n)
        for r in range(min(TN, n - nb * TN)):
            row_i = nb * TN + r
            # (b & 0x7F) + 8·(E_n − 15) = 8·e + (m >> 4), wrapping in 16 bits like the reference's
            # int32 -> int16 cast (exponents outside [16, 254] decode to the same bits as there)
            add = np.uint16(((np.int32(exps[row_i]) - (WIN - 1)) * 8) & 0xFFFF)
            for kb in range(kb0, kb1):
                col0 = kb * TK
                width = min(TK, k - col0)
                base = (nb * kb_n + kb) * REC_BYTES
                v0 = np.uint64(base + r * TK)
                n0 = np.uint64(base + VIEW_BYTES + r * (TK // 2))
                o0 = np.uint64(row_i * k + col0)
                if width == TK:
                    for j in range(_U32):
                        b0 = np.uint16(records[v0 + j])
                        b1 = np.uint16(records[v0 + j + _U32])
                        q = np.uint16(records[n0 + j])
                        l0 = np.uint16(q & m) | f
                        l1 = np.uint16(np.uint16(q >> np.uint16(4)) & m) | f
                        h0 = np.uint16(np.uint16(b0 & np.uint16(0x80)) << np.uint16(8)) | np.uint16(
                            np.uint16(np.uint16(b0 & np.uint16(0x7F)) + add) << np.uint16(4)
                        ) | l0
                        h1 = np.uint16(np.uint16(b1 & np.uint16(0x80)) << np.uint16(8)) | np.uint16(
                            np.uint16(np.uint16(b1 & np.uint16(0x7F)) + add) << np.uint16(4)
                        ) | l1
                        out[o0 + j] = np.uint16(h0)
                        out[o0 + j + _U32] = np.uint16(h1)
                else:
                    for c in range(width):
                        b = np.int32(records[v0 + np.uint64(c)])
                        q = np.int32(records[n0 + np.uint64(c % (TK // 2))])
                        lo = (((q >> (4 * (c // (TK // 2)))) & 0xF) & np.int32(lo_mask)) | np.int32(lo_fill)
                        h = ((b & 0x80) << 8) | ((((b & 0x7F) + np.int32(add)) << 4) & 0xFFFF) | lo
                        out[o0 + np.uint64(c)] = np.uint16(h)
        if patch:
            bad_here = 0
            for kb in range(kb0, kb1):
                o = offsets[nb * kb_n + kb]
                for i in range(o, o + counts[nb, kb]):
                    p = np.int64(escapes[i, 0])
                    row_i = nb * TN + (p >> 6)
                    col = kb * TK + (p & (TK - 1))
                    if p < 0 or p >= TW or row_i >= n or col >= k:
                        bad_here += 1
                        continue
                    out[row_i * k + col] = np.uint16(escapes[i, 1])
            bad[item] = bad_here
    return bad.sum()


# ---------------------------------------------------------------------------------------------
# public API


def _keeps_torch_threads(fn):
    """numba's first parallel call starts its OpenMP layer, which resets the process-wide thread count that
    torch also uses (a `torch.set_num_threads(1)` made before loading a W12 model would silently become
    the core count): restore torch's setting after every call."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        n = torch.get_num_threads()
        try:
            return fn(*args, **kwargs)
        finally:
            if torch.get_num_threads() != n:
                torch.set_num_threads(n)
    return wrapper


@_keeps_torch_threads
def encode(bits: torch.Tensor, exponents: torch.Tensor | None = None):
    """bits: int16 [N, K] BF16 patterns. Returns (records u8 [NB,KB,12288], exponents u8 [N_PAD],
    counts i32 [NB,KB], escapes i16 [nnz,2]), byte-identical to `reference.encode`.
    `exponents` forces E_n (values in [16, 254], shape [N] or [N_PAD])."""
    check_bits(bits)
    n, k = bits.shape
    nb, kb = tiles(n, k)
    n_pad, _ = padded(n, k)
    h = _as_numpy(bits).view(np.uint16)
    if exponents is None:
        forced = np.zeros(1, dtype=np.int32)
        use_forced = False
    else:
        forced = _forced_exponents(exponents, n, n_pad)
        use_forced = True

    records = np.empty((nb, kb, REC_BYTES), dtype=np.uint8)
    exps = np.empty(n_pad, dtype=np.uint8)
    seg = np.empty((n_pad, kb), dtype=np.uint8)
    _encode_pass1(h.reshape(-1), n, k, forced, use_forced, records.reshape(-1), exps, seg.reshape(-1))

    counts = seg.reshape(nb, TN, kb).sum(axis=1, dtype=np.int32)
    offsets = np.zeros(nb * kb + 1, dtype=np.int64)
    np.cumsum(counts.reshape(-1), out=offsets[1:])
    nnz = int(offsets[-1])
    escapes = np.empty((nnz, 2), dtype=np.int16)
    if nnz:
        _encode_pass2(h, exps, seg, offsets, escapes)
    return (
        torch.from_numpy(records),
        torch.from_numpy(exps),
        torch.from_numpy(counts),
        torch.from_numpy(escapes),
    )


def _check_decode_inputs(records, exponents, counts, escapes, n: int, k: int):
    n, k = int(n), int(k)
    if n < 1 or k < 1:
        raise InputError(f"expected n >= 1 and k >= 1, found n={n}, k={k}")
    nb, kb = tiles(n, k)
    n_pad, _ = padded(n, k)
    want = {
        "records": (records, torch.uint8, (nb, kb, REC_BYTES)),
        "exponents": (exponents, torch.uint8, (n_pad,)),
        "counts": (counts, torch.int32, (nb, kb)),
    }
    for name, (t, dtype, shape) in want.items():
        if not isinstance(t, torch.Tensor) or t.dtype != dtype or tuple(t.shape) != shape:
            found = f"{t.dtype} {tuple(t.shape)}" if isinstance(t, torch.Tensor) else type(t).__name__
            raise TensorLayoutError(f"{name}: expected {dtype} {shape} for a [{n}, {k}] matrix, found {found}")
    if not isinstance(escapes, torch.Tensor) or escapes.dtype != torch.int16 or escapes.dim() != 2 or escapes.shape[1] != 2:
        found = f"{escapes.dtype} {tuple(escapes.shape)}" if isinstance(escapes, torch.Tensor) else type(escapes).__name__
        raise TensorLayoutError(f"escapes: expected int16 [nnz, 2], found {found}")
    c = _as_numpy(counts).reshape(-1)
    if c.size and int(c.min()) < 0:
        raise EscapeCountError(f"escape counts: expected values >= 0, found {int(c.min())}")
    offsets = np.zeros(c.size + 1, dtype=np.int64)
    np.cumsum(c, out=offsets[1:], dtype=np.int64)
    if int(offsets[-1]) != escapes.shape[0]:
        raise EscapeCountError(f"escapes: counts add up to {int(offsets[-1])} entries, found {escapes.shape[0]}")
    return n, k, offsets


@_keeps_torch_threads
def decode(records, exponents, counts, escapes, n: int, k: int, lo_fill: int | None = None):
    """Back to int16 [N, K] BF16 patterns, identical to `reference.decode`. lo_fill=8 gives the 8-bit
    view (SPEC.md §4), whose escapes keep their code value."""
    n, k, offsets = _check_decode_inputs(records, exponents, counts, escapes, n, k)
    if lo_fill is not None and not 0 <= int(lo_fill) <= 15:
        raise InputError(f"lo_fill must be a nibble value in [0, 15], found {lo_fill}")
    rec = _as_numpy(records)
    exps = _as_numpy(exponents)
    nb, kb = tiles(n, k)
    kc = min(kb, max(1, -(-nb * kb // _DECODE_ITEMS)))  # records per work item
    out = np.empty((n, k), dtype=np.uint16)
    mask, fill = (0xF, 0) if lo_fill is None else (0, int(lo_fill))
    patch = lo_fill is None and escapes.shape[0] > 0
    bad = _decode_kernel(rec.reshape(-1), exps, _as_numpy(counts), offsets, _as_numpy(escapes), n, k, kc, mask, fill,
                         patch, out.reshape(-1))
    if bad:
        raise EscapePositionError(
            f"escapes: expected positions in [0, {TW}) outside padded rows/columns of a [{n}, {k}] "
            f"matrix, found {bad} entries that are not"
        )
    return torch.from_numpy(out.view(np.int16))
