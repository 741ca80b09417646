"""A Llama-3.1-8B-shaped decode step at batch 1 in one CUDA graph: W12 with and without programmatic dependent
launch (PDL) against cuBLAS BF16. One GPU call.

    W12_CUDA=1 PYTHONUNBUFFERED=1 python bench/decode_step.py [--layers 6] [--out DIR]

L layers with distinct weights (nothing stays in L2 from one layer to the next), captured in one CUDA graph:
per layer q/k/v (6144×4096), o (4096²), gate/up (28672×4096) and down (4096×14336) projections, with
torch.compile'd stand-ins for what a model runs between them (RMSNorm + residual, rotary + KV-cache write + GQA
attention over 320 cached positions, SiLU·mul) — the kernel sequence a compiled Transformers decode step
replays. Projections: W12 (the skinny CUDA kernel, `gemm_cuda.PDL` on / off) or cuBLAS (`torch.matmul` on the
same weights in BF16). Checks first: the W12 final hidden state is the same bits with and without PDL, and
close to cuBLAS's (relative ∞-norm error printed). Then each variant is timed (do_bench on the graph replay,
median) as µs per layer, with the projections alone (back to back, no stand-ins) too.
"""

import argparse
import datetime
import os
import sys

import torch
import torch.nn.functional as F
import triton

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kernels import Mat, rel, spin  # noqa: E402  (bench/kernels.py)

from w12.kernels import gemm_cuda as gc  # noqa: E402

H, NQ, NKV, HD, FF, CACHE = 4096, 32, 8, 128, 14336, 320


def norm_add(h, r, w):
    """(h + r, rmsnorm(h + r) · w) in bf16 (fp32 statistics)."""
    s = h + r
    f = s.float()
    return s, (f * torch.rsqrt(f.pow(2).mean(-1, keepdim=True) + 1e-5)).to(torch.bfloat16) * w


def attention(qkv, kc, vc, pos, cos, sin):
    """Rotary on q, k; k, v written at `pos` of the static cache; GQA attention over the cache."""
    q = qkv[:, :H].view(1, NQ, 1, HD)
    k = qkv[:, H:H + NKV * HD].view(1, NKV, 1, HD)
    v = qkv[:, H + NKV * HD:].view(1, NKV, 1, HD)

    def rot(t):
        t1, t2 = t[..., :HD // 2], t[..., HD // 2:]
        return t * cos + torch.cat([-t2, t1], -1) * sin

    kc.index_copy_(2, pos, rot(k))
    vc.index_copy_(2, pos, v)
    o = F.scaled_dot_product_attention(rot(q), kc, vc, enable_gqa=True)
    return o.reshape(1, H)


def silu_mul(gu):
    return F.silu(gu[:, :FF]) * gu[:, FF:]


class Step:
    def __init__(self, layers: int):
        dev = "cuda"
        self.mats = [dict(qkv=Mat(6144, H, 10 * i), o=Mat(H, H, 10 * i + 1), gu=Mat(2 * FF, H, 10 * i + 2),
                          dn=Mat(H, FF, 10 * i + 3)) for i in range(layers)]
        self.kc0 = [torch.randn(1, NKV, CACHE, HD, device=dev).to(torch.bfloat16) for _ in range(layers)]
        self.vc0 = [torch.randn(1, NKV, CACHE, HD, device=dev).to(torch.bfloat16) for _ in range(layers)]
        self.kc, self.vc = [t.clone() for t in self.kc0], [t.clone() for t in self.vc0]
        self.nw = torch.rand(H, device=dev).to(torch.bfloat16) + 0.5
        self.pos = torch.tensor([100], device=dev)
        ang = torch.rand(1, 1, 1, HD, device=dev)
        self.cos, self.sin = ang.cos().to(torch.bfloat16), ang.sin().to(torch.bfloat16)
        self.h0 = torch.randn(1, H, device=dev).to(torch.bfloat16)
        self.norm_add = torch.compile(norm_add, dynamic=False, fullgraph=True)
        self.attention = torch.compile(attention, dynamic=False, fullgraph=True)
        self.silu_mul = torch.compile(silu_mul, dynamic=False, fullgraph=True)

    @staticmethod
    def proj(mt, x, kind):
        return mt.op(x) if kind == "w12" else torch.matmul(x, mt.w.t())

    def run(self, kind, glue=True):
        h, r = self.h0, torch.zeros_like(self.h0)
        for i, m in enumerate(self.mats):
            h, a = self.norm_add(h, r, self.nw) if glue else (h, h)
            qkv = self.proj(m["qkv"], a, kind)
            att = self.attention(qkv, self.kc[i], self.vc[i], self.pos, self.cos, self.sin) if glue else qkv[:, :H]
            o = self.proj(m["o"], att, kind)
            h, a = self.norm_add(h, o, self.nw) if glue else (h, o)
            gu = self.proj(m["gu"], a, kind)
            mlp = self.silu_mul(gu) if glue else gu[:, :FF]
            r = self.proj(m["dn"], mlp, kind)
        return h + r


def graph_us(fn, per):
    """(µs per layer of the graph replay, the replay's output)."""
    fn()
    torch.cuda.synchronize()
    gr = torch.cuda.CUDAGraph()
    with torch.cuda.graph(gr):
        out = fn()
    spin()
    t = triton.testing.do_bench(gr.replay, warmup=10, rep=100, return_mode="median") * 1e3 / per
    gr.replay()
    torch.cuda.synchronize()
    return t, out.clone()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args()
    st = Step(args.layers)
    L = args.layers
    variants = [("cuBLAS BF16", "bf16", None), ("W12, no PDL", "w12", False), ("W12, PDL", "w12", True)]
    rows, outs = [], {}
    for name, kind, pdl in variants:
        if pdl is not None:
            gc.PDL = pdl
        for c0, c in zip(st.kc0 + st.vc0, st.kc + st.vc):
            c.copy_(c0)
        t_all, out = graph_us(lambda: st.run(kind), L)
        t_proj, _ = graph_us(lambda: st.run(kind, glue=False), L)
        outs[name] = out
        rows.append((name, t_all, t_proj))
        print(f"{name:14s} step {t_all:7.1f} µs/layer, projections alone {t_proj:7.1f} µs/layer", flush=True)
    same = torch.equal(outs["W12, PDL"].view(torch.int16), outs["W12, no PDL"].view(torch.int16))
    err = rel(outs["W12, PDL"], outs["cuBLAS BF16"].float())
    print(f"W12 PDL == no PDL by bits: {same}; W12 vs cuBLAS rel err {err:.2e}")
    base = rows[0][1]
    lines = [f"# Decode-step model: W12 with / without PDL vs cuBLAS BF16 — {datetime.date.today()}", "",
             f"- GPU: {torch.cuda.get_device_name()}; torch {torch.__version__}; commit {os.environ.get('W12_REV', '?')}",
             f"- command: `W12_CUDA=1 python bench/decode_step.py --layers {L} --out $OUT`",
             f"- final hidden state: W12 with PDL == without, by bits: **{same}**; W12 vs cuBLAS ‖Δ‖∞/‖ref‖∞ = {err:.2e}",
             "", "| variant | step µs per layer | speed-up vs cuBLAS | projections alone µs per layer |",
             "|---|---|---|---|"]
    lines += [f"| {n} | {t:.1f} | {base / t:.3f}× | {p:.1f} |" for n, t, p in rows]
    text = "\n".join(lines) + "\n"
    print(text)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "decode_step.md"), "w") as fh:
        fh.write(text)
    if not same:
        sys.exit("W12 output differs with PDL: a race (X read before the previous kernel finished?)")


if __name__ == "__main__":
    main()
