"""`w12 check-lossless`: token forcing of system outputs through a scorer (seed paper §3.4)."""

import json
import sys

import click

from w12.cli_common import EXIT_MISMATCH, EXIT_OK, run


def read_outputs(path: str) -> tuple[list[list[int]], list[list[int]]]:
    """JSONL of {"prompt_ids": [...], "output_ids": [...]} -> (prompts, outputs)."""
    prompts, outputs = [], []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            if line.strip():
                try:
                    d = json.loads(line)
                    prompts.append([int(t) for t in d["prompt_ids"]])
                    outputs.append([int(t) for t in d["output_ids"]])
                except (ValueError, KeyError, TypeError) as e:
                    raise click.BadParameter(f"{path} line {n}: expected {{\"prompt_ids\", \"output_ids\"}} ({e})")
    return prompts, outputs


@click.command("check-lossless")
@click.option("--scorer", required=True, type=click.Path(exists=True, file_okay=False),
              help="The reference BF16 target (its LM head is applied in FP32).")
@click.option("--stock", required=True, type=click.Path(exists=True, dir_okay=False),
              help="Outputs of the stock system (JSONL: prompt_ids, output_ids).")
@click.option("--ar", required=True, type=click.Path(exists=True, dir_okay=False),
              help="Outputs of plain autoregressive decoding on the same prompts (sets δ in Phase 0).")
@click.argument("systems", nargs=-1, type=click.Path(exists=True, dir_okay=False))
@click.option("--json", "as_json", is_flag=True)
def check_lossless(scorer, stock, ar, systems, as_json):
    """Teacher-force each SYSTEMS output file through the scorer and decide, against stock, whether it
    still emits the target's argmax. Exit 0: every system passes; 1: a system is rejected.

    \b
    Phase 0: δ = largest margin where stock first diverges from AR, rounded up to a multiple of 1/8.
    Reject: mismatch rate > stock's + 0.5 points, or events (margin ≥ 2δ) more frequent than stock's.
    """
    import torch
    from transformers import AutoModelForCausalLM

    from w12.specdec.token_forcing import check, decide, phase0_delta

    model = AutoModelForCausalLM.from_pretrained(scorer, dtype=torch.bfloat16).eval()
    p_stock, o_stock = read_outputs(stock)
    _, o_ar = read_outputs(ar)
    delta, margins = run(phase0_delta, model, p_stock, o_stock, o_ar)
    stock_rep = run(check, model, p_stock, o_stock)
    report = {"delta": delta, "stock_divergences": len(margins), "stock": stock_rep.summary(delta), "systems": {}}
    rejected = False
    for path in systems:
        p, o = read_outputs(path)
        rep = run(check, model, p, o)
        d = decide(rep, stock_rep, delta)
        rejected |= d.reject
        report["systems"][path] = {**rep.summary(delta), "reject": d.reject, "reasons": d.reasons}
    if as_json:
        click.echo(json.dumps(report, indent=1))
    else:
        click.echo(f"δ = {delta} ({len(margins)} stock/AR divergences); stock: {_line(report['stock'])}")
        for path, r in report["systems"].items():
            verdict = "REJECT: " + "; ".join(r["reasons"]) if r["reject"] else "pass"
            click.echo(f"{path}: {_line(r)} -> {verdict}")
    sys.exit(EXIT_MISMATCH if rejected else EXIT_OK)


def _line(r: dict) -> str:
    lo, hi = r["rate_ci95"]
    return (f"{r['mismatches']}/{r['tokens']} mismatches ({r['rate']:.2%}, 95 % CI {lo:.2%}–{hi:.2%}), "
            f"{r['events_ge_2delta']} events ≥ 2δ, max margin {r['max_margin']:.3f}")
