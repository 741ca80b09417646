"""How fast does a ring of bulk copies stream weights from DRAM?  The ws kernel's ring without its work. One GPU call.

    python bench/tma_stream.py --build DIR                       # here (nvcc): one small library
    W12_CUDA=1 python bench/tma_stream.py --libs DIR [--out OUT]  # on the GPU

The ws kernel streams each CTA's record row through a ring of bulk copies (cp.async.bulk + mbarriers): per slot one
12 KB record from DRAM and an X tile from L2 (4 KB at M = 32, 16 KB at M = 128).  With its decode and MMAs removed it
still took 58.9 of 64.4 µs on 28672×4096 at M = 32 (~3.0 TB/s, 2026-12-03-ws-diag-h200-s20.md), where kernels that
load the weights with per-thread loads reach ~3.7 TB/s after a clean flush.  This kernel is that ring alone: one
producer lane issues the copies, eight consumer warps wait for each slot, read one word of it and release it.  It
sweeps the CTA count, the CTAs per SM (forced by the shared-memory size), the ring depth and the X tile, beside a
per-thread-load stream of the same bytes (256 threads, 16-byte loads, 4 in flight per thread), and reports TB/s of
weight bytes (do_bench: CUDA events, L2 flushed by a 256 MB write before each run, median).
If TB/s grows with depth at a fixed CTA count, a CTA's copies are latency-bound; if it grows with CTAs per SM at a
fixed depth per CTA but not with depth, the bound is per CTA; if neither moves it, the copy path itself is the limit.
"""

import argparse
import ctypes
import datetime
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from revision import commit  # noqa: E402  (bench/revision.py)

SRC = r"""
#include <cuda_runtime.h>
#include <stdint.h>

__device__ __forceinline__ uint32_t sa(const void* p) { return (uint32_t)__cvta_generic_to_shared(p); }
__device__ __forceinline__ void bar_wait(uint64_t* b, uint32_t parity) {
  asm volatile("{\n.reg .pred P;\nW_%=:\nmbarrier.try_wait.parity.shared::cta.b64 P, [%0], %1;\n@!P bra W_%=;\n}"
               ::"r"(sa(b)), "r"(parity) : "memory");
}

// Grid: one contiguous region of `per_cta` bytes per CTA, `chunk` bytes per slot (+ an X tile of `xb` bytes from a
// small buffer every CTA reads, slot i's tile i % 64), `stages` slots.  Warp 8 lane 0 copies; warps 0-7 consume.
__global__ void __launch_bounds__(288, 1) bulk_stream(const uint8_t* src, long per_cta, int chunk, int stages,
                                                      const uint8_t* xsrc, int xb, unsigned* sink) {
  extern __shared__ __align__(128) uint8_t smem[];
  uint64_t* full = reinterpret_cast<uint64_t*>(smem);
  uint64_t* empty = full + stages;
  uint8_t* ring = smem + 1024;
  const int slot = chunk + xb, n = (int)(per_cta / chunk), warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  if (threadIdx.x == 0) {
    for (int s = 0; s < stages; ++s) {
      asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(sa(full + s)));
      asm volatile("mbarrier.init.shared::cta.b64 [%0], 8;" ::"r"(sa(empty + s)));
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  const uint8_t* base = src + (long)blockIdx.x * per_cta;
  if (warp == 8) {
    for (int i = 0; i < n; ++i) {
      const int s = i % stages;
      if (i >= stages) bar_wait(empty + s, ((i / stages) - 1) & 1);
      if (lane == 0) {
        uint8_t* dst = ring + s * slot;
        asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(sa(full + s)), "r"(chunk + xb) : "memory");
        if (xb)
          asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                       ::"r"(sa(dst)), "l"(xsrc + (long)(i % 64) * xb), "r"(xb), "r"(sa(full + s)) : "memory");
        asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                     ::"r"(sa(dst + xb)), "l"(base + (long)i * chunk), "r"(chunk), "r"(sa(full + s)) : "memory");
      }
      __syncwarp();
    }
    return;
  }
  unsigned acc = 0;
  for (int i = 0; i < n; ++i) {
    const int s = i % stages;
    bar_wait(full + s, (i / stages) & 1);
    acc ^= *reinterpret_cast<volatile const unsigned*>(ring + s * slot + xb + 4 * (warp * 32 + lane));
    __syncwarp();
    if (lane == 0) asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(sa(empty + s)) : "memory");
  }
  if (acc == 0x12345678u) sink[0] = acc;
}

// The same bytes by per-thread loads: 256 threads, 16-byte read-only loads that skip L1, 4 in flight per thread.
__global__ void __launch_bounds__(256) ldg_stream(const uint8_t* src, long per_cta, unsigned* sink) {
  const uint4* p = reinterpret_cast<const uint4*>(src + (long)blockIdx.x * per_cta);
  const long n = per_cta / 16;
  unsigned acc = 0;
  for (long i = threadIdx.x; i < n; i += 4 * 256) {
    uint4 v[4];
#pragma unroll
    for (int u = 0; u < 4; ++u)
      if (i + u * 256 < n)
        asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                     : "=r"(v[u].x), "=r"(v[u].y), "=r"(v[u].z), "=r"(v[u].w) : "l"(p + i + u * 256));
      else
        v[u] = make_uint4(0, 0, 0, 0);
#pragma unroll
    for (int u = 0; u < 4; ++u) acc ^= v[u].x ^ v[u].w;
  }
  if (acc == 0x12345678u) sink[0] = acc;
}

extern "C" int launch_bulk(const void* src, long per_cta, int chunk, int stages, const void* xsrc, int xb, int ctas,
                           int smem, void* sink, cudaStream_t st) {
  cudaError_t e = cudaFuncSetAttribute(bulk_stream, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (e != cudaSuccess) return e;
  bulk_stream<<<ctas, 288, smem, st>>>((const uint8_t*)src, per_cta, chunk, stages, (const uint8_t*)xsrc, xb,
                                       (unsigned*)sink);
  return cudaGetLastError();
}
extern "C" int launch_ldg(const void* src, long per_cta, int ctas, void* sink, cudaStream_t st) {
  ldg_stream<<<ctas, 256, 0, st>>>((const uint8_t*)src, per_cta, (unsigned*)sink);
  return cudaGetLastError();
}
extern "C" int bulk_occupancy(int smem, int* blocks) {
  cudaError_t e = cudaFuncSetAttribute(bulk_stream, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (e != cudaSuccess) return e;
  return cudaOccupancyMaxActiveBlocksPerMultiprocessor(blocks, bulk_stream, 288, smem);
}
"""

KB = 1024
# (weight MB, CTAs, CTAs per SM, chunk, X bytes, stages): the ws kernel at M = 32 on 28672×4096 is 224 CTAs, 2 per
# SM, 12 KB + 4 KB, 5 stages; at M = 128 one CTA per SM, 12 KB + 16 KB, 5 stages
CASES = [(176, c, o, 12 * KB, x, s) for c, o in ((224, 2), (264, 2), (132, 1), (132, 2), (528, 2))
         for x in (4 * KB,) for s in (3, 5)]
CASES += [(176, 224, 2, 12 * KB, 0, s) for s in (3, 5, 7)]
CASES += [(176, 132, 1, 12 * KB, 4 * KB, s) for s in (8, 12)]
CASES += [(176, 224, 1, 12 * KB, 4 * KB, s) for s in (5, 10)]
CASES += [(176, 132, 1, 12 * KB, 16 * KB, s) for s in (3, 5, 7)]
CASES += [(176, 132, 1, 12 * KB, 0, s) for s in (5, 8, 12, 16)]
CASES += [(176, c, 2, 6 * KB, 0, s) for c in (224, 448) for s in (5, 10)]
CASES += [(788, c, o, 12 * KB, x, 5) for c, o, x in ((264, 2, 4 * KB), (132, 1, 16 * KB))]
LDG = [(176, c) for c in (132, 224, 264, 528, 1056, 1792)] + [(788, c) for c in (264, 1056, 8016)]


def build(out: Path) -> Path:
    from w12.kernels import cuda_build
    out.mkdir(parents=True, exist_ok=True)
    src = out / "tma_stream.cu"
    src.write_text(SRC)
    lib = out / "tma_stream.so"
    flags = [f for f in cuda_build.FLAGS if f != "-lineinfo"]
    subprocess.run([cuda_build.nvcc_path(), *flags, "-o", str(lib), str(src)], check=True)
    return lib


def run(lib_path: Path, out: str):
    import torch
    from triton.testing import do_bench
    lib = ctypes.CDLL(str(lib_path))
    vp = ctypes.c_void_p
    big = torch.empty(800 * 2 ** 20, dtype=torch.uint8, device="cuda").random_(0, 255)
    xs = torch.empty(64 * 16 * KB, dtype=torch.uint8, device="cuda").random_(0, 255)
    sink = torch.zeros(4, dtype=torch.int32, device="cuda")
    st = vp(torch.cuda.current_stream().cuda_stream)
    rows = []

    def timed(fn, mb_bytes):
        fn()
        torch.cuda.synchronize()
        ms = do_bench(fn, warmup=10, rep=60)
        return ms * 1e3, mb_bytes / (ms * 1e-3) / 1e12

    for mb, ctas, per_sm, chunk, xb, stages in CASES:
        slot = chunk + xb
        need = 1024 + stages * slot
        smem = max(need, (227 * KB) // per_sm - 1024)  # at most per_sm CTAs fit
        blocks = ctypes.c_int(0)
        if need > 227 * KB or lib.bulk_occupancy(smem, ctypes.byref(blocks)) != 0 or blocks.value != per_sm:
            rows.append(f"| bulk | {mb} | {ctas} | {per_sm} (fits {blocks.value}) | {chunk // KB} | {xb // KB} | "
                        f"{stages} | — | — |")
            continue
        per_cta = (mb * 2 ** 20 // ctas) // chunk * chunk
        nbytes = per_cta * ctas

        def fn():
            err = lib.launch_bulk(vp(big.data_ptr()), ctypes.c_long(per_cta), chunk, stages, vp(xs.data_ptr()), xb,
                                  ctas, smem, vp(sink.data_ptr()), st)
            assert err == 0, err
        us, tbs = timed(fn, nbytes)
        rows.append(f"| bulk | {mb} | {ctas} | {per_sm} | {chunk // KB} | {xb // KB} | {stages} | {us:.1f} | {tbs:.2f} |")
        print(rows[-1], flush=True)
    for mb, ctas in LDG:
        per_cta = (mb * 2 ** 20 // ctas) // 16 * 16
        nbytes = per_cta * ctas

        def fn():
            err = lib.launch_ldg(vp(big.data_ptr()), ctypes.c_long(per_cta), ctas, vp(sink.data_ptr()), st)
            assert err == 0, err
        us, tbs = timed(fn, nbytes)
        rows.append(f"| per-thread loads | {mb} | {ctas} | — | — | — | — | {us:.1f} | {tbs:.2f} |")
        print(rows[-1], flush=True)
    text = "\n".join([
        f"# Bulk-copy ring vs per-thread loads, streaming alone — {datetime.date.today()}", "",
        f"- GPU: {torch.cuda.get_device_name()}; torch {torch.__version__}; commit {commit()}",
        "- command: `python bench/tma_stream.py --build DIR` here, then `W12_CUDA=1 python bench/tma_stream.py --libs DIR`",
        "- TB/s of weight bytes (the X tiles, L2-resident, not counted); do_bench median, L2 flushed before each run", "",
        "| path | MB | CTAs | CTAs/SM | chunk KB | X KB | stages | µs | TB/s |", "|---|---|---|---|---|---|---|---|---|",
        *rows]) + "\n"
    Path(out).mkdir(parents=True, exist_ok=True)
    (Path(out) / "tma_stream.md").write_text(text)
    print(text)


def floor_us(lib, nbytes: int, bench) -> float:
    """The fastest of a few streaming configs over (at least) nbytes, µs, timed as bench/kernels.py times (CUDA graph
    replay): the bulk ring at 264 CTAs (2 per SM, 5 stages of 12 KB) and at 132 (1 per SM, 12 stages), and
    per-thread loads at 1056 CTAs."""
    import torch
    vp = ctypes.c_void_p
    chunk = 12 * KB
    bulk = [(ctas, per_sm, stages, -(-nbytes // (ctas * chunk)) * chunk) for ctas, per_sm, stages in
            ((264, 2, 5), (132, 1, 12))]
    ldg_per_cta = -(-nbytes // (1056 * 16)) * 16
    src = torch.empty(max([c * p for c, _, _, p in bulk] + [1056 * ldg_per_cta]), dtype=torch.uint8, device="cuda")
    sink = torch.zeros(4, dtype=torch.int32, device="cuda")
    times = []
    for ctas, per_sm, stages, per_cta in bulk:
        smem = max(1024 + stages * chunk, (227 * KB) // per_sm - 1024)

        def fn(ctas=ctas, stages=stages, per_cta=per_cta, smem=smem):
            st = vp(torch.cuda.current_stream().cuda_stream)
            assert lib.launch_bulk(vp(src.data_ptr()), ctypes.c_long(per_cta), chunk, stages, vp(src.data_ptr()), 0,
                                   ctas, smem, vp(sink.data_ptr()), st) == 0
        times.append(bench(fn))

    def ldg():
        st = vp(torch.cuda.current_stream().cuda_stream)
        assert lib.launch_ldg(vp(src.data_ptr()), ctypes.c_long(ldg_per_cta), 1056, vp(sink.data_ptr()), st) == 0
    times.append(bench(ldg))
    del src
    torch.cuda.empty_cache()
    return min(times)


def shapes(lib_path: Path, out: str):
    """Per shape of bench/kernels.py: cuBLAS, W12 (as the op dispatches it) and the streaming floor of W12's bytes,
    all timed alike (CUDA graph replay, do_bench, L2 flushed): the ratio W12 could reach at that floor."""
    import math

    import torch
    from kernels import SHAPES, Mat, bench
    lib = ctypes.CDLL(str(lib_path))
    rows, ratio, ceil = [], {1: [], 32: []}, {1: [], 32: []}
    for si, (n, k) in enumerate(SHAPES):
        mt = Mat(n, k, 300 + si)
        wbytes = mt.bytes(0, "w12")
        f_w12, f_bf16 = floor_us(lib, wbytes, bench), floor_us(lib, 2 * n * k, bench)
        cells = []
        for m in (1, 32):
            x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
            t_cb = bench(lambda: torch.matmul(x, mt.w.t()))
            t_w = bench(lambda: mt.op(x))
            ratio[m].append(t_cb / t_w)
            ceil[m].append(t_cb / f_w12)
            cells += [f"{t_cb:.1f}", f"{t_w:.1f}", f"{t_cb / t_w:.3f}", f"{t_cb / f_w12:.3f}"]
        rows.append(f"| {n}×{k} | {wbytes / 1e6:.1f} | {f_w12:.1f} | {f_bf16:.1f} | " + " | ".join(cells) + " |")
        print(rows[-1], flush=True)
        del mt
        torch.cuda.empty_cache()
    geo = lambda v: math.exp(sum(map(math.log, v)) / len(v))  # noqa: E731
    text = "\n".join([
        f"# Streaming floors of the kernel shapes — {datetime.date.today()}", "",
        f"- GPU: {torch.cuda.get_device_name()}; torch {torch.__version__}; commit {commit()}",
        "- command: `python bench/tma_stream.py --build DIR` here, then "
        "`W12_CUDA=1 python bench/tma_stream.py --libs DIR --shapes`",
        "- every time: CUDA graph replay, do_bench (L2 flushed by a 256 MB write), median, µs. Floor = the fastest "
        "bulk-copy ring or per-thread-load stream of that many bytes, with no other work; ceiling = cuBLAS / floor "
        "of W12's bytes (the ratio a W12 kernel that only streamed its bytes would reach)", "",
        "| N×K | W12 MB | floor, W12 bytes | floor, BF16 bytes | cuBLAS M=1 | W12 M=1 | ratio | ceiling | "
        "cuBLAS M=32 | W12 M=32 | ratio | ceiling |", "|---" * 12 + "|", *rows, "",
        f"Geomean: M = 1 ratio {geo(ratio[1]):.3f}, ceiling {geo(ceil[1]):.3f}; "
        f"M = 32 ratio {geo(ratio[32]):.3f}, ceiling {geo(ceil[32]):.3f}."]) + "\n"
    Path(out).mkdir(parents=True, exist_ok=True)
    (Path(out) / "tma_stream_shapes.md").write_text(text)
    print(text)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", type=Path, help="write the library here (needs nvcc, no GPU)")
    ap.add_argument("--libs", type=Path, help="time the library of this folder (needs the GPU)")
    ap.add_argument("--shapes", action="store_true",
                    help="with --libs: the streaming floors of bench/kernels.py's shapes beside cuBLAS and W12")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    a = ap.parse_args()
    if a.build:
        print(build(a.build))
    if a.libs and a.shapes:
        shapes(a.libs / "tma_stream.so", a.out)
    elif a.libs:
        run(a.libs / "tma_stream.so", a.out)
    if not (a.build or a.libs):
        ap.error("give --build DIR (here) or --libs DIR (on the GPU)")


if __name__ == "__main__":
    main()
