"""Prefill through stock Transformers: BF16 vs W12, with the M > LARGE_M path (decode + cuBLAS) and without it.

A Llama-3.1-8B-shaped model with random weights (bench/hf_decode.py's build: BF16 checkpoint, `w12 convert` with
the LM head converted) is loaded both ways with `from_pretrained` after `w12.patch_transformers()`. For each
prompt length T, one forward of a batch-1 prompt as `generate` runs its prefill (eager, `logits_to_keep=1`,
`use_cache=True`) is timed (CUDA-synchronised wall clock, median of --reps after a warm-up) for:
  bf16      the BF16 model;
  w12       the W12 model as shipped: projections with T ≤ ops.LARGE_M rows on the fused kernels, above it
            decode + cuBLAS (kernels/decode.py);
  w12-old   the W12 model with ops.LARGE_M raised above T: every projection on the fused Triton kernel, as
            before decode + cuBLAS existed.
Also reported: whether W12's last-position logits equal BF16's bit for bit, and their largest difference.

    python bench/hf_prefill.py [--tokens 128,512,2048] [--layers 32] [--reps 5] [--out DIR]
    python bench/hf_prefill.py --tiny    # CPU smoke test (seconds; the CPU runs the reference path only)
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import os
import statistics
import sys
import tempfile
import time

import torch
from revision import commit  # noqa: E402  (bench/revision.py)

# This folder off sys.path: its kernels.py would shadow the PyPI `kernels` package that Transformers imports.
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != HERE]
_spec = importlib.util.spec_from_file_location("hf_decode", os.path.join(HERE, "hf_decode.py"))
hf_decode = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(hf_decode)
build_checkpoints, llama_config, load, sync = hf_decode.build_checkpoints, hf_decode.llama_config, hf_decode.load, \
    hf_decode.sync


def time_prefill(model, ids, reps: int, device: str) -> tuple[float, torch.Tensor]:
    """Median ms of one prefill forward, and its last-position logits."""
    with torch.inference_mode():
        out = model(ids, logits_to_keep=1, use_cache=True)
        times = []
        for _ in range(reps):
            sync(device)
            t = time.perf_counter()
            model(ids, logits_to_keep=1, use_cache=True)
            sync(device)
            times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times), out.logits[0, -1].float()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", default="128,512,2048", help="prompt lengths (comma-separated)")
    ap.add_argument("--layers", type=int, default=None, help="decoder layers (default: the model's 32)")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--tiny", action="store_true", help="tiny config on the CPU")
    ap.add_argument("--out", default="", help="directory for hf_prefill.md")
    args = ap.parse_args(argv)
    import w12
    from w12.kernels import ops

    w12.patch_transformers()
    device = "cpu" if args.tiny else "cuda"
    cfg = llama_config(args.tiny)
    if args.layers:
        cfg.num_hidden_layers = args.layers
    tokens = [int(t) for t in args.tokens.split(",")]
    rows = []
    with tempfile.TemporaryDirectory() as work:
        bf16_dir, w12_dir = build_checkpoints(cfg, work, device, seed=0)
        models = {"bf16": load(bf16_dir, device, None), "w12": load(w12_dir, device, None)}
        gen = torch.Generator().manual_seed(1)
        for t in tokens:
            ids = torch.randint(0, cfg.vocab_size, (1, t), generator=gen).to(device)
            ms_bf16, ref = time_prefill(models["bf16"], ids, args.reps, device)
            ms_w12, got = time_prefill(models["w12"], ids, args.reps, device)
            saved = ops.LARGE_M
            ops.LARGE_M = max(saved, t)
            try:
                ms_old, old = time_prefill(models["w12"], ids, args.reps, device)
            finally:
                ops.LARGE_M = saved
            same = torch.equal(got, ref)
            diff = (got - ref).abs().max().item()
            rows.append((t, ms_bf16, ms_w12, ms_old, same, diff, (old - ref).abs().max().item()))
            print(f"T={t}: bf16 {ms_bf16:.2f} ms, w12 {ms_w12:.2f} ms, w12-old {ms_old:.2f} ms; logits equal {same}, "
                  f"max |Δ| {diff:.3g}", flush=True)
    text = report(rows, cfg, args, device)
    print(text)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "hf_prefill.md"), "w") as f:
            f.write(text)
    return rows


def report(rows, cfg, args, device) -> str:
    import transformers

    rev = commit()
    dev = torch.cuda.get_device_name() if device == "cuda" else "cpu"
    out = [f"# Prefill through Transformers: BF16 vs W12 — {datetime.date.today()}", "",
           f"- device: {dev}; torch {torch.__version__}; transformers {transformers.__version__}; commit {rev}",
           f"- command: `python bench/hf_prefill.py {' '.join(sys.argv[1:])}`",
           f"- model: {'tiny Llama (--tiny)' if args.tiny else 'Llama-3.1-8B-shaped'}, random N(0, 0.02) weights, {cfg.num_hidden_layers} layers, LM head in W12; "
           "batch 1, one eager forward with logits_to_keep=1 (generate's prefill); ms: median of "
           f"{args.reps} after a warm-up", "",
           "| prompt tokens | BF16 ms | W12 ms | BF16 / W12 | W12 before decode + cuBLAS ms | BF16 / that | "
           "W12 logits = BF16 (bits) | max abs Δ logit | before: max abs Δ |", "|---|---|---|---|---|---|---|---|---|"]
    for t, b, w, o, same, diff, odiff in rows:
        out.append(f"| {t} | {b:.2f} | {w:.2f} | {b / w:.3f} | {o:.2f} | {b / o:.3f} | {same} | {diff:.3g} | "
                   f"{odiff:.3g} |")
    out += ["", "The logits need not match BF16's bits: the LM head runs at M = 1 on the fused kernel (its own fp32 "
            "summation order), and the fused q/k/v and gate/up groups run one GEMM on concatenated weights."]
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    main()
