"""CUDA check of torch.ops.w12.gemm_packed (what W12Linear and fused groups call) against torch.ops.w12.gemm.

    W12_CUDA=1 python bench/packed_op_check.py

For a random 4096×4096 and a 6144×4096 (fused-width) matrix with escapes: both ops at M = 1, 16, 48, 128, 200
(the skinny and ws kernels, and the path above 128 rows), outputs compared by bits; then a W12Linear prepared on CUDA and
captured in a CUDA graph, compared with the op's eager output.
"""

import torch

from w12.formats.matrix import W12Matrix
from w12.kernels import ops  # noqa: F401
from w12.kernels.gemm import prepare_escapes
from w12.kernels.ops import pack_matrix
from w12.runtime.w12_linear import W12Linear, prepare


def main():
    torch.manual_seed(0)
    ok = True
    for n, k in ((4096, 4096), (6144, 4096)):
        w = (torch.randn(n, k) * 0.02).to(torch.bfloat16)
        w[::97, ::13] = 300.0
        m = W12Matrix.from_bf16(w)
        rec, exps, counts, esc = (t.cuda() for t in (m.records, m.exponents, m.esc_counts, m.escapes))
        offs, cols = prepare_escapes(counts, esc)
        packed = pack_matrix(rec, exps, esc, offs, cols)
        for rows in (1, 16, 48, 128, 200):
            x = torch.randn(rows, k, device="cuda").to(torch.bfloat16)
            a = torch.ops.w12.gemm(x, rec, exps, esc, offs, cols, n)
            b = torch.ops.w12.gemm_packed(x, packed, n, esc.shape[0])
            same = torch.equal(a.view(torch.int16), b.view(torch.int16))
            ok &= same
            print(f"{n}x{k} M={rows} nnz={esc.shape[0]}: gemm_packed == gemm bits: {same}")
        lin = W12Linear(k, n, bias=False, nnz=esc.shape[0], device="cuda")
        lin.load_matrix(m)
        lin.cuda()
        prepare(lin)
        x = torch.randn(1, k, device="cuda").to(torch.bfloat16)
        y0 = lin(x)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            yg = lin(x)
        g.replay()
        torch.cuda.synchronize()
        same = torch.equal(y0.view(torch.int16), yg.view(torch.int16)) and torch.equal(
            y0.view(torch.int16), torch.ops.w12.gemm(x, rec, exps, esc, offs, cols, n).view(torch.int16))
        ok &= same
        print(f"{n}x{k} W12Linear on CUDA (eager, CUDA graph) == gemm: {same}")
    print("ALL OK" if ok else "MISMATCH")


if __name__ == "__main__":
    main()
