"""The SM clock right after a load: is it the 1.98 GHz nvidia-smi reports, or lower? One GPU call.

    python bench/clock_probe.py --build DIR               # here (nvcc): DIR/clock_probe.so
    W12_CUDA=1 python bench/clock_probe.py --libs DIR     # on the GPU

bench/ws_trace.py reads 1.70-1.80 GHz inside the ws kernel's main loop (clock64 over globaltimer) while nvidia-smi's
clocks.sm reads 1980 MHz most of the time. Here a spin kernel (one warp per SM, a dependent FMA chain) measures
clock64 cycles over globaltimer ns: alone after an idle second, and captured in one CUDA graph right after R calls of
a load (cuBLAS, the W12 kernel, the 8-bit view; X random or zeros), whose clock it then inherits (the board's power
management acts over milliseconds, the spin lasts ~50 µs). Per load: µs per call (graph replay wall time / R, no L2
flush) and the spin's GHz (median over SMs and replays). Same clock after cuBLAS and after W12: their comparison is
at one clock; lower after X random than after zeros: the tensor cores' power sets it.
"""

import ctypes
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from revision import commit  # noqa: E402  (bench/revision.py)
SPIN_CU = r"""
#include <cuda_runtime.h>
__global__ void w12_spin(unsigned long long* out, int iters) {
  unsigned long long t0, t1;
  const long long c0 = clock64();
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  float a = threadIdx.x * 1e-3f;
  for (int i = 0; i < iters; ++i) a = fmaf(a, 0.9999f, 1e-4f);  // dependent: ~4 cycles each
  const long long c1 = clock64();
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t1));
  if (threadIdx.x == 0) {
    out[2 * blockIdx.x] = (unsigned long long)(c1 - c0);
    out[2 * blockIdx.x + 1] = t1 - t0;
  }
  if (a == 12345.0f) out[0] = 0;  // keeps the chain
}
extern "C" int w12_spin_launch(void* out, int iters, int blocks, void* stream) {
  w12_spin<<<blocks, 32, 0, (cudaStream_t)stream>>>((unsigned long long*)out, iters);
  return (int)cudaGetLastError();
}
"""
ITERS, R, REPLAYS = 12000, 20, 12


def build(out: Path) -> Path:
    from w12.kernels import cuda_build
    out.mkdir(parents=True, exist_ok=True)
    src, lib = out / "clock_probe.cu", out / "clock_probe.so"
    src.write_text(SPIN_CU)
    flags = [f for f in cuda_build.FLAGS if f != "-lineinfo"]
    subprocess.run([cuda_build.nvcc_path(), *flags, "-o", str(lib), str(src)], check=True)
    src.unlink()
    return lib


def ghz(buf: torch.Tensor) -> list:
    """Per SM: cycles / ns."""
    c = buf.view(-1, 2).cpu().tolist()
    return [cy / ns for cy, ns in c if ns > 0]


def probe(lib, load, sms: int) -> tuple:
    """(µs per load call, median GHz of the spin right after R calls), over REPLAYS replays of one graph."""
    buf = torch.zeros(2 * sms, dtype=torch.int64, device="cuda")
    spin = lambda: lib.w12_spin_launch(ctypes.c_void_p(buf.data_ptr()), ITERS, sms,  # noqa: E731
                                       ctypes.c_void_p(torch.cuda.current_stream().cuda_stream))
    if load is not None:
        load()
    torch.cuda.synchronize()
    gr = torch.cuda.CUDAGraph()
    with torch.cuda.graph(gr):
        for _ in range(R if load is not None else 0):
            load()
        assert spin() == 0
    rates, walls = [], []
    for i in range(REPLAYS):
        if load is None:
            time.sleep(0.5)  # idle: the clock the board gives an unloaded GPU
        t = time.perf_counter()
        gr.replay()
        torch.cuda.synchronize()
        walls.append(time.perf_counter() - t)
        if i >= 2:
            rates += ghz(buf)
    us = statistics.median(walls) * 1e6 / R if load is not None else float("nan")
    return us, statistics.median(rates), min(rates), max(rates)


def run(lib_dir: Path, out: str):
    from kernels import Mat
    from ws_trace import X_KINDS

    from w12.kernels import gemm_cuda as gc
    lib = ctypes.CDLL(str(lib_dir / "clock_probe.so"))
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    rows = [("idle 0.5 s, then the spin alone", *probe(lib, None, sms))]
    big = torch.randn(8192, 8192, device="cuda").to(torch.bfloat16)
    rows.append(("cuBLAS 8192³ bf16 (compute-bound)", *probe(lib, lambda: big @ big, sms)))
    del big
    for n, k in [(151936, 5120), (28672, 4096)]:
        mt = Mat(n, k, 7)
        for m in (1, 32, 128):
            for kind in ("randn", "zeros"):
                x = X_KINDS[kind](m, k)
                loads = [("cuBLAS", lambda: torch.matmul(x, mt.w.t())), ("W12", lambda: mt.op(x)),
                         ("view", lambda: mt.op(x, view=True))]
                for name, load in loads:
                    rows.append((f"{n}×{k} M={m} X {kind}: {name}", *probe(lib, load, sms)))
                    print(rows[-1], flush=True)
        del mt
        torch.cuda.empty_cache()
    text = "\n".join([
        "# The SM clock right after a load (bench/clock_probe.py)", "",
        f"- GPU: {torch.cuda.get_device_name()}; torch {torch.__version__}; commit {commit()}; "
        f"gemm_cuda library {gc.library() is not None}",
        "- command: `python bench/clock_probe.py --build DIR` here, then `W12_CUDA=1 python bench/clock_probe.py --libs DIR`",
        f"- each load called {R}× in one CUDA graph, then a spin kernel (one warp per SM, {ITERS} dependent FMAs): "
        f"clock64 cycles / globaltimer ns, median (min–max) over the SMs and {REPLAYS - 2} replays; µs per call = "
        "replay wall time / R (no L2 flush, so below do_bench's)", "",
        "| load | µs per call | GHz after it | min | max |", "|---|---|---|---|---|",
        *(f"| {name} | {us:.1f} | {g:.3f} | {lo:.3f} | {hi:.3f} |" for name, us, g, lo, hi in rows)]) + "\n"
    Path(out, "clock_probe.md").write_text(text)
    print(text)


def main():
    from ab_kernel import build_or_run
    build_or_run(__doc__, lambda d: print(build(d)), run)


if __name__ == "__main__":
    main()
