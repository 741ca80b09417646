"""The skinny kernel at nt = 4 (17–64 rows) against what gemm_cuda dispatches today and cuBLAS BF16. One GPU call.

    W12_CUDA=1 python bench/skinny_configs.py [--ms 24,32,48,64] [--out DIR]

Its xreg form (CudaConfig.xreg: 4 warps, unroll 1, the next group's X words in registers; one CTA per SM fewer) may
beat the ws / xs / skinny choices that gemm_cuda's tables made without it.
1. Identity product (X = consecutive rows of the identity, Y[m, n] = W[n, i + m]) for every candidate on N = 300 ×
   K = 1024 with escapes, a full and a partial M tile: in-window weights and the 8-bit view bit-exact, escapes
   restored (bench/xs_configs.identity_product).
2. Per (shape, M), W12 and view: every candidate CudaConfig(4, 4 warps ± xreg or 8 warps, unroll 1, split 1/2/3/4/
   6/8) checked against the reference (decoded weights, fp32 matmul: relative ∞-norm error < 1e-2) and for
   determinism (the same bits over 3 runs), then timed as bench/kernels.py times (CUDA graph replay, do_bench, L2
   flushed, median) beside today's dispatch and cuBLAS (`torch.matmul`).  Writes OUT/skinny_configs.md after every
   case and OUT/skinny_table.py: the fastest candidate per (N, K, M) where it is at least 3 % faster than today's
   dispatch.
"""

import argparse
import datetime
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kernels import bench, rel, sweep_cases  # noqa: E402  (bench/kernels.py)
from xs_configs import identity_product  # noqa: E402

from w12.kernels import gemm_cuda as gc  # noqa: E402

SPLITS = (1, 2, 3, 4, 6, 8)


def candidates(k: int):
    """nt = 4, unroll 1: 4 warps with and without xreg, 8 warps; every split of SPLITS that leaves each warp ≥ 2
    records."""
    return [gc.CudaConfig(4, w, 1, s, xreg=x) for w, x in ((4, True), (4, False), (8, False)) for s in SPLITS
            if s <= k // 64 // (2 * w)]


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
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    a = ap.parse_args()
    ms = [int(v) for v in a.ms.split(",")]
    bad = identity_product([c for c in candidates(4096) if c.split in (1, 3)], lambda c: (c.warps, c.split, c.xreg))
    ident = "every candidate bit-exact (decode, view) with escapes restored" if not bad else f"FAILED: {sorted(bad)}"
    print("identity product:", ident, flush=True)
    rows, table, fails = [], {}, []
    for n, k, m, mt, x, ref32, t_cb in sweep_cases(ms):
        for view in (False, True):
            ref = ref32 if not view else x.float() @ view_weights(mt).float().t()
            today = gc.dispatched_config(m, n, k, view)
            t_today = checked_time(mt, x, ref, today, view)
            res = {}
            for c in candidates(k):
                t = checked_time(mt, x, ref, c, view)
                if isinstance(t, str):
                    fails.append(f"- {n}×{k} M={m} {'view' if view else 'W12'} {c}: {t}")
                else:
                    res[c] = t
            best = min(res, key=res.get)
            xreg = min((c for c in res if c.xreg), key=res.get)
            four = min((c for c in res if c.warps == 4 and not c.xreg), key=res.get)
            eight = min((c for c in res if c.warps == 8), key=res.get)
            win = isinstance(t_today, float) and res[best] <= 0.97 * t_today
            if win:
                table[(n, k, m, view)] = best
            rows.append(f"| {n}×{k} | {m} | {'view' if view else 'W12'} | {t_cb:.1f} | {cfg_str(today)} "
                        f"{fmt(t_today)} | {cfg_str(xreg)} {res[xreg]:.1f} | {cfg_str(four)} {res[four]:.1f} | "
                        f"{cfg_str(eight)} {res[eight]:.1f} | "
                        f"{fmt(t_today) if not win else '**' + f'{res[best]:.1f}' + '**'} | "
                        f"{(t_cb / min(res[best], t_today) if isinstance(t_today, float) else float('nan')):.3f} |")
            print(rows[-1], flush=True)
            write(a.out, ms, ident, rows, table, fails)
    write(a.out, ms, ident, rows, table, fails, done=True)


def view_weights(mt):
    """W as the 8-bit view decodes it (bench/kernels.decode_gpu), cached on the Mat."""
    if not hasattr(mt, "_wq"):
        from kernels import decode_gpu
        mt._wq = decode_gpu(mt.records, mt.exps, mt.counts, mt.escapes, mt.n, mt.k, view=True)
    return mt._wq


def cfg_str(c) -> str:
    if isinstance(c, gc.CudaConfig):
        return f"skinny {c.nt}/{c.warps}/{c.unroll}/{c.split}" + (" xreg" if c.xreg else "")
    return f"{type(c).__name__[:2].lower()} {c}"


def fmt(t) -> str:
    return f"{t:.1f}" if isinstance(t, float) else f"({t})"


def write(out, ms, ident, rows, table, fails, done=False):
    text = "\n".join([
        f"# Skinny kernel at nt = 4 against today's dispatch (bench/skinny_configs.py) — {datetime.date.today()}", "",
        *([] if done else [f"**Incomplete**: {len(rows)} rows.", ""]),
        f"- GPU: {torch.cuda.get_device_name()}; torch {torch.__version__}; commit {os.environ.get('W12_REV', '?')}",
        f"- command: `W12_CUDA=1 python bench/skinny_configs.py --ms {','.join(map(str, ms))}`",
        f"- identity product: {ident}; every timed candidate within 1e-2 of the reference and deterministic (else "
        "listed at the end); µs: CUDA graph replay, do_bench, L2 flushed, median", "",
        "| N×K | M | | cuBLAS µs | today µs | best xreg µs | best 4-warp µs | best 8-warp µs | adopted µs | "
        "adopted vs cuBLAS |", "|---|---|---|---|---|---|---|---|---|---|", *rows, "",
        f"{len(table)} adopted (≥ 3 % faster than today; bold above): OUT/skinny_table.py.",
        *(["", "Failed checks:", *fails] if fails else [])]) + "\n"
    with open(os.path.join(out, "skinny_configs.md"), "w") as fh:
        fh.write(text)
    with open(os.path.join(out, "skinny_table.py"), "w") as fh:
        fh.write("# (N, K, M, view) -> CudaConfig: bench/skinny_configs.py's wins over today's dispatch\n")
        fh.write("SKINNY_WINS = {\n" + "".join(f"    {key}: {c},\n" for key, c in table.items()) + "}\n")
    if done:
        print(text, flush=True)


if __name__ == "__main__":
    main()
