"""Does prefetching the next projection's W12 weights into L2 shorten a decode step? One GPU call.

    W12_CUDA=1 PYTHONUNBUFFERED=1 python bench/l2_prefetch.py [--layers 6] [--out DIR]

A Llama-3.1-8B-shaped decode step at batch 1, L layers with distinct weights (so nothing stays in L2 from one
layer to the next), captured in one CUDA graph: per layer q/k/v (6144×4096), o (4096²), gate/up (28672×4096)
and down (4096×14336) W12 GEMMs, with torch.compile'd stand-ins for what a model runs between them
(RMSNorm + residual, rotary + KV-cache write + GQA attention over 320 cached positions, SiLU·mul).
Variants: no prefetch; after each GEMM, an L2 prefetch of the next GEMM's first records
(gemm_cuda.prefetch_l2: bulk or per-line, on the same stream or a side stream that the next GEMM waits for).
The final hidden state of every variant is compared by bits with the no-prefetch one (a prefetch must not
change results), then each is timed (do_bench on the graph replay, median) as µs per layer; the GEMMs alone
and the stand-ins alone are timed too, so the gap the prefetch can use is visible.
"""

import argparse
import datetime
import os
import sys

import torch
import torch.nn.functional as F
import triton

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kernels import Mat, spin  # noqa: E402  (bench/kernels.py)

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
        self.kc = [torch.randn(1, NKV, CACHE, HD, device=dev).to(torch.bfloat16) for _ in range(layers)]
        self.vc = [torch.randn(1, NKV, CACHE, HD, device=dev).to(torch.bfloat16) for _ in range(layers)]
        self.nw = torch.rand(H, device=dev).to(torch.bfloat16) + 0.5
        self.pos = torch.tensor([100], device=dev)
        ang = torch.rand(1, 1, 1, HD, device=dev)
        self.cos, self.sin = ang.cos().to(torch.bfloat16), ang.sin().to(torch.bfloat16)
        self.h0 = torch.randn(1, H, device=dev).to(torch.bfloat16)
        self.side, self.pending = torch.cuda.Stream(), False
        self.norm_add = torch.compile(norm_add, dynamic=False, fullgraph=True)
        self.attention = torch.compile(attention, dynamic=False, fullgraph=True)
        self.silu_mul = torch.compile(silu_mul, dynamic=False, fullgraph=True)

    def gemm(self, mt, x, pf, nxt):
        y = mt.op(x)
        if pf and nxt is not None:
            mode, budget, side = pf
            if side:
                self.side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(self.side):
                    gc.prefetch_l2(nxt.records, budget, nxt.n, mode)
                self.pending = True
            else:
                gc.prefetch_l2(nxt.records, budget, nxt.n, mode)
        return y

    def run(self, pf=None, gemms=True, glue=True):
        h, r = self.h0, torch.zeros_like(self.h0)
        L = len(self.mats)
        side = bool(pf and pf[2])
        for i, m in enumerate(self.mats):
            nxt_qkv = self.mats[i + 1]["qkv"] if i + 1 < L else None

            def join():
                if side and self.pending:
                    torch.cuda.current_stream().wait_stream(self.side)
                    self.pending = False

            h, a = self.norm_add(h, r, self.nw) if glue else (h, h)
            join()
            qkv = self.gemm(m["qkv"], a, pf, m["o"]) if gemms else torch.zeros(1, 6144, device="cuda", dtype=torch.bfloat16)
            att = self.attention(qkv, self.kc[i], self.vc[i], self.pos, self.cos, self.sin) if glue else qkv[:, :H]
            join()
            o = self.gemm(m["o"], att, pf, m["gu"]) if gemms else att
            h, a = self.norm_add(h, o, self.nw) if glue else (h, o)
            join()
            gu = self.gemm(m["gu"], a, pf, m["dn"]) if gemms else torch.zeros(1, 2 * FF, device="cuda", dtype=torch.bfloat16)
            mlp = self.silu_mul(gu) if glue else gu[:, :FF]
            join()
            r = self.gemm(m["dn"], mlp, pf, nxt_qkv) if gemms else mlp[:, :H]
        if side and self.pending:
            torch.cuda.current_stream().wait_stream(self.side)
            self.pending = False
        return h + r


def graph_us(fn, per):
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
    variants = [("none", None), ("bulk 24 MB", (0, 24 << 20, False)), ("bulk 40 MB", (0, 40 << 20, False)),
                ("line 24 MB", (1, 24 << 20, False)), ("bulk 24 MB, side stream", (0, 24 << 20, True)),
                ("bulk 40 MB, side stream", (0, 40 << 20, True))]
    rows, ref = [], None
    t_gemm, _ = graph_us(lambda: st.run(glue=False), L)
    t_glue, _ = graph_us(lambda: st.run(gemms=False), L)
    print(f"GEMMs alone {t_gemm:.1f} µs/layer; stand-ins alone {t_glue:.1f} µs/layer", flush=True)
    for name, pf in variants:
        t, out = graph_us(lambda: st.run(pf), L)
        if ref is None:
            ref = out
        same = torch.equal(out.view(torch.int16), ref.view(torch.int16))
        rows.append((name, t, same))
        print(f"{name:28s} {t:7.1f} µs/layer  same bits as none: {same}", flush=True)
    # the prefetch kernel alone, and an o GEMM right after its weights were prefetched
    o = st.mats[0]["o"]
    x = torch.randn(1, H, device="cuda").to(torch.bfloat16)
    t_pf, _ = graph_us(lambda: (gc.prefetch_l2(o.records, 24 << 20, o.n), x)[1], 1)
    t_o, _ = graph_us(lambda: o.op(x), 1)
    t_pfo, _ = graph_us(lambda: (gc.prefetch_l2(o.records, 24 << 20, o.n), o.op(x))[1], 1)
    base = rows[0][1]
    lines = [f"# L2 prefetch of the next projection's weights, decode-step model — {datetime.date.today()}", "",
             f"- GPU: {torch.cuda.get_device_name()}; torch {torch.__version__}; commit {os.environ.get('W12_REV', '?')}",
             f"- command: `W12_CUDA=1 python bench/l2_prefetch.py --layers {L} --out $OUT`",
             f"- GEMMs alone {t_gemm:.1f} µs/layer; stand-ins alone {t_glue:.1f} µs/layer; "
             f"prefetch kernel alone (24 MB asked) {t_pf:.1f} µs; o GEMM {t_o:.1f} µs, prefetch then o GEMM {t_pfo:.1f} µs", "",
             "| variant | µs per layer | vs none | final state bit-identical |", "|---|---|---|---|"]
    lines += [f"| {n} | {t:.1f} | {base / t:.3f}× | {s} |" for n, t, s in rows]
    text = "\n".join(lines) + "\n"
    print(text)
    with open(os.path.join(args.out, "l2_prefetch.md"), "w") as fh:
        fh.write(text)


if __name__ == "__main__":
    main()
