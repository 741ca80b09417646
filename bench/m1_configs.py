"""The skinny kernel's M = 1 config per shape, chosen as bench/kernels.py's headline timing times it. One GPU call.

    W12_CUDA=1 python bench/m1_configs.py [--out OUT]
    W12_CUDA=1 python bench/m1_configs.py --unseen [--out OUT]   # the 14 shapes of bench/unseen_shapes.py instead
    W12_CUDA=1 python bench/m1_configs.py --unseen --view         # the same sweep for the 8-bit view's configs
    W12_CUDA=1 python bench/m1_configs.py --m 16                  # W12 at another M (9-64: l2 0, no view column)


gemm_cuda.TABLE's M ≤ 8 configs were swept after a read-only (clean) L2 flush; the issue's figures are taken after
do_bench's zeroing flush, which leaves the L2 full of dirty lines, and there the L2 priority of the weight loads
matters (bench/dirty_l2.py). For every shape of bench/kernels.py at M = 1: every candidate of bench/kernels.py's
cuda sweep (warps, unroll, split) with CudaConfig.l2 = 0, 50 and 100 (W12), checked against the reference
(decode + fp32 matmul, rel. error < 1e-2) and, per (warps, unroll, split), bit-equal across l2; round 1 times all
of them (CUDA graph replay, do_bench, median), rounds 2–4 time the best four and the current config interleaved (the
median kept). The view keeps its config; its l2 = 0 and 100 are timed the same way. Also the chosen and the current
config after a clean flush. Prints and writes OUT/m1_configs.md and OUT/m1_table.py (the entries to adopt: the
best where it beats the current config by ≥ 1.5 %, else the current one).  With --unseen the shapes are other models'
widths (bench/unseen_shapes.UNSEEN; l2 0 and 100 only), where "current" is gemm_cuda.pick_config's rule: how far the
rule is from the best config there (OUT/m1_configs-unseen.md; no table is written — the rule, not per-shape entries,
is what to change).  With --view the candidates are swept for the 8-bit view instead (checked against the product
of the view's decoded weights; the view's l2 part is then the sweep itself).
"""

import argparse
import datetime
import math
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from revision import commit  # noqa: E402  (bench/revision.py)
from kernels import SHAPES, Mat, bench, cuda_candidates, decode_gpu, rel  # noqa: E402

from w12.kernels import gemm_cuda as gc  # noqa: E402

L2S = (0, 50, 100)


def timed(fns: dict, rounds: int) -> dict:
    """name -> median µs over interleaved rounds (each round starts one name later)."""
    names, out = list(fns), {name: [] for name in fns}
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            out[name].append(bench(fns[name]))
    return {name: statistics.median(v) for name, v in out.items()}


def sweep_shape(si, n, k, l2s=L2S, view=False, m=1):
    """W12's candidates (view: the 8-bit view's) at M = m on one shape, the view's l2 beside them (not with view, and
    only at m ≤ 8). The current config is the dispatched one, a ws config too."""
    mt = Mat(n, k, 300 + si)
    x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
    w = decode_gpu(mt.records, mt.exps, mt.counts, mt.escapes, n, k, view=True) if view else mt.w
    ref = x.float() @ w.float().t()
    t_cb = bench(lambda: torch.matmul(x, mt.w.t()))
    cur = gc.dispatched_config(m, n, k, view)
    cands = {}
    for c in cuda_candidates(m):
        y0 = None
        for l2 in l2s:
            cfg = gc.CudaConfig(c.nt, c.warps, c.unroll, c.split, l2)
            y = mt.run(x, view=view, cuda=cfg)
            assert rel(y, ref) < 1e-2, f"{cfg} {n}x{k}: rel err {rel(y, ref):.2e}"
            y0 = y if y0 is None else y0
            assert torch.equal(y.view(torch.int16), y0.view(torch.int16)), f"{cfg} {n}x{k}: bits differ across l2"
            cands[cfg] = cfg
    assert rel(mt.run(x, view=view, cuda=cur), ref) < 1e-2, f"current {cur} {n}x{k}"
    fn = lambda cfg: (lambda: mt.run(x, view=view, cuda=cfg))  # noqa: E731
    first = {cfg: bench(fn(cfg), rep=20) for cfg in cands}
    top = sorted(first, key=first.get)[:4]
    finals = timed({cfg: fn(cfg) for cfg in dict.fromkeys(top + [cur])}, 3)
    best = min(finals, key=finals.get)
    pick = best if finals[best] < finals[cur] / 1.015 else cur
    clean = {c: bench(fn(c), clean=True) for c in dict.fromkeys([cur, pick])}
    res = dict(n=n, k=k, cb=t_cb, cur=cur, t_cur=finals[cur], best=best, t_best=finals[best], pick=pick,
               t_pick=finals[pick], clean=clean, top=[(c, finals[c]) for c in sorted(finals, key=finals.get)])
    if not view and m <= 8:  # the view's dispatched config at l2 0 and 100, beside W12's sweep
        vcur = gc.dispatched_config(1, n, k, view=True)
        vcfgs = [gc.CudaConfig(vcur.nt, vcur.warps, vcur.unroll, vcur.split, l2) for l2 in (0, 100)]
        yv = [mt.run(x, view=True, cuda=c) for c in vcfgs]
        assert torch.equal(yv[0].view(torch.int16), yv[1].view(torch.int16)), f"view {n}x{k}: bits differ across l2"
        vt = timed({c: (lambda c=c: mt.run(x, view=True, cuda=c)) for c in vcfgs}, 3)
        vpick = min(vt, key=vt.get) if min(vt.values()) < vt[vcur] / 1.015 else vcur
        res.update(vcur=vcur, vt=vt, vpick=vpick)
    del mt
    torch.cuda.empty_cache()
    return res


def name(c):
    if isinstance(c, gc.WsConfig):
        return f"ws {c.nt}/{c.split}"
    return f"{c.nt}/{c.warps}/{c.unroll}/{c.split} l2 {c.l2}" + (" xreg" if c.xreg else "")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--unseen", action="store_true", help="sweep bench/unseen_shapes.py's 14 shapes (the rule's M = 1 "
                    "configs) instead of bench/kernels.py's ten")
    ap.add_argument("--view", action="store_true", help="sweep the 8-bit view's configs instead of W12's (no table)")
    ap.add_argument("--m", type=int, default=1, help="the rows of X (default 1; above 8: W12 only, l2 0)")
    a = ap.parse_args()
    assert a.m <= 8 or not (a.view or a.unseen), "--m above 8: W12 on bench/kernels.py's shapes only"
    kind = "view" if a.view else "W12"
    flags = (" --unseen" if a.unseen else "") + (" --view" if a.view else "") + (f" --m {a.m}" if a.m != 1 else "")
    shapes = SHAPES
    if a.unseen:
        from unseen_shapes import UNSEEN  # bench/unseen_shapes.py
        shapes = [s for group in UNSEEN.values() for s in group]
    rows = []
    for si, (n, k) in enumerate(shapes):
        r = sweep_shape(si, n, k, (0,) if a.m > 8 else (0, 100) if a.unseen else L2S, view=a.view, m=a.m)
        rows.append(r)
        print(f"{n}x{k}: cuBLAS {r['cb']:.1f}; current {name(r['cur'])} {r['t_cur']:.1f}; best {name(r['best'])} "
              f"{r['t_best']:.1f}" + ("" if "vt" not in r else f"; view l2 0/100 {list(r['vt'].values())}"), flush=True)
    geo = lambda v: math.exp(sum(map(math.log, v)) / len(v))  # noqa: E731
    g_cur = geo([r["cb"] / r["t_cur"] for r in rows])
    g_pick = geo([r["cb"] / r["t_pick"] for r in rows])
    vcol = not a.view and a.m <= 8
    g_vcur = geo([r["cb"] / r["vt"][r["vcur"]] for r in rows]) if vcol else None
    g_vpick = geo([r["cb"] / r["vt"][r["vpick"]] for r in rows]) if vcol else None
    lines = [
        f"# M = {a.m} skinny {kind} configs under do_bench's flush"
        f"{' on shapes outside the tables' if a.unseen else ''} — "
        f"{datetime.date.today()}", "",
        f"- GPU: {torch.cuda.get_device_name()}; torch {torch.__version__}; commit {commit()}",
        f"- command: `W12_CUDA=1 python bench/m1_configs.py{flags} --out $OUT`",
        "- every candidate within 1e-2 of the reference, bit-equal across l2; µs: CUDA graph replay, do_bench (zeroing "
        "flush), median of 3 interleaved rounds; clean: after a read-only flush",
        f"- {kind} geomean vs cuBLAS: current {g_cur:.3f}, adopted {g_pick:.3f}"
        + ("" if not vcol else f"; view: current {g_vcur:.3f}, adopted {g_vpick:.3f}"), "",
        "| N×K | cuBLAS µs | current (nt/warps/unroll/split l2) | µs | adopted | µs | ratio now → adopted | clean µs current / adopted "
        "| view l2 0 / 100 µs | view adopted | runners-up |",
        "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        cl = " / ".join(f"{v:.1f}" for v in r["clean"].values())
        lines.append(
            f"| {r['n']}×{r['k']} | {r['cb']:.1f} | {name(r['cur'])} | {r['t_cur']:.1f} | {name(r['pick'])} | "
            f"{r['t_pick']:.1f} | {r['cb'] / r['t_cur']:.3f} → {r['cb'] / r['t_pick']:.3f} | {cl} | "
            + ("— | — | " if not vcol
               else " / ".join(f"{v:.1f}" for v in r["vt"].values()) + f" | l2 {r['vpick'].l2} | ")
            + ", ".join(f"{name(c)} {t:.1f}" for c, t in r["top"][:4]) + " |")
    text = "\n".join(lines) + "\n"
    bucket = 8 if a.m <= 8 else 8 * gc._nt_for(a.m)  # gemm_cuda.TABLE's M bucket
    table = "" if a.view else "".join(
        f"    ({r['n']}, {r['k']}, {bucket}, {v}): CudaConfig({c.nt}, {c.warps}, {c.unroll}, {c.split}, {c.l2}, {c.xreg}),\n"
        for r in rows for v, c in ((False, r["pick"]), (True, r.get("vpick")))
        if isinstance(c, gc.CudaConfig))
    stem = f"m{a.m}_configs" + ("-unseen" if a.unseen else "") + ("-view" if a.view else "")
    with open(os.path.join(a.out, stem + ".md"), "w") as fh:
        fh.write(text)
    if not a.unseen and not a.view:
        with open(os.path.join(a.out, f"m{a.m}_table.py"), "w") as fh:
            fh.write("TABLE = {\n" + table + "}\n")
    print(text)
    print(table)


if __name__ == "__main__":
    main()
