"""Fused W12 GEMM: Y[M, N] = X[M, K] · Wᵀ with W stored as W12 records (SPEC.md), decoded in registers.

Contract
--------
* X: bf16 [M, K] (any M; tuned for 1..128), row stride free, unit column stride.
* W: W12 matrix of shape [N, K]: records u8 [NB, KB, 12288], exponents u8 [N_PAD], and the escapes,
  prepared once at load time by `prepare_escapes` into `esc_offsets` i32 [NB·KB + 1] (exclusive prefix
  sums of the per-record counts) and `esc_cols` i32 [nnz] (global column of each entry).
* Y: bf16 [M, N]; fp32 accumulation; one rounding to bf16 at the end.

How a program works (one program = 128 output channels = one row of records, a K range, BM rows of X)
------------------------------------------------------------------------------------------------------
    for each record (128 × 64 weights, 12 KB contiguous) of the program's K range:
        view bytes b [128, 32] ×2 halves, nibble bytes [128, 32] (low nibble: column j, high: j + 32)
        scaled decode  h' = ((b << 8) & 0x8000) | (b << 4) | 0x3800 | lo   (bf16 of w · 2^(127 − E_n))
        acc[128, BM] += h'[128, 32] · Xᵀ[32, BM]     (tl.dot, swap-AB; or FMA + row sum when M = 1)
    y = acc · 2^(E_n − 127)                          (exact: a power of two per row, built as E_n << 23)
    y += Σ_escapes x[m, k] · (w − w_code)            (exact sparse correction, SPEC.md §7, see below)

Escapes (W12 GEMM): added as an exact sparse correction after the scaled accumulation (SPEC.md §7): an
escape's code b = 0, lo = 0 decodes to w_code = 2^(E_n − 142); the program that owns a record range owns
the contiguous run of its escape entries and adds x·(w − w_code) in fp32, in real units, through a
one-hot [128, EB] × [EB, BM] product (fixed order, IEEE fp32).  Only the order of fp32 rounding differs
from a patched tile; the decoded weights are the exact BF16 ones.
8-bit view GEMM: lo = 8 for every weight, escapes are IGNORED (they keep their code value, as
SPEC.md §4 defines the view; `reference.decode(..., lo_fill=8)` gives the same weights).

Decode paths (constexpr USE_PTX): inline PTX on the GPU (prmt / shr / lop3 on 32-bit words holding two
bf16 lanes, about 2.6 integer operations per weight, masking of nibbles folded into the last lop3), and
a portable Triton integer decode that the CPU interpreter runs (the tests cover it; both are checked
against the reference on the GPU by bench/kernels.py).  UPCAST (interpreter): fp32 dots and an
integer round-to-nearest-even for the bf16 output, because the interpreter gets bf16 arithmetic wrong.

Split-K (deterministic): with SPLIT > 1 each program writes its fp32 partial (already scaled and
escape-corrected) to a workspace, then takes an atomic ticket for its output tile; the last-arriving
program sums the SPLIT partials in the fixed order 0..SPLIT−1, writes bf16 Y and resets the ticket to 0.
Same bits on every run whatever the arrival order.  The tickets are a per-device buffer of zeros kept
between calls (allocate it outside CUDA-graph capture: the first call does); two streams must not run
split-K launches of these ops concurrently.
"""

import os
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

TN, TK, REC = 128, 64, 12288
INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
USE_PTX = not INTERPRET  # default decode path (inline PTX on the GPU)

# --------------------------------------------------------------------------------------------------
# Decode
# --------------------------------------------------------------------------------------------------
# Two weights per 32-bit word (the CUDA kernels' decode4, kernels/w12_gemv.cu). b = four view bytes [b3 b2 b1 b0],
# n = their nibble bytes, lo in bits 3..0 (low half of the tile) or 7..4 (high half).
#   h = prmt(b, n, 0x1504) -> [b1 n1 b0 n0]     a 16-bit lane b·2^8 + n per weight
#   u = h >> 4                                  b's low 7 bits at 4..10 (bits 12..15 of the low lane: junk)
#   m = (h & keep) | (u & ~keep)                sign from h; lo from h (keep 0x800F800F) or u (0x80008000) (lop3)
#   w = (m & 0x87FF87FF) | 0x38003800           junk cleared, exponent bits 13..11 set                     (lop3)
# 8-bit view (lo = 8): t = prmt(b, 0, 0x9180) = [sgn b1, b1, sgn b0, b0] (sign-replicate mode),
#   w = ((t << 4) & 0x87F087F0) | 0x38083808
_PTX_BODY = """
    prmt.b32 h, $2, $3, 0x1504;
    shr.u32 u, h, 4;
    lop3.b32 m, h, keep, u, 0xE2;
    lop3.b32 $0, m, msk, kb, 0xEA;
    prmt.b32 h, $2, $3, 0x3726;
    shr.u32 u, h, 4;
    lop3.b32 m, h, keep, u, 0xE2;
    lop3.b32 $1, m, msk, kb, 0xEA;
"""
_PTX_DECLS = """
    .reg .b32 h, u, m, keep, msk, kb;
    mov.b32 msk, 0x87FF87FF;
    mov.b32 kb, 0x38003800;
"""
PTX_LO = tl.constexpr("{" + _PTX_DECLS + "    mov.b32 keep, 0x800F800F;\n" + _PTX_BODY + "}")
PTX_HI = tl.constexpr("{" + _PTX_DECLS + "    mov.b32 keep, 0x80008000;\n" + _PTX_BODY + "}")
PTX_VIEW = tl.constexpr("""{
    .reg .b32 t, z, msk, kv;
    mov.b32 z, 0;
    mov.b32 msk, 0x87F087F0;
    mov.b32 kv, 0x38083808;
    prmt.b32 t, $2, z, 0x9180;
    shl.b32 t, t, 4;
    lop3.b32 $0, t, msk, kv, 0xEA;
    prmt.b32 t, $2, z, 0xB3A2;
    shl.b32 t, t, 4;
    lop3.b32 $1, t, msk, kv, 0xEA;
}""")


@triton.jit
def _decode(v, nib, HALF: tl.constexpr, VIEW: tl.constexpr, USE_PTX: tl.constexpr):
    """uint8 view bytes v (+ uint8 nibble bytes) -> bf16 of w · 2^(127 − E_n)."""
    if USE_PTX:
        if VIEW:
            w = tl.inline_asm_elementwise(PTX_VIEW, "=r,=r,r", [v], dtype=tl.bfloat16, is_pure=True, pack=4)
        elif HALF == 0:
            w = tl.inline_asm_elementwise(PTX_LO, "=r,=r,r,r", [v, nib], dtype=tl.bfloat16, is_pure=True, pack=4)
        else:
            w = tl.inline_asm_elementwise(PTX_HI, "=r,=r,r,r", [v, nib], dtype=tl.bfloat16, is_pure=True, pack=4)
    else:
        b = v.to(tl.int32)
        if VIEW:
            lo = 8
        elif HALF == 0:
            lo = nib.to(tl.int32) & 0xF
        else:
            lo = nib.to(tl.int32) >> 4
        h = ((b << 8) & 0x8000) | (b << 4) | 0x3800 | lo
        w = h.to(tl.int16).to(tl.bfloat16, bitcast=True)
    return w


@triton.jit
def _to_bf16(x, UPCAST: tl.constexpr):
    """fp32 -> bf16, round to nearest even (integer trick in the interpreter, which truncates)."""
    if UPCAST:
        u = x.to(tl.uint32, bitcast=True)
        r = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
        return r.to(tl.uint16).to(tl.bfloat16, bitcast=True)
    else:
        return x.to(tl.bfloat16)


# --------------------------------------------------------------------------------------------------
# Kernel
# --------------------------------------------------------------------------------------------------
@triton.jit(do_not_specialize=["M", "N", "tiles_per_split"])
def _w12_gemm_kernel(
    # tensors
    x_ptr, rec_ptr, exp_ptr, esc_ptr, esc_off_ptr, esc_col_ptr, y_ptr, ws_ptr, tk_ptr,
    # sizes and strides
    M, N, K, KB, stride_xm, stride_ym, tiles_per_split,
    # meta
    BM: tl.constexpr, SPLIT_K: tl.constexpr, VIEW: tl.constexpr, USE_PTX: tl.constexpr,
    UPCAST: tl.constexpr, EB: tl.constexpr,
):
    # ---- which work: split s, row block nb, X rows [m0, m0 + BM)
    pid_s = tl.program_id(0)
    pid_n = tl.program_id(1)
    pid_m = tl.program_id(2)
    kb0 = pid_s * tiles_per_split
    kb1 = tl.minimum(kb0 + tiles_per_split, KB)
    rows = tl.arange(0, 128)
    cols = tl.arange(0, 32)
    offs_m = pid_m * BM + tl.arange(0, BM)
    m_mask = offs_m < M
    if not VIEW:  # escape run of this program's records, fetched early
        e_lo = tl.load(esc_off_ptr + pid_n * KB + kb0)
        e_hi = tl.load(esc_off_ptr + pid_n * KB + kb1)

    rec = rec_ptr + (pid_n * KB + kb0).to(tl.int64) * 12288
    v_ptrs = rec + rows[:, None] * 64 + cols[None, :]
    n_ptrs = rec + 8192 + rows[:, None] * 32 + cols[None, :]
    if BM == 1:
        acc = tl.zeros([128, 32], dtype=tl.float32)
        x_ptrs = x_ptr + pid_m * stride_xm + kb0 * 64 + cols
    else:
        acc = tl.zeros([128, BM], dtype=tl.float32)
        x_ptrs = x_ptr + offs_m[None, :] * stride_xm + (kb0 * 64 + cols)[:, None]
    kk = kb0 * 64 + cols

    # ---- main loop: one 12 KB record per step
    for kb in range(kb0, kb1):
        v0 = tl.load(v_ptrs)
        v1 = tl.load(v_ptrs + 32)
        if VIEW:
            nib = v0
        else:
            nib = tl.load(n_ptrs)
        w0 = _decode(v0, nib, 0, VIEW, USE_PTX)
        w1 = _decode(v1, nib, 1, VIEW, USE_PTX)
        if BM == 1:
            x0 = tl.load(x_ptrs, mask=kk < K, other=0.0).to(tl.float32)
            x1 = tl.load(x_ptrs + 32, mask=kk + 32 < K, other=0.0).to(tl.float32)
            acc += w0.to(tl.float32) * x0[None, :] + w1.to(tl.float32) * x1[None, :]
        else:
            x0 = tl.load(x_ptrs, mask=m_mask[None, :] & (kk[:, None] < K), other=0.0)
            x1 = tl.load(x_ptrs + 32, mask=m_mask[None, :] & (kk[:, None] + 32 < K), other=0.0)
            if UPCAST:
                acc = tl.dot(w0.to(tl.float32), x0.to(tl.float32), acc, input_precision="ieee")
                acc = tl.dot(w1.to(tl.float32), x1.to(tl.float32), acc, input_precision="ieee")
            else:
                acc = tl.dot(w0, x0, acc)
                acc = tl.dot(w1, x1, acc)
        v_ptrs += 12288
        n_ptrs += 12288
        x_ptrs += 64
        kk += 64

    # ---- epilogue: per-row factor 2^(E_n − 127) (fp32 bits E_n << 23), escape correction
    if BM == 1:
        acc = tl.sum(acc, axis=1, keep_dims=True)  # [128, 1]
    n_idx = pid_n * 128 + rows
    e_row = tl.load(exp_ptr + n_idx).to(tl.int32)
    scale = (e_row << 23).to(tl.float32, bitcast=True)
    out = acc * scale[:, None]
    if not VIEW:
        for c0 in range(e_lo, e_hi, EB):
            idx = c0 + tl.arange(0, EB)
            em = idx < e_hi
            p = tl.load(esc_ptr + 2 * idx, mask=em, other=0).to(tl.int32)
            hbits = tl.load(esc_ptr + 2 * idx + 1, mask=em, other=0)
            col = tl.load(esc_col_ptr + idx, mask=em, other=0)
            r = p >> 6
            w = hbits.to(tl.bfloat16, bitcast=True).to(tl.float32)
            er = tl.load(exp_ptr + pid_n * 128 + r).to(tl.int32)
            w_code = ((er - 15) << 23).to(tl.float32, bitcast=True)  # 2^(E_n − 142)
            d = tl.where(em, w - w_code, 0.0)
            a = tl.where(rows[:, None] == r[None, :], d[None, :], 0.0)  # [128, EB] one-hot · delta
            if BM == 1:
                xv = tl.load(x_ptr + pid_m * stride_xm + col, mask=em, other=0.0).to(tl.float32)
                out += tl.sum(a * xv[None, :], axis=1, keep_dims=True)
            else:
                xv = tl.load(x_ptr + offs_m[None, :] * stride_xm + col[:, None],
                             mask=em[:, None] & m_mask[None, :], other=0.0).to(tl.float32)
                out += tl.dot(a, xv, input_precision="ieee")

    # ---- store (direct, or split-K partial + last-arriving program reduces in fixed order)
    y_mask = (n_idx < N)[:, None] & m_mask[None, :]
    y_off = offs_m[None, :] * stride_ym + n_idx[:, None]
    if not SPLIT_K:
        tl.store(y_ptr + y_off, _to_bf16(out, UPCAST), mask=y_mask)
    else:
        w_off = offs_m[None, :] * N + n_idx[:, None]
        MN = M * N
        tl.store(ws_ptr + pid_s * MN + w_off, out, mask=y_mask)
        tl.debug_barrier()
        tile = pid_n * tl.num_programs(2) + pid_m
        ticket = tl.atomic_add(tk_ptr + tile, 1, sem="acq_rel", scope="gpu")
        n_split = tl.num_programs(0)
        if ticket == n_split - 1:
            tot = tl.load(ws_ptr + w_off, mask=y_mask, other=0.0, cache_modifier=".cg")
            for s in range(1, n_split):
                tot += tl.load(ws_ptr + s * MN + w_off, mask=y_mask, other=0.0, cache_modifier=".cg")
            tl.store(y_ptr + y_off, _to_bf16(tot, UPCAST), mask=y_mask)
            tl.atomic_xchg(tk_ptr + tile, 0, sem="relaxed", scope="gpu")


# --------------------------------------------------------------------------------------------------
# Configs: picked by shape from a table (no autotuning, no host sync)
# --------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Config:
    bm: int  # X rows per program (1: FMA + row-sum GEMV; ≥ 16: tl.dot)
    split: int  # K splits
    num_warps: int = 4
    num_stages: int = 2
    ptx: int = -1  # decode path: 1 inline PTX, 0 portable, -1 default (PTX for the GEMV, portable for tl.dot)


NUM_SMS = 132  # H200; only used to size split-K
# (N, K, M bucket, view) -> Config(bm, split, num_warps, num_stages, ptx): the fastest candidate of
# `python bench/kernels.py --sweep` on the H200 (2026-11-29, CUDA-graph timing); other shapes: pick_config's rule.
TABLE: dict = {
    (6144, 4096, 1, False): Config(1, 8, 4, 1, -1),
    (6144, 4096, 1, True): Config(1, 8, 8, 1, -1),
    (6144, 4096, 16, False): Config(16, 8, 4, 3, 1),
    (6144, 4096, 32, False): Config(32, 8, 4, 3, -1),
    (6144, 4096, 64, False): Config(64, 8, 4, 3, -1),
    (6144, 4096, 128, False): Config(64, 8, 4, 3, -1),
    (4096, 4096, 1, False): Config(1, 16, 4, 1, -1),
    (4096, 4096, 1, True): Config(1, 16, 8, 1, -1),
    (4096, 4096, 16, False): Config(16, 16, 4, 3, -1),
    (4096, 4096, 32, False): Config(32, 16, 4, 3, -1),
    (4096, 4096, 64, False): Config(64, 16, 4, 3, 1),
    (4096, 4096, 128, False): Config(64, 16, 4, 3, -1),
    (28672, 4096, 1, False): Config(1, 2, 4, 3, -1),
    (28672, 4096, 1, True): Config(1, 2, 8, 1, -1),
    (28672, 4096, 16, False): Config(16, 4, 4, 3, -1),
    (28672, 4096, 32, False): Config(32, 2, 4, 3, -1),
    (28672, 4096, 64, False): Config(64, 2, 4, 3, -1),
    (28672, 4096, 128, False): Config(128, 1, 4, 3, -1),
    (4096, 14336, 1, False): Config(1, 16, 4, 3, -1),
    (4096, 14336, 1, True): Config(1, 16, 8, 1, -1),
    (4096, 14336, 16, False): Config(16, 16, 4, 3, 1),
    (4096, 14336, 32, False): Config(32, 16, 4, 3, -1),
    (4096, 14336, 64, False): Config(64, 16, 4, 3, -1),
    (4096, 14336, 128, False): Config(64, 16, 4, 3, -1),
    (128256, 4096, 1, False): Config(1, 2, 4, 1, -1),
    (128256, 4096, 1, True): Config(1, 2, 4, 1, -1),
    (128256, 4096, 16, False): Config(16, 1, 4, 3, -1),
    (128256, 4096, 32, False): Config(32, 1, 4, 3, 1),
    (128256, 4096, 64, False): Config(64, 1, 4, 3, 1),
    (128256, 4096, 128, False): Config(128, 1, 4, 3, 1),
    (10240, 5120, 1, False): Config(1, 8, 4, 1, -1),
    (10240, 5120, 1, True): Config(1, 8, 4, 1, -1),
    (10240, 5120, 16, False): Config(16, 4, 4, 3, 1),
    (10240, 5120, 32, False): Config(32, 4, 4, 3, -1),
    (10240, 5120, 64, False): Config(64, 4, 4, 3, -1),
    (10240, 5120, 128, False): Config(64, 4, 4, 3, -1),
    (5120, 8192, 1, False): Config(1, 16, 4, 1, -1),
    (5120, 8192, 1, True): Config(1, 16, 4, 1, -1),
    (5120, 8192, 16, False): Config(16, 8, 4, 3, 1),
    (5120, 8192, 32, False): Config(32, 8, 4, 3, -1),
    (5120, 8192, 64, False): Config(64, 8, 4, 3, -1),
    (5120, 8192, 128, False): Config(64, 8, 4, 3, -1),
    (51200, 5120, 1, False): Config(1, 2, 4, 3, -1),
    (51200, 5120, 1, True): Config(1, 2, 8, 1, -1),
    (51200, 5120, 16, False): Config(16, 2, 4, 3, -1),
    (51200, 5120, 32, False): Config(32, 2, 4, 3, -1),
    (51200, 5120, 64, False): Config(64, 2, 4, 3, -1),
    (51200, 5120, 128, False): Config(128, 1, 4, 3, 1),
    (5120, 25600, 1, False): Config(1, 16, 4, 1, -1),
    (5120, 25600, 1, True): Config(1, 16, 4, 3, -1),
    (5120, 25600, 16, False): Config(16, 16, 4, 3, -1),
    (5120, 25600, 32, False): Config(32, 16, 4, 3, -1),
    (5120, 25600, 64, False): Config(64, 8, 4, 3, -1),
    (5120, 25600, 128, False): Config(64, 8, 4, 3, -1),
    (151936, 5120, 1, False): Config(1, 2, 4, 1, -1),
    (151936, 5120, 1, True): Config(1, 2, 4, 3, -1),
    (151936, 5120, 16, False): Config(16, 1, 4, 3, -1),
    (151936, 5120, 32, False): Config(32, 1, 4, 3, 1),
    (151936, 5120, 64, False): Config(64, 1, 4, 3, 1),
    (151936, 5120, 128, False): Config(128, 1, 4, 3, 1),
}


def _m_bucket(m: int) -> int:
    for b in (1, 16, 32, 64):
        if m <= b:
            return b
    return 128


def pick_config(m: int, n: int, k: int, view: bool = False) -> Config:
    mb_ = _m_bucket(m)
    hit = TABLE.get((n, k, mb_, view))
    if hit is not None:
        return hit
    nb, kb = triton.cdiv(n, TN), triton.cdiv(k, TK)
    bm = mb_
    progs = nb * triton.cdiv(m, bm)
    split = 1
    while progs * split < 2 * NUM_SMS and kb // (split * 2) >= 4:
        split *= 2
    return Config(bm=bm, split=split, num_warps=4 if bm <= 64 else 8, num_stages=2)


# --------------------------------------------------------------------------------------------------
# Host side
# --------------------------------------------------------------------------------------------------
def prepare_escapes(counts: torch.Tensor, escapes: torch.Tensor):
    """Load-time helper: (esc_offsets i32 [NB·KB + 1], esc_cols i32) from SPEC.md §6 data.

    esc_cols = [column in K of each entry (max(nnz, 1)) | pad to even | gemm_cuda.tile_escapes(...)]: the
    Triton kernel reads the columns, the CUDA kernel its per-tile lists."""
    from . import gemm_cuda

    nb, kb = counts.shape
    dev = counts.device
    c = counts.reshape(-1).to(torch.int64)
    offsets = torch.zeros(nb * kb + 1, dtype=torch.int64, device=dev)
    offsets[1:] = torch.cumsum(c, 0)
    rec = torch.repeat_interleave(torch.arange(nb * kb, device=dev), c)
    cols = (rec % kb) * TK + escapes[:, 0].to(torch.int64) % TK
    width = gemm_cuda._even(max(cols.numel(), 1))
    cols = torch.cat([cols, torch.zeros(width - cols.numel(), dtype=torch.int64, device=dev)])
    index = torch.cat([cols.to(torch.int32), gemm_cuda.tile_escapes(rec, escapes, nb, kb)])
    if dev.type == "cuda":  # the split-K ticket buffers live outside any CUDA-graph pool: make them now
        _tickets(dev, 1 << 16)
        gemm_cuda._tickets(dev, 1 << 16)
    return offsets.to(torch.int32), index


_TICKETS: dict = {}


def _tickets(device, n: int) -> torch.Tensor:
    t = _TICKETS.get(device)
    if t is None or t.numel() < n:
        t = torch.zeros(max(n, 1 << 16), dtype=torch.int32, device=device)
        _TICKETS[device] = t
    return t


def launch(x, records, exponents, n, escapes=None, esc_offsets=None, esc_cols=None, *, view=False,
           config: Config | None = None, use_ptx: bool | None = None, upcast: bool | None = None):
    """Check -> allocate -> launch. x bf16 [M, K]; returns bf16 [M, n]."""
    assert x.dim() == 2 and x.dtype == torch.bfloat16 and x.stride(1) == 1, "x: bf16 [M, K], unit column stride"
    m, k = x.shape
    nb, kb = records.shape[:2]
    assert records.dtype == torch.uint8 and records.shape[2] == REC and records.is_contiguous()
    assert nb == triton.cdiv(n, TN) and kb == triton.cdiv(k, TK), f"records {tuple(records.shape)} vs N={n}, K={k}"
    if not view:
        assert escapes is not None and esc_offsets is not None and esc_cols is not None
        if escapes.numel() == 0:
            escapes = torch.zeros(1, 2, dtype=torch.int16, device=x.device)
    else:
        escapes = esc_offsets = esc_cols = exponents  # unused placeholders
    cfg = config or pick_config(m, n, k, view)
    if use_ptx is None:
        use_ptx = USE_PTX and (cfg.ptx == 1 or (cfg.ptx == -1 and cfg.bm == 1))
    upcast = INTERPRET if upcast is None else upcast
    bm = cfg.bm
    grid_m = triton.cdiv(m, bm)
    tps = triton.cdiv(kb, max(1, min(cfg.split, kb)))
    split = triton.cdiv(kb, tps)  # every split non-empty
    y = torch.empty(m, n, dtype=torch.bfloat16, device=x.device)
    if split > 1:
        ws = torch.empty(split * m * n, dtype=torch.float32, device=x.device)
        tk = _tickets(x.device, nb * grid_m)
    else:
        ws = tk = y
    _w12_gemm_kernel[(split, nb, grid_m)](
        x, records, exponents, escapes, esc_offsets, esc_cols, y, ws, tk,
        m, n, k, kb, x.stride(0), y.stride(0), tps,
        BM=bm, SPLIT_K=split > 1, VIEW=view, USE_PTX=use_ptx, UPCAST=upcast, EB=16,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
    return y
