"""How fast can the ws kernel's tensor-core chain go at all?  Bare wgmma loops, no ring, no escapes. One GPU call.

    python bench/wgmma_bound.py --build DIR              # here (nvcc): one library with every variant
    W12_CUDA=1 python bench/wgmma_bound.py --libs DIR [--out OUT]   # on the GPU

The ws kernel at M = 128 (nt = 16) takes 746 ns per record per SM (151936×5120; 393 ns with constant A fragments and
no decode, against ~280 ns at the tensor cores' dense rate: 2026-12-03-ws-diag2-h200-s21.md), and two warpgroup pairs
instead of one made it slower (2026-12-04-ab-ws-p2-FAILED-h200-s29.md).  This times the loop that remains without
the ring: one CTA per SM, NWG warpgroups of 64 channels, each running `records` records of four wgmma m64n(8·NT)k16
(A in registers — RS — or in shared memory — SS; B = a 128-byte-swizzled X tile in shared memory, shared by the
warpgroups or one per warpgroup), BATCH records per commit group, then wait_group 0 (or 1: PIPE, one group left in
flight), optionally decoding A from shared memory every record (DEC: the ws kernel's ws_decode).  Reported per
variant: clocks per wgmma per SM (the dense rate: 4·NT clocks for m64n(8·NT)k16 at 2048 MAC/clock/SM) and ns per
128-channel record per SM (the ws kernel's unit).  Prints and writes OUT/wgmma_bound.md.
"""

import argparse
import ctypes
import datetime
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from revision import commit  # noqa: E402  (bench/revision.py)

# (name, NT, NWG, BATCH, SS, OWNB, PIPE, DEC); DEC 2: decode with two fragment sets alternating (the next record's
# decode while the current one's wgmma runs: BATCH 2 sets, one record per commit, wait_group 1); DEC 3: decode only
VARIANTS = [
    ("ws as is: 2 WG, RS, 1 record per commit", 16, 2, 1, 0, 0, 0, 0),
    ("2 WG, RS, 2 records per commit", 16, 2, 2, 0, 0, 0, 0),
    ("2 WG, RS, 4 records per commit", 16, 2, 4, 0, 0, 0, 0),
    ("2 WG, RS, wait_group 1", 16, 2, 1, 0, 0, 1, 0),
    ("2 WG, RS, own B tile each", 16, 2, 1, 0, 1, 0, 0),
    ("1 WG, RS", 16, 1, 1, 0, 0, 0, 0),
    ("1 WG, RS, wait_group 1", 16, 1, 1, 0, 0, 1, 0),
    ("3 WG, RS", 16, 3, 1, 0, 0, 0, 0),
    ("4 WG, RS", 16, 4, 1, 0, 0, 0, 0),
    ("2 WG, SS", 16, 2, 1, 1, 0, 0, 0),
    ("2 WG, SS, wait_group 1", 16, 2, 1, 1, 0, 1, 0),
    ("1 WG, SS, wait_group 1", 16, 1, 1, 1, 0, 1, 0),
    ("2 WG, RS, decode each record", 16, 2, 1, 0, 0, 0, 1),
    ("2 WG, RS, decode, 2 records per commit", 16, 2, 2, 0, 0, 0, 1),
    ("2 WG, RS, decode, 4 records per commit", 16, 2, 4, 0, 0, 0, 1),
    ("2 WG, RS, decode under the previous wgmma (2 sets, wait_group 1)", 16, 2, 2, 0, 0, 1, 2),
    ("3 WG, RS, decode each record", 16, 3, 1, 0, 0, 0, 1),
    ("4 WG, RS, decode each record", 16, 4, 1, 0, 0, 0, 1),
    ("4 WG, RS, decode, 2 records per commit", 16, 4, 2, 0, 0, 0, 1),
    ("2 WG, decode only (no wgmma)", 16, 2, 1, 0, 0, 0, 3),
    ("nt 8: 2 WG, RS", 8, 2, 1, 0, 0, 0, 0),
    ("nt 8: 2 WG, RS, wait_group 1", 8, 2, 1, 0, 0, 1, 0),
    ("nt 8: 2 WG, SS, wait_group 1", 8, 2, 1, 1, 0, 1, 0),
]


def wgmma_ss_src(nt: int) -> str:
    """wgmma m64n(8nt)k16 with A and B from shared memory (descriptors), accumulating into d[nt][4]."""
    n = 4 * nt
    regs = ", ".join(f"%{i}" for i in range(n))
    outs = ", ".join(f'"+f"(d[{i // 4}][{i % 4}])' for i in range(n))
    return f"""
__device__ __forceinline__ void wgmma_ss{nt}(float (&d)[{nt}][4], uint64_t da, uint64_t db) {{
  asm volatile("{{\\n.reg .pred p;\\nsetp.ne.b32 p, %{n + 2}, 0;\\n"
               "wgmma.mma_async.sync.aligned.m64n{8 * nt}k16.f32.bf16.bf16 {{{regs}}}, %{n}, %{n + 1}, p, 1, 1, 0, 0;\\n}}"
               : {outs} : "l"(da), "l"(db), "r"(1));
}}
"""


KERNEL = r"""
namespace {
template <int NT, int NWG, int BATCH, bool SS, bool OWNB, bool PIPE, int DEC>
__global__ void __launch_bounds__(128 * NWG, 1) wg_bound(int records, float* out, unsigned long long* clk) {
  extern __shared__ __align__(16) uint8_t smem_raw[];
  uint8_t* sm = smem_raw + ((1024 - (__cvta_generic_to_shared(smem_raw) & 1023)) & 1023);
  constexpr int BT = 8 * NT * 128, NB = OWNB ? NWG : 1;  // B tile bytes (MT rows of 128 B); B tiles
  const int tid = threadIdx.x, wg = tid >> 7, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
  for (int i = tid; i < (NB * BT + NWG * 8192 + 12288) / 4; i += blockDim.x)
    reinterpret_cast<uint32_t*>(sm)[i] = 0x3C003C00u ^ (i & 0x00070007u);  // small bf16 values
  __syncthreads();
  const uint32_t bb = saddr(sm + (OWNB ? wg : 0) * BT), ab = saddr(sm + NB * BT + wg * 8192);
  const uint8_t* rec = sm + NB * BT + NWG * 8192;  // a 12 KB record to decode from (DEC)
  const int v0 = ((warp & 3) * 16 + g) * 64 + 16 * t, v1 = v0 + 8 * 64;
  const int n0 = 8192 + ((warp & 3) * 16 + g) * 32 + 16 * (t & 1), n1 = n0 + 8 * 32;
  float acc[NT][4];
#pragma unroll
  for (int j = 0; j < NT; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;
  uint32_t fa[BATCH][4][4];
#pragma unroll
  for (int b = 0; b < BATCH; ++b)
#pragma unroll
    for (int k = 0; k < 4; ++k)
#pragma unroll
      for (int q = 0; q < 4; ++q) fa[b][k][q] = 0x3C003C00u ^ (uint32_t)((lane + b + k + q) & 7);
  __syncthreads();
  const unsigned long long c0 = clock64(), t0 = globaltimer();
  uint32_t sink = 0;
  for (int i = 0; DEC == 3 && i < records; ++i) {  // decode only: fold the fragments into sink
    ws_decode<false>(rec + 64 * (i & 3), v0, v1, n0, n1, nib_keep(t), fa[0]);
#pragma unroll
    for (int k = 0; k < 4; ++k) sink ^= fa[0][k][0] ^ fa[0][k][1] ^ fa[0][k][2] ^ fa[0][k][3];
  }
  for (int i = 0; DEC == 2 && i < records; i += 2) {  // fragment sets alternate: set b decoded while set 1 − b runs
#pragma unroll
    for (int b = 0; b < 2; ++b) {
      ws_decode<false>(rec + 64 * ((i + b) & 3), v0, v1, n0, n1, nib_keep(t), fa[b]);
      fence_acc(acc);
      wg_fence();
#pragma unroll
      for (int k = 0; k < 4; ++k)
        wgmma_k16<NT>(acc, fa[b][k][0], fa[b][k][1], fa[b][k][2], fa[b][k][3], wg_desc(bb + 32 * k));
      wg_commit();
      asm volatile("wgmma.wait_group.sync.aligned 1;" ::: "memory");
    }
  }
  for (int i = 0; DEC < 2 && i < records; i += BATCH) {
    if (DEC) {
#pragma unroll
      for (int b = 0; b < BATCH; ++b) ws_decode<false>(rec + 64 * ((i + b) & 3), v0, v1, n0, n1, nib_keep(t), fa[b]);
    }
    fence_acc(acc);
    wg_fence();
#pragma unroll
    for (int b = 0; b < BATCH; ++b)
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        if constexpr (SS)
          wgmma_ssNT(acc, wg_desc(ab + 32 * k), wg_desc(bb + 32 * k));
        else
          wgmma_k16<NT>(acc, fa[b][k][0], fa[b][k][1], fa[b][k][2], fa[b][k][3], wg_desc(bb + 32 * k));
      }
    wg_commit();
    if (PIPE)
      asm volatile("wgmma.wait_group.sync.aligned 1;" ::: "memory");
    else
      wg_wait0();
  }
  wg_wait0();
  fence_acc(acc);
  const unsigned long long c1 = clock64(), t1 = globaltimer();
  float s = 0.f;
#pragma unroll
  for (int j = 0; j < NT; ++j) s += acc[j][0] + acc[j][1] + acc[j][2] + acc[j][3];
  out[blockIdx.x * blockDim.x + tid] = s + (float)(sink & 1);
  if (tid == 0) {
    clk[2 * blockIdx.x] = c1 - c0;
    clk[2 * blockIdx.x + 1] = t1 - t0;
  }
}
}  // namespace

// The ws kernel's ring without escapes or epilogue, one record row per CTA: a producer warp bulk-copies each record
// and, with XRING, its X tile into slot i % STAGES; two consumer warpgroups decode and run wgmma two records per
// commit as the ws kernel does at nt = 16, then release the slots.  !XRING: one X tile fixed in shared memory (the
// ring carries the records only).  (4 warpgroups on two record rows — 544 threads, 120 registers — made ptxas
// serialize the wgmma: not built.)
template <bool XRING, int STAGES>
__global__ void __launch_bounds__(288, 1) ring_bound(const uint8_t* rec, const uint8_t* xq, int KB, float* out) {
  constexpr int NT = 16, XB = 128 * 128, SLOT = (XRING ? XB : 0) + REC;
  extern __shared__ __align__(16) uint8_t smem_raw[];
  uint8_t* ring = smem_raw + ((1024 - (__cvta_generic_to_shared(smem_raw) & 1023)) & 1023);
  uint8_t* xfix = ring + STAGES * SLOT;
  uint64_t* full = reinterpret_cast<uint64_t*>(xfix + (XRING ? 0 : XB));
  uint64_t* empty = full + STAGES;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
  if (tid == 0) {
    for (int s = 0; s < STAGES; ++s) {
      mbar_init(full + s, 1);
      mbar_init(empty + s, 8);
    }
    mbar_init_fence();
  }
  if (!XRING)
    for (int i = tid; i < XB / 4; i += blockDim.x) reinterpret_cast<uint32_t*>(xfix)[i] = 0x3C003C00u ^ (i & 7);
  __syncthreads();
  float acc[NT][4];
#pragma unroll
  for (int j = 0; j < NT; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;
  if (warp == 8) {  // producer
    uint64_t first;
    asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(first));
    for (int i = 0; i < KB; ++i) {
      const int s = i % STAGES;
      if (i >= STAGES) mbar_wait(empty + s, ((i / STAGES) - 1) & 1);
      if (lane == 0) {
        uint8_t* slot = ring + s * SLOT;
        mbar_expect(full + s, SLOT);
        if (XRING) bulk_g2s(slot, xq + (size_t)i * XB, XB, full + s);
        bulk_g2s(slot + (XRING ? XB : 0), rec + ((size_t)blockIdx.x * KB + i) * REC, REC, full + s, first);
      }
      __syncwarp();
    }
  } else {  // consumers: warp w decodes channels 16w .. 16w + 15
    const int off = XRING ? XB : 0;
    const int v0 = off + (16 * warp + g) * 64 + 16 * t, v1 = v0 + 8 * 64;
    const int n0 = off + VIEW_BYTES + (16 * warp + g) * 32 + 16 * (t & 1), n1 = n0 + 8 * 32;
    const uint32_t nkeep = nib_keep(t);
    for (int i = 0; i + 1 < KB; i += 2) {
      const int s0 = i % STAGES, s1 = (i + 1) % STAGES;
      const uint8_t *slot0 = ring + s0 * SLOT, *slot1 = ring + s1 * SLOT;
      uint32_t fa[4][4], fb[4][4];
      mbar_wait(full + s0, (i / STAGES) & 1);
      ws_decode<false>(slot0, v0, v1, n0, n1, nkeep, fa);
      mbar_wait(full + s1, ((i + 1) / STAGES) & 1);
      ws_decode<false>(slot1, v0, v1, n0, n1, nkeep, fb);
      fence_acc(acc);
      wg_fence();
      ws_mma<NT>(acc, fa, saddr(XRING ? slot0 : xfix));
      ws_mma<NT>(acc, fb, saddr(XRING ? slot1 : xfix));
      wg_commit();
      wg_wait0();
      __syncwarp();
      if (lane == 0) {
        mbar_arrive(empty + s0);
        mbar_arrive(empty + s1);
      }
    }
    fence_acc(acc);
  }
  float sum = 0.f;
#pragma unroll
  for (int j = 0; j < NT; ++j) sum += acc[j][0] + acc[j][1] + acc[j][2] + acc[j][3];
  out[blockIdx.x * blockDim.x + tid] = sum;
}

// ring variant v (0: records and X tiles; 1: records only; 2: records only, 8 stages; 3, 4: records and X tiles, 6 and
// 7 stages — the ws kernel's shared memory without its 64 KB of escape corrections) over NB record rows of KB records.
extern "C" int ring_bound_run(int v, const void* rec, const void* xq, int NB, int KB, void* out, void* stream) {
  cudaStream_t st = (cudaStream_t)stream;
#define RGB(I, XR, ST)                                                                                            \
  if (v == I) {                                                                                                   \
    auto k = ring_bound<XR, ST>;                                                                                  \
    const int smem = 1024 + ST * ((XR ? 16384 : 0) + REC) + (XR ? 0 : 16384) + 2 * ST * 8;                        \
    cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);                                   \
    k<<<NB, 288, smem, st>>>((const uint8_t*)rec, (const uint8_t*)xq, KB, (float*)out);                           \
    return (int)cudaGetLastError();                                                                               \
  }
  RGB(0, true, 5) RGB(1, false, 5) RGB(2, false, 8) RGB(3, true, 6) RGB(4, true, 7)
#undef RGB
  return (int)cudaErrorInvalidValue;
}

extern "C" int wg_bound_run(int v, int ctas, int records, void* out, void* clk, void* stream) {
  cudaStream_t st = (cudaStream_t)stream;
#define WGB(I, NT, NWG, B, SS, OWNB, PIPE, DEC)                                                                \
  if (v == I) {                                                                                                \
    auto k = wg_bound<NT, NWG, B, SS, OWNB, PIPE, DEC>;                                                        \
    const int smem = 1024 + (OWNB ? NWG : 1) * 8 * NT * 128 + NWG * 8192 + 12288;                              \
    cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);                                \
    k<<<ctas, 128 * NWG, smem, st>>>(records, (float*)out, (unsigned long long*)clk);                          \
    return (int)cudaGetLastError();                                                                            \
  }
VARIANT_CASES
#undef WGB
  return (int)cudaErrorInvalidValue;
}
"""


def source() -> str:
    cases = "\n".join(f"  WGB({i}, {nt}, {nwg}, {b}, {bool(ss)!s:s}, {bool(own)!s:s}, {bool(p)!s:s}, {d})"
                      .replace("True", "true").replace("False", "false")
                      for i, (_, nt, nwg, b, ss, own, p, d) in enumerate(VARIANTS))
    kern = KERNEL.replace("VARIANT_CASES", cases)
    kern = kern.replace("wgmma_ssNT(acc,", "wgmma_ss<NT>(acc,")
    ss = ("namespace {\ntemplate <int NT> __device__ void wgmma_ss(float (&d)[NT][4], uint64_t da, uint64_t db);\n"
          + "".join(wgmma_ss_src(nt).replace(f"void wgmma_ss{nt}(", f"void wgmma_ss<{nt}>(")
                    .replace("__device__ __forceinline__ void", "template <> __device__ __forceinline__ void")
                    for nt in (8, 16)) + "}  // namespace\n")
    return (ROOT / "kernels/w12_gemv.cu").read_text() + ss + kern


def run(lib_path: str, out: str):
    import torch
    lib = ctypes.CDLL(lib_path)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    records = 4096
    rows = []
    for i, (name, nt, nwg, batch, ss, own, pipe, dec) in enumerate(VARIANTS):
        o = torch.empty(sms * 128 * nwg, device="cuda")
        clk = torch.zeros(2 * sms, dtype=torch.int64, device="cuda")
        best = None
        for _ in range(5):  # the best of 5 (the first warms up)
            err = lib.wg_bound_run(i, sms, records, ctypes.c_void_p(o.data_ptr()), ctypes.c_void_p(clk.data_ptr()),
                                   ctypes.c_void_p(torch.cuda.current_stream().cuda_stream))
            if err:
                raise RuntimeError(f"variant {i} ({name}): cudaError {err}")
            torch.cuda.synchronize()
            c, ns = clk.view(-1, 2)[:, 0].float().median().item(), clk.view(-1, 2)[:, 1].float().median().item()
            best = (c, ns) if best is None or ns < best[1] else best
        c, ns = best
        per_wgmma = c / (records * nwg * 4)
        per_rec = ns / (records * nwg / 2)  # a 128-channel record = two warpgroups' records
        rows.append(f"| {name} | {nt} | {per_wgmma:.1f} | {4 * nt} | {4 * nt / per_wgmma:.2f} | {per_rec:.0f} |")
        print(rows[-1], flush=True)
    ring_rows = ring(lib, sms)
    text = "\n".join([
        f"# Bare wgmma loops: the tensor-core chain's bound (bench/wgmma_bound.py) — {datetime.date.today()}", "",
        f"- GPU: {torch.cuda.get_device_name()}; {sms} CTAs (one per SM), {records} records per warpgroup; commit "
        f"{commit()}",
        "- command: `python bench/wgmma_bound.py --build DIR` (here), then `W12_CUDA=1 python bench/wgmma_bound.py "
        "--libs DIR`",
        "- clk/wgmma: clock64 over the loop (median CTA, best of 5 launches) / (records × warpgroups × 4); dense rate: "
        "4·NT clocks per m64n(8·NT)k16 per SM; ns/record: a 128-channel record per SM (the ws kernel's 746 ns at nt 16)",
        "", "| variant | nt | clk / wgmma | dense | fraction of dense | ns / 128-ch record / SM |",
        "|---|---|---|---|---|---|", *rows, "", *ring_rows]) + "\n"
    Path(out, "wgmma_bound.md").write_text(text)
    print(text)


RINGS = ["2 WG, records and X tiles through the ring (the ws kernel, no escapes or epilogue)",
         "2 WG, records only (one X tile fixed in shared memory)",
         "2 WG, records only, 8 stages",
         "2 WG, records and X tiles, 6 stages", "2 WG, records and X tiles, 7 stages"]


def ring(lib, sms, n=151936, k=5120):
    """The ring variants on a 151936×5120 W12 matrix of random bytes (M = 128: X tiles of 128 rows), beside the ws
    kernel itself on a real encoded matrix of that shape (bench/kernels.Mat; do_bench as bench/kernels.py times)."""
    import torch
    from kernels import Mat, bench

    from w12.kernels import gemm_cuda as gc
    nb, kb = n // 128, k // 64
    rec = torch.randint(0, 256, (nb, kb, 12288), dtype=torch.uint8, device="cuda")
    xq = (torch.randn(kb * 128 * 64, device="cuda") * 0.1).to(torch.bfloat16)
    out = torch.empty(nb * 288, device="cuda")
    rows = ["| ring variant (151936×5120 records, M = 128, nt = 16, 5 stages unless said) | µs | ns / 128-ch record / SM |",
            "|---|---|---|"]
    for v, name in enumerate(RINGS):
        def call():
            err = lib.ring_bound_run(v, ctypes.c_void_p(rec.data_ptr()), ctypes.c_void_p(xq.data_ptr()), nb, kb,
                                     ctypes.c_void_p(out.data_ptr()),
                                     ctypes.c_void_p(torch.cuda.current_stream().cuda_stream))  # the capture's stream
            if err:
                raise RuntimeError(f"ring variant {v}: cudaError {err}")
        us = bench(call)
        rows.append(f"| {name} | {us:.1f} | {us * 1e3 * sms / (nb * kb):.0f} |")
        print(rows[-1], flush=True)
    del rec
    torch.cuda.empty_cache()
    mt = Mat(n, k, 7)
    x = torch.randn(128, k, device="cuda").to(torch.bfloat16)
    cfg = gc.dispatched_config(128, n, k)
    us = bench(lambda: mt.run(x, cuda=cfg))
    us_cb = bench(lambda: torch.matmul(x, mt.w.t()))
    nrec = mt.records.shape[0] * kb
    rows.append(f"| the ws kernel itself ({cfg}; escapes, epilogue, X reorder kernel) | {us:.1f} | "
                f"{us * 1e3 * sms / nrec:.0f} |")
    rows.append(f"| cuBLAS BF16 (torch.matmul) | {us_cb:.1f} | - |")
    print(*rows[-2:], sep="\n", flush=True)
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build")
    ap.add_argument("--libs")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    a = ap.parse_args()
    if a.build:
        from ab_kernel import build_libs
        print(build_libs({"bound": source()}, Path(a.build)))
    elif a.libs:
        run(str(Path(a.libs) / "w12_gemv_bound.so"), a.out)
    else:
        ap.error("--build DIR or --libs DIR")


if __name__ == "__main__":
    main()
