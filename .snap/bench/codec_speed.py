"""Speed of the fast (numba) W12 codec on LLM-like BF16 matrices.

    .venv/bin/python bench/codec_speed.py [--repeat 5] [--threads 2,1] [--ref-max-weights 64000000]

For each shape: encode and decode throughput in million weights per second (best of --repeat full
calls after a warm-up, output allocation included) for each thread count (and, single-threaded, per
CPU-second of the calling thread, robust to other processes on the machine), the bits per weight
(SPEC.md §12) and the escape rate. It asserts that decode round-trips bit-exactly and, for matrices of
at most --ref-max-weights weights, that the fast encoding is byte-identical to the reference's
(the reference takes about 2 s and 1 GB per 16 M weights) and that the 8-bit views agree.
"""

import argparse
import time

import numba
import torch

from w12.formats import fast, reference
from w12.formats.layout import bits_per_weight

SHAPES = [(4096, 4096), (14336, 4096)]


def llm_like(n: int, k: int, seed: int = 0) -> torch.Tensor:
    """randn·0.02 cast to BF16, a few exact zeros (1e-5) and rare large outliers (1e-5, σ = 4),
    as int16 bit patterns."""
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=g) * 0.02
    u = torch.rand(n, k, generator=g)
    w = torch.where(u < 1e-5, torch.randn(n, k, generator=g) * 4.0, w)
    w = torch.where(u > 1 - 1e-5, torch.zeros(()), w)
    return w.to(torch.bfloat16).view(torch.int16)


def best_of(fn, repeat: int) -> tuple[float, float]:
    """(best wall-clock seconds, best CPU seconds of the calling thread) over `repeat` calls."""
    fn()  # warm-up (JIT compile or cache load, page cache)
    wall, cpu = [], []
    for _ in range(repeat):
        c0, t0 = time.thread_time(), time.perf_counter()
        out = fn()
        wall.append(time.perf_counter() - t0)
        cpu.append(time.thread_time() - c0)
        del out
    return min(wall), min(cpu)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--threads", default=None, help="comma-separated numba thread counts (default: all, then 1)")
    ap.add_argument("--ref-max-weights", type=int, default=64_000_000,
                    help="compare with the reference encoder only up to this many weights")
    ap.add_argument("--shapes", default=None, help="e.g. 4096x4096,14336x4096")
    args = ap.parse_args()

    max_threads = numba.get_num_threads()
    threads = [int(t) for t in args.threads.split(",")] if args.threads else sorted({max_threads, 1}, reverse=True)
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")] if args.shapes else SHAPES

    fast.decode(*fast.encode(torch.zeros(1, 1, dtype=torch.int16)), 1, 1)  # compile / load, start the thread pool
    print(f"numba {numba.__version__}, threading layer {numba.threading_layer()!r}, {max_threads} threads; "
          f"wall clock, best of {args.repeat} full calls after a warm-up")
    print("1-thread rows also give M weights per CPU-second of the calling thread (which runs all the work")
    print("then), a measure that other processes competing for the 2 cores disturb much less than wall clock")
    header = (f"{'shape':>12} {'threads':>7} {'encode Mw/s':>12} {'decode Mw/s':>12} {'enc/cpu-s':>10} {'dec/cpu-s':>10} "
              f"{'bits/weight':>12} {'escapes':>9} {'ref':>5}")
    print(header)
    print("-" * len(header))
    for n, k in shapes:
        bits = llm_like(n, k, seed=n + k)
        enc = fast.encode(bits)
        nnz = int(enc[3].shape[0])
        assert torch.equal(fast.decode(*enc, n, k), bits), f"{n}x{k}: decode does not round-trip"
        if n * k <= args.ref_max_weights:
            ref = reference.encode(bits)
            for name, a, b in zip(("records", "exponents", "counts", "escapes"), enc, ref):
                assert a.dtype == b.dtype and torch.equal(a, b), f"{n}x{k}: {name} differ from the reference"
            assert torch.equal(fast.decode(*enc, n, k, lo_fill=8), reference.decode(*ref, n, k, lo_fill=8))
            del ref
            ref_ok = "same"
        else:
            ref_ok = "skip"
        for t in threads:
            numba.set_num_threads(t)
            try:
                te, ce = best_of(lambda: fast.encode(bits), args.repeat)
                td, cd = best_of(lambda: fast.decode(*enc, n, k), args.repeat)
            finally:
                numba.set_num_threads(max_threads)
            cpu = f"{n * k / ce / 1e6:>10.0f} {n * k / cd / 1e6:>10.0f}" if t == 1 else f"{'-':>10} {'-':>10}"
            print(f"{f'{n}x{k}':>12} {t:>7} {n * k / te / 1e6:>12.0f} {n * k / td / 1e6:>12.0f} {cpu} "
                  f"{bits_per_weight(n, k, nnz):>12.4f} {nnz / (n * k):>9.2e} {ref_ok:>5}")
        del enc


if __name__ == "__main__":
    main()
