"""Host time torch.compile spends checking guards per decode step: BF16 vs W12 layers (CPU, no GPU needed).

    python bench/guard_cost.py [--layers 32] [--rounds 3] [--out DIR]

A compiled `generate` call re-checks, before every decode step, the guards of the compiled forward: one
group per tensor the graph reads (~6 guards each) and one per Python attribute the layers consult. That
time ("TorchDynamo Cache Lookup" in torch.profiler) is host time in series with the GPU in Transformers'
decode loop (it synchronises every step), so it adds to every token. This bench builds a tiny Llama with
`--layers` decoder layers (hidden 256), saves it as BF16 and as W12 (`w12 convert --exclude '*embed*'`),
and for each model, in its own process, runs greedy `generate` with a static cache and the compiled forward
(eager backend: the guard check is the same as inductor's, the kernels are not what is measured), W12
through the GEMM op (`set_cpu_gemm_op(True)`, prepared and fused as on CUDA). µs per step = (lookup time of
a 33-token generate − that of a 1-token one) / 32, median of 5 profiles; the models take turns `--rounds`
times in fresh processes (~3 min per model and round on a 2-core CPU machine).
"""

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile

import torch


def measure(path: str, w12: bool) -> list:
    import w12 as w12pkg
    from torch.profiler import ProfilerActivity, profile
    from hf_decode import compile_config  # bench/hf_decode.py (this script's folder is on sys.path)
    from transformers import AutoModelForCausalLM

    w12pkg.patch_transformers()
    if w12:
        from w12.runtime import prepare
        from w12.runtime.w12_linear import set_cpu_gemm_op

        set_cpu_gemm_op(True)
    model = AutoModelForCausalLM.from_pretrained(path)
    if w12:
        prepare(model, fuse=True)
    cc = compile_config("eager")
    ids = torch.randint(0, model.config.vocab_size, (1, 8), generator=torch.Generator().manual_seed(0))
    kw = dict(attention_mask=torch.ones_like(ids), do_sample=False, cache_implementation="static", pad_token_id=0,
              compile_config=cc)
    model.generate(ids, max_new_tokens=40, min_new_tokens=40, **kw)  # compile; the cache fits every call below

    def lookup_us(n):
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            model.generate(ids, max_new_tokens=n, min_new_tokens=n, **kw)
        return sum(a.self_cpu_time_total for a in prof.key_averages() if a.key == "TorchDynamo Cache Lookup")

    return [(lookup_us(33) - lookup_us(1)) / 32 for _ in range(5)]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", default=None, help="write guard_cost.md here")
    ap.add_argument("--child", nargs=2, metavar=("PATH", "KIND"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(measure(args.child[0], args.child[1] == "w12")))
        return
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from hf_decode import build_checkpoints  # bench/hf_decode.py
    from transformers import LlamaConfig

    cfg = LlamaConfig(vocab_size=1024, hidden_size=256, intermediate_size=512, num_hidden_layers=args.layers,
                      num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=1024,
                      tie_word_embeddings=False)
    work = tempfile.mkdtemp(prefix="w12-guards-")
    bf16_dir, w12_dir = build_checkpoints(cfg, work, "cpu", 0, "w12")
    per = {"bf16": [], "w12": []}
    for r in range(args.rounds):
        for kind, path in (("bf16", bf16_dir), ("w12", w12_dir)):
            out = subprocess.run([sys.executable, __file__, "--child", path, kind], capture_output=True, text=True)
            if out.returncode != 0:
                sys.exit(f"{kind} child failed:\n{out.stderr[-3000:]}")
            vals = json.loads(out.stdout.strip().splitlines()[-1])
            per[kind].append(sorted(vals)[len(vals) // 2])
            print(f"round {r} {kind}: {per[kind][-1]:.0f} µs/step (5 profiles: {', '.join(f'{v:.0f}' for v in vals)})",
                  flush=True)
    med = {k: sorted(v)[len(v) // 2] for k, v in per.items()}
    rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                         cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip()
    text = "\n".join([
        f"# Guard check per decode step, BF16 vs W12 layers (CPU) — {datetime.date.today()}", "",
        f"- commit {rev}; torch {torch.__version__}; {args.layers}-layer tiny Llama, eager backend; "
        f"`python bench/guard_cost.py --layers {args.layers} --rounds {args.rounds}`", "",
        "| | BF16 | W12 | W12 − BF16 |", "|---|---|---|---|",
        f"| TorchDynamo Cache Lookup, µs per step (median of rounds) | {med['bf16']:.0f} | {med['w12']:.0f} | "
        f"{med['w12'] - med['bf16']:.0f} |",
        f"| rounds | {', '.join(f'{v:.0f}' for v in per['bf16'])} | {', '.join(f'{v:.0f}' for v in per['w12'])} | |", ""])
    print(text)
    if args.out:
        with open(os.path.join(args.out, "guard_cost.md"), "w") as fh:
            fh.write(text)


if __name__ == "__main__":
    main()
