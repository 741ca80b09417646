"""Reference W12 encoder and decoder in plain torch (SPEC.md §3–6).

Written to be obviously correct, not fast: every step is one line of the spec. The fast numba codec
(`formats.fast`) must produce identical bytes; tests compare the two.
"""

import torch

from .layout import E_HI, E_LO, NIB_BYTES, REC_BYTES, TK, TN, TW, VIEW_BYTES, WIN, padded, tiles


def split_fields(h: torch.Tensor):
    """h: int32 holding 16-bit patterns -> (s, e, m) as in SPEC.md §1."""
    return h >> 15, (h >> 7) & 0xFF, h & 0x7F


def top_exponents(h: torch.Tensor) -> torch.Tensor:
    """E_n = lowest E in [16, 254] maximising #normal weights with E−15 ≤ e ≤ E (SPEC.md §3)."""
    n = h.shape[0]
    _, e, _ = split_fields(h)
    normal = (e >= 1) & (e <= 254)
    hist = torch.zeros(n, 256, dtype=torch.int64)
    hist.scatter_add_(1, e.long(), normal.long())
    cum = torch.cat([torch.zeros(n, 1, dtype=torch.int64), hist.cumsum(1)], dim=1)  # cum[:, j] = Σ_{e<j}
    cand = torch.arange(E_LO, E_HI + 1)
    count = cum[:, cand + 1] - cum[:, cand + 1 - WIN]  # count_n(E) for E in [16, 254]
    return (cand[count.argmax(dim=1)]).to(torch.int32)  # argmax returns the first (lowest) maximum


def encode(bits: torch.Tensor, exponents: torch.Tensor | None = None):
    """bits: int16 [N, K] BF16 patterns. Returns (records u8 [NB,KB,12288], exponents u8 [N_PAD],
    counts i32 [NB,KB], escapes i16 [nnz,2]). `exponents` forces E_n (tests: every window position)."""
    n, k = bits.shape
    nb, kb = tiles(n, k)
    n_pad, k_pad = padded(n, k)
    h = bits.to(torch.int32) & 0xFFFF
    s, e, m = split_fields(h)
    top = top_exponents(h) if exponents is None else exponents.to(torch.int32)
    u = e - (top[:, None] - (WIN - 1))
    in_window = (e >= 1) & (e <= 254) & (u >= 0) & (u <= WIN - 1)
    b = torch.where(in_window, (s << 7) | (u << 3) | (m >> 4), 0)
    lo = torch.where(in_window, m & 0xF, 0)

    b_pad = torch.zeros(n_pad, k_pad, dtype=torch.int32)
    lo_pad = torch.zeros(n_pad, k_pad, dtype=torch.int32)
    b_pad[:n, :k], lo_pad[:n, :k] = b, lo
    view = b_pad.view(nb, TN, kb, TK).permute(0, 2, 1, 3).reshape(nb, kb, VIEW_BYTES)
    lo_t = lo_pad.view(nb, TN, kb, 2, TK // 2)
    nib = (lo_t[:, :, :, 0] | (lo_t[:, :, :, 1] << 4)).permute(0, 2, 1, 3).reshape(nb, kb, NIB_BYTES)
    records = torch.cat([view, nib], dim=2).to(torch.uint8)

    exps = torch.full((n_pad,), E_LO, dtype=torch.uint8)
    exps[:n] = top.to(torch.uint8)

    rows, cols = torch.nonzero(~in_window, as_tuple=True)
    rec = (rows // TN) * kb + cols // TK
    pos = (rows % TN) * TK + cols % TK
    order = torch.argsort(rec * TW + pos)
    counts = torch.bincount(rec, minlength=nb * kb).to(torch.int32).view(nb, kb)
    escapes = torch.stack([pos[order], h[rows, cols][order]], dim=1).to(torch.int32)
    escapes = torch.where(escapes > 32767, escapes - 65536, escapes).to(torch.int16)
    return records, exps, counts, escapes


def unpack_codes(records: torch.Tensor, n_pad: int, k_pad: int):
    """records u8 [NB,KB,12288] -> (b, lo) as int32 [N_PAD, K_PAD]."""
    nb, kb = records.shape[:2]
    r = records.to(torch.int32)
    b = r[:, :, :VIEW_BYTES].view(nb, kb, TN, TK).permute(0, 2, 1, 3).reshape(n_pad, k_pad)
    nib = r[:, :, VIEW_BYTES:REC_BYTES].view(nb, kb, TN, TK // 2)
    lo = torch.cat([nib & 0xF, nib >> 4], dim=3).permute(0, 2, 1, 3).reshape(n_pad, k_pad)
    return b, lo


def escape_coordinates(counts: torch.Tensor, escapes: torch.Tensor):
    """(rows, cols) int64 of every escape entry, from the per-record counts (SPEC.md §6)."""
    nb, kb = counts.shape
    rec = torch.repeat_interleave(torch.arange(nb * kb), counts.reshape(-1).long())
    pos = escapes[:, 0].long()
    return (rec // kb) * TN + pos // TK, (rec % kb) * TK + pos % TK


def decode(records, exponents, counts, escapes, n: int, k: int, lo_fill: int | None = None):
    """Back to int16 [N, K] BF16 patterns. lo_fill=8 gives the 8-bit view (SPEC.md §4), whose
    escapes keep their code value. Inputs must have passed W12Matrix.validate (no bounds checks here)."""
    n_pad, k_pad = padded(n, k)
    b, lo = unpack_codes(records, n_pad, k_pad)
    if lo_fill is not None:
        lo = torch.full_like(lo, lo_fill)
    top = exponents.to(torch.int32)[:, None]
    h = ((b >> 7) << 15) | ((top - (WIN - 1) + ((b >> 3) & 0xF)) << 7) | ((b & 7) << 4) | lo
    if lo_fill is None:
        rows, cols = escape_coordinates(counts, escapes)
        h[rows, cols] = escapes[:, 1].to(torch.int32) & 0xFFFF
    h = h[:n, :k]
    return torch.where(h > 32767, h - 65536, h).to(torch.int16)


def scaled_decode(b: torch.Tensor, lo: torch.Tensor) -> torch.Tensor:
    """The kernels' decode: BF16 bits of w·2^(127−E_n) = ((b<<8)&0x8000)|(b<<4)|0x3800|lo (SPEC.md §4)."""
    h = ((b << 8) & 0x8000) | (b << 4) | 0x3800 | lo
    return torch.where(h > 32767, h - 65536, h).to(torch.int16)
