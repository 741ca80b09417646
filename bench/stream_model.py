"""A float64 model of w12_stream_kernel's data flow, run on the CPU against X · Wᵀ (no GPU needed).

    python bench/stream_model.py [--cases 40]

It follows the kernel's index maths, not its lanes: CTA p's records [⌊p·T/P⌋, ⌊(p+1)·T/P⌋), the row segments they
cut, each 16-channel tile's escapes of a segment from the tables gemm.prepare_escapes builds (toff[c·KB + ka ..
c·KB + kend), entries in chunks of 16, the code value 2^(E_n − 142) that decode4 gives an escape), a split row's
partials in slot 0 / 1 (each written once), a ticket per (row, warp) and the last arrival's sums in CTA order — for 8
consumer warps and for 4 (two tiles each), random shapes, escape densities, M and CTA counts (more CTAs than records
too). What it cannot check (lane layouts, barriers, the ring) bench/stream_kernel.py checks on the GPU.
"""
import argparse
import random

import torch

from w12.formats import reference as fmt
from w12.formats.matrix import W12Matrix
from w12.kernels.gemm import prepare_escapes
from w12.kernels.gemm_cuda import _even

ECH = 16  # STREAM_ECH: escape entries per chunk


def first(p, P, T):  # stream_first: CTA p's first record
    return p * T // P


def owner(i, P, T):  # stream_owner: the CTA whose range holds record i
    return ((i + 1) * P - 1) // T


def tables(m):
    """(toff, tent) as lists, cut from the esc_cols that prepare_escapes builds (gemm_cuda._tile_escape_ptrs)."""
    nb, kb = m.records.shape[:2]
    nnz = m.escapes.shape[0]
    _, cols = prepare_escapes(m.esc_counts, m.escapes)
    at = _even(max(nnz, 1))
    tent_at = at + _even(nb * 8 * kb + 1)
    assert cols.numel() == tent_at + 2 * nnz
    return cols[at:at + nb * 8 * kb + 1].tolist(), cols[tent_at:tent_at + 2 * nnz].tolist()


def tile_out(X, wc, E, toff, tent, nb, u, ka, kend, kb):
    """Tile u of row nb over records [ka, kend): the MMAs' sum times 2^(E − 127) (X · the code values), then each
    escape's x[m, col] · (w − w_code) in list order, chunk by chunk."""
    base_ch = nb * 128 + 16 * u
    out = X[:, ka * 64:kend * 64] @ wc[base_ch:base_ch + 16, ka * 64:kend * 64].t()
    c = nb * 8 + u
    e_lo, e_hi = toff[c * kb + ka], toff[c * kb + kend]
    for base in range(e_lo, e_hi, ECH):
        for e in range(base, min(base + ECH, e_hi)):
            ex, ey = tent[2 * e] & 0xFFFFFFFF, tent[2 * e + 1]
            r, col = ex >> 24, ex & 0xFFFFFF
            assert ka * 64 <= col < kend * 64, "an escape outside the segment's columns"
            wcode = 2.0 ** (E[base_ch + r] - 142)
            assert wc[base_ch + r, col] == wcode, "an escape's code value is not 2^(E - 142)"
            wv = torch.tensor([ey & 0xFFFF], dtype=torch.int32).to(torch.int16).view(torch.bfloat16).double().item()
            out[:, r] += X[:, col] * (wv - wcode)
    return out


def model(x, m, P, W):
    """Y [M, N] as the kernel computes it with P CTAs and W consumer warps (float64)."""
    H = 8 // W
    n, k = m.shape
    nb_, kb_ = m.records.shape[:2]
    T = nb_ * kb_
    P = min(P, T)  # launch_stream: at most one CTA per record
    toff, tent = tables(m)
    code = fmt.decode(m.records, m.exponents, torch.zeros_like(m.esc_counts), m.escapes[:0], n, k)
    wc = torch.zeros(nb_ * 128, k, dtype=torch.float64)  # what decode4 gives: escapes keep their code value
    wc[:n] = code.view(torch.bfloat16).double()
    E = m.exponents.to(torch.int64).tolist()
    X = x.double()
    y = torch.full((X.shape[0], nb_ * 128), float("nan"), dtype=torch.float64)
    ws, tickets = {}, {}
    for p in range(P):
        g0, g1 = first(p, P, T), first(p + 1, P, T)
        assert g1 > g0
        i = g0
        while i < g1:  # one segment: row nb, records [ka, kend)
            nb, ka = i // kb_, i % kb_
            kend = min(kb_, g1 - nb * kb_)
            row0 = nb * kb_
            plo, phi = owner(row0, P, T), owner(row0 + kb_ - 1, P, T)
            lo_first = first(plo, P, T) == row0
            for w in range(W):
                us = [H * w + h for h in range(H)]
                outs = [tile_out(X, wc, E, toff, tent, nb, u, ka, kend, kb_) for u in us]
                if plo == phi:  # the whole row
                    for u, out in zip(us, outs):
                        y[:, nb * 128 + 16 * u:nb * 128 + 16 * u + 16] = out
                    continue
                which = 0 if (p > plo or lo_first) else 1
                assert (nb == first(p, P, T) // kb_) == (which == 0)
                for u, out in zip(us, outs):
                    assert (p, which, u) not in ws, f"partial slot {(p, which, u)} written twice"
                    ws[(p, which, u)] = out
                tk = tickets.get((nb, us[0]), 0)
                tickets[(nb, us[0])] = tk + 1
                if tk == phi - plo:  # the last arrival adds the pieces in CTA order
                    for u in us:
                        s = sum(ws[(q, 0 if (q > plo or lo_first) else 1, u)] for q in range(plo, phi + 1))
                        y[:, nb * 128 + 16 * u:nb * 128 + 16 * u + 16] = s
                    tickets[(nb, us[0])] = 0
            i = row0 + kend
    return y[:, :n]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", type=int, default=40)
    a = ap.parse_args()
    random.seed(0)
    torch.manual_seed(0)
    worst = 0.0
    for case in range(a.cases):
        n, k = random.choice([128, 300, 1000, 640]), 64 * random.choice([1, 3, 16, 20])
        w = (torch.randn(n, k) * 0.02).to(torch.bfloat16)
        w.view(-1)[::random.choice([7, 97, 997])] = 100.0  # the small weights of those channels become escapes
        m = W12Matrix.from_bf16(w)
        x = torch.randn(random.choice([1, 3, 8, 13, 32]), k).to(torch.bfloat16)
        P, W = random.choice([1, 2, 5, 33, 264, 10000]), random.choice([8, 4])
        y = model(x, m, P, W)
        ref = x.double() @ w.double().t()
        err = ((y - ref).abs().max() / ref.abs().max()).item()
        worst = max(worst, err)
        assert err < 1e-10, f"case {case}: N={n} K={k} M={x.shape[0]} P={P} W={W}: relative error {err:.1e}"
    print(f"{a.cases} cases: the model matches X · Wᵀ (worst relative error {worst:.1e})")


if __name__ == "__main__":
    main()
