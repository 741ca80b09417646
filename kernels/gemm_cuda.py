"""Host side of the CUDA W12 GEMMs (kernels/w12_gemv.cu: skinny, ws, stream): checks, config choice, launch.

    if gemm_cuda.usable(x, records, exponents, n):
        y = gemm_cuda.launch(x, records, exponents, n, escapes, esc_offsets, esc_cols)   # bf16 [M, n]

Same contract and same tensors as kernels/gemm.py's Triton launcher (records u8 [NB, KB, 12288],
exponents u8 [N_PAD], escapes i16 [nnz, 2], esc_offsets/esc_cols from `gemm.prepare_escapes`; esc_cols
carries this kernel's per-tile escape lists after the Triton kernel's columns, see `tile_escapes`).  The
CUDA kernels cover Hopper, the shapes `kernel_for` names (M ≤ 128), K a multiple of 64 and 16-byte-aligned
X rows; everything else runs the Triton kernel.  Deterministic: warp partials (and split-K CTA partials) are added in a fixed order.
"""

import ctypes
import functools
import os
from dataclasses import dataclass

import torch

from . import cuda_build


@dataclass(frozen=True)
class CudaConfig:
    nt: int  # X rows per CTA / 8: 1, 2, 4 or 8
    warps: int  # 4 or 8 warps per CTA (each takes every `warps`-th record of the CTA's 16 channels)
    unroll: int  # records per pipeline stage per warp, 1 or 2 (two stages in flight; 4 never won the sweep)
    split: int = 1  # CTAs along K (deterministic: the last CTA of a tile adds the partials in order)
    l2: int = 0  # % of the weight lines loaded with L2 priority evict_normal, the rest evict_first (w12_gemv.cu
    #              weight_policy: 100 wins on the large matrices after an L2 flush that leaves dirty lines)
    xreg: bool = False  # nt = 4, unroll 1 only: the next records' X words held in registers (w12_gemv.cu Group's
    #                     XPF; with 4 warps a CTA per SM fewer than the plain form, with 8 the same)


# Programmatic dependent launch (PDL) of the skinny kernel (w12_gemv.cu pdl_wait): it may start while the previous
# kernel in the stream finishes and reads X only once that kernel is complete.  Measured in a decode-step graph
# (bench/decode_step.py, 2026-12-01-pdl-h200-s7.md): it pays only when the kernels around it use PDL too, so by
# default it follows inductor's switch (TORCHINDUCTOR_ENABLE_PDL=1); W12_PDL=0/1 overrides.
PDL = os.environ.get("W12_PDL", os.environ.get("TORCHINDUCTOR_ENABLE_PDL", "0")) != "0"

@dataclass(frozen=True)
class WsConfig:
    """The warp-specialized kernel (w12_gemm_ws_kernel: 128 channels × 8·nt X rows per CTA; a producer warp streams
    records and X tiles into a shared-memory ring with bulk copies, two warpgroups decode and run wgmma)."""
    nt: int  # X rows per CTA / 8: 2, 4, 6, 8 or 16 (WS_NTS)
    split: int = 1  # CTAs along K
    evict_first: bool = True  # the record copies with L2 evict_first (w12_gemv.cu ws_produce; False: no hint)
    tail: int = 0  # > 1 (split 1, one M tile): the record rows that would leave the last wave part-empty run as `tail`
    #                CTAs each, launched last (w12_gemv.cu's tail split; tail_rows says which)


@dataclass(frozen=True)
class StreamConfig:
    """The stream kernel (w12_gemv.cu's w12_stream_kernel, M ≤ 32): ctas_per_sm · SMs CTAs, each streaming an equal
    contiguous range of the matrix's records and their X tiles through a ring of `stages` slots (aligned: NB · S CTAs,
    each range inside one record row, stream_ctas); a row split between CTAs is added in a fixed order (the same bits
    every run).  Two CTAs per SM fit while their rings do (228 KB of shared
    memory per SM: a slot is 12 KB of record and 1, 2 or 4 KB of X tile at up to 8, 16 or 32 rows; stream_fits says
    whether they do: the default's 6 stages fit two CTAs per SM up to 16 rows, not at 17–32 for W12)."""
    ctas_per_sm: int = 2
    stages: int = 6
    evict_first: bool = False  # the record copies with L2 evict_first (False: no hint)
    warps: int = 8  # consumer warps: 8 of 16 channels each, or 4 of 32 (half the X tile's shared-memory reads)
    aligned: bool = False  # NB · S CTAs instead, each in one record row (stream_ctas): no segment ends mid-loop


# (N, K, M bucket 1 / 8 / 16 / 32, view) -> StreamConfig: where the stream kernel measured ≥ 1.5 % faster than the
# kernel that took the call before it on the H200 (bench/stream_kernel.py writes the entries; W12_STREAM_TABLE=path.py
# loads them).  Session 46's H200 sweep (2026-12-06-stream-kernel-aligned-h200-s46-call7.md, the table emptied first):
# only the view at 17–32 rows on these two shapes, with each CTA's range in one record row (aligned, +2.8 / +2.9 %);
# W12 lost on every shape (the LM heads by ~20 %: 151936×5120 360.7 µs against the ws kernel's 295.6).  Sessions 42
# and 46 had measured wins on H100s only (W12 on 10240×5120 and 51200×5120, the view on six shapes,
# 2026-12-05-stream-kernel-h100-s42-call2.md, 2026-12-06-stream-kernel-aligned-h100-s46-call1.md); on the H200 those
# W12 entries ran 7–11 % slower than the ws kernel (M = 32 W12 geomean 1.059 with them, 1.092 without: -s46-call6/7).
STREAM_TABLE: dict = {
    (6144, 4096, 32, True): StreamConfig(ctas_per_sm=2, stages=6, evict_first=True, warps=4, aligned=True),
    (4096, 14336, 32, True): StreamConfig(ctas_per_sm=2, stages=6, evict_first=True, warps=4, aligned=True),
}


# Per SM on the H100 / H200: 228 KB of shared memory (1 KB of it reserved per CTA).
SM_SMEM, CTA_SMEM_RESERVED = 233472, 1024


def stream_smem(m: int, view: bool, stages: int) -> int:
    """w12_gemv.cu's stream_smem: 128 (alignment) + stages · (slot + two mbarriers) + (W12) 8 tiles' escape staging;
    a slot is the X tile (8·nt rows × 128 B) and the record's bytes (12 KB; the view 8 KB); a tile's staging is 16
    entries × (8 + 4 · 8·nt + 4) bytes, and (W12) the next row's escape offsets, 8 tiles × 2 int32."""
    nt = _nt_for(m)
    slot = 8 * nt * 128 + (8192 if view else 12288)
    return 128 + stages * (slot + 16) + (0 if view else 8 * 16 * (8 + 32 * nt + 4) + 64)


def stream_fits(cfg: "StreamConfig", m: int, view: bool) -> bool:
    """True when cfg.ctas_per_sm CTAs of the stream kernel at m rows are resident on one SM together (else the grid,
    ctas_per_sm · SMs CTAs, runs in more than one wave: still right, not the config it names): their shared memory fits
    and they are within the launch bounds' CTAs per SM (stream_min_ctas: 2 with 8 consumer warps or at nt = 4, else 3),
    which is what the registers were fitted to."""
    bound = 2 if cfg.warps == 8 or _nt_for(m) == 4 else 3
    return (cfg.ctas_per_sm <= bound
            and cfg.ctas_per_sm * (stream_smem(m, view, cfg.stages) + CTA_SMEM_RESERVED) <= SM_SMEM)


def stream_ctas(cfg: StreamConfig, nb: int, kb: int, sms: int) -> int:
    """The stream kernel's grid for NB × KB records on `sms` SMs: ctas_per_sm · sms CTAs, or, aligned, NB · S with
    S = max(1, min(KB, ⌊ctas_per_sm · sms / NB⌋)). The kernel gives CTA p records ⌊p·T/P⌋ .. ⌊(p+1)·T/P⌋ − 1 of the
    T = NB·KB; with P = NB·S that is ⌊p·KB/S⌋, so CTA r·S + j takes records ⌊j·KB/S⌋ .. ⌊(j+1)·KB/S⌋ − 1 of row r: every
    range lies in one row. Why: with equal ranges the CTAs whose range spans two rows end last, for the partial store,
    fence and ticket they take mid-loop while the whole wave streams (2026-12-06-stream-trace-segment-ends-h100-s45)."""
    if not cfg.aligned:
        return cfg.ctas_per_sm * sms
    return nb * max(1, min(kb, cfg.ctas_per_sm * sms // nb))


def stream_key(m: int, n: int, k: int, view: bool = False) -> tuple:
    """STREAM_TABLE's key of a call with m ≤ 32 rows: the M bucket is 1 for one row (a decode step;
    bench/stream_kernel.py measures it on its own, so that a win there does not dispatch M = 2–8 unmeasured), else the
    8, 16 or 32 rows of its tile."""
    return (n, k, 1 if m == 1 else 8 * _nt_for(m), view)

WS_NTS = (2, 4, 6, 8, 16)

# (N, K, M bucket) -> WsConfig: where the ws kernel measured at least 3 % faster than the other kernels
# (bench/ws_configs.py, 2026-12-02-ws-configs-h200-s15.md: 36 of the 50; re-run after the 4-op decode, -s17.md: 37).
# Session 18 (2026-12-03-ws-configs-h200-s18.md): every split 1–8 instead of 1/2/4/8 — a split that makes the grid
# one full wave (3, 5, 6: e.g. 10240×5120 at M = 64, 80 tiles × 3 = 240 CTAs ≤ 264 slots instead of 320) is up to 1.55×
# faster; 38 of the 50; the M = 128 entries measured with the nt = 16 kernel taking records in pairs.
# Session 26 (2026-12-03-ab-ws-l2-h200-s26.md): the record copies with L2 evict_first, 3–9 % faster at M = 32–64
# except on the LM heads, which lose 2–3 % at M = 16–32 and keep the copies without a hint there (evict_first=False).
# With them the ws kernel now also takes 4096×14336 at M = 17–32 (1.08× against the xs kernel, since removed;
# bench/ws_configs.py --ms 32, 2026-12-03-ws-configs-m32-h200-s26.md).  Not 4096² (ws 1.03× skinny for W12, but its view then fell 1.25 → 1.07×
# cuBLAS in the full run, 2026-12-03-kernels-cuda-h200-s26-call10.md: the table is shared by W12 and view).
# M = 33–48: the nt = 6 kernel (one 48-row tile) on every shape, 1.04–1.16× the best nt = 8 config
# (2026-12-03-ws-configs-m48-h200-s26.md).
# M = 49–128 re-swept with the evict_first copies (2026-12-03-ws-configs-m64-m128-h200-s26.md): 4096² at M = 64
# joins (ws 8/4 24.4 µs against skinny 29.0); 6144×4096 M = 64 split 4 → 5, 10240×5120 M = 128 split 1 → 3
# (2–6 % each); the other 16 entries kept their configs.  (4096² M = 128 two nt-8 tiles → one nt-16 tile was 2 %
# faster in the sweep, equal for W12 and 3 % slower for the view in the full run: not adopted.)
# Session 32, with split 2 as a cluster pair (2026-12-04-ws-configs-m32-64-cluster-h200-s32.md): 51200×5120 takes
# split 2 at M = 48 (143.2 → 139.3 µs against split 3) and 64 (153.2 → 146.9 against split 1), confirmed in the full
# run (141.9 → 138.3, 151.9 → 147.1; the view 103.2 → 98.0 at 48).  The sweep also put the two LM heads' 64-row tile
# ahead at M = 48 (128256×4096 258.3 → 238.5, 151936×5120 396.7 → 339.1), but the full run did not confirm it
# (241.1 → 239.7 and 361.9 → 377.5; their view 5 % slower): not adopted.
# Session 33, the tail split (WsConfig.tail; bench/ws_configs.py --ms 128,64, 2026-12-04-ws-configs-tail-h200-s33.md):
# 51200×5120's 400 record rows are three waves of 132 and 4 rows, which took a fourth wave of whole-K CTAs; cut into
# 4 CTAs each they take 216.2 → 198.2 µs at M = 128, and at M = 64 (two CTAs per SM: 264 + 136 rows, 2 CTAs each)
# 148.6 → 144.3 against split 2.  Where the last wave is nearly full the cut only adds partials (151936×5120 at 128:
# 131 rows left, 537.9 → 573.3; 28672×4096 96.8 → 108.4), so it is a per-shape table choice.
# Session 33: 51200×5120 at M = 9–16 back to the skinny kernel, whose 4-warp builds now copy the escapes' X in the
# prologue (2/4/1/1 118.6 µs against ws 2/3 123.3; bench/m1_configs.py --m 16,
# 2026-12-04-ab-skinny-early-x-4warps-h200-s33.md).
# The split that w12_gemv.cu runs as a cluster pair, in both kernels (launch_ws / launch_t; finish_tile_cluster /
# finish_pair: partials added in shared memory, no ws buffer or tickets); clusters of 3–8 measured much slower
# (2026-12-04-ab-ws-cluster-splitk-h200-s32.md).
# Session 64 (an H200; bench/ws_configs.py --ms 32,128 after session 39's ws kernel, then bench/kernels.py with the
# changes against the tables before them on the same card, 2026-12-07-ws-configs-m32-m128-h200-s64-call1.md,
# 2026-12-07-kernels-cuda-h200-s64-call1.md / -call2-base.md): 51200×5120 at M = 32 split 3 → split 1 with the tail cut
# in 4 (131.4 → 122.9 µs), 4096×14336 at M = 32 split 4 → 8 (41.1 → 40.4), and 5120×8192 at M = 32 to the skinny
# kernel's nt = 2 two-M-tile build (TABLE; 33.6 → 32.0, session 63's sweep). Not adopted: the sweep's evict_first
# copies on the LM heads at M = 32 (it compares ws with the skinny kernel only): 128256×4096 210.0 → 213.4 µs,
# 151936×5120 298.1 → 305.7 in the full run. The M = 128 sweep moved nothing (its one entry is the table's).
CLUSTER_SPLIT = 2
WS_TABLE: dict = {
    (6144, 4096, 48): WsConfig(nt=6, split=5),
    (6144, 4096, 64): WsConfig(nt=8, split=5),
    (6144, 4096, 128): WsConfig(nt=16, split=2),
    (4096, 4096, 48): WsConfig(nt=6, split=4),
    (4096, 4096, 64): WsConfig(nt=8, split=4),
    (4096, 4096, 128): WsConfig(nt=8, split=4),
    (28672, 4096, 32): WsConfig(nt=4, split=1),
    (28672, 4096, 48): WsConfig(nt=6, split=1),
    (28672, 4096, 64): WsConfig(nt=8, split=1),
    (28672, 4096, 128): WsConfig(nt=16, split=1),
    (4096, 14336, 32): WsConfig(nt=4, split=8),
    (4096, 14336, 48): WsConfig(nt=6, split=8),
    (4096, 14336, 64): WsConfig(nt=8, split=8),
    (4096, 14336, 128): WsConfig(nt=16, split=4),
    (128256, 4096, 16): WsConfig(nt=2, split=1, evict_first=False),
    (128256, 4096, 32): WsConfig(nt=4, split=1, evict_first=False),
    (128256, 4096, 48): WsConfig(nt=6, split=1),
    (128256, 4096, 64): WsConfig(nt=8, split=1),
    (128256, 4096, 128): WsConfig(nt=16, split=1),
    (10240, 5120, 32): WsConfig(nt=4, split=3),
    (10240, 5120, 48): WsConfig(nt=6, split=3),
    (10240, 5120, 64): WsConfig(nt=8, split=3),
    (10240, 5120, 128): WsConfig(nt=16, split=3),
    (5120, 8192, 48): WsConfig(nt=6, split=6),
    (5120, 8192, 64): WsConfig(nt=8, split=6),
    (5120, 8192, 128): WsConfig(nt=16, split=3),
    (51200, 5120, 32): WsConfig(nt=4, split=1, tail=4),
    (51200, 5120, 48): WsConfig(nt=6, split=2),
    (51200, 5120, 64): WsConfig(nt=8, split=1, tail=2),
    (51200, 5120, 128): WsConfig(nt=16, split=1, tail=4),
    (5120, 25600, 32): WsConfig(nt=4, split=6),
    (5120, 25600, 48): WsConfig(nt=6, split=6),
    (5120, 25600, 64): WsConfig(nt=8, split=6),
    (5120, 25600, 128): WsConfig(nt=16, split=3),
    (151936, 5120, 16): WsConfig(nt=2, split=1, evict_first=False),
    (151936, 5120, 32): WsConfig(nt=4, split=1, evict_first=False),
    (151936, 5120, 48): WsConfig(nt=6, split=1),
    (151936, 5120, 64): WsConfig(nt=8, split=1),
    (151936, 5120, 128): WsConfig(nt=16, split=1),
}


M_BUCKETS = (16, 32, 48, 64, 128)


def m_bucket(m: int) -> int | None:
    """The WS_TABLE bucket of M: the smallest measured M ≥ m (None outside 9–128)."""
    return next((b for b in M_BUCKETS if m <= b), None) if m > 8 else None


SKINNY_MAX_N = 65535 * 16  # the skinny grid's y dimension (≤ 65535) holds 8 CTAs of 16 channels per record row


def kernel_for(m: int, n: int, k: int, view: bool = False) -> str | None:
    """Which kernel takes Y[m, n] = X·Wᵀ on the H200: "stream" where STREAM_TABLE holds a measured config (up to 32
    rows), "ws" where WS_TABLE holds a measured config (39 of the 50
    (shape, M bucket) pairs of 9–128 of bench/kernels.py's shapes), then "skinny" where the skinny TABLE measured
    that shape at that M (those shapes' other buckets: M ≤ 8, M = 9–16 below N = 100000, 6144×4096, 4096² and
    5120×8192 at M = 17–32); None above M = 128 (decode + cuBLAS, or the Triton kernel).

    Shapes outside the tables (another model's widths) by the tables' pattern, measured on 14 shapes of Llama-3.1-70B,
    Qwen2.5-7B, Llama-2-7B and SmolLM2-135M (bench/unseen_shapes.py): the skinny kernel up to M = 8, at 9–16 below
    N = 51200, at 17–32 below 4 M weights and at 33–64 below 1 M; the ws kernel with ws_rule_config elsewhere.
    - At M = 17–128 the ws kernel was 1.1–2.2× the skinny / tensor-core kernel that took those calls before
      (2026-12-04-unseen-shapes-h200-s27.md; the tensor-core kernel, "wgmma", was removed in session 28).
    - SmolLM2's widths, where the ws kernel's grid is a few CTAs: at 17–32 the skinny kernel ran 1.05–1.8× the ws
      kernel's speed on its four shapes, at 33–64 1.14–1.64× on the three below 1 M weights, while 3072×576 ran
      1.22–1.43× faster on the ws kernel (2026-12-04-unseen-shapes-h200-s28.md).  (The ops decode + cuBLAS most of
      these calls instead: prefers_decode.)"""
    if m <= 32 and stream_key(m, n, k, view) in STREAM_TABLE:
        return "stream"
    if (n, k, m_bucket(m)) in WS_TABLE:
        return "ws"
    if m > 128:
        return None
    if n > SKINNY_MAX_N:  # wider than the skinny grid: the ws kernel from 9 rows, the Triton kernel below
        return "ws" if m > 8 else None
    if m <= 8 or (m <= 64 and (n, k, 8 * _nt_for(m), False) in TABLE):
        return "skinny"
    if m <= 16:
        return "ws" if n >= 51200 else "skinny"
    if m <= 64 and n * k < (4 << 20 if m <= 32 else 1 << 20):
        return "skinny"
    return "ws"


def prefers_decode(m: int, n: int, k: int, view: bool = False) -> bool:
    """True where the op should decode W and run cuBLAS (as it does above ops.LARGE_M rows) although a kernel takes
    the call: small matrices (below 4 M weights) at more than 32 rows (the 8-bit view, whose kernels are faster: more
    than 48), where the skinny kernel's 64-row tile and the ws kernel's few CTAs cost more than decoding W once.
    Measured on SmolLM2-135M's four shapes (0.3–1.8 M weights; bench/unseen_shapes.py,
    2026-12-04-unseen-shapes-h200-s28-call3.md and -call4.md): W12 decode + cuBLAS 0.62–0.69× cuBLAS BF16 at every M,
    the kernels 0.53–0.69× at M = 40–64 and 0.34–0.51× at 96–128 (at 33–40 about even); the view's decode + cuBLAS
    0.70–0.77×, its kernels 0.69–0.78× at 40–48, 0.63–0.69× at 64 and 0.39–0.56× at 96–128.  Qwen2.5-7B's 3584²
    (12.8 M) stays on the ws kernel (W12 0.63–0.76× at 40–64 against decode's 0.54–0.62×, even at 96–128).  The
    table shapes (≥ 16 M weights) never decode here."""
    return m > (48 if view else 32) and n * k < 4 << 20


def ws_rule_config(m: int, n: int, k: int) -> WsConfig:
    """The ws config for a shape outside WS_TABLE, by the table's pattern: the smallest nt that holds M; split K
    while the grid fits one wave (2 CTAs per SM up to nt = 8, 1 at nt = 16; 132 SMs) and each split keeps ≥ 16
    records, at most 8 splits; grids of ≥ 200 tiles are not split, and at nt ≥ 8 take the tail split (4 CTAs per row
    past the last full wave) when at most a quarter of a wave is left over: Qwen2.5-7B's 37888×3584 (296 rows) at
    M = 128 123.2 → 107.6 µs and at M = 64 90.0 → 74.2, where a larger remainder lost (28672×4096, 92 of 132 rows:
    96.8 → 108.4; bench/ws_configs.py --unseen, 2026-12-04-ws-configs-tail-unseen-h200-s33.md).  The LM-head sizes
    (N ≥ 100 000) at M ≤ 32 copy records without the evict_first hint, as their table entries do.  On the table's
    shapes it matched 32 of the 41 entries; where it differed it measured 0.99–1.06× the table's time
    (bench/unseen_shapes.py part 1, 2026-12-04-unseen-shapes-h200-s27.md)."""
    nt = next(v for v in WS_NTS if m <= 8 * v)
    tiles, kb = (n + 127) // 128 * ((m + 8 * nt - 1) // (8 * nt)), k // 64
    slots = 132 if nt == 16 else 264
    split = 1 if tiles >= 200 else max(1, min(8, slots // tiles, kb // 16))
    # the tail split where the grid leaves at most a quarter of a wave over (measured at nt = 8 and 16 only)
    tail = 4 if split == 1 and tiles >= 200 and nt >= 8 and 0 < tiles % slots <= slots // 4 else 0
    return WsConfig(nt, split, evict_first=not (n >= 100_000 and m <= 32), tail=tail)


def _nt_for(m: int) -> int:
    for nt in (1, 2, 4):
        if m <= 8 * nt:
            return nt
    return 8


# (N, K, M bucket, view) -> CudaConfig: the fastest candidate of `python bench/kernels.py --cuda-sweep`
# on the H200, clean-flush timing (M ≤ 8: 2026-12-01 at 2b9a964, `--sweep-ms 1`, 2026-12-01-kernels-cuda-h200-s5.md;
# M 9-64: 2026-12-02 at aaf9ff8, `--sweep-ms 16,32,64`, 2026-12-02-kernels-cuda-sweep-h200-s10.txt);
# other shapes: pick_config's rule.  A re-sweep of M ≤ 8 after the one-warp epilogue (2026-12-02-kernels-cuda-h200-
# s13-sweep.md) was not adopted: no better by do_bench, and the Transformers decode was measured with these.
# Re-swept after the 4-op decode (e88f001; `--sweep-ms 1,16`, 2026-12-02-kernels-cuda-h200-s17-sweep.md): adopted for
# the view at M ≤ 8 (5120×8192 and 5120×25600 9–12 % faster by do_bench) and for M 9–16; W12 at M ≤ 8 kept.
# Session 19: W12 at M ≤ 8 re-swept under do_bench's own (dirty-L2) flush with the weight loads' L2 priority as a
# field (bench/m1_configs.py, 2026-12-03-m1-configs-h200-s19.md): l2 = 100 on the two LM heads and 51200×5120
# (1.5–3.8 % faster), every other shape kept its config.
# Session 22: the xreg form at nt = 4 against every kernel dispatched at 17–64 rows (bench/skinny_configs.py,
# 2026-12-03-skinny-configs*-h200-s22.md, 2026-12-03-ab-xreg-cap-h200-s22.md): 6144×4096 W12 and view at 17–32 rows
# (W12 28.4 → 26.3 µs at M = 32, view 22.8 → 19.8) and the 4096² view at 33–64 rows (27.9 → 22.3 at M = 64).
# Session 29: the view at M ≤ 8 swept the same way (bench/m1_configs.py --view, 2026-12-04-m1-configs-view-h200-s29.md):
# 8 warps on 4096×14336 (23.7 → 23.1 µs), and 8 warps with l2 = 100 on the two LM heads (128256×4096 135.9 → 131.6,
# 151936×5120 195.6 → 188.2); the other seven kept (m8_rule_config's view rule picks them too, but for 51200×5120's 8
# warps, 1 % slower).
# Session 52: 4096² W12 at 17–32 rows takes the xreg form with 4 warps (the table's 4/8/1/1 predates the load-pointer
# loop): at M = 32 19.0 against 20.0 µs on the H200 (cuBLAS 19.6; 2026-12-06-skinny-configs-wide-FAILED-h200-s52.md,
# call 4's rows), 20.0 against 21.9 on an H100 (2026-12-06-skinny-configs-m32-h100-s50-call6.md).
TABLE: dict = {
    (6144, 4096, 8, False): CudaConfig(1, 8, 1, 1),
    (6144, 4096, 8, True): CudaConfig(1, 8, 1, 1),
    (6144, 4096, 16, False): CudaConfig(2, 4, 1, 1),
    (6144, 4096, 16, True): CudaConfig(2, 8, 1, 1),
    (6144, 4096, 32, False): CudaConfig(4, 4, 1, 1, xreg=True),
    (6144, 4096, 32, True): CudaConfig(4, 4, 1, 1, xreg=True),
    (6144, 4096, 64, False): CudaConfig(4, 4, 1, 1),
    (6144, 4096, 64, True): CudaConfig(8, 4, 1, 1),
    (4096, 4096, 8, False): CudaConfig(1, 8, 2, 1),
    (4096, 4096, 8, True): CudaConfig(1, 8, 1, 1),
    (4096, 4096, 16, False): CudaConfig(2, 8, 1, 1),
    (4096, 4096, 16, True): CudaConfig(2, 8, 1, 1),
    (4096, 4096, 32, False): CudaConfig(4, 4, 1, 1, xreg=True),
    (4096, 4096, 32, True): CudaConfig(2, 4, 1, 1),
    (4096, 4096, 64, False): CudaConfig(4, 4, 1, 1),
    (4096, 4096, 64, True): CudaConfig(4, 4, 1, 1, xreg=True),
    (28672, 4096, 8, False): CudaConfig(1, 4, 1, 1),
    (28672, 4096, 8, True): CudaConfig(1, 8, 1, 1),
    (28672, 4096, 16, False): CudaConfig(2, 4, 1, 1),
    (28672, 4096, 16, True): CudaConfig(2, 4, 1, 1),
    (28672, 4096, 32, False): CudaConfig(4, 4, 1, 1),
    (28672, 4096, 32, True): CudaConfig(2, 4, 1, 1),
    (28672, 4096, 64, False): CudaConfig(4, 4, 1, 1),
    (28672, 4096, 64, True): CudaConfig(4, 4, 1, 1),
    (4096, 14336, 8, False): CudaConfig(1, 8, 2, 1),
    (4096, 14336, 8, True): CudaConfig(1, 8, 1, 1),
    (4096, 14336, 16, False): CudaConfig(2, 8, 1, 1),
    (4096, 14336, 16, True): CudaConfig(2, 8, 1, 1),
    (4096, 14336, 32, False): CudaConfig(4, 4, 1, 2),
    (4096, 14336, 32, True): CudaConfig(4, 8, 1, 1),
    (4096, 14336, 64, False): CudaConfig(4, 4, 1, 1),
    (4096, 14336, 64, True): CudaConfig(4, 8, 1, 1),
    (128256, 4096, 8, False): CudaConfig(1, 4, 1, 1, 100),
    (128256, 4096, 8, True): CudaConfig(1, 8, 1, 1, 100),
    (128256, 4096, 16, False): CudaConfig(2, 4, 1, 1),
    (128256, 4096, 16, True): CudaConfig(2, 4, 1, 1),
    (128256, 4096, 32, False): CudaConfig(4, 4, 1, 1),
    (128256, 4096, 32, True): CudaConfig(4, 4, 1, 1),
    (128256, 4096, 64, False): CudaConfig(4, 4, 1, 1),
    (128256, 4096, 64, True): CudaConfig(4, 4, 1, 1),
    (10240, 5120, 8, False): CudaConfig(1, 4, 1, 1),
    (10240, 5120, 8, True): CudaConfig(1, 4, 1, 1),
    (10240, 5120, 16, False): CudaConfig(2, 4, 1, 1),
    (10240, 5120, 16, True): CudaConfig(2, 4, 1, 1),
    (10240, 5120, 32, False): CudaConfig(4, 4, 1, 1),
    (10240, 5120, 32, True): CudaConfig(2, 4, 1, 1),
    (10240, 5120, 64, False): CudaConfig(4, 4, 1, 1),
    (10240, 5120, 64, True): CudaConfig(4, 4, 1, 1),
    (5120, 8192, 8, False): CudaConfig(1, 4, 1, 2),
    (5120, 8192, 8, True): CudaConfig(1, 8, 1, 1),
    (5120, 8192, 16, False): CudaConfig(2, 4, 1, 2),
    (5120, 8192, 16, True): CudaConfig(2, 8, 1, 1),
    (5120, 8192, 32, False): CudaConfig(2, 4, 1, 1),  # nt = 2, two M tiles (session 63 sweep, session 64 full run)
    (5120, 8192, 32, True): CudaConfig(2, 4, 1, 1),
    (5120, 8192, 64, False): CudaConfig(4, 4, 1, 1),
    (5120, 8192, 64, True): CudaConfig(4, 4, 1, 1),
    (51200, 5120, 8, False): CudaConfig(1, 4, 1, 1, 100),
    (51200, 5120, 8, True): CudaConfig(1, 4, 1, 1),
    (51200, 5120, 16, False): CudaConfig(2, 4, 1, 1),
    (51200, 5120, 16, True): CudaConfig(2, 4, 1, 1),
    (51200, 5120, 32, False): CudaConfig(4, 4, 1, 1),
    (51200, 5120, 32, True): CudaConfig(4, 4, 1, 1),
    (51200, 5120, 64, False): CudaConfig(4, 4, 1, 1),
    (51200, 5120, 64, True): CudaConfig(4, 4, 1, 1),
    (5120, 25600, 8, False): CudaConfig(1, 4, 1, 2),
    (5120, 25600, 8, True): CudaConfig(1, 8, 1, 1),
    (5120, 25600, 16, False): CudaConfig(2, 4, 1, 2),
    (5120, 25600, 16, True): CudaConfig(2, 4, 1, 2),
    (5120, 25600, 32, False): CudaConfig(4, 4, 1, 4),
    (5120, 25600, 32, True): CudaConfig(2, 4, 1, 1),
    (5120, 25600, 64, False): CudaConfig(4, 4, 1, 4),
    (5120, 25600, 64, True): CudaConfig(4, 4, 1, 1),
    (151936, 5120, 8, False): CudaConfig(1, 4, 2, 1, 100),
    (151936, 5120, 8, True): CudaConfig(1, 8, 1, 1, 100),
    (151936, 5120, 16, False): CudaConfig(2, 4, 1, 1),
    (151936, 5120, 16, True): CudaConfig(2, 4, 1, 1),
    (151936, 5120, 32, False): CudaConfig(4, 4, 1, 1),
    (151936, 5120, 32, True): CudaConfig(4, 4, 1, 1),
    (151936, 5120, 64, False): CudaConfig(4, 4, 1, 1),
    (151936, 5120, 64, True): CudaConfig(4, 4, 1, 1),
    (1024, 4096, 8, False): CudaConfig(1, 8, 1, 4),
    (1024, 4096, 8, True): CudaConfig(1, 8, 1, 4),
    (1024, 4096, 16, False): CudaConfig(1, 8, 2, 1),
    (1024, 4096, 16, True): CudaConfig(1, 8, 1, 1),
    (1024, 4096, 32, False): CudaConfig(2, 8, 2, 1),
    (1024, 4096, 32, True): CudaConfig(2, 8, 1, 1),
    (1024, 4096, 64, False): CudaConfig(4, 8, 1, 1),
    (1024, 4096, 64, True): CudaConfig(4, 8, 1, 1),
    (14336, 4096, 8, False): CudaConfig(1, 4, 1, 1),
    (14336, 4096, 8, True): CudaConfig(1, 4, 1, 1),
    (14336, 4096, 16, False): CudaConfig(2, 8, 1, 1),
    (14336, 4096, 16, True): CudaConfig(2, 8, 1, 1),
    (14336, 4096, 32, False): CudaConfig(4, 4, 1, 1),
    (14336, 4096, 32, True): CudaConfig(2, 4, 1, 1),
    (14336, 4096, 64, False): CudaConfig(4, 4, 1, 1),
    (14336, 4096, 64, True): CudaConfig(4, 4, 1, 1),
}


def _load_override():
    """W12_CUDA_TABLE=path.py (a `TABLE = {...}` written by bench/kernels.py --cuda-sweep), W12_WS_TABLE=path.py
    (a `WS_TABLE = {...}` written by bench/ws_configs.py) and W12_STREAM_TABLE=path.py (a `STREAM_TABLE = {...}` written
    by bench/stream_kernel.py) replace entries; an entry whose value is None removes the key (a WS_TABLE bucket handed
    to the skinny kernel: bench/skinny_configs.py --adopt-ws). A variable may name several files separated by
    os.pathsep (two sweeps' outputs): they apply in order, so a later file's entry wins."""
    for var, name, table in (("W12_CUDA_TABLE", "TABLE", TABLE), ("W12_WS_TABLE", "WS_TABLE", WS_TABLE),
                             ("W12_STREAM_TABLE", "STREAM_TABLE", STREAM_TABLE)):
        for path in filter(None, os.environ.get(var, "").split(os.pathsep)):
            scope = {"CudaConfig": CudaConfig, "WsConfig": WsConfig, "StreamConfig": StreamConfig}
            exec(compile(open(path).read(), path, "exec"), scope)  # a file this project's bench wrote
            for key, cfg in scope[name].items():
                if cfg is None:
                    table.pop(key, None)
                else:
                    table[key] = cfg


_load_override()


def m8_rule_config(n: int, k: int, view: bool = False) -> CudaConfig:
    """The skinny kernel's config at M ≤ 8 for a shape outside TABLE, by the size of its grid of 16-channel CTAs
    (c = N / 16) and the builds' CTAs per SM.
    W12 (8 warps: 2 with unroll 2, 3 with unroll 1; 4 warps: 7 with unroll 1):
      c ≤ 264 (one wave of 8 warps × unroll 2):  8 warps, 2 records per stage; split K (≤ 4) while the grid stays
                                                 within one wave and every split keeps ≥ 16 records
      c ≤ 396 (one wave of 8 warps × unroll 1):  8 warps (K < 16384), else 4 warps and split 2
      larger:                                    4 warps; 2 records per stage from K = 16384 (a warp's record chain
                                                 halves); L2 evict_normal from N = 50000 (CudaConfig.l2)
    It reproduces TABLE's W12 choice on 9 of its 12 shapes (5120×8192: 8/1/1 against 4/1/2, which measured the same;
    151936×5120: unroll 1 against 2, 2.5 % slower; 1024×4096: unroll 2 against 1).  On 14 other models' shapes it
    picks configs within 2 % of the best of 34 (bench/m1_configs.py --unseen, 2026-12-04-m1-configs-unseen-h200-s28.md),
    where the rule before it (8 warps below 1500 CTAs, split K below two CTAs per SM) lost up to 27 %: Llama-3.1-70B's
    8192² and 8192×28672 1.09 / 1.03× cuBLAS → 1.31 / 1.27×, Qwen2.5-7B's 3584² and 3584×18944 0.95 / 1.02× → 1.29 /
    1.32×.
    The 8-bit view (unroll 1; 8 warps: 4 CTAs per SM, 4 warps: 8):
      c ≤ 528 (one wave of 8 warps):             8 warps; split K as W12 does up to c = 264 (1024×4096's TABLE split 4;
                                                 at 3584² split 2 was 12 % slower)
      c ≤ 1056 (one wave of 4 warps):            4 warps
      larger:                                    8 warps if each warp keeps ≥ 8 records (K ≥ 4096), else 4
      L2 evict_normal once the view's bytes N·K reach 256 MiB (W12's N = 50000 at K ≈ 3584–5120, in bytes).
    Best or within 1.1 % of the best of 34 on 23 of 24 shapes (the 14 above and TABLE's ten; 576×1536: 7 % behind,
    a 7 µs launch); the rule before it: view geomean 1.598 on the 14 (bench/m1_configs.py --unseen --view,
    2026-12-04-m1-configs-view-h200-s29.md) against 1.647 for the best per shape: 10240×8192 1.73 → 1.98×, 3584²
    1.47 → 1.66×, 57344×8192 1.91 → 2.00×; this rule 1.641 (-rule.md)."""
    c, kb = (n + 127) // 128 * 8, k // 64
    split = max(1, min(4, 264 // c, kb // 16))  # 1 from c = 133 on
    if view:
        warps = 8 if c <= 528 or (c > 1056 and kb >= 64) else 4
        return CudaConfig(1, warps, 1, split, 100 if n * k >= 1 << 28 else 0)
    if c <= 264:
        return CudaConfig(1, 8, 2, split)
    if c <= 396:
        return CudaConfig(1, 8, 1, 1) if k < 16384 else CudaConfig(1, 4, 1, 2)
    return CudaConfig(1, 4, 2 if k >= 16384 else 1, 1, 100 if n >= 50000 else 0)


def pick_config(m: int, n: int, k: int, view: bool = False) -> CudaConfig:
    nt = _nt_for(m)
    hit = TABLE.get((n, k, 8 * nt, view))
    if hit is not None:
        return hit
    if nt == 1:
        return m8_rule_config(n, k, view)
    # the sweep's pattern: one record per pipeline stage; 8 warps per CTA unless the grid has ≥ ~1500 CTAs;
    # split K until there are ≥ 2 CTAs per SM (132 SMs), each warp keeping ≥ 2 records
    ctas = (n + 127) // 128 * 8 * ((m + 8 * nt - 1) // (8 * nt))
    warps = 4 if ctas >= 1500 else 8
    split, kb = 1, k // 64
    while split < 4 and ctas * split < 264 and kb // (2 * split) >= 2 * warps:
        split *= 2
    return CudaConfig(nt, warps, 1, split)


def dispatched_config(m: int, n: int, k: int, view: bool = False) -> CudaConfig | WsConfig | StreamConfig:
    """The kernel and config that `launch` runs for Y[m, n] = X·Wᵀ when it is given none (kernel_for's choice)."""
    kind = kernel_for(m, n, k, view)
    if kind is None:
        raise ValueError(f"no CUDA W12 kernel takes M = {m} rows × N = {n} channels (they cover M ≤ 128, and below 9 "
                         f"rows N ≤ {SKINNY_MAX_N}): check gemm_cuda.usable first")
    if kind == "stream":
        return STREAM_TABLE[stream_key(m, n, k, view)]
    if kind == "ws":
        return WS_TABLE.get((n, k, m_bucket(m))) or ws_rule_config(m, n, k)
    return pick_config(m, n, k, view)


def _even(v: int) -> int:
    return v + (v & 1)


def tile_escapes(rec_of_entry: torch.Tensor, escapes: torch.Tensor, nb: int, kb: int) -> torch.Tensor:
    """Load time: the escape lists of the CUDA kernel's tiles (16 channels of a record row) as one int32
    tensor [toff (NB·8·KB + 1) | pad to even | tent (2·nnz)].  `rec_of_entry` (int64 [nnz]) is the record
    nb·KB + kb of each entry of `escapes` (SPEC.md §6 order).  Entries are ordered by (tile, kb) and keep
    their §6 order inside (so each channel's escapes stay in list order); toff[c·KB + kb] is the first entry
    of tile c's record kb; an entry is (row in tile << 24 | column in K, h & 0xFFFF)."""
    dev = escapes.device
    pos = escapes[:, 0].to(torch.int64) & 0xFFFF
    row, nbi, kbi = pos >> 6, rec_of_entry // kb, rec_of_entry % kb
    key = (nbi * 8 + row // 16) * kb + kbi
    order = torch.sort(key, stable=True).indices
    toff = torch.zeros(nb * 8 * kb + 1, dtype=torch.int64, device=dev)
    toff[1:] = torch.cumsum(torch.bincount(key, minlength=nb * 8 * kb), 0)
    ent = torch.stack([((row % 16) << 24) | (kbi * 64 + (pos & 63)), escapes[:, 1].to(torch.int64) & 0xFFFF], 1)
    pad = torch.zeros(_even(toff.numel()) - toff.numel(), dtype=torch.int64, device=dev)
    return torch.cat([toff, pad, ent[order].reshape(-1)]).to(torch.int32)


def _tile_escape_ptrs(esc_cols: torch.Tensor, nnz: int, nb: int, kb: int):
    """(toff, tent) pointers inside esc_cols = [columns (max(nnz, 1)) | pad | tile_escapes(...)]."""
    at = _even(max(nnz, 1))
    tent_at = at + _even(nb * 8 * kb + 1)
    if esc_cols.dtype != torch.int32 or esc_cols.numel() != tent_at + 2 * nnz:
        raise ValueError(f"esc_cols holds {esc_cols.numel()} int32 values, expected {tent_at + 2 * nnz} "
                         f"(nnz={nnz}, NB={nb}, KB={kb}): build it with w12.kernels.gemm.prepare_escapes")
    base = esc_cols.data_ptr()
    return _vp(base + 4 * at), _vp(base + 4 * tent_at)


def library():
    return cuda_build.load("w12_gemv")


def usable(x: torch.Tensor, records: torch.Tensor, exponents: torch.Tensor, n: int | None = None) -> bool:
    """True when a CUDA kernel can take this call (else use the Triton kernel); n = output channels
    (default: the records' padded N)."""
    m, k = x.shape
    n = records.shape[0] * 128 if n is None else n
    return (x.is_cuda and kernel_for(m, n, k) is not None and k % 64 == 0 and x.stride(1) == 1 and x.stride(0) % 8 == 0
            and x.data_ptr() % 16 == 0 and records.is_contiguous() and records.data_ptr() % 16 == 0
            and exponents.data_ptr() % 16 == 0 and library() is not None)


def launch(x, records, exponents, n, escapes=None, esc_offsets=None, esc_cols=None, *, view=False,
           config: CudaConfig | WsConfig | StreamConfig | None = None, trace: torch.Tensor | None = None):
    """Y = X · Wᵀ (view=True: the 8-bit view, escapes ignored). x bf16 [M, K]; returns bf16 [M, n].
    trace (a diagnostic, bench/trace_kernel.py; skinny configs with nt = 1): int64 [CTAs, 8] that the kernel's
    TRACE build fills with each CTA's (globaltimer ns, clock64) at entry, main-loop end and exit, and its SM."""
    m, k = x.shape
    nb, kb = records.shape[:2]
    assert records.dtype == torch.uint8 and records.shape[2] == 12288 and kb * 64 == k, "records vs K"
    assert nb * 128 >= n and exponents.numel() >= nb * 128, "records/exponents vs N"
    if view:
        toff = tent = _p(exponents)  # unused by the view kernel
    else:
        toff, tent = _tile_escape_ptrs(esc_cols, escapes.shape[0], nb, kb)
    cfg = config or dispatched_config(m, n, k, view)
    if trace is not None and not isinstance(cfg, CudaConfig):
        raise ValueError(f"trace: only the skinny kernel has a TRACE build, the config is {cfg}")
    y = torch.empty(m, n, dtype=torch.bfloat16, device=x.device)
    stream = _vp(torch.cuda.current_stream(x.device).cuda_stream)
    if isinstance(cfg, StreamConfig):
        if m > 32:
            raise ValueError(f"the stream kernel takes M ≤ 32 rows, got M = {m} (config {cfg})")
        ctas = stream_ctas(cfg, nb, kb, _sms(x.device))
        ws = torch.empty(ctas * 2 * 8 * 128 * _nt_for(m), dtype=torch.float32, device=x.device)  # partial rows' sums
        err = library().w12_stream(
            _p(x), m, x.stride(0), _p(records), _p(exponents), toff, tent, _p(y), y.stride(0), n, nb, kb, int(view),
            ctas, cfg.stages, cfg.warps, _p(ws), _p(_tickets(x.device, nb * 8)), stream, int(cfg.evict_first))
    elif isinstance(cfg, WsConfig):
        mpad = (m + 8 * cfg.nt - 1) // (8 * cfg.nt) * 8 * cfg.nt
        # no partials in global memory for a cluster pair (it adds them in shared memory)
        partials = 1 if cfg.split == CLUSTER_SPLIT else cfg.split
        tail = tail_rows(cfg, nb, mpad, x.device)
        if tail:  # partials for the tail rows only, a ticket per record row
            ws = torch.empty(tail * cfg.tail * 128 * 8 * cfg.nt, dtype=torch.float32, device=x.device)
            tk = _tickets(x.device, nb)
        else:
            ws, tk = _split_buffers(x.device, y, nb * mpad // (8 * cfg.nt), partials, 128 * 8 * cfg.nt)
        xq = torch.empty(mpad, k, dtype=torch.bfloat16, device=x.device)  # X in the ring's order (w12_x_ws_kernel)
        err = library().w12_gemm_ws(
            _p(x), m, x.stride(0), _p(records), _p(exponents), toff, tent, _p(y), y.stride(0), n, nb, kb,
            int(view), cfg.nt, cfg.split, _p(ws), _p(tk), _p(xq), stream, int(cfg.evict_first), nb - tail,
            cfg.tail if tail else 1)
    else:
        tiles = nb * 8 * ((m + 8 * cfg.nt - 1) // (8 * cfg.nt))
        partials = 1 if cfg.split == CLUSTER_SPLIT else cfg.split
        ws, tk = _split_buffers(x.device, y, tiles, partials, 16 * 8 * cfg.nt)
        if trace is None:
            err = library().w12_gemv(
                _p(x), m, x.stride(0), _p(records), _p(exponents), toff, tent, _p(y), y.stride(0), n, nb, kb,
                int(view), cfg.nt, cfg.warps, cfg.unroll, cfg.split, _p(ws), _p(tk), int(PDL), stream, cfg.l2,
                int(cfg.xreg))
        else:
            if cfg.nt != 1 or trace.dtype != torch.int64 or trace.numel() < 8 * tiles * cfg.split:
                raise ValueError(f"trace: int64 [{tiles * cfg.split}, 8] for a skinny config with nt = 1, got "
                                 f"{trace.dtype} {tuple(trace.shape)} for {cfg}")
            err = library().w12_gemv_trace(
                _p(x), m, x.stride(0), _p(records), _p(exponents), toff, tent, _p(y), y.stride(0), n, nb, kb,
                int(view), cfg.warps, cfg.unroll, cfg.split, _p(ws), _p(tk), _p(trace), stream, cfg.l2)
    if err != 0:
        raise RuntimeError(f"W12 CUDA launch failed: cudaError {err} (config {cfg}, M={m}, N={n}, K={k})")
    return y


def blocks_per_sm(cfg: CudaConfig, view: bool = False) -> int:
    """Resident CTAs per SM of the skinny kernel with `cfg` (CUDA's occupancy calculator: registers, shared
    memory); a launch of C CTAs runs in C / (blocks · SMs) waves."""
    blocks = ctypes.c_int(0)
    err = library().w12_gemv_occupancy(int(view), cfg.nt, cfg.warps, cfg.unroll, int(cfg.xreg), ctypes.byref(blocks))
    if err != 0:
        raise RuntimeError(f"w12_gemv_occupancy failed: cudaError {err} (config {cfg})")
    return blocks.value


def stream_blocks_per_sm(cfg: StreamConfig, m: int, view: bool = False) -> int:
    """Resident CTAs per SM of the stream kernel with `cfg` at m rows (CUDA's occupancy calculator: registers, shared
    memory; 0 where a CTA's ring is more shared memory than a CTA may have); stream_fits is the same rule on the CPU."""
    blocks = ctypes.c_int(0)
    err = library().w12_stream_occupancy(m, int(view), cfg.warps, cfg.stages, ctypes.byref(blocks))
    if err != 0:
        raise RuntimeError(f"w12_stream_occupancy failed: cudaError {err} (config {cfg}, M={m})")
    return blocks.value


def tail_rows(cfg: WsConfig, nb: int, mpad: int, device) -> int:
    """How many record rows a ws config's tail split cuts (0: none): with split 1 and one M tile, the rows past the
    last full wave (nb mod CTAs per wave: 1 per SM at nt = 16, else 2), each run as cfg.tail CTAs."""
    if cfg.tail <= 1 or cfg.split != 1 or mpad != 8 * cfg.nt:
        return 0
    return nb % (_sms(device) * (1 if cfg.nt >= 16 else 2))


@functools.lru_cache(maxsize=None)
def _sms(device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


def _split_buffers(device, y, tiles: int, split: int, tile_floats: int):
    """(ws, tickets) of a split-K launch (placeholders when split == 1)."""
    if split == 1:
        return y, y
    return torch.empty(tiles * split * tile_floats, dtype=torch.float32, device=device), _tickets(device, tiles)


_TICKETS: dict = {}


def _tickets(device, n: int) -> torch.Tensor:
    """Per-device int32 zeros, one per output tile; split-K kernels leave them at zero. Allocated on first
    use (do that outside CUDA-graph capture: call once eagerly); concurrent streams must not share them."""
    t = _TICKETS.get(device)
    if t is None or t.numel() < n:
        t = torch.zeros(max(n, 1 << 16), dtype=torch.int32, device=device)
        _TICKETS[device] = t
    return t


def _p(t: torch.Tensor):
    return _vp(t.data_ptr())


def _vp(v: int):
    return ctypes.c_void_p(v)
