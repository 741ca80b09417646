"""`w12 specdec …`: lossless speculative decoding from the command line (a thin shell over w12.specdec).

Exit codes: 0 ok, 1 `--check` found an output that differs from plain greedy decoding, 2 unusable input.
"""

import json
import sys
from pathlib import Path

import click

from w12.cli_common import EXIT_MISMATCH, EXIT_UNUSABLE, run as _run

TREES = ["chain", "best-first", "best-first-marginal", "eagle2", "sequoia"]


def _patch_if_w12(path: str) -> None:
    """A W12 checkpoint loads through `w12.patch_transformers()` (imported lazily, only here)."""
    cfg = Path(path) / "config.json"
    try:
        quant = json.loads(cfg.read_text()).get("quantization_config") or {}
    except (OSError, json.JSONDecodeError):
        return
    if quant.get("quant_method") == "w12":
        import w12

        if not hasattr(w12, "patch_transformers"):
            click.echo(f"error: {path} is a W12 checkpoint but this w12 has no patch_transformers()", err=True)
            sys.exit(EXIT_UNUSABLE)
        w12.patch_transformers()


@click.group("specdec", context_settings={"help_option_names": ["-h", "--help"]})
def specdec():
    """Lossless speculative decoding: draft trees verified in one target pass, output = greedy output.

    \b
      w12 specdec generate --target DIR --drafter ngram --prompts p.jsonl --check --record rec.json.gz
      w12 specdec replay rec.json.gz          # τ per tree builder and node budget, no model needed
    """


@specdec.command()
@click.option("--target", required=True, type=click.Path(exists=True, file_okay=False), help="Target model folder (BF16 or W12).")
@click.option("--drafter", required=True, metavar="DIR|ngram|self",
              help="A causal LM folder sharing the target's tokenizer, 'ngram' (prompt lookup), or 'self' (with --drafter-layers).")
@click.option("--drafter-layers", type=int, help="Keep only the drafter's first N decoder layers (+ norm and LM head).")
@click.option("--tree", type=click.Choice(TREES), default="best-first", show_default=True)
@click.option("--budget", type=int, default=32, show_default=True, help="Draft nodes per target pass.")
@click.option("--positions", type=int, default=8, show_default=True, help="Lattice positions drafted per step.")
@click.option("--topk", type=int, default=16, show_default=True, help="Candidates kept per position.")
@click.option("--prompts", required=True, type=click.Path(exists=True, dir_okay=False), help='JSONL, one {"turns": [...]} per line.')
@click.option("--limit", type=int, help="Use only the first N prompts.")
@click.option("--max-new-tokens", type=int, default=64, show_default=True)
@click.option("--dtype", type=click.Choice(["auto", "bfloat16", "float32"]), default="auto", show_default=True,
              help="Target compute dtype (float32 holds BF16 weights exactly).")
@click.option("--drafter-dtype", type=click.Choice(["auto", "bfloat16", "float32"]), default="auto", show_default=True)
@click.option("--threads", type=int, help="torch.set_num_threads.")
@click.option("--check", is_flag=True, help="Also decode greedily; exit 1 if any output differs.")
@click.option("--record", type=click.Path(dir_okay=False), help="Save every position's lattice for `replay` (.json or .json.gz).")
@click.option("--tlv", is_flag=True, help="TLV cycles (specdec/tlv.py): Q pass on the W12 8-bit view, then one exact "
              "pass over the commit chain + a fresh subtree; τ = tokens per exact pass. With --record, the Q "
              "argmaxes are recorded too (for `replay --tlv`).")
@click.option("--json", "as_json", is_flag=True, help="Print results as JSON.")
def generate(target, drafter, drafter_layers, tree, budget, positions, topk, prompts, limit, max_new_tokens,
             dtype, drafter_dtype, threads, check, record, tlv, as_json):
    """Greedy speculative generation of each prompt (first turn, chat template); tokens/s and τ per prompt."""
    import torch
    from transformers import AutoTokenizer

    from w12.specdec.prompts import chat_ids, load_prompts
    from w12.specdec.replay import save_records
    from w12.specdec.run import load_model, make_drafter, run_prompts, summarize
    from w12.specdec.trees import make_builder

    if threads:
        torch.set_num_threads(threads)
    if as_json:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
    for path in {target, drafter} - {"ngram", "self"}:
        _patch_if_w12(path)
    texts = _run(load_prompts, prompts, limit)
    tok = AutoTokenizer.from_pretrained(target)
    ids = [chat_ids(tok, t) for t in texts]
    model = _run(load_model, target, dtype)
    draft = _run(make_drafter, drafter, model, drafter_layers, positions, topk, drafter_dtype)
    build = _run(make_builder, tree, budget)

    def show(r):
        if not as_json:
            line = f"prompt {r['prompt']:3d}: {r['new_tokens']:4d} tokens  {r['tokens_per_s']:7.2f} tok/s  τ {r['tau']:.2f}"
            if check:
                d = r["divergence"]
                line += "  identical" if r["identical"] else f"  DIFFERS at token {d[0]} (margin {d[1]:.3f} nat)"
            click.echo(line)

    if tlv:
        from w12.specdec.tlv import run_prompts_tlv, save_tlv_records

        _run(__import__("w12.specdec.tlv", fromlist=["view_q"]).view_q, model)   # exit 2 if not a W12 target
        if dtype == "float32":      # the W12 quantizer loads BF16; fp32 compute = cast everything but the W12 buffers
            torch.nn.Module.float(model)
        results, records = _run(run_prompts_tlv, model, draft, ids, tree, budget, max_new_tokens, check,
                                bool(record), progress=show)
        save_records = save_tlv_records
    else:
        results, records = _run(run_prompts, model, draft, ids, build, max_new_tokens, check, bool(record), progress=show)
    summary = summarize(results)
    if tlv:
        summary["q_agreement"] = round(sum(r["q_agree"][0] for r in results) / max(1, sum(r["q_agree"][1] for r in results)), 4)
    if record:
        _run(save_records, record, records, {"tlv": tlv, "target": str(target), "drafter": drafter, "drafter_layers": drafter_layers,
                                             "positions": positions, "topk": topk, "prompts": str(prompts),
                                             "max_new_tokens": max_new_tokens, "dtype": dtype})
    if as_json:
        click.echo(json.dumps({"summary": summary, "prompts": results}, indent=1))
    else:
        line = f"{summary['prompts']} prompts, {summary['new_tokens']} tokens: {summary['tokens_per_s']} tok/s, τ {summary['tau']}"
        if check:
            line += (f"; greedy {summary['greedy_tokens_per_s']} tok/s (speedup {summary['speedup']}x); "
                     f"{summary['identical']}/{summary['prompts']} identical to greedy")
        click.echo(line)
    if check and summary["identical"] != summary["prompts"]:
        sys.exit(EXIT_MISMATCH)


@specdec.command()
@click.argument("recording", type=click.Path(dir_okay=False))
@click.option("--budgets", default="16,32,64", show_default=True, help="Comma-separated node budgets.")
@click.option("--trees", default="chain,best-first,eagle2,sequoia", show_default=True, help="Comma-separated builders.")
@click.option("--max-depth", type=int, help="Cap tree depth (default: the lattice's positions).")
@click.option("--tlv", is_flag=True, help="Also replay TLV (tokens per exact pass) from the recorded Q argmaxes "
              "(`generate --tlv --record`), or from --q-agree.")
@click.option("--q-agree", type=float, help="With --tlv: model the Q pass as agreeing with the target with this "
              "probability per position (independent, seeded) instead of recorded Q argmaxes.")
@click.option("--json", "as_json", is_flag=True, help="Print the table as JSON.")
def replay(recording, budgets, trees, max_depth, tlv, q_agree, as_json):
    """τ (tokens per target pass) per tree builder and node budget from a `generate --record` file."""
    from w12.specdec.replay import load_records, tau_table

    try:
        sizes = [int(b) for b in budgets.split(",")]
    except ValueError:
        raise click.BadParameter(f"expected integers like 16,32,64, found {budgets!r}", param_hint="--budgets")
    names = [t for t in trees.split(",") if t]
    if bad := [t for t in names if t not in TREES]:
        raise click.BadParameter(f"unknown {bad}; choose from {', '.join(TREES)}", param_hint="--trees")
    records, meta = _run(load_records, recording)
    table = _run(tau_table, records, sizes, names, max_depth)
    if tlv:
        from w12.specdec.tlv import tlv_tau_table

        table.update(_run(tlv_tau_table, recording, records, sizes, names, max_depth, q_agree))
        names = names + [f"tlv-{n}" for n in names]
    if as_json:
        click.echo(json.dumps({"meta": meta, "prompts": len(records), "tau": table}, indent=1))
        return
    click.echo(f"{len(records)} prompts, {sum(len(r.tokens) for r in records)} tokens; τ = tokens per target pass")
    click.echo("| tree | " + " | ".join(f"{n} nodes" for n in sizes) + " |")
    click.echo("|---|" + "---|" * len(sizes))
    for name in names:
        click.echo(f"| {name} | " + " | ".join(f"{table[name][n]:.2f}" for n in sizes) + " |")
    click.echo(f"| oracle (target token in top-k) | " + " | ".join(f"{table['oracle']:.2f}" for _ in sizes) + " |")
