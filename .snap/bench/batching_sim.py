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
       python bench/batching_sim.py --only-budget [--seeds 3] [--cal-p-only]
       (only the calibrated-budget section, written to bench/results/2026-11-29-batching-calibrated.md:
       reliability of the drafter's probabilities, then equal / shared / calibrated shared at the same total
       budget on held-out halves of the prompts; --calibrated adds that section to the full report.
       Quick: --recordings trunc-fp32 --cal-batches 4,16 --cal-per-req 2,8 --report /tmp/x.md)
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections import deque
from itertools import islice
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

from w12.specdec.batching import (CalibratedBudget, DraftBlock, EdgeCalibration, RowCurve, equal_split,  # noqa: E402
                                  llama8b_curve, shared_budget)
from w12.specdec.trees import _child_order, best_first_order  # noqa: E402
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
    """One closed-loop run. policy: ar | equal | shared, or a plan object (e.g. a CalibratedBudget: called
    with the requests' keys, and `update(lattice, committed, key)` after each verified step with only the
    tokens that step committed); admission: separate | merge | flat."""
    n_requests = n_requests or max(2 * B, len(records))
    stream = deque(enumerate(records[i % len(records)] for i in range(n_requests)))
    live, waiting = [], deque()
    t = tokens = steps = dec_tokens = dec_slots = drafter_rows = 0.0
    plan = policy if callable(policy) else {"shared": shared_budget, "equal": equal_split}.get(policy)
    learns = hasattr(plan, "update")
    while stream or live or waiting:
        while stream and len(live) + len(waiting) < B:
            key, rec = stream.popleft()
            waiting.append({"rec": rec, "key": key, "j": 1, "waited": 0,
                            "blk": block.init() if block else None})
        # verification rows of the running requests
        if live and policy != "ar":
            depths = [block.choose(r["blk"]) for r in live] if block else [None] * len(live)
            lats = [r["rec"].lattices[r["j"]] for r in live]
            keys = {"keys": [r["key"] for r in live]} if learns else {}
            trees = plan(lats, [r["rec"].root(r["j"]) for r in live], per_req * len(live), depths, **keys)
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
            if learns and tree is not None:
                plan.update(rec.lattices[j], rec.tokens[j:j + tau], r["key"])      # only what this step committed
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
    return {"tok_s": tokens / t, "tau": dec_tokens / dec_slots, "steps": steps, "dec_tokens": dec_tokens,
            "dec_slots": dec_slots,
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



# --- calibrated node budget (issue 12 follow-up) ------------------------------------------------------

REL_BINS = (0.0, 0.01, 0.03, 0.1, 0.2, 0.4, 0.6, 0.8, 0.9, 1.0)
CAL_PER_REQ = [1, 2, 4, 8]
CAL_BATCHES = [1, 4, 8, 16, 32, 64]


def halves(records):
    """Two disjoint halves of the prompts (even / odd index): a calibration fitted on one is evaluated on
    the other."""
    return [records[0::2], records[1::2]]


def heldout_fits(records, **opts) -> list[EdgeCalibration]:
    """fits[k]: EdgeCalibration fitted on half k (to be used on half 1 - k)."""
    return [EdgeCalibration.fit([s for r in h for s in r.steps()], **opts) for h in halves(records)]


def _path_outcomes(lat, cont, cal, top):
    """(raw path p, calibrated path q, accepted) of the `top` best nodes by raw path score (those within
    the continuation's length)."""
    nodes, out = [(None, None, 0, True, True, 0.0)], []        # (rank, parent rank, depth, chain, match, log q)
    ids = lat.lists()[0]
    orders = {}
    for p, r, s in islice(best_first_order(lat), top):
        _, prank, d0, ch0, m0, lq0 = nodes[p] if p else (None, None, 0, True, True, 0.0)
        if p not in orders:
            raw = _child_order(lat, d0, nodes[p][0] if p else None, True)
            orders[p] = ({rr: i for i, (_, rr) in enumerate(raw)}, math.exp(raw[0][0]) if raw else 0.0, raw)
        where, p1, raw = orders[p]
        c = where[r]
        d = d0 + 1
        q = cal.prob(d, ch0, c, math.exp(raw[c][0]), p1)
        m = m0 and d <= len(cont) and ids[d - 1][r] == cont[d - 1]
        nodes.append((r, prank, d, ch0 and r == 0, m, lq0 + math.log(q)))
        if d <= len(cont):
            out.append((math.exp(s), math.exp(nodes[-1][5]), m))
    return out


def reliability(records, fits, top=32):
    """Predicted vs realised acceptance of the drafter's best `top` nodes per lattice (each half scored by
    the calibration fitted on the other half). Returns (rows by raw p bin, rows by calibrated q bin,
    per-prompt ratios, edge table)."""
    hs = halves(records)
    nb = len(REL_BINS) - 1
    by = {"raw": [[0, 0.0, 0] for _ in range(nb)], "cal": [[0, 0.0, 0] for _ in range(nb)]}
    per = []                                                    # per prompt: {half: [Σ raw p, Σ q, Σ real]}
    binof = lambda x: min(nb - 1, max(b for b in range(nb) if x >= REL_BINS[b]))
    for k in (0, 1):
        for rec in hs[k]:
            acc = {0: [0.0, 0.0, 0], 1: [0.0, 0.0, 0]}
            for j in range(1, len(rec.tokens)):
                lat = rec.lattices[j]
                if not lat.positions:
                    continue
                a = acc[int(j >= len(rec.tokens) // 2)]
                for p, q, m in _path_outcomes(lat, rec.tokens[j:], fits[1 - k], top):
                    for key, x in (("raw", p), ("cal", q)):
                        c = by[key][binof(x)]
                        c[0] += 1
                        c[1] += x
                        c[2] += m
                    a[0] += p
                    a[1] += q
                    a[2] += m
            per.append(acc)
    edges = {}                                                  # (group, bin) -> [n, accepted]
    for rec in records:
        for lat, cont in rec.steps():
            for d, ch, c, p, p1, ok in fits[0].edges(lat, cont):
                g = "depth 1" if d == 1 else "deeper, on chain" if ch else "deeper, off chain"
                e = edges.setdefault((g, binof(p)), [0, 0])
                e[0] += 1
                e[1] += ok
    return by, per, edges


def _corr(xs, ys):
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxy = sum((x - mx) * (y - my) for x, y in zip(xs, ys))
    sx, sy = sum((x - mx) ** 2 for x in xs) ** 0.5, sum((y - my) ** 2 for y in ys) ** 0.5
    return sxy / (sx * sy) if sx and sy else float("nan")


def reliability_section(records, fits, top=32) -> list[str]:
    by, per, edges = reliability(records, fits, top)
    L = ["### Are the drafter's path probabilities calibrated? (reliability)", "",
         f"The {top} best nodes of every recorded lattice by raw path probability (best-first order), "
         "prompts split into two halves (even / odd index); a node is realised when its path is a prefix of "
         "the target's greedy continuation (it would be accepted in any prefix-closed tree that holds it). "
         "Calibrated q = Π over the path of the held-out edge calibration (`EdgeCalibration`, fitted on the "
         "other half).", "",
         "| bin | nodes (raw p) | mean raw p | realised | realised / p | nodes (cal q) | mean q | realised | realised / q |",
         "|---|---|---|---|---|---|---|---|---|"]
    for b in range(len(REL_BINS) - 1):
        (n1, s1, m1), (n2, s2, m2) = by["raw"][b], by["cal"][b]
        f = lambda n, s, m: (f"{n} | {s / n:.3f} | {m / n:.3f} | {m / s:.2f}" if n else "0 | – | – | –")
        L.append(f"| {REL_BINS[b]:.2f}–{REL_BINS[b + 1]:.2f} | {f(n1, s1, m1)} | {f(n2, s2, m2)} |")
    ratio = lambda a, i: (a[0][2] + a[1][2]) / (a[0][i] + a[1][i])
    L += ["", "Per request (prompt): realised / predicted over its nodes above, quantiles over the prompts; "
          "persistence = correlation over prompts between that ratio on the first and on the second half "
          "of its steps (what a per-request online correction could exploit).", "",
          "| score | min | 10 % | 25 % | median | 75 % | 90 % | max | persistence (corr) |",
          "|---|---|---|---|---|---|---|---|---|"]
    for name, i in (("raw p", 0), ("calibrated q", 1)):
        rs = sorted(ratio(a, i) for a in per)
        qs = [rs[round(q * (len(rs) - 1))] for q in (0, .1, .25, .5, .75, .9, 1)]
        ok = [a for a in per if a[0][i] > 0 and a[1][i] > 0]
        c = _corr([a[0][2] / a[0][i] for a in ok], [a[1][2] / a[1][i] for a in ok])
        L.append(f"| {name} | " + " | ".join(f"{q:.2f}" for q in qs) + f" | {c:+.2f} |")
    groups = ["depth 1", "deeper, on chain", "deeper, off chain"]
    L += ["", "Edges (the calibration's input): P(edge accepted | its parent accepted) vs the drafter's edge "
          "probability p, all prompts. On chain = every ancestor is the drafter's top-1 candidate at its "
          "position (the context the drafter drafted that position in).", "",
          "| edge p | " + " | ".join(f"{g}: edges | realised" for g in groups) + " |",
          "|---|" + "---|---|" * len(groups)]
    for b in range(len(REL_BINS) - 1):
        cells = []
        for g in groups:
            n, m = edges.get((g, b), [0, 0])
            cells.append(f"{n} | {m / n:.3f}" if n else "0 | –")
        L.append(f"| {REL_BINS[b]:.2f}–{REL_BINS[b + 1]:.2f} | " + " | ".join(cells) + " |")
    return L + [""]


def cal_policies(cal_opts: dict) -> dict:
    """name -> (fit for this half -> plan); plans are stateful, so one per run."""
    return {
        "equal": lambda fit: "equal",
        "shared": lambda fit: "shared",
        "cal-equal": lambda fit: CalibratedBudget(fit, online=False, split="equal"),
        "cal-shared": lambda fit: CalibratedBudget(fit, online=False),
        "online": lambda fit: CalibratedBudget(EdgeCalibration(**cal_opts)),
        "online+req": lambda fit: CalibratedBudget(EdgeCalibration(**cal_opts), per_request=8.0),
    }


def calibrated_table(records, curve, batches=CAL_BATCHES, per_reqs=CAL_PER_REQ, seeds=1, cal_opts=None,
                     fits=None):
    """τ per policy at the same total budget B × n, on held-out halves: each half of the prompts is run
    alone (closed loop) with the calibration fitted on the other half; tokens and request-steps of the
    two halves (and of `seeds` stream orders) are pooled. Seed s > 0 shuffles the order of the prompts
    in the stream. Returns rows {B, n, pol: τ, "seeds": {pol: [τ per seed]}}."""
    import random
    cal_opts = cal_opts or {}
    fits = fits or heldout_fits(records, **cal_opts)
    hs = halves(records)
    pols = cal_policies(cal_opts)
    out = []
    for B in batches:
        for n in per_reqs:
            row = {"B": B, "n": n, "seeds": {}}
            for name, mk in pols.items():
                per_seed = []
                for s in range(seeds):
                    tok = slots = 0
                    for k in (0, 1):
                        recs = list(hs[k])
                        if s:
                            random.Random(s).shuffle(recs)
                        x = simulate(recs, B, curve, mk(fits[1 - k]), n)
                        tok, slots = tok + x["dec_tokens"], slots + x["dec_slots"]
                    per_seed.append((tok, slots))
                row[name] = sum(t for t, _ in per_seed) / sum(s for _, s in per_seed)
                row["seeds"][name] = [t / s for t, s in per_seed]
            out.append(row)
    return out


def calibrated_section(records, curve, batches=CAL_BATCHES, per_reqs=CAL_PER_REQ, seeds=1, cal_opts=None,
                       top=32) -> list[str]:
    cal_opts = cal_opts or {}
    fits = heldout_fits(records, **cal_opts)
    L = reliability_section(records, fits, top)
    rows = calibrated_table(records, curve, batches, per_reqs, seeds, cal_opts, fits)
    gain = lambda a, b: f"{(a / b - 1) * 100:+.1f} % / {((a - 1) / (b - 1) - 1) * 100:+.1f} %"
    L += ["### Calibrated shared budget vs equal split at the same total budget", "",
          "Closed loop, B slots, held-out halves: each half of the prompts runs alone, requests cycled (2·B or "
          "the half's prompts, whichever is more), with the calibration fitted on the other half; the two "
          f"halves{' and ' + str(seeds) + ' stream orders' if seeds > 1 else ''} are pooled. τ = tokens per "
          "request per step (bonus included); gains are given as τ / accepted draft tokens per step (τ − 1). "
          "Policies: equal = equal split, raw best-first within each share (the baseline); shared = one "
          "budget best-first by raw path probability; cal-equal = equal split, calibrated best-first within "
          "each share (control: tree shape only); cal-shared = one budget best-first by calibrated path "
          "acceptance (fitted on the other half, frozen); online = cal-shared with one calibration learnt "
          "during the run from verified steps only (starts as the raw probabilities); online+req = online × a "
          "per-request acceptance multiplier from that request's own verified steps (8 pseudo-edges prior).", "",
          "| B | nodes/request | total | τ equal | τ shared | τ cal-equal | τ cal-shared | τ online | τ online+req "
          "| cal-shared vs equal | cal-shared vs shared | cal-shared vs cal-equal |",
          "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        L.append(f"| {r['B']} | {r['n']} | {r['B'] * r['n']} | {r['equal']:.3f} | {r['shared']:.3f} | "
                 f"{r['cal-equal']:.3f} | {r['cal-shared']:.3f} | {r['online']:.3f} | {r['online+req']:.3f} | "
                 f"{gain(r['cal-shared'], r['equal'])} | {gain(r['cal-shared'], r['shared'])} | "
                 f"{gain(r['cal-shared'], r['cal-equal'])} |")
    if seeds > 1:
        L += ["", "Spread over stream orders (min … max of the per-order τ gain, cal-shared vs cal-equal and "
              "shared vs equal):", "", "| B | nodes/request | cal-shared vs cal-equal | shared vs equal |",
              "|---|---|---|---|"]
        for r in rows:
            sp = lambda a, b: [x / y - 1 for x, y in zip(r["seeds"][a], r["seeds"][b])]
            f = lambda g: f"{min(g) * 100:+.1f} … {max(g) * 100:+.1f} %"
            L.append(f"| {r['B']} | {r['n']} | {f(sp('cal-shared', 'cal-equal'))} | {f(sp('shared', 'equal'))} |")
    return L + [""]


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
                    "curve), bench/results/batching-sim-gpu-curve.md (with --costs) or "
                    "bench/results/2026-11-29-batching-calibrated.md (with --only-budget)")
    ap.add_argument("--costs", default=None, help="JSON of bench/gpu_step_costs.py: use its measured row-cost curves")
    ap.add_argument("--recordings", default=",".join(RECORDINGS), help="comma-separated subset of " + ",".join(RECORDINGS))
    ap.add_argument("--limit", type=int, default=None, help="use only the first N recorded prompts (quick runs)")
    ap.add_argument("--batches", default=",".join(map(str, REPORT_B)), help="batch sizes of the speed tables")
    ap.add_argument("--tau-batches", default=",".join(map(str, BATCHES)), help="batch sizes of the τ tables")
    ap.add_argument("--calibrated", action="store_true", help="add the calibrated-budget section (reliability of the "
                    "drafter's probabilities; calibrated shared budget vs equal split on held-out halves)")
    ap.add_argument("--only-budget", action="store_true", help="only the calibrated-budget section (no curves, no speed "
                    "tables): τ needs no row-cost curve")
    ap.add_argument("--cal-batches", default=",".join(map(str, CAL_BATCHES)), help="batch sizes of the calibrated table")
    ap.add_argument("--cal-per-req", default=",".join(map(str, CAL_PER_REQ)), help="nodes per request of that table")
    ap.add_argument("--seeds", type=int, default=1, help="stream orders pooled in the calibrated table (1 = as recorded)")
    ap.add_argument("--cal-p-only", action="store_true", help="calibrate on the edge probability alone "
                    "(EdgeCalibration(by_rank=False)) instead of rank bucket + probability given the best child failed")
    args = ap.parse_args(argv)
    default = ("2026-11-29-batching-calibrated.md" if args.only_budget else
               "batching-sim-gpu-curve.md" if args.costs else "2026-11-29-batching-sim.md")
    report = args.report or str(ROOT / "bench/results" / default)
    speed_b, tau_b = [int(b) for b in args.batches.split(",")], [int(b) for b in args.tau_batches.split(",")]
    cal_b, cal_n = [int(b) for b in args.cal_batches.split(",")], [int(n) for n in args.cal_per_req.split(",")]
    cal_opts = {"by_rank": False} if args.cal_p_only else {}
    t0 = time.time()
    curves, text = load_curves(args.costs)
    cmd = "python bench/batching_sim.py" + (f" --costs {Path(args.costs).name}" if args.costs else "")
    if args.only_budget:
        cmd = " ".join(["python bench/batching_sim.py", *(sys.argv[1:] if argv is None else argv)])
        L = [f"# Calibrated shared node budget vs equal split — simulated on recorded SmolLM2 lattices — "
             f"{time.strftime('%Y-%m-%d')}", "",
             f"Generated by `{cmd}` (exact replay of the recordings in `bench/results/specdec-work/`; no model in "
             "the loop; τ does not depend on a row-cost curve). Policies: `w12/specdec/batching.py` "
             "(`shared_budget`, `equal_split`, `CalibratedBudget`, `EdgeCalibration`).", ""]
    else:
        L = ["# Batching policies: simulated on recorded SmolLM2 lattices — "
             + ("row costs measured on the GPU" if args.costs else "2026-11-29"), "",
             f"Generated by `{cmd}` (exact replay of the recordings in "
             "`bench/results/specdec-work/`; no model in the loop). Policies: `w12/specdec/batching.py`. "
             f"Curve source: **{'measured (' + Path(args.costs).name + ')' if args.costs else 'derived from the kernel table'}**.",
             "", *curve_section(curves, text)]
    for rec_name in args.recordings.split(","):
        records = records_of(rec_name)[:args.limit]
        P, k = (max(getattr(l, a) for r in records for l in r.lattices) for a in ("positions", "topk"))
        L += [f"## {rec_name}: {len(records)} recorded prompts (up to {P} positions × top-{k}, "
              f"{len(records[0].tokens)} tokens each)", ""]
        if args.calibrated or args.only_budget:
            L += calibrated_section(records, next(iter(curves.values())), cal_b, cal_n, args.seeds, cal_opts)
        if args.only_budget:
            continue
        L += ["### Shared node budget vs equal split at the same total budget (τ = tokens per request per step)", "",
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
