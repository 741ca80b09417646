"""The xs W12 kernel (w12_gemm_xs_kernel: X staged in shared memory for 16·warps channels, W streamed into
registers) against what gemm_cuda dispatches today and cuBLAS BF16, every shape, M = 16…128. One GPU call.

    W12_CUDA=1 python bench/xs_configs.py [--ms 16,32,48,64,128] [--out DIR]

1. Identity product (X = consecutive rows of the identity, so Y[m, n] = W[n, i + m]): every in-window weight
   decoded bit-exact and every escape restored, W12 and 8-bit view, for every XsConfig (mma.sync: nt 2/4/8,
   warps 4/8; wgmma: nt 4/8/16, 8 warps; unroll 1/2, split 1/3) on N = 300 (a partial record row) × K = 1024
   (16 records: several X chunks, the ring wraps), with full and partial M tiles.
2. Per (shape, M): every candidate (`configs`: mma.sync and, from M = 17, wgmma; × unroll × split 1/2/4/8)
   checked against the reference (decoded weights, fp32 matmul: relative ∞-norm error < 1e-2) and for
   determinism (the same bits over 3 runs), then timed as bench/kernels.py times (CUDA graph replay, do_bench,
   L2 flushed, median), beside cuBLAS (`torch.matmul`) and today's dispatch (gemm_cuda.launch's own choice).
   A variant that fails a check is reported and left out, not fatal (part 1 runs each variant in its own
   process, so an illegal access only disqualifies its variant).  Writes OUT/xs_configs.md (after every case),
   OUT/xs_configs.json (every config's µs) and OUT/xs_table.py: the fastest xs config per (N, K, M) where it
   beats today's dispatch.
   W12_XS_TABLE=OUT/xs_table.py makes gemm_cuda dispatch to those (e.g. bench/kernels.py in the same GPU call).
"""

import argparse
import datetime
import json
import os
import subprocess
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kernels import bench, decode_gpu, make_weight, mat_of, rel, sweep_cases  # noqa: E402  (bench/kernels.py)

from w12.kernels import gemm_cuda as gc  # noqa: E402


def configs(m: int, k: int, splits=(1, 2, 4, 8)):
    """The candidates at M (from gemm_cuda.XS_VARIANTS): mma.sync with the smallest nt that holds M (else 8), and
    with more than one M tile also the launch order with a channel block's M tiles next to each other (mfirst);
    from M = 17 on, wgmma with the smallest nt that holds M; every split of `splits` up to K / 64."""
    out = []
    for wg in (False, True):
        nts = sorted({v[0] for v in gc.XS_VARIANTS if v[3] == wg})
        nt = next((v for v in nts if m <= 8 * v), nts[-1])
        if wg and m <= 16:
            continue
        orders = (False, True) if m > 8 * nt else (False,)
        out += [gc.XsConfig(nt, w, u, s, o, wg) for (vnt, w, u, vwg) in gc.XS_VARIANTS if (vnt, vwg) == (nt, wg)
                for s in splits if s <= k // 64 for o in orders]
    return out


def variant(c) -> tuple:
    """A config without its split and launch order: what the kernel's code depends on."""
    return c.nt, c.warps, c.unroll, c.wg


def identity_check(variants) -> set:
    """Part 1 for the variants (nt, warps, unroll, wg) given: decoded weights through the xs kernel, bit for bit.
    Returns the variants that failed (printed)."""
    return identity_product([gc.XsConfig(nt, w, u, s, wg=wg) for nt, w, u, wg in variants for s in (1, 3)], variant)


def identity_product(cands, variant_of) -> set:
    """Each config of cands on N = 300 × K = 1024 with escapes, X = the identity (Y = W as the kernel decodes it),
    with a full and a partial M tile: in-window weights and the 8-bit view bit-exact, escapes restored.  Returns
    variant_of(config) for those that failed (printed)."""
    n, k = 300, 1024
    w = make_weight(n, k, 3)
    w.view(-1)[::997] = torch.tensor(100.0, dtype=torch.bfloat16)  # out-of-window weights: escapes
    mt, esc = mat_of(w)
    wq = decode_gpu(mt.records, mt.exps, mt.counts, mt.escapes, n, k, view=True)
    bad = set()
    for cfg in cands:
        for m in (8 * cfg.nt, 8 * cfg.nt - 3):  # a full M tile and a partial one
            try:
                yt, yq = mt.seen(m, cuda=cfg), mt.seen(m, view=True, cuda=cfg)
            except RuntimeError as e:  # a launch error
                print(f"FAIL identity product {cfg} M={m}: {e}", flush=True)
                bad.add(variant_of(cfg))
                continue
            fails = [what for what, ok in (
                ("decode", torch.equal(yt.view(torch.int16)[~esc], w.view(torch.int16)[~esc])),
                ("escapes", torch.allclose(yt[esc].float(), w[esc].float(), rtol=2**-8, atol=1e-6)),
                ("view", torch.equal(yq.view(torch.int16)[~esc], wq.view(torch.int16)[~esc]))) if not ok]
            if fails:
                print(f"FAIL identity product {cfg} M={m}: {', '.join(fails)}", flush=True)
                bad.add(variant_of(cfg))
    return bad


def identity_check_isolated() -> set:
    """Part 1 with every variant in its own process (run_isolated).  Returns the variants that failed or crashed."""
    return run_isolated(os.path.abspath(__file__), gc.XS_VARIANTS, lambda v: ",".join(map(str, v)))


def run_isolated(script: str, variants, arg_of, limit_s: int = 180) -> set:
    """`python script --identity arg_of(v)` for every variant, all at once, each in its own process: an illegal access
    (which ends a CUDA process) or a hang (killed after limit_s) then only disqualifies its own variant.  Prints a
    line per failure and a summary; returns the variants that failed, crashed or hung."""
    procs = {v: subprocess.Popen([sys.executable, script, "--identity", arg_of(v)], stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, text=True) for v in variants}
    bad = set()
    for v, p in procs.items():
        try:
            out = p.communicate(timeout=limit_s)[0]
        except subprocess.TimeoutExpired:
            p.kill()
            out = p.communicate()[0] + f"\n(no result within {limit_s} s: a hang)"
        if p.returncode != 0:
            tail = " | ".join(out.strip().splitlines()[-3:])
            print(f"FAIL identity product, variant {v}: exit {p.returncode}: {tail}", flush=True)
            bad.add(v)
    print(f"identity product: {len(procs) - len(bad)} of {len(procs)} variants bit-exact (W12 and view, escapes, "
          f"full and partial M tiles, split 1 and 3); failed: {sorted(bad) or 'none'}", flush=True)
    return bad


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ms", default="16,32,48,64,128")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--identity", help="only part 1 for one variant nt,warps,unroll,wg (exit 1 if it fails)")
    args = ap.parse_args()
    if args.identity:
        nt, w, u, wg = args.identity.split(",")
        sys.exit(1 if identity_check([(int(nt), int(w), int(u), wg == "True")]) else 0)
    ms = [int(v) for v in args.ms.split(",")]
    torch.backends.cuda.matmul.allow_tf32 = False
    bad = identity_check_isolated()
    lines, best_of, raw = [], {}, []
    for n, k, m, mt, x, ref, t_cublas in sweep_cases(ms):
        kind = gc.kernel_for(m, n, k)
        t_now = bench(lambda: mt.op(x))
        res, worst = {}, 0.0
        for cfg in configs(m, k):
            if variant(cfg) in bad:
                continue
            try:
                y = mt.run(x, cuda=cfg)
            except RuntimeError as e:
                print(f"FAIL {n}x{k} M={m} {cfg}: {e}", flush=True)
                bad.add(variant(cfg))
                continue
            err = rel(y, ref)
            same = all(torch.equal(mt.run(x, cuda=cfg), y) for _ in range(3))
            if err >= 1e-2 or not same:
                print(f"FAIL {n}x{k} M={m} {cfg}: relative error {err:.2e}, deterministic {same}", flush=True)
                bad.add(variant(cfg))
                continue
            worst = max(worst, err)
            res[cfg] = bench(lambda cfg=cfg: mt.run(x, cuda=cfg))
        if not res:
            print(f"| {n}×{k} | {m} | no xs config passed |", flush=True)
            continue
        best = min(res, key=res.get)
        if res[best] < t_now:  # XS_TABLE holds only where xs beats today's dispatch
            best_of[(n, k, m)] = best
        cols = []
        for wg in (False, True):
            mine = {c: t for c, t in res.items() if c.wg == wg}
            c = min(mine, key=mine.get) if mine else None
            cols.append(f"{name(c)}: {mine[c]:.1f} ({t_cublas / mine[c]:.2f}×)" if c else "—")
        row = (f"| {n}×{k} | {m} | {t_cublas:.1f} | {kind} {t_now:.1f} ({t_cublas / t_now:.2f}×) | {cols[0]} | "
               f"{cols[1]} | {t_cublas / res[best]:.2f}× | {t_now / res[best]:.2f}× | {worst:.1e} |")
        print(row, flush=True)
        lines.append(row)
        raw.append(dict(n=n, k=k, m=m, cublas=t_cublas, today=t_now, kind=kind,
                        xs={repr(c): t for c, t in res.items()}))
        write(args, lines, best_of, raw, bad)  # after every case: a run cut short keeps what it measured
    write(args, lines, best_of, raw, bad)
    print(open(os.path.join(args.out, "xs_configs.md")).read())


def name(c) -> str:
    return (f"{'wgmma' if c.wg else 'mma'} nt {c.nt}, w {c.warps}, u {c.unroll}, split {c.split}"
            f"{', mfirst' if c.mfirst else ''}")


def write(args, lines, best_of, raw, bad):
    text = "\n".join([
        f"# xs W12 kernel (X in shared memory) against today's dispatch and cuBLAS — {datetime.date.today()}", "",
        f"- GPU: {torch.cuda.get_device_name()}; torch {torch.__version__}; commit {os.environ.get('W12_REV', '?')}",
        f"- command: `W12_CUDA=1 python bench/xs_configs.py --ms {args.ms} --out $OUT`",
        "- µs: CUDA graph replay, do_bench median, L2 flushed; every config checked against the reference first "
        "(identity product bit-exact; relative ∞-norm error < 1e-2; 3 runs the same bits)",
        f"- variants (nt, warps, unroll, wg) that failed a check: {sorted(bad) or 'none'}", "",
        "| N×K | M | cuBLAS µs | today: kernel µs (vs cuBLAS) | best xs mma.sync µs | best xs wgmma µs "
        "| best xs vs cuBLAS | best xs vs today | worst rel. error |",
        "|---|---|---|---|---|---|---|---|---|", *lines]) + "\n"
    write_files(args.out, "xs", text, best_of, raw)


def write_files(out: str, kind: str, text: str, best_of: dict, raw) -> None:
    """OUT/{kind}_configs.md (text), OUT/{kind}_table.py (a {KIND}_TABLE = {...} that W12_{KIND}_TABLE loads) and
    OUT/{kind}_configs.json (raw)."""
    with open(os.path.join(out, f"{kind}_configs.md"), "w") as fh:
        fh.write(text)
    with open(os.path.join(out, f"{kind}_table.py"), "w") as fh:
        fh.write(f"{kind.upper()}_TABLE = {{\n" + "".join(f"    {key}: {c!r},\n" for key, c in best_of.items()) + "}\n")
    with open(os.path.join(out, f"{kind}_configs.json"), "w") as fh:
        json.dump(raw, fh, indent=1)


if __name__ == "__main__":
    main()
