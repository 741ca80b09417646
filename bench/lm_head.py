"""Certified INT8 LM head vs the BF16 head (cuBLAS) on one GPU: check first, then time.

    PYTHONUNBUFFERED=1 python bench/lm_head.py                 # H200: 128256×4096, 151936×5120; M = 1, 4, 32
    python bench/lm_head.py --cpu-smoke                        # tiny shape on the CPU (Triton interpreter)

Weights: random but LLM-like (Student-t rows, log-normal row norms, bf16); hidden states aimed at random
rows plus noise, so the top logits stand out as in a real model (survivor counts on random-direction
hidden states would be larger; real hidden states are what matter -- see the report).
Per (shape, M): argmax agreement with torch.argmax of the cuBLAS head, survivors per row (mean, max),
ambiguous rows (lm_head_int8.py step 6), then times with triton.testing.do_bench (L2 flushed, median):
    bf16   F.linear(x, W).argmax(-1)                               reads 2·V·K bytes
    int8   the two Triton launches (INT8 pass + candidate selection) reads V·K + 8·V bytes
    cert   CertifiedHead.argmax end to end (+ torch rescoring, which syncs once for the survivor count)
Napkin: 128256×4096 bf16 = 1.05 GB → 219 µs at 4.8 TB/s; int8 = 0.53 GB → 110 µs.  The certified
path only wins if the rescoring (gather S·K bf16 per token + launches) stays well under the difference.
"""

import argparse
import os
import sys


def llm_like(v, k, device, seed=0):
    import torch

    g = torch.Generator(device=device).manual_seed(seed)
    w = torch.empty(v, k, device=device)
    for r0 in range(0, v, 16384):  # Student-t(4) by normal / sqrt(chi²/4), in chunks
        n = min(16384, v - r0)
        z = torch.randn(n, k, device=device, generator=g)
        chi = torch.randn(n, k, 4, device=device, generator=g).square().sum(-1) / 4
        w[r0:r0 + n] = z / chi.sqrt() * 0.02 * torch.exp(0.3 * torch.randn(n, 1, device=device, generator=g))
    return w.bfloat16()


def hidden(w, m, seed=1):
    import torch

    g = torch.Generator(device=w.device).manual_seed(seed)
    aim = torch.randint(0, w.shape[0], (m,), device=w.device, generator=g)
    d = w[aim].float()
    x = d / d.norm(dim=1, keepdim=True) * 60 + torch.randn(m, w.shape[1], device=w.device, generator=g)
    return x.bfloat16()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cpu-smoke", action="store_true", help="tiny shape, CPU, Triton interpreter")
    ap.add_argument("--ms", default="1,4,32")
    ap.add_argument("--trials", type=int, default=8, help="hidden batches per (shape, M) for the agreement check")
    args = ap.parse_args(argv)
    if args.cpu_smoke:
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernel module is imported
    import torch
    import torch.nn.functional as F
    import triton

    from w12.kernels import lm_head_int8_triton as kt
    from w12.kernels.lm_head_int8 import CertifiedHead

    if args.cpu_smoke:
        device, shapes, bench = "cpu", [(2000, 256)], False
    else:
        if not torch.cuda.is_available():
            print("no CUDA device: use --cpu-smoke", file=sys.stderr)
            return 2
        device, shapes, bench = "cuda", [(128256, 4096), (151936, 5120)], True
    ms = [int(m) for m in args.ms.split(",")]
    print(f"{'V×K':>12} {'M':>3} {'agree':>9} {'surv mean':>9} {'max':>5} {'ambig':>6} "
          f"{'bf16 µs':>8} {'int8 µs':>8} {'cert µs':>8} {'speedup':>7} {'int8 TB/s':>9}")
    for v, k in shapes:
        w = llm_like(v, k, device)
        head = CertifiedHead.from_weight(w.cpu()).to(device) if device == "cuda" else CertifiedHead.from_weight(w)
        head.weight = w
        for m in ms:
            agree = total = 0
            counts, amb = [], 0
            for t in range(args.trials if not args.cpu_smoke else 1):
                x = hidden(w, m, seed=100 + t)
                ref = F.linear(x, w).argmax(-1)
                ids, info = head.argmax(x, backend="triton")
                agree += int((ids == ref).sum())
                total += m
                counts.append(info.counts.float())
                amb += int(info.ambiguous.sum())
            c = torch.cat(counts)
            row = f"{v}×{k:<5} {m:>3} {agree:>4}/{total:<4} {c.mean():>9.2f} {int(c.max()):>5} {amb:>6}"
            if bench:
                x = hidden(w, m, seed=7)
                t_bf16 = triton.testing.do_bench(lambda: F.linear(x, w).argmax(-1), return_mode="median") * 1e3
                t_int8 = triton.testing.do_bench(lambda: kt.candidates(head, x), return_mode="median") * 1e3
                t_cert = triton.testing.do_bench(lambda: head.argmax(x, backend="triton"), return_mode="median") * 1e3
                tbs = (v * k + 8 * v) / (t_int8 * 1e-6) / 1e12
                row += f" {t_bf16:>8.1f} {t_int8:>8.1f} {t_cert:>8.1f} {t_bf16 / t_cert:>6.2f}× {tbs:>9.2f}"
            print(row)
            if agree != total:
                print(f"ARGMAX MISMATCH at {v}×{k}, M={m}: {total - agree} rows", file=sys.stderr)
                return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
