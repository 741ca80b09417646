"""Batching simulator (issue 12): replay recorded SmolLM2 lattices through the batching policies with a
row-cost curve, for batch sizes 1-64, and write bench/results/2026-11-29-batching-sim.md.

Model of a step (closed loop: B slots, a finished request's slot goes to the next prompt in the stream):
  rows  = Σ tree nodes incl. roots (AR: one row per request) + prompt rows merged into the step
  time  = curve(rows) [+ curve(prompt rows) for each separate prefill pass]
  tokens= Σ τ (exact: `walk` of each tree over the recorded greedy continuation) + 1 per prefill
Speed-up = (tokens / time) of a policy over AR at the same B with separate prefill passes. Drafter cost
is not modelled (the drafter rows of the draft-block policy are reported instead).

Row-cost curve: `--costs PATH` reads the curve measured on the GPU by bench/gpu_step_costs.py (BF16 and W12
forwards of R rows of a Llama-3.1-8B-shaped model, RowCurve.from_json); without it, the fallback derives a
GEMM-only curve from the H200 kernel table (llama8b_curve). The report names the source it used.

Usage: python bench/batching_sim.py [--report bench/results/2026-11-29-batching-sim.md]
       python bench/batching_sim.py --costs gpu-step-costs.json --report bench/results/DATE-batching-sim-gpu.md
       (--recordings trunc-fp32 --limit 8 --batches 1,4: a quick partial run)
"""

from __future__ import annotations

import argparse
import time
from collections import deque
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

from w12.specdec.batching import DraftBlock, RowCurve, equal_split, llama8b_curve, shared_budget  # noqa: E402
from w12.specdec.replay import load_records  # noqa: E402
from w12.specdec.verify import walk  # noqa: E402

WORK = ROOT / "bench/results/specdec-work"
KERNELS = ROOT / "bench/results/2026-11-29-kernels-h200.md"
RECORDINGS = {"trunc-fp32": ["trunc-fp32.json.gz", "trunc-fp32.r30-50.json.gz"], "ngram-fp32": ["ngram-fp32.json.gz"]}
BATCHES = [1, 4, 8, 16, 24, 32, 64]      # the τ table
REPORT_B = [1, 4, 16, 32, 64]
PER_REQ = [1, 2, 4, 8, 16]          # node budget per request (total = B × this) swept for the speed table


def records_of(name):
    out = []
    for f in RECORDINGS[name]:
        out += load_records(WORK / f)[0]
    return out


class Flat:
    def __init__(self, curve: RowCurve, tol=0.05):
        self.curve, self.tol, self.memo = curve, tol, {}

    def __call__(self, rows):
        if rows not in self.memo:
            self.memo[rows] = self.curve.flat_limit(max(rows, 1), self.tol)
        return self.memo[rows]


def simulate(records, B, curve, policy="shared", per_req=2, block=None, admission="separate",
             n_requests=None, max_wait=4, flat=None, tau_only=False):
    """One closed-loop run. policy: ar | equal | shared; admission: separate | merge | flat."""
    n_requests = n_requests or max(2 * B, len(records))
    stream = deque(records[i % len(records)] for i in range(n_requests))
    live, waiting = [], deque()
    t = tokens = steps = dec_tokens = dec_slots = drafter_rows = 0.0
    plan = {"shared": shared_budget, "equal": equal_split}.get(policy)
    while stream or live or waiting:
        while stream and len(live) + len(waiting) < B:
            waiting.append({"rec": stream.popleft(), "j": 1, "waited": 0,
                            "blk": block.init() if block else None})
        # verification rows of the running requests
        if live and policy != "ar":
            depths = [block.choose(r["blk"]) for r in live] if block else [None] * len(live)
            lats = [r["rec"].lattices[r["j"]] for r in live]
            trees = plan(lats, [r["rec"].root(r["j"]) for r in live], per_req * len(live), depths)
            rows = sum(len(x) for x in trees)
            drafter_rows += sum(d or lat.positions for d, lat in zip(depths, lats))
        else:
            trees, rows = [None] * len(live), len(live)
        # prompt admission
        merged, separate = [], []
        for w in list(waiting):
            L = len(w["rec"].prompt)
            if admission == "merge" or not live and not merged:
                merged.append(w)
            elif admission == "separate":
                separate.append(w)
            elif rows + sum(len(m["rec"].prompt) for m in merged) + L <= flat(rows):
                merged.append(w)
            elif w["waited"] >= max_wait:
                separate.append(w)
            else:
                w["waited"] += 1
        for w in merged + separate:
            waiting.remove(w)
        prompt_rows = sum(len(w["rec"].prompt) for w in merged)
        if separate:
            t += curve(sum(len(w["rec"].prompt) for w in separate))
        if live or merged:
            t += curve(rows + prompt_rows)
            steps += 1
        # accept
        nxt = []
        for r, tree in zip(live, trees):
            rec, j = r["rec"], r["j"]
            tau = walk(tree, rec.tokens[j:]) if tree is not None else 1
            if block:
                block.update(r["blk"], tau - 1, rec.lattices[j])
            tokens += tau
            dec_tokens += tau
            dec_slots += 1
            r["j"] = j + tau
            if r["j"] < len(rec.tokens):
                nxt.append(r)
        for w in merged + separate:           # prefill: the first token t[0]
            tokens += 1
            if len(w["rec"].tokens) > 1:
                nxt.append(w)
        live = nxt
    return {"tok_s": tokens / t, "tau": dec_tokens / dec_slots, "steps": steps,
            "drafter_rows": drafter_rows / max(steps, 1)}


def tau_table(records, curve, batches=BATCHES):
    """Tokens per request per step (τ), shared vs equal split at the same total budget B × n."""
    rows = []
    for B in batches:
        for n in (1, 2, 4):
            eq = simulate(records, B, curve, "equal", n)["tau"]
            sh = simulate(records, B, curve, "shared", n)["tau"]
            rows.append((B, n, B * n, eq, sh, sh / eq - 1))
    return rows


def speed_table(records, curve, flat, batches=REPORT_B):
    """Speed-up over AR (same B, separate prefill) per policy; budget per request swept, best kept."""
    blk = DraftBlock().scaled(0.5)      # recordings are 8 positions deep: menu 16/12/8 -> 8/6/4
    out = []
    for B in batches:
        ar = simulate(records, B, curve, "ar")["tok_s"]
        row = {"B": B, "ar_tok_s": ar}
        for name, pol, bk, adm in [("equal", "equal", None, "separate"), ("shared", "shared", None, "separate"),
                                   ("shared+block", "shared", blk, "separate"),
                                   ("shared+block+merge-all", "shared", blk, "merge"),
                                   ("shared+block+flat-admission", "shared", blk, "flat")]:
            best = max(((simulate(records, B, curve, pol, n, bk, adm, flat=flat), n) for n in PER_REQ),
                       key=lambda x: x[0]["tok_s"])
            row[name] = (best[0]["tok_s"] / ar, best[1], best[0]["tau"], best[0]["drafter_rows"])
        out.append(row)
    return out


def load_curves(costs=None) -> tuple[dict[str, RowCurve], list[str]]:
    """({name: curve}, report lines describing them): measured (--costs) or derived from the kernel table."""
    if costs:
        curves = {k: RowCurve.from_json(costs, k) for k in ("bf16", "w12")}
        text = [f"Target step **measured** by `bench/gpu_step_costs.py` (`{Path(costs).name}`): "
                f"{curves['w12'].label.split(' step ', 1)[1]}; one forward of R rows (all layers, attention over a "
                "static KV cache of ctx committed tokens, LM head, argmax of every row), CUDA-graph replays, median. "
                "BF16 = cuBLAS through `nn.Linear`; W12 = `torch.ops.w12.gemm`. Piecewise linear between the "
                f"measured R; past R = {curves['w12'].rows[-1]} linear extrapolation of the last segment (marked *). "
                "The R rows share one KV cache: B requests' separate caches (B·ctx·128 KiB of K/V reads per step "
                "for this shape) are not in the curve."]
        return curves, text
    curves = {k: llama8b_curve(KERNELS, k) for k in ("cublas", "w12")}
    text = ["Llama-3.1-8B-shaped target step, **derived** from the H200 kernel table "
            "`bench/results/2026-11-29-kernels-h200.md` (not a measured step): per layer qkv 6144×4096 + o 4096×4096 + "
            "gate_up 28672×4096 + down 4096×14336, × 32 layers, + LM head 128256×4096. GEMMs only (no attention, "
            "norms, KV reads, launch gaps). Piecewise linear between the measured M; past M = 128 linear extrapolation "
            "of the 64→128 segment (marked *)."]
    return curves, text


def curve_section(curves: dict[str, RowCurve], text: list[str]) -> list[str]:
    """The report's input section: the curves at a few row counts and their flat regions."""
    (a, ca), (b, cb) = curves.items()
    last = min(ca.rows[-1], cb.rows[-1])
    L = ["## Row-cost curve (input)", "", *text, "",
         f"| rows M | {a} ms | {b} ms | {a} / {a}(1) | {b} / {b}(1) |", "|---|---|---|---|---|"]
    for M in [1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384]:
        x, y = ca(M), cb(M)
        L.append(f"| {M}{'*' if M > last else ''} | {x * 1e3:.3f} | {y * 1e3:.3f} | {x / ca(1):.3f} | {y / cb(1):.3f} |")
    flat = lambda c, r: c.flat_limit(r)
    L += ["", f"Flat region (step time within 5 % of the time at the step's own rows): {a} from 1 row: "
          f"{flat(ca, 1)} rows; from 16: {flat(ca, 16)}; from 64: {flat(ca, 64)}. {b} from 1 row: {flat(cb, 1)}; "
          f"from 2: {flat(cb, 2)}; from 16: {flat(cb, 16)}; from 64: {flat(cb, 64)}.", ""]
    return L


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--report", default=None, help="default: bench/results/2026-11-29-batching-sim.md (kernel-table "
                    "curve) or bench/results/batching-sim-gpu-curve.md (with --costs)")
    ap.add_argument("--costs", default=None, help="JSON of bench/gpu_step_costs.py: use its measured row-cost curves")
    ap.add_argument("--recordings", default=",".join(RECORDINGS), help="comma-separated subset of " + ",".join(RECORDINGS))
    ap.add_argument("--limit", type=int, default=None, help="use only the first N recorded prompts (quick runs)")
    ap.add_argument("--batches", default=",".join(map(str, REPORT_B)), help="batch sizes of the speed tables")
    ap.add_argument("--tau-batches", default=",".join(map(str, BATCHES)), help="batch sizes of the τ tables")
    args = ap.parse_args(argv)
    report = args.report or str(ROOT / "bench/results" / ("batching-sim-gpu-curve.md" if args.costs
                                                          else "2026-11-29-batching-sim.md"))
    speed_b, tau_b = [int(b) for b in args.batches.split(",")], [int(b) for b in args.tau_batches.split(",")]
    t0 = time.time()
    curves, text = load_curves(args.costs)
    cmd = "python bench/batching_sim.py" + (f" --costs {Path(args.costs).name}" if args.costs else "")
    L = ["# Batching policies: simulated on recorded SmolLM2 lattices — "
         + ("row costs measured on the GPU" if args.costs else "2026-11-29"), "",
         f"Generated by `{cmd}` (exact replay of the recordings in "
         "`bench/results/specdec-work/`; no model in the loop). Policies: `w12/specdec/batching.py`. "
         f"Curve source: **{'measured (' + Path(args.costs).name + ')' if args.costs else 'derived from the kernel table'}**.",
         "", *curve_section(curves, text)]
    for rec_name in args.recordings.split(","):
        records = records_of(rec_name)[:args.limit]
        L += [f"## {rec_name}: {len(records)} recorded prompts ({records[0].lattices[1].positions} positions × "
              f"top-{records[0].lattices[1].topk}, {len(records[0].tokens)} tokens each)", "",
              "### Shared node budget vs equal split at the same total budget (τ = tokens per request per step)", "",
              "Closed loop, B slots, requests cycled through the recordings (2·B or all of them, whichever is more).", "",
              "| B | nodes/request | total nodes | τ equal split | τ shared | shared gain |", "|---|---|---|---|---|---|"]
        for B, n, N, eq, sh, g in tau_table(records, next(iter(curves.values())), tau_b):
            L.append(f"| {B} | {n} | {N} | {eq:.3f} | {sh:.3f} | {g * 100:+.1f} % |")
        for cname, curve in curves.items():
            flat = Flat(curve)
            L += ["", f"### Predicted speed-up over AR at the same B — {cname} curve "
                  f"({'measured' if args.costs else 'derived from the kernel table'})", "",
                  "Cell: speed-up (best nodes/request from 1/2/4/8/16; τ; drafter rows per step). "
                  "Prefill: separate pass per arriving batch of prompts unless stated; flat admission merges a prompt "
                  "when step rows + prompt rows stay within 5 % of the step's own time, else it waits (≤ 4 steps, then "
                  "a separate pass). Draft block: menu 8/6/4 (16/12/8 scaled to the 8-deep recordings).", "",
                  "| B | AR tok/s | equal | shared | shared+block | shared+block+merge-all | shared+block+flat-admission |",
                  "|---|---|---|---|---|---|---|"]
            for row in speed_table(records, curve, flat, speed_b):
                cells = [f"{s:.3f}× (n={n}; τ {tau:.2f}; dr {dr:.0f})" for s, n, tau, dr in
                         (row[k] for k in ["equal", "shared", "shared+block", "shared+block+merge-all",
                                           "shared+block+flat-admission"])]
                L.append(f"| {row['B']} | {row['ar_tok_s']:.0f} | " + " | ".join(cells) + " |")
    L += ["", f"Wall time of this run: {time.time() - t0:.0f} s (CPU, 1 thread).", ""]
    Path(report).write_text("\n".join(L))
    print("\n".join(L))


if __name__ == "__main__":
    main()
