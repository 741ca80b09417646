"""The skinny kernel at 9–64 rows against what gemm_cuda dispatches today and cuBLAS BF16. One GPU call.

    W12_CUDA=1 python bench/skinny_configs.py [--ms 24,32,48,64] [--w12-only] [--nts 2,4] [--adopt-ws]
                                              [--shapes 4096x4096,…] [--out DIR]
    W12_CUDA=1 W12_CUDA_TABLE=DIR/cuda_table.py W12_WS_TABLE=DIR/ws_table.py python bench/kernels.py  # adopted

Its xreg form (CudaConfig.xreg, nt = 4: unroll 1, the next group's X words in registers; with 4 warps a CTA per SM
fewer, with 8 capped to keep its CTAs per SM) may beat the skinny configs that gemm_cuda.TABLE chose without it.
1. Identity product (X = consecutive rows of the identity, Y[m, n] = W[n, i + m]) for every candidate on N = 300 ×
   K = 1024 with escapes, a full and a partial M tile: in-window weights and the 8-bit view bit-exact, escapes
   restored (bench/kernels.identity_product).
2. Per (shape, M), W12 and view (--w12-only: W12): every candidate CudaConfig(nt = 4, or 2 and 4 up to 32 rows;
   4 or 8 warps, unroll 1, split 1/2/3/4/6/8; ± xreg at nt = 4) checked against the reference (decoded weights, fp32
   matmul: relative ∞-norm error < 1e-2) and for determinism (the same bits over 3 runs), then timed as
   bench/kernels.py times (CUDA graph replay, do_bench, L2 flushed, median) beside today's dispatch and cuBLAS
   (`torch.matmul`).  Writes OUT/skinny_configs.md after every case and OUT/cuda_table.py (a TABLE for
   W12_CUDA_TABLE): per (N, K, TABLE bucket 16, 32 or 64, view) where today's dispatch is the skinny kernel at every M
   of the bucket, the candidate with the least total time over those M if that total is at least 3 % below today's.
   With --adopt-ws also W12 buckets that the ws kernel takes today (not those of STREAM_TABLE, which stay);
   OUT/ws_table.py (W12_WS_TABLE) then removes their WS_TABLE keys, so that gemm_cuda.kernel_for hands the bucket to
   the skinny kernel (the 8-bit view too, at its own TABLE entry: time it with bench/kernels.py before landing such
   an entry).
"""

import argparse
import datetime
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from revision import commit  # noqa: E402  (bench/revision.py)
from kernels import bench, decode_gpu, identity_product, rel, sweep_cases  # noqa: E402  (bench/kernels.py)

from w12.kernels import gemm_cuda as gc  # noqa: E402

SPLITS = (1, 2, 3, 4, 6, 8)
KINDS = ((4, True), (4, False), (8, True), (8, False))  # (warps, xreg): the report's "best" columns


def candidates(k: int, m: int = 32):
    """Unroll 1, nt = 4 (and 2 up to 32 rows: two M tiles at 17–32, as the 4096² view's entry), 4 or 8 warps, ± xreg
    (nt = 4); each split of SPLITS that leaves a warp ≥ 2 records."""
    return [gc.CudaConfig(nt, w, 1, s, xreg=x) for nt in ((2, 4) if m <= 32 else (4,)) for w in (4, 8)
            for x in ((False, True) if nt == 4 else (False,)) for s in SPLITS if s <= k // 64 // (2 * w)]


def checked_time(mt, x, ref, cfg, view):
    """µs of cfg after the reference and determinism checks, or the reason it failed."""
    y = mt.run(x, view=view, cuda=cfg)
    err = rel(y, ref)
    if err >= 1e-2:
        return f"rel. error {err:.1e}"
    if not all(torch.equal(mt.run(x, view=view, cuda=cfg), y) for _ in range(3)):
        return "not deterministic"
    return bench(lambda: mt.run(x, view=view, cuda=cfg))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ms", default="24,32,48,64")
    ap.add_argument("--w12-only", action="store_true", help="time W12 only, not the 8-bit view")
    ap.add_argument("--nts", default="2,4", help="the candidates' nt values (2 is swept up to 32 rows)")
    ap.add_argument("--shapes", default="", help="N×K,… (default: bench/kernels.py's ten)")
    ap.add_argument("--adopt-ws", action="store_true",
                    help="also adopt W12 buckets that the ws kernel takes today (OUT/ws_table.py then removes "
                         "their WS_TABLE keys: the 8-bit view moves to its TABLE entry with them)")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    ms = [int(v) for v in a.ms.split(",")]
    nts = {int(v) for v in a.nts.split(",")}
    bad = identity_product([c for c in candidates(4096, 16) if c.split in (1, 3)],
                           lambda c: (c.nt, c.warps, c.split, c.xreg))
    ident = "every candidate bit-exact (decode, view) with escapes restored" if not bad else f"FAILED: {sorted(bad)}"
    print("identity product:", ident, flush=True)
    rows, fails, times = [], [], {}  # times[(n, k, bucket, view)][config or "today"][m] = µs
    shapes = [tuple(int(v) for v in s.split("x")) for s in a.shapes.split(",")] if a.shapes else None
    opts = (" --w12-only" if a.w12_only else "") + (f" --shapes {a.shapes}" if a.shapes else "") + (
        " --adopt-ws" if a.adopt_ws else "") + (f" --nts {a.nts}" if a.nts != "2,4" else "")
    moved = set()  # (n, k, bucket, view) where the ws kernel takes some M today
    for n, k, m, mt, x, ref32, t_cb in sweep_cases(ms, shapes=shapes):
        for view in (False,) if a.w12_only else (False, True):
            ref = ref32 if not view else x.float() @ view_weights(mt).float().t()
            today = gc.dispatched_config(m, n, k, view)
            t_today = checked_time(mt, x, ref, today, view)
            if isinstance(t_today, str):
                fails.append(f"- {n}×{k} M={m} {'view' if view else 'W12'} today's {today}: {t_today}")
            key = (n, k, 8 * gc._nt_for(m), view)
            # a stream bucket has no "today" (never adopted: STREAM_TABLE would still take it)
            res = {"today": t_today} if isinstance(t_today, float) and not isinstance(today, gc.StreamConfig) else {}
            if isinstance(today, gc.WsConfig):
                moved.add(key)
            for c in (c for c in candidates(k, m) if c.nt in nts):
                t = checked_time(mt, x, ref, c, view)
                if isinstance(t, str):
                    fails.append(f"- {n}×{k} M={m} {'view' if view else 'W12'} {c}: {t}")
                else:
                    res[c] = t
            bucket = times.setdefault(key, {})
            for c, t in res.items():
                bucket.setdefault(c, {})[m] = t
            best = {kind: min((c for c in res if c != "today" and (c.warps, c.xreg) == kind), key=res.get, default=None)
                    for kind in KINDS}
            fastest = min(t for t in [*res.values(), t_today] if isinstance(t, float))
            rows.append(f"| {n}×{k} | {m} | {'view' if view else 'W12'} | {t_cb:.1f} | {cfg_str(today)} "
                        f"{fmt(t_today)} | "
                        + " | ".join(f"{cfg_str(c)} {res[c]:.1f}" if c else "-" for c in best.values())
                        + f" | {t_cb / fastest:.3f} |")
            print(rows[-1], flush=True)
            write(a.out, ms, opts, ident, rows, adopt(times, moved, a.adopt_ws), fails)
    write(a.out, ms, opts, ident, rows, adopt(times, moved, a.adopt_ws), fails, done=True)


def adopt(times, moved=frozenset(), adopt_ws=False) -> dict:
    """(n, k, bucket, view) -> (the candidate adopted, its time over today's) (see the module docstring).  A bucket
    that another kernel takes at some M today (moved) only with adopt_ws, and only for W12 (the view follows W12's
    dispatch: gemm_cuda.kernel_for)."""
    out = {}
    for key, res in times.items():
        today = res.get("today", {})
        ms = set().union(*(r.keys() for r in res.values()))
        if set(today) != ms or (key in moved and not (adopt_ws and not key[3])):
            continue
        cands = {c: sum(r.values()) for c, r in res.items() if c != "today" and set(r) == ms}
        best = min(cands, key=cands.get, default=None)  # None: every candidate failed a check at some M
        if best is not None and cands[best] <= 0.97 * sum(today.values()):
            out[key] = (best, cands[best] / sum(today.values()))
    return out


def view_weights(mt):
    """W as the 8-bit view decodes it (bench/kernels.decode_gpu), cached on the Mat."""
    if not hasattr(mt, "_wq"):
        mt._wq = decode_gpu(mt.records, mt.exps, mt.counts, mt.escapes, mt.n, mt.k, view=True)
    return mt._wq


def cfg_str(c) -> str:
    if isinstance(c, gc.CudaConfig):
        return f"skinny {c.nt}/{c.warps}/{c.unroll}/{c.split}" + (" xreg" if c.xreg else "")
    return f"{type(c).__name__[:2].lower()} {c}"


def fmt(t) -> str:
    return f"{t:.1f}" if isinstance(t, float) else f"({t})"


def write(out, ms, opts, ident, rows, table, fails, done=False):
    text = "\n".join([
        f"# Skinny kernel configs against today's dispatch (bench/skinny_configs.py) — {datetime.date.today()}", "",
        *([] if done else [f"**Incomplete**: {len(rows)} rows.", ""]),
        f"- GPU: {torch.cuda.get_device_name()}; torch {torch.__version__}; commit {commit()}",
        f"- command: `W12_CUDA=1 python bench/skinny_configs.py --ms {','.join(map(str, ms))}"
        f"{opts}`",
        f"- identity product: {ident}; every timed candidate within 1e-2 of the reference and deterministic (else "
        "listed at the end); µs: CUDA graph replay, do_bench, L2 flushed, median", "",
        "| N×K | M | | cuBLAS µs | today µs | " + " | ".join(f"best {w}-warp{' xreg' if x else ''}" for w, x in KINDS)
        + " | best vs cuBLAS |", "|---|---|---|---|---|" + "---|" * len(KINDS) + "---|", *rows, "",
        f"Adopted into OUT/cuda_table.py ({len(table)}; time over the bucket's M values relative to today's):", "",
        *(f"- {key}: {cfg_str(c)} ({r:.3f})" for key, (c, r) in table.items()),
        *(["", "Failed checks:", *fails] if fails else [])]) + "\n"
    with open(os.path.join(out, "skinny_configs.md"), "w") as fh:
        fh.write(text)
    with open(os.path.join(out, "cuda_table.py"), "w") as fh:
        fh.write("# (N, K, M bucket, view) -> CudaConfig: bench/skinny_configs.py's adopted entries (W12_CUDA_TABLE)\n")
        fh.write("TABLE = {\n" + "".join(f"    {key}: {c},\n" for key, (c, _) in table.items()) + "}\n")
    with open(os.path.join(out, "ws_table.py"), "w") as fh:  # the WS_TABLE keys of the buckets moved to skinny
        fh.write("# (N, K, M bucket) -> None: WS_TABLE keys removed (W12_WS_TABLE), bench/skinny_configs.py --adopt-ws\n")
        fh.write("WS_TABLE = {\n" + "".join(f"    {key[:3]}: None,\n" for key in table if key[:3] in gc.WS_TABLE)
                 + "}\n")
    if done:
        print(text, flush=True)


if __name__ == "__main__":
    main()
