"""W12 GEMM at M = 16…128 on shapes outside the measured tables: the ws kernel with gemm_cuda.ws_rule_config against the
skinny kernel with gemm_cuda.pick_config (M ≤ 64) and cuBLAS BF16 — the data behind kernel_for's choice between the two
kernels for other models' widths — and against decode + cuBLAS (kernels/decode.py then F.linear, what the op runs above
ops.LARGE_M rows), which small matrices might prefer at 33–128 rows. One GPU call.

    W12_CUDA=1 python bench/unseen_shapes.py [--ms 16,32,48,64,128] [--out DIR]

WS_TABLE and the skinny TABLE hold configs for the ten shapes of bench/kernels.py only; a model with other widths
(Llama-3.1-70B, Qwen2.5-7B, SmolLM2) gets kernel_for's rule, which this bench measured: "now" is what kernel_for
dispatches (the rule's ws config, or the skinny kernel where the rule keeps it), or decode + cuBLAS where
gemm_cuda.prefers_decode says the op decodes (W12 / view: "now" names both). Part 1, the rule on the table's own shapes:
wherever ws_rule_config differs from the WS_TABLE entry, both timed (what the rule loses where the table knows better).
Part 2, unseen shapes: per (shape, M), W12 and the 8-bit view, the rule's ws config and the skinny one, each checked
first (relative ∞-norm error against the fp32 product of the decoded weights < 1e-2; two runs, the same bits), and
decode + cuBLAS for both (checked: the bits of F.linear on the weight it decodes), then timed as bench/kernels.py times
(CUDA graph replay, do_bench, L2 flushed, median) beside cuBLAS. Writes OUT/unseen_shapes.md, rewritten after every row.
"""

import argparse
import datetime
import os
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from revision import commit  # noqa: E402  (bench/revision.py)
from kernels import SHAPES, Mat, bench, decode_gpu, geo, rel  # noqa: E402  (bench/kernels.py)

from w12.kernels import decode as dec  # noqa: E402
from w12.kernels import gemm_cuda as gc  # noqa: E402
from w12.kernels import ops  # noqa: E402,F401  (registers torch.ops.w12)

UNSEEN = {
    "Llama-3.1-70B": [(10240, 8192), (8192, 8192), (57344, 8192), (8192, 28672)],
    "Qwen2.5-7B": [(4608, 3584), (3584, 3584), (37888, 3584), (3584, 18944), (152064, 3584)],
    "Llama-2-7B down": [(4096, 11008)],
    "SmolLM2-135M": [(960, 576), (576, 576), (3072, 576), (576, 1536)],
}


def short(cfg) -> str:
    if isinstance(cfg, gc.WsConfig):
        return f"ws {cfg.nt}/{cfg.split}" + ("" if cfg.evict_first else " nohint")
    return f"skinny {cfg.nt}/{cfg.warps}/{cfg.unroll}/{cfg.split}"


def checked(mt, x, refs, cfg, view):
    """Run cfg twice: (relative error against the reference, same bits)."""
    y1, y2 = mt.run(x, view=view, cuda=cfg), mt.run(x, view=view, cuda=cfg)
    return rel(y1, refs[view]), torch.equal(y1.view(torch.int16), y2.view(torch.int16))


def case(mt, m, cfgs, seed, decoded=False):
    """{name: (cfg, W12 µs, view µs, worst rel. error, deterministic)} and cuBLAS µs for X [m, k]; decoded: also the
    µs of decode + cuBLAS (W12, view), else None for both."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(m, mt.k, device="cuda", generator=g).to(torch.bfloat16)
    refs = {False: x.float() @ mt.w.float().t(), True: x.float() @ mt.wq.t()}
    out = {}
    for name, (cw, cv) in cfgs.items():
        (e1, d1), (e2, d2) = checked(mt, x, refs, cw, False), checked(mt, x, refs, cv, True)
        if max(e1, e2) >= 1e-2 or not (d1 and d2):
            raise AssertionError(f"{mt.n}×{mt.k} M={m} {name}: rel. errors {e1:.2e} / {e2:.2e}, "
                                 f"deterministic {d1}/{d2}")
        out[name] = (cw, bench(lambda: mt.run(x, cuda=cw)), bench(lambda: mt.run(x, view=True, cuda=cv)), max(e1, e2))
    t_dec = (decoded_linear(mt, x, False), decoded_linear(mt, x, True)) if decoded else (None, None)
    return out, bench(lambda: torch.matmul(x, mt.w.t())), *t_dec


def decoded_linear(mt, x, view: bool) -> float:
    """µs of decode + cuBLAS (the ops' path above ops.LARGE_M; W12, or the 8-bit view), after checking it gives the bits
    of F.linear on the weight it decodes — and, where gemm_cuda.prefers_decode sends the op there, that
    torch.ops.w12.gemm (or view_gemm) does too."""
    def run():
        if view:
            return F.linear(x, dec.decode(mt.records, mt.exps, None, None, mt.n, mt.k, view=True))
        return F.linear(x, dec.decode(mt.records, mt.exps, mt.escapes, mt.offs, mt.n, mt.k))
    ref = F.linear(x, mt.wq.to(torch.bfloat16) if view else mt.w).view(torch.int16)
    if not torch.equal(run().view(torch.int16), ref):
        raise AssertionError(f"{mt.n}×{mt.k} M={x.shape[0]} view={view}: decode + cuBLAS is not F.linear's bits")
    if gc.prefers_decode(x.shape[0], mt.n, mt.k, view):
        y = (torch.ops.w12.view_gemm(x, mt.records, mt.exps, mt.n) if view else
             torch.ops.w12.gemm(x, mt.records, mt.exps, mt.escapes, mt.offs, mt.cols, mt.n))
        if not torch.equal(y.view(torch.int16), ref):
            raise AssertionError(f"{mt.n}×{mt.k} M={x.shape[0]} view={view}: the op does not give F.linear's bits")
    return bench(run)


def prepared(n, k, seed):
    mt = Mat(n, k, seed)
    mt.wq = decode_gpu(mt.records, mt.exps, mt.counts, mt.escapes, n, k, view=True).float()
    return mt


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ms", default="16,32,48,64,128")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    a = ap.parse_args()
    ms = [int(v) for v in a.ms.split(",")]
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    head = [f"# W12 at M = {a.ms} on shapes outside the tables: ws_rule_config vs the skinny kernel — "
            f"{datetime.date.today()}", "",
            f"- GPU: {torch.cuda.get_device_name()}; torch {torch.__version__}; "
            f"commit {commit()}",
            f"- command: `W12_CUDA=1 python bench/unseen_shapes.py --ms {a.ms}`",
            "- µs: CUDA graph replay, do_bench (L2 flushed), median; ratio = cuBLAS µs / kernel µs; every config "
            "checked first (rel. error < 1e-2 against the fp32 product of the decoded weights, two runs the same bits)",
            ""]
    part1 = ["## 1. The rule where it differs from WS_TABLE (the table's shapes)", "",
             "| N×K | M | cuBLAS µs | table | µs | rule | µs | rule / table time | view: table µs | rule µs |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    part2 = ["## 2. Shapes outside the tables", "",
             "| model | N×K | M | cuBLAS µs | skinny | W12 µs | view µs | ws (rule) | W12 µs | view µs | now | "
             "W12 ratio: skinny | ws | view ratio: skinny | ws | decode + cuBLAS µs | ratio | "
             "view decode + cuBLAS µs | ratio |",
             "|---" * 19 + "|"]
    ratios: dict = {}

    def write():
        summ = ["## Summary: geomean of cuBLAS µs / kernel µs over the unseen shapes", "",
                "| M | W12 skinny | W12 ws | W12 now | view skinny | view ws | view now | W12 decode + cuBLAS | "
                "view decode + cuBLAS |", "|---|---|---|---|---|---|---|---|---|"]
        for m in ms:
            r = ratios.get(m, {})
            cells = (f"{geo(r.get(c, [])):.3f}" for c in ("wf", "wr", "wn", "vf", "vr", "vn", "wd", "vd"))
            summ.append(f"| {m} | " + " | ".join(cells) + " |")
        (out / "unseen_shapes.md").write_text("\n".join(head + part1 + [""] + part2 + [""] + summ) + "\n")

    def emit(part, row):
        part.append(row)
        print(row, flush=True)
        write()

    for si, (n, k) in enumerate(SHAPES):
        diff = {m: (gc.WS_TABLE[(n, k, gc.m_bucket(m))], gc.ws_rule_config(m, n, k)) for m in ms
                if (n, k, gc.m_bucket(m)) in gc.WS_TABLE}
        diff = {m: (tab, rule) for m, (tab, rule) in diff.items() if tab != rule}
        if not diff:
            continue
        mt = prepared(n, k, 100 + si)
        for m, (tab, rule) in diff.items():
            r, cub, _, _ = case(mt, m, {"table": (tab, tab), "rule": (rule, rule)}, m)
            emit(part1, f"| {n}×{k} | {m} | {cub:.1f} | {short(tab)} | {r['table'][1]:.1f} | {short(rule)} | "
                        f"{r['rule'][1]:.1f} | {r['rule'][1] / r['table'][1]:.3f} | {r['table'][2]:.1f} | "
                        f"{r['rule'][2]:.1f} |")
        del mt
        torch.cuda.empty_cache()
    for model, shapes in UNSEEN.items():
        for si, (n, k) in enumerate(shapes):
            mt = prepared(n, k, 500 + si)
            for m in ms:
                rule = gc.ws_rule_config(m, n, k)
                cfgs = {"rule": (rule, rule)}
                if m <= 64:  # the skinny kernel's range
                    cfgs["skinny"] = (gc.pick_config(m, n, k), gc.pick_config(m, n, k, True))
                r, cub, td, tdv = case(mt, m, cfgs, m, decoded=True)
                (_, rw, rv, _) = r["rule"]
                sk, fw, fv, _ = r.get("skinny", (None, float("nan"), float("nan"), 0.0))
                now = gc.kernel_for(m, n, k)
                assert now in ("ws", "skinny") and (now == "ws" or m <= 64)
                assert (now == "ws") == isinstance(gc.dispatched_config(m, n, k), gc.WsConfig)
                nw, nv = (rw, rv) if now == "ws" else (fw, fv)  # the skinny kernel: pick_config's choice, timed above
                if gc.prefers_decode(m, n, k):  # the op decodes (ops._gemm, ops.w12_view_gemm)
                    nw = td
                if gc.prefers_decode(m, n, k, True):
                    nv = tdv
                now = "/".join("decode" if gc.prefers_decode(m, n, k, v) else now for v in (False, True))
                for key, t in (("wf", fw), ("wr", rw), ("wn", nw), ("vf", fv), ("vr", rv), ("vn", nv), ("wd", td),
                               ("vd", tdv)):
                    if t == t:  # not NaN (no skinny kernel above M = 64)
                        ratios.setdefault(m, {}).setdefault(key, []).append(cub / t)
                emit(part2, f"| {model} | {n}×{k} | {m} | {cub:.1f} | {short(sk) if sk else '—'} | {fw:.1f} | "
                            f"{fv:.1f} | {short(rule)} | {rw:.1f} | {rv:.1f} | {now} | {cub / fw:.3f} | "
                            f"{cub / rw:.3f} | {cub / fv:.3f} | {cub / rv:.3f} | {td:.1f} | {cub / td:.3f} | "
                            f"{tdv:.1f} | {cub / tdv:.3f} |")
            del mt
            torch.cuda.empty_cache()
    write()
    print((out / "unseen_shapes.md").read_text())


if __name__ == "__main__":
    main()
