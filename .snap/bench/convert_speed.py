"""End-to-end converter speed and memory on a synthetic 1B-parameter BF16 checkpoint in 4 shards.

    python bench/convert_speed.py [--dir /tmp/w12-bench-1b] [--params 1.0]

Builds the checkpoint once (Llama-like shapes: hidden 2048, FFN 8192, 15 layers ≈ 1.0 B weights,
LLM-like values), then runs `w12 convert` in a child process and reports wall time, weights/s and the
child's peak RSS against the budget of 1.5 GB + the largest tensor. A second, in-process run times the
library call alone (no interpreter start-up or imports).
Napkin maths: 1e9 weights at 150 M/s is 6.7 s; the work is reading 2 GB, hashing it, encoding 1e9
weights (numba, ~300 M/s on 2 cores) and writing 1.5 GB.
"""

import argparse
import json
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

import torch
from safetensors.torch import save_file

HIDDEN, FFN = 2048, 8192


def layer_shapes(i):
    p = f"model.layers.{i}."
    return {p + "self_attn.q_proj.weight": (HIDDEN, HIDDEN), p + "self_attn.k_proj.weight": (HIDDEN, HIDDEN),
            p + "self_attn.v_proj.weight": (HIDDEN, HIDDEN), p + "self_attn.o_proj.weight": (HIDDEN, HIDDEN),
            p + "mlp.gate_proj.weight": (FFN, HIDDEN), p + "mlp.up_proj.weight": (FFN, HIDDEN),
            p + "mlp.down_proj.weight": (HIDDEN, FFN), p + "input_layernorm.weight": (HIDDEN,)}


def build(folder: Path, params: float, shards: int = 4) -> int:
    layers = max(1, round(params * 1e9 / (4 * HIDDEN * HIDDEN + 3 * HIDDEN * FFN)))
    total = 0
    if (folder / "done.json").exists():
        return json.loads((folder / "done.json").read_text())["weights"]
    folder.mkdir(parents=True, exist_ok=True)
    g = torch.Generator().manual_seed(0)
    weight_map = {}
    per = -(-layers // shards)
    for s in range(shards):
        tensors = {}
        for i in range(s * per, min(layers, (s + 1) * per)):
            for name, shape in layer_shapes(i).items():
                t = (torch.randn(shape, generator=g) * 0.02).to(torch.bfloat16)
                tensors[name] = t
                total += t.numel()
        fname = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        save_file(tensors, str(folder / fname), metadata={"format": "pt"})
        weight_map.update({n: fname for n in tensors})
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    (folder / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "dtype": "bfloat16"}))
    (folder / "done.json").write_text(json.dumps({"weights": total}))
    return total


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", default="/tmp/w12-bench-1b")
    ap.add_argument("--params", type=float, default=1.0, help="billions of weights")
    args = ap.parse_args()
    src, out = Path(args.dir) / "bf16", Path(args.dir) / "w12"
    weights = build(src, args.params)
    largest = 2 * HIDDEN * FFN
    shutil.rmtree(out, ignore_errors=True)
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "w12.cli", "convert", str(src), str(out)], check=True,
                   stderr=subprocess.DEVNULL)
    wall = time.perf_counter() - t0
    rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
    from w12.convert.convert import convert

    shutil.rmtree(out)
    t0 = time.perf_counter()
    convert(str(src), str(out))
    lib = time.perf_counter() - t0
    budget = 1.5e9 + largest
    print(f"| weights | CLI wall s | CLI M weights/s | library s | library M weights/s | peak RSS GB | budget GB |")
    print(f"|---|---|---|---|---|---|---|")
    print(f"| {weights / 1e9:.3f} B | {wall:.2f} | {weights / wall / 1e6:.0f} | {lib:.2f} | {weights / lib / 1e6:.0f} "
          f"| {rss / 1e9:.2f} | {budget / 1e9:.2f} |")


if __name__ == "__main__":
    main()
