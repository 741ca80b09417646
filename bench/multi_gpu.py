"""W12 layers on a GPU that is not the current device: the case of a model split over GPUs in one process
(Transformers' device_map="auto"), where every layer on the second GPU is called with cuda:0 current. One GPU call on a
machine with two GPUs (the device tool's nvidia-h100-x2):

    W12_CUDA=1 python bench/multi_gpu.py [--out OUT]

The kernels launch on the current device (CUDA's runtime and Triton both), so kernels/ops.py makes the input's GPU
current for such a call (ops._other_gpu). For each M (the skinny, ws and stream kernels, the Triton kernels and the
decode + cuBLAS path) and for W12 and the view: a W12Linear on cuda:1, called with cuda:0 current, against the same
layer on cuda:0 — the same bits — and against F.linear on the BF16 weight (within BF16 output rounding); then the layer
on cuda:0 after cuda:1 ran (each device's kernel attributes are its own: w12_gemv.cu's raise_smem). Prints a table and
writes OUT/multi_gpu.md.
"""

import argparse
import copy
import datetime
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from revision import commit  # noqa: E402  (bench/revision.py)

from w12.kernels import gemm_cuda as gc  # noqa: E402
from w12.kernels import ops  # noqa: E402
from w12.runtime.w12_linear import W12Linear  # noqa: E402

MS = (1, 4, 16, 32, 64, 128, 200)


def layer(n, k, seed):
    torch.manual_seed(seed)
    lin = nn.Linear(k, n, bias=False, dtype=torch.bfloat16)
    with torch.no_grad():
        lin.weight.normal_(0, 0.02)
        lin.weight.view(-1)[::997] = 30.0  # out-of-window weights: escapes in those channels
    return lin.weight.detach().clone(), W12Linear.from_linear(lin)


def view_op(mod, x):
    return torch.ops.w12.view_gemm(x, mod.weight, mod.weight_exponents, mod.out_features)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    a = ap.parse_args()
    if torch.cuda.device_count() < 2:
        sys.exit(f"needs two GPUs, found {torch.cuda.device_count()}")
    d0, d1 = torch.device("cuda:0"), torch.device("cuda:1")
    rows, ok = [], True
    for n, k in ((4096, 4096), (6144, 4096)):
        w, mod = layer(n, k, n)
        m0, m1 = copy.deepcopy(mod).to(d0), mod.to(d1)
        w1 = w.to(d1)
        for m in MS:
            x = torch.randn(m, k, dtype=torch.bfloat16)
            torch.cuda.set_device(d0)
            kernel = gc.kernel_for(m, n, k) if m <= ops.LARGE_M else "decode"
            y1 = m1(x.to(d1))  # cuda:0 current, the layer on cuda:1
            v1 = view_op(m1, x.to(d1))
            torch.cuda.synchronize(d1)
            y0, v0 = m0(x.to(d0)), view_op(m0, x.to(d0))  # cuda:0 after cuda:1 ran
            ref = F.linear(x.to(d1).float(), w1.float())
            err = ((y1.float() - ref).abs().max() / ref.abs().max()).item()
            same = torch.equal(y1.cpu().view(torch.int16), y0.cpu().view(torch.int16))
            vsame = torch.equal(v1.cpu().view(torch.int16), v0.cpu().view(torch.int16))
            good = same and vsame and err < 1e-2 and y1.device == d1
            ok &= good
            rows.append(f"| {n}×{k} | {m} | {kernel} | {same} | {vsame} | {err:.1e} | {'ok' if good else 'FAILED'} |")
            print(rows[-1], flush=True)
    lines = [f"# W12 layers on a GPU other than the current one — {datetime.date.today()}", "",
             f"- GPUs: 2 × {torch.cuda.get_device_name(0)}; torch {torch.__version__}; commit {commit()}",
             "- command: `W12_CUDA=1 python bench/multi_gpu.py --out $OUT`",
             "- each row: the layer on cuda:1 called with cuda:0 current, against the same layer on cuda:0 (bits, W12 "
             "and view) and F.linear on the BF16 weight (max relative error)", "",
             "| N×K | M | kernel (cuda:0's table) | W12 bits equal | view bits equal | rel. err | |",
             "|---|---|---|---|---|---|---|", *rows, "", f"all ok: {ok}"]
    text = "\n".join(lines)
    with open(os.path.join(a.out, "multi_gpu.md"), "w") as fh:
        fh.write(text + "\n")
    print(text)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
