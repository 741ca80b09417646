"""Host time torch.compile spends checking guards per decode step: BF16 vs W12 layers (CPU, no GPU needed).

    python bench/guard_cost.py [--layers 32] [--rounds 2] [--method latency|profile] [--out DIR]

A compiled `generate` call re-checks, before every decode step, the guards of the compiled forward: one
group per tensor the graph reads (~6 guards each) and one per Python attribute the layers consult. That
time is host time in series with the GPU in Transformers' decode loop (it synchronises every step), so it
adds to every token. This bench builds a tiny Llama with `--layers` decoder layers (hidden 256, 4 KV heads,
so q/k/v fuse as in Llama-3.1-8B), saves it as BF16 and as W12 (`w12 convert --exclude '*embed*'`), and for
each model, in its own process, runs greedy `generate` with a static cache and the compiled forward (eager
backend: the guards are the same as inductor's), W12 through the GEMM op (`set_cpu_gemm_op(True)`, prepared
and fused as on CUDA). Two measures:

* `latency` (default, ~1 min per model and round): the decode graph's guard tree, captured when it is
  built (torch._dynamo.guards.guard_manager_testing_hook_fn), checked to pass on its frame's locals, then
  timed by torch's own `profile_guard_manager` (31 × 300 evaluations; median and min, µs); also the
  number of guards by kind.
* `profile` (~3 min per model and round): torch.profiler's "TorchDynamo Cache Lookup" per step = (lookup
  time of a 33-token generate − that of a 1-token one) / 32, median of 5 profiles (what the GPU profile of
  bench/hf_decode.py --profile reports).
The models take turns `--rounds` times, each in a fresh process.
"""

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile

import torch


def load(path: str, w12: bool):
    import w12 as w12pkg
    from transformers import AutoModelForCausalLM

    w12pkg.patch_transformers()
    if w12:
        from w12.runtime import prepare
        from w12.runtime.w12_linear import set_cpu_gemm_op

        set_cpu_gemm_op(True)
    model = AutoModelForCausalLM.from_pretrained(path)
    if w12:
        prepare(model, fuse=True)
    return model


def generate_kw(model):
    from hf_decode import compile_config  # bench/hf_decode.py (this script's folder is on sys.path)

    ids = torch.randint(0, model.config.vocab_size, (1, 8), generator=torch.Generator().manual_seed(0))
    return ids, dict(attention_mask=torch.ones_like(ids), do_sample=False, cache_implementation="static",
                     pad_token_id=0, compile_config=compile_config("eager"))


def measure_latency(path: str, w12: bool) -> dict:
    """Guard-tree latency of the decode graph, µs (median, min of 31 × 300 evaluations), and guard counts."""
    from hf_decode import GuardProbe

    model = load(path, w12)
    ids, kw = generate_kw(model)
    with GuardProbe() as probe:
        model.generate(ids, max_new_tokens=4, min_new_tokens=4, **kw)  # compiles the decode step once
    if len(probe.frames) != 1 or "error" in probe.frames[0]:
        raise RuntimeError(f"guard_cost: expected one compiled decode graph whose guards pass, got {probe.frames}")
    return probe.frames[0]


def measure_profile(path: str, w12: bool) -> dict:
    from torch.profiler import ProfilerActivity, profile

    model = load(path, w12)
    ids, kw = generate_kw(model)
    model.generate(ids, max_new_tokens=40, min_new_tokens=40, **kw)  # compile; the cache fits every call below

    def lookup_us(n):
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            model.generate(ids, max_new_tokens=n, min_new_tokens=n, **kw)
        return sum(a.self_cpu_time_total for a in prof.key_averages() if a.key == "TorchDynamo Cache Lookup")

    vals = sorted((lookup_us(33) - lookup_us(1)) / 32 for _ in range(5))
    return {"median_us": vals[2], "min_us": vals[0], "guards": {}}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--method", choices=("latency", "profile"), default="latency")
    ap.add_argument("--out", default=None, help="write guard_cost.md here")
    ap.add_argument("--child", nargs=3, metavar=("PATH", "KIND", "METHOD"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    if args.child:
        path, kind, method = args.child
        print(json.dumps((measure_latency if method == "latency" else measure_profile)(path, kind == "w12")))
        return
    from hf_decode import build_checkpoints  # bench/hf_decode.py
    from transformers import LlamaConfig

    cfg = LlamaConfig(vocab_size=1024, hidden_size=256, intermediate_size=512, num_hidden_layers=args.layers,
                      num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=1024,
                      tie_word_embeddings=False)
    work = tempfile.mkdtemp(prefix="w12-guards-")
    bf16_dir, w12_dir = build_checkpoints(cfg, work, "cpu", 0, "w12")
    per = {"bf16": [], "w12": []}
    for r in range(args.rounds):
        for kind, path in (("bf16", bf16_dir), ("w12", w12_dir)):
            out = subprocess.run([sys.executable, __file__, "--child", path, kind, args.method],
                                 capture_output=True, text=True)
            if out.returncode != 0:
                sys.exit(f"{kind} child failed:\n{out.stderr[-3000:]}")
            per[kind].append(json.loads(out.stdout.strip().splitlines()[-1]))
            v = per[kind][-1]
            print(f"round {r} {kind}: {v['median_us']:.0f} µs (min {v['min_us']:.0f}); guards {v['guards']}", flush=True)
    med = {k: sorted(v["median_us"] for v in runs)[len(runs) // 2] for k, runs in per.items()}
    low = {k: min(v["min_us"] for v in runs) for k, runs in per.items()}
    tensors = {k: runs[0]["guards"].get("TENSOR_MATCH", "") for k, runs in per.items()}
    total = {k: sum(runs[0]["guards"].values()) or "" for k, runs in per.items()}
    rounds = {k: ", ".join(f"{v['median_us']:.0f}" for v in runs) for k, runs in per.items()}
    rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                         cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip()
    what = ("guard-tree latency of the decode graph" if args.method == "latency"
            else "TorchDynamo Cache Lookup per step")
    text = "\n".join([
        f"# Guard check per decode step, BF16 vs W12 layers (CPU) — {datetime.date.today()}", "",
        f"- commit {rev}; torch {torch.__version__}; {args.layers}-layer tiny Llama, eager backend; "
        f"`python bench/guard_cost.py --layers {args.layers} --rounds {args.rounds} --method {args.method}`", "",
        "| | BF16 | W12 | W12 − BF16 |", "|---|---|---|---|",
        f"| {what}, µs (median of rounds) | {med['bf16']:.0f} | {med['w12']:.0f} | {med['w12'] - med['bf16']:.0f} |",
        f"| same, fastest evaluation | {low['bf16']:.0f} | {low['w12']:.0f} | {low['w12'] - low['bf16']:.0f} |",
        f"| rounds (median µs) | {rounds['bf16']} | {rounds['w12']} | |",
        f"| guards / tensor guards | {total['bf16']} / {tensors['bf16']} | {total['w12']} / {tensors['w12']} | |", ""])
    print(text)
    if args.out:
        with open(os.path.join(args.out, "guard_cost.md"), "w") as fh:
            fh.write(text)


if __name__ == "__main__":
    main()
