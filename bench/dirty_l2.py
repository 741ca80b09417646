"""What a dirty L2 costs each M = 1 kernel, and which load hints change that. One GPU call.

    python bench/dirty_l2.py --build DIR           # here (nvcc): one library per load-hint variant
    W12_CUDA=1 python bench/dirty_l2.py --libs DIR [--out OUT]   # on the GPU

bench/kernels.py times every call twice: after do_bench's L2 flush (zeroing 256 MB, which leaves the L2 full of
dirty lines whose write-back lands in the timed call) and after a read-only flush (clean lines). At M = 1 the
skinny kernel pays far more for the dirty state than cuBLAS on the large shapes (LM heads: +18–21 µs against
cuBLAS's +8.6; 2026-12-03-kernels-cuda-h200-s18-call10.md). This script times, under both flushes and at M = 1 on
every shape: cuBLAS, a PyTorch reduction over the record bytes (the read floor), and the skinny kernel (W12 and
view, the dispatched config) built with each variant of its weight and X loads. Every variant must give the base
build's bits (checked first). The variants patch kernels/w12_gemv.cu as of REV (1576469): since then the weight
loads' L2 priority is a config field (CudaConfig.l2, swept by bench/m1_configs.py). Prints and writes OUT/dirty_l2.md.
"""

import os
import sys
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from revision import commit  # noqa: E402  (bench/revision.py)
from ab_kernel import build_libs, build_or_run, source_at  # noqa: E402

REV = "1576469"  # the source the variants patch: before CudaConfig.l2 made the weight loads' L2 priority a config
W_BASE = 'asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"'
W_END = ': "l"(p));\n  return r;'
X_BASE = "    a = __ldg(p);\n    b = __ldg(p + 1);"


def policy(kind):
    return f'uint64_t pol; asm("createpolicy.fractional.L2::{kind}.b64 %0, 1.0;" : "=l"(pol)); '


def w_hint(text, kind):
    """ld_stream with an L2 cache-hint policy of `kind` on the weight loads."""
    text = text.replace(W_BASE, policy(kind) + W_BASE.replace("no_allocate.v4", "no_allocate.L2::cache_hint.v4")
                        .replace("[%4];", "[%4], %5;"))
    return text.replace(W_END, ': "l"(p), "l"(pol));\n  return r;', 1)


def x_hint(text, kind):
    """load_x16 with an L2 cache-hint policy of `kind` on the X loads."""
    ld = ('asm volatile("ld.global.nc.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;" : "=r"(V.x), "=r"(V.y), '
          '"=r"(V.z), "=r"(V.w) : "l"(p + I), "l"(pol));')
    a, b = ld.replace("V", "a").replace("I", "0"), ld.replace("V", "b").replace("I", "1")
    return text.replace(X_BASE, "    " + policy(kind) + a + "\n    " + b)


VARIANTS = {
    "base": lambda t: t,
    "w_normal": lambda t: w_hint(t, "evict_normal"),  # the cache-hint path itself, no change of priority
    "w_first": lambda t: w_hint(t, "evict_first"),
    "x_last": lambda t: x_hint(t, "evict_last"),
    "w_first_x_last": lambda t: x_hint(w_hint(t, "evict_first"), "evict_last"),
    "w_unchanged": lambda t: w_hint(t, "evict_unchanged"),
}


def build(out: Path):
    text = source_at(REV)
    assert text.count(W_BASE) == 1 and text.count(W_END) == 1 and text.count(X_BASE) == 1, \
        "ld_stream / load_x16 changed: update bench/dirty_l2.py"
    for name, lib in build_libs({name: f(text) for name, f in VARIANTS.items()}, out).items():
        print(name, lib)


def run(libs: Path, out: str):
    import ctypes
    import datetime

    import torch
    from kernels import SHAPES, Mat, bench

    from w12.kernels import gemm_cuda as gc
    cdlls = {name: ctypes.CDLL(str(libs / f"w12_gemv_{name}.so")) for name in VARIANTS}
    rows = []
    head = ["cuBLAS", "read floor"] + [f"{kind} {v}" for kind in ("W12", "view") for v in VARIANTS]
    for si, (n, k) in enumerate(SHAPES):
        mt = Mat(n, k, 300 + si)
        x = torch.randn(1, k, device="cuda").to(torch.bfloat16)
        recs = mt.records.view(torch.int64)
        fns = {"cuBLAS": lambda: torch.matmul(x, mt.w.t()), "read floor": lambda: recs.sum()}
        for view in (False, True):
            cfg = gc.dispatched_config(1, n, k, view)
            ref = None
            for name, lib in cdlls.items():
                gc.library = lambda lib=lib: lib
                y = mt.run(x, view=view, cuda=cfg)
                ref = y if ref is None else ref
                assert torch.equal(y.view(torch.int16), ref.view(torch.int16)), f"{name} {n}x{k} view={view}: not base's bits"

                def call(lib=lib, view=view, cfg=cfg):
                    gc.library = lambda: lib
                    return mt.run(x, view=view, cuda=cfg)
                fns[f"{'view' if view else 'W12'} {name}"] = call
        cells = []
        for name in head:
            dirty, clean = bench(fns[name]), bench(fns[name], clean=True)
            cells.append((dirty, clean))
        row = f"| {n}×{k} | " + " | ".join(f"{d:.1f} / {c:.1f} (+{d - c:.1f})" for d, c in cells) + " |"
        print(row, flush=True)
        rows.append(row)
        del mt, fns
        torch.cuda.empty_cache()
    text = "\n".join([
        f"# M = 1 under a dirty and a clean L2 — {datetime.date.today()}", "",
        f"- GPU: {torch.cuda.get_device_name()}; torch {torch.__version__}; commit {commit()}",
        "- command: `python bench/dirty_l2.py --build DIR` (here), then `W12_CUDA=1 python bench/dirty_l2.py --libs DIR`",
        "- every variant gave the base build's bits (W12 and view); cells: µs after do_bench's zeroing flush (dirty L2) / "
        "after a read-only 512 MB flush (clean L2) (+ the difference); CUDA graph replay, median; configs as dispatched", "",
        "| N×K | " + " | ".join(head) + " |", "|---" * (len(head) + 1) + "|", *rows]) + "\n"
    with open(os.path.join(out, "dirty_l2.md"), "w") as fh:
        fh.write(text)
    print(text)


if __name__ == "__main__":
    build_or_run(__doc__, build, run)
