"""The `w12` command line: a thin shell over the library. Parses, calls one function, maps errors
to messages and exit codes in one place (`run`)."""

import json
import sys

import click


from w12.cli_common import EXIT_MISMATCH, EXIT_OK, EXIT_UNUSABLE, human, run  # noqa: F401


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="w12")
def main():
    """W12: lossless 12-bit storage of BF16 weights.

    \b
    Typical use:
      w12 convert ./my-model ./my-model-w12     # BF16 checkpoint -> W12 (25 % smaller, exact)
      w12 verify ./my-model-w12 ./my-model      # prove, by bits, that it decodes to the original
      w12 inspect ./my-model-w12                # sizes, bits per weight, escape rates
      w12 decode ./my-model-w12 ./restored      # back to a plain BF16 checkpoint
    """


@main.command()
@click.argument("src")
@click.argument("out", type=click.Path(file_okay=False))
@click.option("--include", multiple=True, metavar="GLOB",
              help="Convert only 2-D weights whose name matches (repeatable). Default: every 2-D '*.weight'.")
@click.option("--exclude", multiple=True, metavar="GLOB",
              help="Keep weights whose name matches in their original dtype (repeatable; replaces the "
                   "default '*embed*' and '*lm_head*': embeddings and the LM head stay BF16).")
@click.option("--cast-bf16", is_flag=True, help="Cast FP32/FP16 matrices to BF16 first (lossy; recorded).")
@click.option("--dry-run", is_flag=True, help="Print the plan (tensors, bytes before/after) and write nothing.")
@click.option("--resume", is_flag=True, help="Continue an interrupted conversion into OUT.")
@click.option("--overwrite", is_flag=True, help="Delete OUT first if it is not empty.")
@click.option("--json", "as_json", is_flag=True, help="Print the plan/result as JSON for scripts.")
def convert(src, out, include, exclude, cast_bf16, dry_run, resume, overwrite, as_json):
    """Convert the BF16 checkpoint SRC (a folder or a Hub id) into a W12 checkpoint in OUT.

    Streams shard by shard (one output shard per input shard), with a progress bar in bytes. Every
    2-D BF16 '*.weight' not excluded becomes a W12 matrix; all other tensors and files (config,
    tokenizer, README, ...) are copied unchanged, and config.json gains a quantization_config with
    quant_method "w12". Pickle (.bin) weights are never loaded.
    """
    from w12.convert.convert import DEFAULT_EXCLUDE, Options, convert as do_convert, make_plan

    options = Options(include=tuple(include) or ("*",), exclude=tuple(exclude) or DEFAULT_EXCLUDE,
                      cast_bf16=cast_bf16)
    if dry_run:
        plan = run(make_plan, src, out, options)
    else:
        plan = run(do_convert, src, out, options, resume=resume, overwrite=overwrite, progress=not as_json,
                   on_interrupt="interrupted; the completed shards are kept: re-run with --resume to continue")
    if as_json:
        click.echo(json.dumps({"dry_run": dry_run, **plan.to_dict()}, indent=1))
        return
    if dry_run:
        for t in plan.tensors:
            click.echo(f"{t.action:5} {t.name:60} {t.dtype:5} {str(t.shape):18} {human(t.bytes_before):>10} -> "
                       f"{human(t.bytes_after):>10}")
    n = sum(t.action == "w12" for t in plan.tensors)
    verb = "would convert" if dry_run else "converted"
    click.echo(f"{verb} {n} of {len(plan.tensors)} tensors; weights {human(plan.bytes_before)} -> "
               f"{'about ' if dry_run else ''}{human(plan.bytes_after)} ({plan.bytes_after / plan.bytes_before:.1%})"
               + ("" if dry_run else f"; wrote {plan.out}"))


@main.command()
@click.argument("w12dir", type=click.Path())
@click.argument("original", required=False, type=click.Path())
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def verify(w12dir, original, as_json):
    """Prove by bits that the W12 checkpoint W12DIR decodes to ORIGINAL (or to the SHA-256 of every
    tensor recorded at conversion, when ORIGINAL is not given).

    Exit status: 0 identical, 1 mismatch or corruption (the first bad tensor, row and column are
    named), 2 unusable input.
    """
    from w12.convert.checkpoint import verify as do_verify

    report = run(do_verify, w12dir, original, progress=not as_json)
    if as_json:
        click.echo(json.dumps({"ok": report.ok, "tensors": report.tensors, "matrices": report.matrices,
                               "mismatches": [str(m) for m in report.mismatches]}))
    elif report.ok:
        against = f"the original {original}" if original else "the recorded SHA-256 of every tensor"
        click.echo(f"OK: {report.tensors} tensors ({report.matrices} W12 matrices) identical to {against}")
    else:
        click.echo(f"MISMATCH: {report.mismatches[0]}", err=True)
    sys.exit(EXIT_OK if report.ok else EXIT_MISMATCH)


@main.command()
@click.argument("w12dir", type=click.Path())
@click.option("--json", "as_json", is_flag=True, help="Print per-tensor figures and totals as JSON.")
def inspect(w12dir, as_json):
    """Sizes of a W12 checkpoint: per tensor shape, bits per weight, escape rate; totals."""
    from w12.convert.checkpoint import inspect as do_inspect

    info = run(do_inspect, w12dir)
    if as_json:
        click.echo(json.dumps(info, indent=1))
        return
    for r in info["tensors"]:
        if r["kind"] == "w12":
            click.echo(f"{r['name']:60} {str(r['shape']):16} {r['bits_per_weight']:7.3f} bits/w  "
                       f"escapes {r['escape_rate']:.2e}")
    click.echo(f"{info['matrices']} W12 matrices, {info['num_tensors'] - info['matrices']} other tensors")
    if info["weights_converted"]:
        click.echo(f"converted weights: {info['bits_per_weight']:.4f} bits/weight, escape rate "
                   f"{info['escape_rate']:.2e}")
    click.echo(f"checkpoint tensors: {human(info['bytes_bf16'])} as BF16 -> {human(info['bytes_w12'])} as W12 "
               f"({info['ratio']:.1%})")


@main.command()
@click.argument("w12dir", type=click.Path())
@click.argument("out", type=click.Path(file_okay=False))
def decode(w12dir, out):
    """Write the W12 checkpoint W12DIR back to a plain BF16 checkpoint in OUT (byte-identical tensors)."""
    from w12.convert.checkpoint import decode as do_decode

    path = run(do_decode, w12dir, out, progress=True)
    click.echo(f"wrote {path}")


def _register():
    from w12.cli_forcing import check_lossless
    from w12.cli_pricing import bench, costmodel
    from w12.cli_specdec import specdec
    from w12.cli_upload import upload

    for command in (costmodel, bench, check_lossless, upload, specdec):
        main.add_command(command)


_register()

if __name__ == "__main__":
    main()
