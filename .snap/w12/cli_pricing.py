"""`w12 costmodel` and `w12 bench --paired`: pricing speed-ups (seed paper §3.2–3.3)."""

import json
import subprocess
import sys

import click


@click.command()
@click.argument("profile", type=click.Path(exists=True, dir_okay=False))
@click.option("--gpu", type=click.Choice(["H100", "H200"]), help="Override the profile's GPU preset.")
@click.option("--bandwidth", type=float, help="Peak bandwidth in bytes/s (overrides the preset).")
@click.option("--peak-flops", type=float, help="Peak dense BF16 FLOP/s (overrides the preset).")
@click.option("--json", "as_json", is_flag=True)
def costmodel(profile, gpu, bandwidth, peak_flops, as_json):
    """Speed-up, byte floor and ceiling of a speculative-decoding profile (JSON).

    \b
    PROFILE: {"gpu": "H200", "t_ar": s, "t_step": {"N": s}, "tau": {"N": τ},
              "kernels": [{"name", "time", "bytes", "flops"}], "tau_best": τ}
    S(N) = τ(N)/c(N), c(N) = T_step(N)/T_AR; ceiling = S · f_tree · f_kernels · f_outside.
    """
    from w12.specdec.cost_model import ceiling, profile_from_dict

    d = json.loads(open(profile).read())
    d.update({k: v for k, v in (("gpu", gpu), ("bandwidth", bandwidth), ("peak_flops", peak_flops)) if v})
    p = profile_from_dict(d)
    rows = [ceiling(p, n) for n in sorted(p.tau)]
    if as_json:
        click.echo(json.dumps(rows, indent=1))
        return
    click.echo(f"GPU {p.gpu.name}: {p.gpu.peak_flops / 1e12:.0f} TFLOP/s, {p.gpu.bandwidth / 1e12:.2f} TB/s")
    click.echo("    N      τ   c(N)   S(N)  f_tree  f_kern  f_out  ceiling  attack")
    for r in rows:
        click.echo(f"{r['n']:5d} {p.tau[r['n']]:6.2f} {r['relative_cost']:6.3f} {r['speedup']:6.2f} "
                   f"{r['f_tree']:7.3f} {r['f_kernels']:7.3f} {r['f_outside']:6.3f} {r['ceiling']:8.2f}  {r['attack']}")


@click.command()
@click.option("--paired", nargs=2, required=True, metavar="CMD_A CMD_B",
              help="Two shell commands; each is run once per request with the request's JSON on stdin.")
@click.option("--requests", "requests_file", required=True, type=click.Path(exists=True, dir_okay=False),
              help="JSONL file, one request per line.")
@click.option("--repeats", default=3, show_default=True)
@click.option("--limit", type=int, help="Use only the first N requests.")
@click.option("--json", "as_json", is_flag=True)
def bench(paired, requests_file, repeats, limit, as_json):
    """Paired benchmark: run A and B on the same requests, interleaved and repeated; report B's gain
    over A with a 95 % CI and the approval rule (lower bound > 1 % + 2 × A's own noise).

    A command may print a last line of JSON with "seconds" to report its own timing (excluding
    start-up); otherwise its wall time is used.
    """
    from w12.specdec.paired_bench import paired_benchmark

    from w12.cli_common import EXIT_UNUSABLE

    requests = [line for line in open(requests_file) if line.strip()][:limit]

    def system(cmd):
        def run(req):
            out = subprocess.run(cmd, shell=True, input=req, capture_output=True, text=True)
            if out.returncode != 0:
                click.echo(f"error: command failed ({out.returncode}): {cmd}\n{out.stderr[-2000:]}", err=True)
                sys.exit(EXIT_UNUSABLE)
            try:
                return float(json.loads(out.stdout.strip().splitlines()[-1])["seconds"])
            except (ValueError, KeyError, IndexError, TypeError):
                return None
        return run

    result = paired_benchmark(system(paired[0]), system(paired[1]), requests, repeats)
    click.echo(json.dumps(result.__dict__) if as_json else result.summary())
