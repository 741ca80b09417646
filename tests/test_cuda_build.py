"""The CUDA kernels' host side on the CPU: config choice, the table override, and (where nvcc exists) that
every kernels/*.cu file compiles for sm_90a and exports its launchers. The kernels themselves are checked
against the reference on the GPU by bench/kernels.py and bench/lm_head.py."""

import ctypes
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from w12.kernels import cuda_build
from w12.kernels import gemm_cuda as gc

ROOT = Path(__file__).resolve().parents[1]


def test_table_hit_and_rule():
    assert gc.pick_config(1, 4096, 4096) == gc.TABLE[(4096, 4096, 8, False)]
    # W12 at M ≤ 8, not in the table (m8_rule_config): by the grid of 16-channel CTAs
    assert gc.pick_config(1, 512, 8192) == gc.CudaConfig(1, 8, 2, 4)  # 32 CTAs: split while one wave, ≥ 16 records
    assert gc.pick_config(1, 960, 576) == gc.CudaConfig(1, 8, 2, 1)  # 9 records: no split
    assert gc.pick_config(1, 3584, 3584) == gc.CudaConfig(1, 8, 2, 1)  # 224 CTAs: one wave at unroll 2
    assert gc.pick_config(8, 4608, 3584) == gc.CudaConfig(1, 8, 1, 1)  # 288: one wave at unroll 1
    assert gc.pick_config(1, 8192, 8192) == gc.CudaConfig(1, 4, 1, 1)
    assert gc.pick_config(1, 8192, 28672) == gc.CudaConfig(1, 4, 2, 1)  # long K: two records per stage
    big = gc.pick_config(3, 999 * 128, 4096)
    assert big == gc.CudaConfig(1, 4, 1, 1, 100)  # N ≥ 50000: L2 evict_normal
    # the view at M ≤ 8 (m8_rule_config(view=True)): 8 warps to one wave of them, then 4 warps to one wave of those,
    # then 8 warps where each keeps ≥ 8 records; K split as W12's for tiny grids; evict_normal from N·K = 2^28
    assert gc.pick_config(1, 512, 8192, view=True) == gc.CudaConfig(1, 8, 1, 4)  # 32 CTAs
    assert gc.pick_config(1, 3584, 3584, view=True) == gc.CudaConfig(1, 8, 1, 1)  # 224 CTAs: no split
    assert gc.pick_config(1, 10240, 8192, view=True) == gc.CudaConfig(1, 4, 1, 1)  # 640 CTAs
    assert gc.pick_config(1, 37888, 3584, view=True) == gc.CudaConfig(1, 4, 1, 1)  # 56 records: 7 per 8 warps
    assert gc.pick_config(1, 57344, 8192, view=True) == gc.CudaConfig(1, 8, 1, 1, 100)
    assert gc.pick_config(3, 999 * 128, 4096, view=True) == gc.CudaConfig(1, 8, 1, 1, 100)
    assert gc.pick_config(1, 152064, 3584, view=True) == gc.CudaConfig(1, 4, 1, 1, 100)
    assert gc.pick_config(1, 51200, 5120, view=True) == gc.TABLE[(51200, 5120, 8, True)]  # the table first
    assert gc.pick_config(40, 999 * 128, 4096).nt == 8


def test_kernel_choice(monkeypatch):
    """The stream kernel where STREAM_TABLE measured it faster, the ws kernel where WS_TABLE did, then the skinny
    kernel where its TABLE measured the shape at that M; shapes outside the tables by the rule (bench/unseen_shapes.py):
    the skinny kernel up to M = 8, at 9–16 below N = 51200, at 17–32 below 4 M weights and at 33–64 below 1 M, elsewhere
    the ws kernel with
    ws_rule_config (nt covers M; split fills one wave, ≥ 16 records each, ≤ 8); None above M = 128, where
    dispatched_config refuses."""
    kf = gc.kernel_for
    assert kf(1, 151936, 5120) == kf(8, 151936, 5120) == "skinny" and kf(9, 151936, 5120) == "ws"
    assert kf(128, 4096, 4096) == kf(17, 28672, 4096) == kf(128, 5120, 25600) == kf(64, 6144, 4096) == "ws"
    assert kf(32, 4096, 14336) == kf(64, 4096, 4096) == "ws"
    assert kf(32, 4096, 4096) == kf(16, 4096, 4096) == kf(16, 28672, 4096) == kf(16, 10240, 5120) == "skinny"
    assert kf(16, 51200, 5120) == "skinny" and kf(17, 51200, 5120) == kf(33, 51200, 5120) == "ws"
    assert kf(16, 6144, 4096, view=True) == "skinny" and kf(17, 6144, 4096, view=True) == "stream"
    assert kf(32, 4096, 14336, view=True) == "stream" and kf(33, 4096, 14336, view=True) == "ws"
    assert kf(32, 6144, 4096) == "skinny" and kf(32, 51200, 5120) == kf(32, 128256, 4096, view=True) == "ws"  # no entry
    assert gc.dispatched_config(32, 4096, 14336, view=True).aligned
    monkeypatch.setattr(gc, "STREAM_TABLE", {})
    assert kf(17, 6144, 4096, view=True) == "skinny" and kf(32, 4096, 14336, view=True) == "ws"
    monkeypatch.setattr(gc, "WS_TABLE", {})  # the skinny TABLE's measured buckets, then the rule
    assert kf(1, 151936, 5120) == kf(16, 6144, 4096) == kf(32, 4096, 4096) == kf(64, 51200, 5120) == "skinny"
    assert kf(128, 4096, 4096) == "ws" and kf(129, 4096, 4096) is None
    # shapes no table holds (Llama-3.1-70B, Qwen2.5-7B, SmolLM2-135M)
    assert kf(8, 57344, 8192) == kf(16, 8192, 8192) == kf(16, 37888, 3584) == "skinny"
    assert kf(9, 57344, 8192) == kf(16, 152064, 3584) == "ws"
    assert kf(32, 960, 576) == kf(32, 3072, 576) == kf(64, 576, 1536) == kf(33, 960, 576) == "skinny"
    assert kf(33, 3072, 576) == kf(64, 3072, 576) == kf(128, 576, 576) == "ws"
    assert kf(17, 3584, 3584) == kf(48, 10240, 8192) == kf(128, 8192, 28672) == "ws"
    rule = gc.ws_rule_config
    assert rule(48, 10240, 8192) == gc.WsConfig(6, 3) and rule(128, 8192, 28672) == gc.WsConfig(16, 2)
    assert rule(20, 152064, 3584) == gc.WsConfig(4, 1, evict_first=False) and rule(64, 57344, 8192) == gc.WsConfig(8, 1)
    assert rule(128, 576, 576) == gc.WsConfig(16, 1)  # 9 records: no split
    # the tail split where at most a quarter of a wave is left over: 296 rows = 2 · 132 + 32, and 296 = 264 + 32
    assert rule(128, 37888, 3584) == gc.WsConfig(16, 1, tail=4) and rule(64, 37888, 3584) == gc.WsConfig(8, 1, tail=4)
    assert rule(128, 57344, 8192) == gc.WsConfig(16, 1) and rule(32, 37888, 3584).tail == 0  # 52 of 132 left; nt 4
    assert gc.dispatched_config(40, 10240, 8192) == gc.WsConfig(6, 3)
    assert all(rule(m, n, k).split <= min(8, k // 64) and m <= 8 * rule(m, n, k).nt for m in (9, 17, 33, 64, 65, 128)
               for n in (128, 1000, 4096, 57344) for k in (64, 576, 4096, 65536))
    # small matrices at 33–128 rows (the view: 49–128): decode + cuBLAS (SmolLM2's widths), never the table shapes
    pd = gc.prefers_decode
    assert pd(33, 960, 576) and pd(128, 3072, 576) and pd(64, 576, 1536)
    assert not pd(32, 576, 576) and not pd(128, 3584, 3584) and not any(pd(128, n, k) for n, k, _, _ in gc.TABLE)
    assert pd(49, 960, 576, view=True) and not pd(48, 960, 576, view=True)  # the view's kernels hold out longer
    with pytest.raises(ValueError, match="M = 129"):
        gc.dispatched_config(129, 4096, 4096)


def test_tail_rows(monkeypatch):
    """The ws kernel's tail split cuts the record rows past the last full wave (132 SMs: one CTA per SM at nt = 16, two
    below), and only with split 1 and one M tile."""
    monkeypatch.setattr(gc, "_sms", lambda device: 132)
    W = gc.WsConfig
    assert gc.tail_rows(W(16, 1, tail=8), 400, 128, None) == 4  # 51200 channels: three full waves and 4 rows
    assert gc.tail_rows(W(8, 1, tail=4), 400, 64, None) == 400 - 264
    assert gc.tail_rows(W(16, 1, tail=3), 264, 128, None) == 0  # full waves: nothing to cut
    assert gc.tail_rows(W(16, 1), 400, 128, None) == 0  # no tail split
    assert gc.tail_rows(W(16, 2, tail=8), 400, 128, None) == 0  # split along K already
    assert gc.tail_rows(W(8, 1, tail=8), 400, 128, None) == 0  # two M tiles


def test_table_override(tmp_path, monkeypatch):
    p = tmp_path / "t.py"
    p.write_text("TABLE = {\n    (777, 64, 8, False): CudaConfig(1, 4, 2, 1),\n}\n")
    monkeypatch.setenv("W12_CUDA_TABLE", str(p))
    saved = dict(gc.TABLE)
    try:
        gc._load_override()
        assert gc.pick_config(1, 777, 64) == gc.CudaConfig(1, 4, 2, 1)
    finally:
        gc.TABLE.clear()
        gc.TABLE.update(saved)


def test_ws_table_dispatch(tmp_path, monkeypatch):
    """M maps to the smallest measured bucket that holds it; every measured ws entry is a compiled nt that holds its
    M bucket (two M tiles of nt 8 allowed at 128), split ≤ min(8, K / 64); a ws_table.py written by
    bench/ws_configs.py (W12_WS_TABLE) sends its entries to the ws kernel."""
    assert [gc.m_bucket(m) for m in (1, 8, 9, 16, 17, 40, 48, 49, 64, 65, 128, 129)] == \
        [None, None, 16, 16, 32, 48, 48, 64, 64, 128, 128, None]
    assert all(c.nt in gc.WS_NTS and (b <= 8 * c.nt or (b, c.nt) == (128, 8)) and 1 <= c.split <= min(8, k // 64)
               for (n, k, b), c in gc.WS_TABLE.items())
    # a copy without the (4096, 14336, 32) entry (dropped after the test): that bucket then falls to the skinny TABLE
    monkeypatch.setattr(gc, "WS_TABLE", {key: c for key, c in gc.WS_TABLE.items() if key != (4096, 14336, 32)})
    assert (4096, 14336, 32, False) in gc.TABLE and gc.kernel_for(32, 4096, 14336) == "skinny"
    p = tmp_path / "ws_table.py"
    p.write_text("WS_TABLE = {\n    (4096, 14336, 32): WsConfig(nt=4, split=4),\n}\n")
    monkeypatch.setenv("W12_WS_TABLE", str(p))
    gc._load_override()
    assert gc.WS_TABLE[(4096, 14336, 32)] == gc.WsConfig(4, 4)
    assert gc.kernel_for(32, 4096, 14336) == gc.kernel_for(17, 4096, 14336) == "ws"
    assert gc.kernel_for(16, 4096, 14336) == "skinny" and gc.kernel_for(1, 4096, 14336) == "skinny"
    # wider than the skinny grid's y dimension holds (8 CTAs per 128 channels): ws from 9 rows, else no CUDA kernel
    wide = gc.SKINNY_MAX_N + 128
    assert gc.kernel_for(1, gc.SKINNY_MAX_N, 4096) == "skinny" and gc.kernel_for(1, wide, 4096) is None
    assert gc.kernel_for(9, wide, 4096) == gc.kernel_for(32, wide, 64) == "ws"
    # what launch runs without a config (and bench/ab_kernel.py times): the table's entry for the kernel chosen
    assert gc.dispatched_config(20, 4096, 14336) == gc.WsConfig(4, 4)
    assert gc.dispatched_config(1, 4096, 14336, view=True) == gc.pick_config(1, 4096, 14336, view=True)
    assert gc.dispatched_config(100, 6144, 4096) == gc.WS_TABLE[(6144, 4096, 128)]



def test_ws_table_removal_and_adopt_ws(tmp_path, monkeypatch):
    """A None entry in a W12_WS_TABLE file removes the key, handing the bucket to the skinny TABLE (W12 and the view
    alike); bench/skinny_configs.adopt takes a bucket that another kernel runs today only with adopt_ws and only for
    W12, and only where the candidate is ≥ 3 % faster over the bucket's M values."""
    monkeypatch.setattr(gc, "WS_TABLE", dict(gc.WS_TABLE))
    assert gc.kernel_for(32, 28672, 4096) == "ws"
    p = tmp_path / "ws_table.py"
    p.write_text("WS_TABLE = {\n    (28672, 4096, 32): None,\n    (1, 2, 3): None,\n}\n")
    monkeypatch.setenv("W12_WS_TABLE", str(p))
    gc._load_override()
    assert (28672, 4096, 32) not in gc.WS_TABLE and (28672, 4096, 64) in gc.WS_TABLE
    assert gc.kernel_for(32, 28672, 4096) == gc.kernel_for(24, 28672, 4096, view=True) == "skinny"
    assert gc.dispatched_config(32, 28672, 4096) == gc.TABLE[(28672, 4096, 32, False)]
    # two files in one variable apply in order: the ws sweep's entry after the removal puts the bucket back
    q = tmp_path / "ws_sweep.py"
    q.write_text("WS_TABLE = {\n    (28672, 4096, 32): WsConfig(nt=4, split=2),\n}\n")
    monkeypatch.setenv("W12_WS_TABLE", os.pathsep.join([str(p), str(q)]))
    gc._load_override()
    assert gc.WS_TABLE[(28672, 4096, 32)] == gc.WsConfig(4, 2) and gc.kernel_for(32, 28672, 4096) == "ws"
    monkeypatch.setenv("W12_WS_TABLE", os.pathsep.join([str(q), str(p)]))
    gc._load_override()
    assert (28672, 4096, 32) not in gc.WS_TABLE
    adopt = _bench_module("skinny_configs").adopt
    c2, c4 = gc.CudaConfig(2, 4, 1, 1), gc.CudaConfig(4, 4, 1, 1)
    times = {(9, 64, 32, False): {"today": {24: 10.0, 32: 10.0}, c2: {24: 9.0, 32: 9.0}, c4: {24: 9.9, 32: 9.9}},
             (9, 64, 32, True): {"today": {24: 10.0, 32: 10.0}, c2: {24: 5.0, 32: 5.0}},
             (9, 64, 16, False): {"today": {16: 10.0}, c2: {16: 9.8}}}  # 2 % is not enough
    moved = {(9, 64, 32, False), (9, 64, 32, True)}
    assert adopt(times, moved) == {}
    assert adopt(times, moved, adopt_ws=True) == {(9, 64, 32, False): (c2, 0.9)}
    assert adopt(times) == {(9, 64, 32, False): (c2, 0.9), (9, 64, 32, True): (c2, 0.5)}


def test_stream_table_dispatch(tmp_path, monkeypatch):
    """A stream_table.py written by bench/stream_kernel.py (W12_STREAM_TABLE) sends its (shape, M bucket 1 / 8 / 16 /
    32, W12 or view) entries to the stream kernel, ahead of the other tables; one row is a bucket of its own; other M
    and the other of W12 / view keep their kernel."""
    monkeypatch.setattr(gc, "STREAM_TABLE", {})
    p = tmp_path / "stream_table.py"
    p.write_text("STREAM_TABLE = {\n    (151936, 5120, 8, False): StreamConfig(ctas_per_sm=2, stages=6, evict_first=True),\n"
                 "    (4096, 4096, 1, False): StreamConfig(3, 5, warps=4),\n"
                 "    (4096, 4096, 32, True): StreamConfig(1, 10),\n}\n")
    monkeypatch.setenv("W12_STREAM_TABLE", str(p))
    gc._load_override()
    assert gc.kernel_for(2, 151936, 5120) == gc.kernel_for(8, 151936, 5120) == "stream"
    assert gc.dispatched_config(3, 151936, 5120) == gc.StreamConfig(2, 6, True)
    assert gc.kernel_for(1, 151936, 5120) == "skinny"  # bucket 1 has no entry for this shape
    assert gc.kernel_for(9, 151936, 5120) == "ws" and gc.kernel_for(1, 151936, 5120, view=True) == "skinny"
    assert gc.dispatched_config(1, 4096, 4096) == gc.StreamConfig(3, 5, warps=4)
    assert gc.kernel_for(2, 4096, 4096) == "skinny"  # the one-row entry does not take M = 2–8
    assert gc.dispatched_config(17, 4096, 4096, view=True) == gc.StreamConfig(1, 10)
    assert gc.kernel_for(32, 4096, 4096) == "skinny" and gc.kernel_for(33, 4096, 4096, view=True) == "ws"


def test_stream_fits():
    """gemm_cuda.stream_fits: CTAs per SM whose shared memory (w12_gemv.cu's stream_smem + 1 KB reserved each, of 228
    KB) and launch bounds (2 CTAs with 8 consumer warps or at 17–32 rows, else 3) hold together.  Sums by hand: W12 at
    32 rows, 6 stages: 128 + 6 · (4096 + 12288 + 16) + 8 · 16 · (8 + 128 + 4) + 8 · 2 · 4 = 116512 B, two need
    235072 > 233472."""
    SC = gc.StreamConfig
    assert gc.stream_smem(32, False, 6) == 116512 and gc.stream_smem(1, True, 8) == 128 + 8 * (1024 + 8192 + 16)
    assert not gc.stream_fits(SC(2, 6), 32, False) and gc.stream_fits(SC(2, 5), 32, False)
    assert gc.stream_fits(SC(2, 6), 32, True) and gc.stream_fits(SC(1, 12), 32, False)
    assert gc.stream_fits(SC(2, 8), 8, False) and not gc.stream_fits(SC(2, 8), 9, False)
    assert gc.stream_fits(SC(3, 5, warps=4), 1, False) and not gc.stream_fits(SC(3, 5, warps=4), 16, False)
    assert not gc.stream_fits(SC(3, 2), 1, True)  # 8 consumer warps: two CTAs per SM at most
    assert not gc.stream_fits(SC(1, 16), 32, False)  # more than one CTA may have


def test_stream_ctas_aligned_ranges_lie_in_one_row():
    """stream_ctas: ctas_per_sm · SMs CTAs by default; aligned, NB · S CTAs whose ranges (the kernel's stream_first,
    ⌊p·T/P⌋ .. ⌊(p+1)·T/P⌋ − 1 of the T = NB·KB records) each lie in one row, none empty, one wave where NB ≤ the
    SMs' CTAs."""
    SC = gc.StreamConfig
    assert gc.stream_ctas(SC(2, 4), 32, 64, 132) == 264
    assert gc.stream_ctas(SC(2, 4, aligned=True), 32, 64, 132) == 256  # 4096²: 8 segments of 8 records per row
    assert gc.stream_ctas(SC(2, 4, aligned=True), 1187, 80, 132) == 1187  # LM head: a row per CTA, several waves
    assert gc.stream_ctas(SC(2, 4, aligned=True), 3, 16, 132) == 48  # S ≤ KB: one record per CTA
    for nb, kb, per_sm, sms in ((32, 64, 2, 132), (48, 64, 2, 132), (80, 80, 1, 132), (224, 64, 2, 114),
                                (40, 128, 2, 132), (7, 5, 3, 132), (1, 64, 2, 132)):
        cfg = SC(per_sm, 4, aligned=True)
        P, T = gc.stream_ctas(cfg, nb, kb, sms), nb * kb
        assert P <= max(nb, per_sm * sms)
        for p in range(P):
            lo, hi = p * T // P, (p + 1) * T // P - 1
            assert lo <= hi and lo // kb == hi // kb, (nb, kb, p, lo, hi)


def test_not_usable_on_cpu():
    x = torch.zeros(1, 64, dtype=torch.bfloat16)
    rec = torch.zeros(1, 1, 12288, dtype=torch.uint8)
    assert not gc.usable(x, rec, torch.zeros(128, dtype=torch.uint8))


def test_tile_escapes_layout():
    """The CUDA kernel's per-tile escape lists hold every escape once, in SPEC order within each channel,
    and sit where the launcher looks for them."""
    from w12.kernels import gemm as g

    nb, kb = 3, 5
    gen = torch.Generator().manual_seed(0)
    counts = torch.randint(0, 6, (nb, kb), generator=gen, dtype=torch.int32)
    esc = []
    for r in range(nb * kb):  # sorted positions per record (SPEC.md §6), random h
        pos = torch.sort(torch.randperm(128 * 64, generator=gen)[: int(counts.view(-1)[r])]).values
        esc.append(torch.stack([pos, torch.randint(-32768, 32767, pos.shape, generator=gen)], 1))
    escapes = torch.cat(esc).to(torch.int16)
    offs, cols = g.prepare_escapes(counts, escapes)
    nnz = escapes.shape[0]
    at = gc._even(max(nnz, 1))
    assert torch.equal(cols[:nnz], g.prepare_escapes(counts, escapes)[1][:nnz])
    toff = cols[at:at + nb * 8 * kb + 1].long()
    tent = cols[at + gc._even(nb * 8 * kb + 1):].view(-1, 2).long()
    assert tent.shape[0] == nnz and toff[-1] == nnz and bool((toff[1:] >= toff[:-1]).all())
    got = []
    for c in range(nb * 8):
        for k in range(kb):
            for e in tent[toff[c * kb + k]:toff[c * kb + k + 1]]:
                row, col = c % 8 * 16 + int(e[0] >> 24), int(e[0] & 0xFFFFFF)
                assert col // 64 == k
                got.append((c // 8, k, row, col % 64, int(e[1])))
    want = []
    for i, r in enumerate(torch.repeat_interleave(torch.arange(nb * kb), counts.view(-1).long()).tolist()):
        p, h = int(escapes[i, 0]) & 0xFFFF, int(escapes[i, 1]) & 0xFFFF
        want.append((r // kb, r % kb, p >> 6, p & 63, h))
    assert sorted(got) == sorted(want)
    # within one channel the entries keep the SPEC order (ascending record, then position)
    per_row = {}
    for nbi, k, row, c, h in got:
        per_row.setdefault((nbi, row), []).append((k, c))
    assert all(v == sorted(v) for v in per_row.values())
    # the launcher finds them (and refuses an index made without them)
    gc._tile_escape_ptrs(cols, nnz, nb, kb)
    with pytest.raises(ValueError, match="prepare_escapes"):
        gc._tile_escape_ptrs(cols[:nnz], nnz, nb, kb)


def test_load_without_gpu_returns_none(monkeypatch):
    monkeypatch.setenv("W12_CUDA", "auto")
    cuda_build._LIBS.pop("w12_gemv", None)
    with pytest.warns(UserWarning, match="unavailable"):
        assert cuda_build.load("w12_gemv") is None
    cuda_build._LIBS.pop("w12_gemv", None)


@pytest.mark.skipif(cuda_build.nvcc_path() is None or shutil.which("nm") is None, reason="needs nvcc and nm")
@pytest.mark.parametrize("name,symbols", [("w12_gemv", ["w12_gemv", "w12_gemv_occupancy", "w12_gemv_trace",
                                                       "w12_gemm_ws", "w12_stream", "w12_stream_occupancy"]),
                                          ("lm_head_int8", ["w12_lmh_certified", "w12_lmh_exact_logits"])])
def test_cu_compiles(tmp_path, name, symbols):
    lib = cuda_build.build(name, out_dir=tmp_path)
    assert lib.exists() and cuda_build.build(name, out_dir=tmp_path) == lib  # cached by content
    import subprocess

    out = subprocess.run(["nm", "-D", "--defined-only", str(lib)], capture_output=True, text=True, check=True).stdout
    for s in symbols:
        assert f" T {s}" in out, f"{s} not exported by {lib.name}"
    ctypes.CDLL(str(lib))  # loads (static CUDA runtime, no GPU needed to load)


@pytest.mark.skipif(cuda_build.nvcc_path() is None or torch.cuda.is_available(),
                    reason="needs nvcc, and no GPU: there the calls below would launch")
def test_configs_name_compiled_kernels(tmp_path):
    """Every config the host side can choose names a kernel that w12_gemv.cu compiles.  Without a GPU a compiled
    variant gets as far as the CUDA runtime and fails there; a variant that is not compiled returns
    cudaErrorInvalidValue (1) from the dispatcher."""
    lib = ctypes.CDLL(str(cuda_build.build("w12_gemv", out_dir=tmp_path)))
    p = None  # no tensors: nothing is launched without a GPU

    def skinny(c, view):
        return lib.w12_gemv(p, 8, 64, p, p, p, p, p, 64, 128, 1, 4, view, c.nt, c.warps, c.unroll, 1, p, p, 0, p, c.l2,
                            int(c.xreg))

    def ws(nt, split, view):
        return lib.w12_gemm_ws(p, 16, 64, p, p, p, p, p, 64, 128, 1, 8, view, nt, split, p, p, p, p, 1, 1, 1)

    shapes = [(n, k) for n, k, _, _ in gc.TABLE] + [(512, 8192), (999 * 128, 4096), (3072, 4096)]
    skinny_cfgs = set(gc.TABLE.values()) | {gc.pick_config(m, n, k, v) for n, k in shapes
                                            for m in (1, 8, 16, 32, 64) for v in (False, True)}
    assert all(skinny(c, v) not in (0, 1) for c in skinny_cfgs for v in (0, 1))
    assert all(ws(nt, 1, v) not in (0, 1) for nt in gc.WS_NTS for v in (0, 1))
    assert all(ws(c.nt, min(c.split, 8), v) not in (0, 1) for c in gc.WS_TABLE.values() for v in (0, 1))
    rule = {gc.ws_rule_config(m, n, k) for n, k in shapes for m in (9, 17, 33, 49, 65, 128)}
    assert all(ws(c.nt, c.split, v) not in (0, 1) for c in rule for v in (0, 1))
    def stream(m, stages, view, warps=8):
        return lib.w12_stream(p, m, 64, p, p, p, p, p, 64, 128, 1, 8, view, 264, stages, warps, p, p, p, 0)

    assert all(stream(m, s, v, w) not in (0, 1) for m in (1, 8, 9, 16, 17, 32) for s in (2, 8, 16) for v in (0, 1)
               for w in (8, 4))
    assert stream(33, 4, 0) == 1 and stream(1, 1, 0) == 1 and stream(1, 17, 1) == 1  # M ≤ 32, 2–16 stages
    assert stream(8, 4, 0, 6) == 1 and stream(8, 4, 1, 16) == 1  # 8 or 4 consumer warps
    # and the dispatchers do refuse what they do not compile
    assert ws(1, 1, 0) == 1 and ws(32, 1, 0) == 1 and ws(4, 9, 0) == 1
    assert skinny(gc.CudaConfig(3, 8, 1), 0) == 1
    assert skinny(gc.CudaConfig(1, 4, 1, 1, 101), 0) == 1 and skinny(gc.CudaConfig(1, 4, 1, 1, -1), 0) == 1
    assert all(skinny(gc.CudaConfig(4, w, 1, 1, xreg=True), v) not in (0, 1) for w in (4, 8) for v in (0, 1))
    assert all(skinny(gc.CudaConfig(nt, 4, u, 1, xreg=True), v) == 1
               for nt, u in ((2, 1), (8, 1), (4, 2)) for v in (0, 1))
    # bench/skinny_configs.py's candidates are all compiled (its sweep would list the others as failures)
    sweep = {c for m in (16, 32) for c in _bench_module("skinny_configs").candidates(4096, m)}
    assert {c.nt for c in sweep} == {2, 4} and all(skinny(c, v) not in (0, 1) for c in sweep for v in (0, 1))


@pytest.mark.parametrize("env, expected", [({}, False), ({"TORCHINDUCTOR_ENABLE_PDL": "1"}, True),
                                           ({"TORCHINDUCTOR_ENABLE_PDL": "1", "W12_PDL": "0"}, False),
                                           ({"W12_PDL": "1"}, True)])
def test_pdl_switch(env, expected):
    """The skinny kernel's PDL launch follows inductor's switch unless W12_PDL says otherwise (read at import)."""
    base = {k: v for k, v in os.environ.items() if k not in ("W12_PDL", "TORCHINDUCTOR_ENABLE_PDL")}
    out = subprocess.run([sys.executable, "-c", "from w12.kernels import gemm_cuda as g; print(g.PDL)"],
                         env={**base, **env}, capture_output=True, text=True, check=True).stdout.split()
    assert out == [str(expected)]


def _bench_module(name: str):
    """bench/<name>.py loaded as a module, leaving sys.path and sys.modules as they were (the script puts bench/ first,
    where its kernels.py would shadow the PyPI `kernels` package that transformers imports; a script that imports
    bench/kernels.py gets it, not a PyPI `kernels` an earlier test imported)."""
    import importlib.util

    path = ROOT / "bench" / f"{name}.py"
    saved, shadowed = sys.path[:], {k: sys.modules.pop(k) for k in ("kernels", "revision") if k in sys.modules}
    try:
        spec = importlib.util.spec_from_file_location(f"w12_bench_{name}", path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
    finally:
        sys.path[:] = saved
        for k in ("kernels", "revision"):
            sys.modules.pop(k, None)
        sys.modules.update(shadowed)
    return mod


def test_ws_diagnostics_patch_the_current_kernel():
    """bench/ws_diag.py, bench/ws_trace.py, bench/stream_trace.py and bench/skinny_diag.py rebuild
    kernels/w12_gemv.cu with text patches on the GPU machine: each of their anchors must occur exactly once in the
    kernel as it is, or those diagnostics stop there (ws_trace's prologue anchor had gone stale unnoticed for six
    sessions)."""
    src = (ROOT / "kernels" / "w12_gemv.cu").read_text()
    diag, trace = _bench_module("ws_diag"), _bench_module("ws_trace")
    diag.check_anchors(src)
    for anchor, _ in trace.PATCHES:
        assert src.count(anchor) == 1, f"bench/ws_trace.py anchor {anchor[:60]!r} does not occur once in w12_gemv.cu"
    for text, _, count in trace.WAITS:
        assert src.count(text) == count, f"bench/ws_trace.py wait {text[:60]!r} does not occur {count}× in w12_gemv.cu"
    stamped = _bench_module("stream_trace").stamped_source(src)  # asserts each of its texts occurs once
    assert stamped.count("W12_STAMP(W12_CTA + ") == 4  # entry, setup, first full slot, loop end
    patched = _bench_module("skinny_diag").variant(src, 7)  # stops (SystemExit) on an anchor that does not occur once
    assert patched.startswith("#define W12_SK_DIAG 7\n") and all(
        patched.count(f"#if W12_SK_DIAG & {bit}") == 1 for bit in (1, 2, 4))


def test_stream_trace_names_the_ctas_that_end_last():
    """bench/stream_trace.py's late-CTA table from trace words: the CTA that ends last on every replay heads it, with
    how often it was among the latest 5 % and the exits of the CTAs on its SM, and its waits in µs at its own clock
    (clock64 counts over its loop's cycles per ns); a CTA without records (no stamps) is left out; a last row gives
    the median over all CTAs."""
    st, words = _bench_module("stream_trace"), _bench_module("ws_trace").WORDS
    ctas, bufs = 40, []
    for rep in range(3):
        buf = [0] * (8 + words * ctas)
        for c in range(ctas - 1):  # the last CTA had no records
            r = 8 + words * c
            late = 6000 if c == 7 else 0  # CTA 7 gets its first record 6 µs late on every replay
            buf[r + 0], buf[r + 1] = 1000 + c, 1300 + c
            buf[r + 2] = buf[r + 1] + 2500 + late
            buf[r + 3] = buf[r + 2] + 11000 + 37 * ((c * 7 + rep) % 11)
            buf[r + 7], buf[r + 11] = c // 2, 8  # SM id (two CTAs per SM), records
            loop = buf[r + 3] - buf[r + 2]  # ns; the SM clock at 2 GHz: 2 cycles per ns
            buf[r + 13], buf[r + 14] = 10 ** 6, 10 ** 6 + 2 * loop
            buf[r + 8], buf[r + 12] = 3000, 1000  # warp 0's full waits 1.5 µs, the producer's empty waits 0.5 µs
            buf[r + 9], buf[r + 10] = (9000, 8000) if c == 7 else (1000, 0)  # CTA 7: a 4 µs mid-loop segment end
            buf[r + 4], buf[r + 5] = (4000, 3000) if c == 7 else (600, 0)  # of which escapes: 1.5 µs mid-loop
            buf[r + 6], buf[r + 15] = (4000, 4000) if c == 7 else (200, 0)  # partial, fence, ticket: 2 µs mid-loop
        bufs.append(buf)
    lines = st.late_ctas("4096×4096 | 1 | test", ctas, bufs, show=3)
    first = [cell.strip() for cell in lines[4].strip("|").split("|")]
    assert first[:3] == ["7", "3", "8"] and first[4] == "8.5" and first[11] == "3 of 3", lines
    assert first[6:11] == ["1.5", "4.5 (4.0)", "2.0 (1.5)", "2.0 (2.0)", "0.5"], lines
    assert float(first[12]) < float(first[3]) - 5  # its SM's other CTA ended ~6 µs earlier
    every = [cell.strip() for cell in lines[7].strip("|").split("|")]
    assert every[0] == "all CTAs (median)" and every[2] == "8" and every[4] == "2.5", lines
    assert every[7:10] == ["0.5 (0.0)", "0.3 (0.0)", "0.1 (0.0)"], lines
    assert len(lines) == 4 + 3 + 1 + 1 and not any(line.startswith("| 39 |") for line in lines)


def test_ab_kernel_clock_samples_fall_into_their_spans():
    """bench/ab_kernel.py --clocks: nvidia-smi's CSV lines parsed (unreadable ones skipped), and each timed span gets the
    median SM clock and the highest power of the samples inside it only."""
    ab = _bench_module("ab_kernel")
    rows = ab.parse_clocks("2026/12/04 23:05:01.100, 1980, 512.3\n2026/12/04 23:05:01.150, 1755, 690.1\nnot a sample\n"
                           "2026/12/04 23:05:01.200, [N/A], 600\n2026/12/04 23:05:01.250, 1600, 700.0\n")
    assert [r[1:] for r in rows] == [(1980.0, 512.3), (1755.0, 690.1), (1600.0, 700.0)]
    t = lambda s: ab.datetime.datetime.strptime("2026/12/04 23:05:" + s, "%Y/%m/%d %H:%M:%S.%f")  # noqa: E731
    stats = ab.span_stats(rows, {"w12": [(t("01.120"), t("01.260"))], "idle": [(t("02.000"), t("03.000"))],
                                 "both": [(t("01.000"), t("01.110")), (t("01.240"), t("01.300"))]})
    assert stats == {"w12": (1677.5, 700.0, 2), "both": (1790.0, 700.0, 2)}


def test_ab_kernel_screen_drops_a_library_that_hangs_or_fails():
    """bench/ab_kernel.py's screen: a child (here a stand-in printing probe_child's lines) is restarted without the
    library whose call never returned or whose call ended the child, the others survive, and a child that dies outside
    any library's call is an error rather than a library's fault."""
    ab = _bench_module("ab_kernel")
    child = """
import sys, time
for shape in ("4096×4096", "6144×4096"):
    print("mat " + shape, flush=True)
    for name in sys.argv[1].split(","):
        print("run " + name + " " + shape + " M=1 W12", flush=True)
        if name == "hangs" and shape == "6144×4096":
            time.sleep(60)
        if name == "faults":
            sys.exit("RuntimeError: CUDA error: an illegal memory access was encountered")
print("done", flush=True)
"""
    cmd = lambda names: [sys.executable, "-c", child, ",".join(names)]  # noqa: E731
    dropped = ab.screen(cmd, ["base", "hangs", "faults", "new"], timeout_s=3)
    assert dropped == {"hangs": "hung (no return within 3 s) at 6144×4096 M=1 W12",
                       "faults": "failed at 4096×4096 M=1 W12: RuntimeError: CUDA error: an illegal memory access was "
                                 "encountered"}
    assert ab.screen(cmd, ["base", "new"], timeout_s=3) == {}
    slow_start = "import sys, time; print('mat 1×1', flush=True); time.sleep(2); print('run base 1×1 M=1 W12'); print('done')"
    assert ab.screen(lambda names: [sys.executable, "-c", slow_start], ["base"], timeout_s=1) == {}  # 2 s < 10 · 1 s
    with pytest.raises(RuntimeError, match="outside any library's call: boom"):
        ab.screen(lambda names: [sys.executable, "-c", "import sys; print('mat 1×1', flush=True); sys.exit('boom')"],
                  ["base"], timeout_s=3)


def test_rev_tree_is_an_importable_revision(tmp_path):
    """bench/rev_tree.sh writes a revision's packages in pyproject's package-dir layout (what the GPU machine runs
    bench scripts on, with no install): `w12.kernels` then imports from that tree, with its .cu source beside it, and
    the bench reports name the revision (REV, read by bench/revision.py); an unknown revision is refused before
    anything is written."""
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("needs the git checkout")
    out = tmp_path / "tree"
    subprocess.run(["bash", str(ROOT / "bench" / "rev_tree.sh"), "HEAD", str(out)], cwd=ROOT, check=True,
                   capture_output=True)
    assert sorted(p.name for p in out.iterdir()) == ["REV", "bench", "w12"]
    assert (out / "w12" / "kernels" / "w12_gemv.cu").is_file() and not (out / "bench" / "results").exists()
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout
    assert (out / "REV").read_text() == head
    env = {k: v for k, v in os.environ.items() if k != "W12_REV"}
    r = subprocess.run([sys.executable, "-I", "-c", "import sys; sys.path.insert(0, sys.argv[1]); "
                        "from revision import commit; print(commit())", str(out / "bench")],
                       capture_output=True, text=True, check=True, env=env)
    assert r.stdout == head
    r = subprocess.run([sys.executable, "-I", "-c", "import sys; sys.path.insert(0, sys.argv[1]); "
                        "import w12.kernels.gemm_cuda as g, w12.formats.matrix; print(g.__file__)", str(out)],
                       capture_output=True, text=True, check=True)
    assert r.stdout.strip() == str(out / "w12" / "kernels" / "gemm_cuda.py")
    bad = subprocess.run(["bash", str(ROOT / "bench" / "rev_tree.sh"), "no-such-rev", str(tmp_path / "x")], cwd=ROOT,
                         capture_output=True, text=True)
    assert bad.returncode == 2 and "no commit 'no-such-rev'" in bad.stderr and not (tmp_path / "x").exists()
