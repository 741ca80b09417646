// W12 GEMMs on Hopper: Y[M, N] = X[M, K] · Wᵀ, W stored as W12 records (SPEC.md), weights decoded in
// registers straight into MMA fragments: the skinny kernel (below; M ≤ 64) and the warp-specialized kernel
// (w12_gemm_ws_kernel, last; 9 ≤ M ≤ 128).  gemm_cuda.kernel_for says which one the host runs.  What was measured
// and not kept (alternatives, removed kernels, the bounds found) is in kernels/w12_gemv_tried.md.
// Built by kernels/cuda_build.py (nvcc, sm_90a);
// called through kernels/gemm_cuda.py.  No torch headers: raw pointers and a cudaStream_t.
//
// Work split
//   tile  = 16 output channels (rows r0..r0+15 of the record row nb) × 8·NT rows of X; CTA (c, mb, z) =
//           tile (c = nb · 8 + r0 / 16, mb) × the records [z·⌈KB/S⌉, (z+1)·⌈KB/S⌉) of split z of S.
//           With S > 1 each CTA writes its partial to ws and takes a ticket; the last of the tile's CTAs
//           adds the partials in the order z = 0, 1, … (the same bits whatever the arrival order), stores
//           the tile and resets the ticket.  S = 2 runs as a cluster pair instead: the partials added
//           through distributed shared memory, the same adds (finish_pair; 5120×8192 M = 1 26.4 → 25.7 µs,
//           M = 16 29.2 → 28.4, 2026-12-04-ab-skinny-cluster-pair-h200-s33.md).  (A stream-K grid — one
//           wave, equal records per CTA — was measured slower at M = 1: every tile then pays the
//           partial/ticket round trip.)
//   warp  = the CTA's records kb = a + warp, a + warp + WARPS, ... (fixed, interleaved); U records per
//           pipeline stage, two stages in flight.  The WARPS partial sums are added in the fixed order
//           0..WARPS−1 in shared memory: no atomics, so every run gives the same bits.
//   start = with programmatic dependent launch (PDL) the CTA may start while the previous kernel in the
//           stream finishes; it reads nothing before griddepcontrol.wait (pdl_wait).
//
// One mma.sync.m16n8k16 (A = 16 channels × 16 k, B = 16 k × 8 X rows) per 16 columns per n-tile.  The
// order of k inside an MMA is free as long as A and B agree, so lane (g = lane/4, t = lane%4) owns the
// 16 contiguous columns 16t..16t+15 of rows g and g+8 of the record: one 16-byte load of view bytes per
// row, one of nibble bytes (columns j and j+32 share a nibble byte: t ≥ 2 takes the high nibbles).  For
// k-step s (0..3) its fragment positions κ = 2t, 2t+1, 2t+8, 2t+9 hold columns 16t+4s+{0,1,2,3}, so the
// matching X fragment is the 32-bit words 2s, 2s+1 of X[m, 16t .. 16t+15] — again one 16-byte load.
//
// Decode (two weights per 32-bit word, SPEC.md §4): view byte b, low nibble lo ->
//   bf16 bits of w · 2^(127 − E_n) = ((b << 8) & 0x8000) | (b << 4) | 0x3800 | lo
//   decode4 below: 4 integer ops per 2 weights (3 for the 8-bit view), no shift of the nibble word.
// 8-bit view: lo = 8 (midpoint of the discarded bits), escapes keep their code value (SPEC.md §4).
// Epilogue: y = (Σ_warps acc) · 2^(E_n − 127)  (exact power of two, fp32 bits E_n << 23), then the
// exact sparse escape correction y += x[m, col] · (w − 2^(E_n − 142)) for the CTA's escapes in list
// order (SPEC.md §7), one rounding to bf16 when the tile is complete.  The escapes come from the per-tile
// lists of gemm_cuda.tile_escapes (load time): entry (row in tile << 24 | column, h), offsets per
// (channel tile, kb), so a CTA's escapes are one contiguous range, fetched while its first records load.
// At M ≤ 2 with ≤ 32 escapes in the CTA (decode), warp 0 alone finishes the tile (warp0_finish): the same adds in
// the same order, without the CTA-wide path's three barriers.  At nt ≥ 2 with ≤ 32 escapes the warps fetch the
// escapes' X before the CTA barrier (esc_x_prefetch) and the first output pass adds them from shared memory: the same
// adds again; that path was the largest cost found at M > 2 (skipping it, wrong results: M = 16 1.159 → 1.243; this
// form M = 32 1.083 → 1.103, M = 16 1.160 → 1.180; 2026-12-04-ab-skinny-escapes-h200-s31.md).  The 4-warp builds
// copy that X in the prologue instead, while the main loop runs (EX: M = 16 1.178 → 1.226,
// 2026-12-04-ab-skinny-early-x-4warps-h200-s33.md).

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>

namespace {

constexpr int REC = 12288;   // bytes per 128 × 64 record
constexpr int VIEW_BYTES = 8192;

// A weight load: read-only path, no L1 allocation, with an L2 cache-hint policy (weight_policy).
__device__ __forceinline__ uint4 ld_stream(const uint8_t* p, uint64_t pol) {
  uint4 r;
  asm volatile("ld.global.nc.L1::no_allocate.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
               : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p), "l"(pol));
  return r;
}

// The skinny kernel's L2 priority for its weight lines: `pct` % of them evict_normal, the rest evict_first
// (pct = 0: all evict_first, which streams as the plain load does).  Measured after do_bench's L2 flush, which
// leaves the L2 full of dirty lines (bench/dirty_l2.py, 2026-12-03-dirty-l2-h200-s19.md): evict_first lines
// keep being recycled around the dirty ones (the LM heads stream ~10 % slower than after a clean flush), while
// evict_normal lines push the dirty ones out once, for a fixed ~8 µs (what cuBLAS pays); so large matrices
// want evict_normal, short ones evict_first (CudaConfig.l2).
__device__ __forceinline__ uint64_t weight_policy(int pct) {
  uint64_t first, normal;
  asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(first));
  asm("createpolicy.fractional.L2::evict_normal.L2::evict_first.b64 %0, %1;" : "=l"(normal) : "f"(0.01f * max(pct, 1)));
  return pct > 0 ? normal : first;
}

// cp.async: global -> shared without holding registers (completed by cp_async_wait_all)
__device__ __forceinline__ void cp_async4(void* smem, const void* gmem) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"((uint32_t)__cvta_generic_to_shared(smem)), "l"(gmem));
}
__device__ __forceinline__ void cp_async8(void* smem, const void* gmem) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8;" ::"r"((uint32_t)__cvta_generic_to_shared(smem)), "l"(gmem));
}
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 16;" ::"r"((uint32_t)__cvta_generic_to_shared(smem)), "l"(gmem));
}
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.commit_group;\ncp.async.wait_all;" ::: "memory"); }

// Programmatic dependent launch (PDL; a no-op unless the launch allowed it, gemm_cuda.PDL): a kernel may
// start while the one before it in the stream is finishing; it reads and writes nothing before pdl_wait.
// pdl_launch_dependents lets the next kernel, if it was launched with PDL, start early in turn.  (An L2
// prefetch of the first records before the wait was measured slower: 2026-12-01-pdl-h200-s7.md.)
__device__ __forceinline__ void pdl_wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }
__device__ __forceinline__ void pdl_launch_dependents() { asm volatile("griddepcontrol.launch_dependents;" ::: "memory"); }

__device__ __forceinline__ uint32_t lop3_and_or(uint32_t a, uint32_t b, uint32_t c) {  // (a & b) | c
  uint32_t d;
  asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
}

// Four weights (view word v = view bytes of columns c..c+3, nibble word n = their nibble bytes, the weight's
// nibble in the low or high half of each byte) -> two bf16x2: w01 = columns c, c+1; w23 = columns c+2, c+3
// (lower address in the low lane).  keep = nib_keep(t) says which nibble: the bits taken from h below.
//   W12:  h = prmt(v, n, ·) = [b1 n1 b0 n0] (a 16-bit half b·2^8 + n per weight);  u = h >> 4 = b·2^4 + n >> 4
//         (bits 12..15 of the low half get n1's low nibble: cleared below);
//         m = (h & keep) | (u & ~keep)   sign = bit 15 of h, b's low 7 bits at 4..10 from u, the nibble at
//         0..3 from h (keep 0x800F800F: low nibbles) or from u (keep 0x80008000: high nibbles);
//         w = (m & 0x87FF87FF) | 0x38003800                                             (4 ops / 2 weights)
//   view: t = prmt(v, 0, ·) = [sgn b1, b1, sgn b0, b0] (sgn: b's bit 7 in all 8 bits, prmt's sign mode);
//         w = ((t << 4) & 0x87F087F0) | 0x38083808  (the nibble at its midpoint 8)       (3 ops / 2 weights)
__device__ __forceinline__ uint32_t nib_keep(int t) { return t >= 2 ? 0x80008000u : 0x800F800Fu; }

__device__ __forceinline__ uint32_t prmt(uint32_t a, uint32_t b, uint32_t sel) {
  uint32_t d;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(sel));
  return d;
}

__device__ __forceinline__ uint32_t lop3_select(uint32_t a, uint32_t k, uint32_t c) {  // (a & k) | (c & ~k)
  uint32_t d;
  asm("lop3.b32 %0, %1, %2, %3, 0xE2;" : "=r"(d) : "r"(a), "r"(k), "r"(c));
  return d;
}

template <bool VIEW>
__device__ __forceinline__ void decode4(uint32_t v, uint32_t n, uint32_t keep, uint32_t& w01, uint32_t& w23) {
  if (VIEW) {
    w01 = lop3_and_or(prmt(v, 0u, 0x9180u) << 4, 0x87F087F0u, 0x38083808u);
    w23 = lop3_and_or(prmt(v, 0u, 0xB3A2u) << 4, 0x87F087F0u, 0x38083808u);
  } else {
    const uint32_t h01 = prmt(v, n, 0x1504u), h23 = prmt(v, n, 0x3726u);
    w01 = lop3_and_or(lop3_select(h01, keep, h01 >> 4), 0x87FF87FFu, 0x38003800u);
    w23 = lop3_and_or(lop3_select(h23, keep, h23 >> 4), 0x87FF87FFu, 0x38003800u);
  }
}

// An escape's correction factor (SPEC.md §7): d = w − w_code, w the escape's bf16 (the low half of entry word h),
// w_code = 2^(E_n − 142) the value decode4 gives its code, in real units (fp32 bits (E_n − 15) << 23).
__device__ __forceinline__ float esc_delta(uint32_t h, int E) {
  return __bfloat162float(__ushort_as_bfloat16((unsigned short)(h & 0xFFFFu))) - __int_as_float((E - 15) << 23);
}

__device__ __forceinline__ void mma16816(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                         uint32_t b0, uint32_t b1) {
  asm(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t word(const uint4& q, int i) {
  return i == 0 ? q.x : i == 1 ? q.y : i == 2 ? q.z : q.w;
}

// One record of a warp's 16 channels: view words va (row g), vb (row g+8) and nibble words na, nb of
// columns 16t..16t+15, X words ya/yb (X row 8j + g, columns 16t..16t+7 / +8..+15) -> 4·NT MMAs.
template <int NT, bool VIEW>
__device__ __forceinline__ void record_mma(float (&acc)[NT][4], const uint4& va, const uint4& vb, const uint4& na,
                                           const uint4& nb, const uint4 (&ya)[NT], const uint4 (&yb)[NT], uint32_t nkeep) {
#pragma unroll
  for (int s = 0; s < 4; ++s) {
    uint32_t a0, a1, a2, a3;
    uint32_t nwa = VIEW ? 0u : word(na, s), nwb = VIEW ? 0u : word(nb, s);
    decode4<VIEW>(word(va, s), nwa, nkeep, a0, a2);
    decode4<VIEW>(word(vb, s), nwb, nkeep, a1, a3);
#pragma unroll
    for (int j = 0; j < NT; ++j) {
      const uint4& q = s < 2 ? ya[j] : yb[j];
      mma16816(acc[j], a0, a1, a2, a3, word(q, 2 * (s & 1)), word(q, 2 * (s & 1) + 1));
    }
  }
}

// X words of columns 16t..16t+15 (a: +0..7, b: +8..15) of one X row.  The skinny kernel's lanes of rows ≥ M load
// row 0 instead (their pointers are clamped): the MMA's output columns are independent, so those rows' outputs take
// whatever they take and are never stored, and a predicate and zero fill per load cost registers and ~10
// instructions per record in the loop.
__device__ __forceinline__ void load_x16(uint4& a, uint4& b, const __nv_bfloat16* xk) {
  const uint4* p = reinterpret_cast<const uint4*>(xk);
  a = __ldg(p);
  b = __ldg(p + 1);
}

// Where a warp's loads point, for its record kb: pv / pn at its lane's view / nibble words (rows g and g + 8 at +0
// and +512 / +256 bytes), px(j, 0) at X row m0 + 8j + g, column 64·kb + 16t.  Record kb + d lies d·REC bytes and
// 64·d columns further on: with d a constant (the groups' offsets in the unrolled loop) the loads take it as an
// immediate, and the loop advances the pointers once per iteration.  Computing every address from kb instead, as
// before session 50, cost the nt = 1 W12 loop ~155 SASS instructions per record against ~89 now (the view's 112
// against 67, nt = 4 W12's ~225 against ~110): ptxas rebuilt each lane's offsets from the thread index for every
// record.  At NT = 8 the X pointers stay fixed and one column offset advances instead: eight moving pointers took the
// view's nt = 8 build from 156 to 178 registers (3 → 2 CTAs per SM).  The 8-warp XREG build (capped at 128 registers,
// dispatched nowhere) spills 128 bytes in this form.
template <int NT>
struct LoadPtrs {
  static constexpr bool XMOVE = NT <= 4;
  const uint8_t* pv;
  const uint8_t* pn;
  const __nv_bfloat16* xr[NT];  // XMOVE: at record kb; else at column 16t, with ox = 64·kb
  uint32_t ox;

  __device__ __forceinline__ const __nv_bfloat16* px(int j, int d) const {
    return XMOVE ? xr[j] + d * 64 : xr[j] + (ox + (uint32_t)d * 64);
  }
  __device__ __forceinline__ void advance(int d) {
    pv += (size_t)d * REC;
    pn += (size_t)d * REC;
    if constexpr (XMOVE) {
#pragma unroll
      for (int j = 0; j < NT; ++j) xr[j] += d * 64;
    } else {
      ox += (uint32_t)d * 64;
    }
  }
};

// U records of one warp's 16 channels: view (and nibble) words of rows g and g+8 for columns
// 16t..16t+15, plus the matching X words when they fit in registers (XPF; else compute() loads them, its latency
// exposed).  The kernel sets XPF for NT ≤ 2, and for NT = 4 in its XREG form (U = 1): with 4 warps 21 more registers
// (W12 123 → 144, 4 → 3 CTAs per SM), which wins where the grid still fits one wave — 6144×4096 M = 24 / 32 26.1 →
// 23.8 / 28.3 → 26.3 µs — and loses where it then takes two (4096² M = 48 27.1 → 37.0); capped at 128 registers
// to keep 4 CTAs per SM it was 2–3 % slower wherever it is dispatched (same bits), so only the 8-warp form is capped
// (128, 2 CTAs per SM as the plain form).  A config choice: CudaConfig.xreg (2026-12-03-ab-x-nt4-h200-s22.md,
// 2026-12-03-skinny-configs*-h200-s22.md, 2026-12-03-ab-xreg-cap-h200-s22.md).
template <int NT, bool VIEW, int U, bool XPF>
struct Group {
  uint4 va[U], vb[U], na[U], nb[U];
  uint4 xa[XPF ? U : 1][NT], xb[XPF ? U : 1][NT];

  // records kb + d + u·warps (those < KB), lp pointing at record kb
  __device__ __forceinline__ void load(const LoadPtrs<NT>& lp, int d, int kb, int KB, int warps,
                                       uint64_t pol) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int o = d + u * warps;
      if (kb + o < KB) {
        const uint8_t* rv = lp.pv + (size_t)o * REC;
        const uint8_t* rn = lp.pn + (size_t)o * REC;
        va[u] = ld_stream(rv, pol);
        vb[u] = ld_stream(rv + 8 * 64, pol);
        if (!VIEW) {
          na[u] = ld_stream(rn, pol);
          nb[u] = ld_stream(rn + 8 * 32, pol);
        }
        if (XPF) {
#pragma unroll
          for (int j = 0; j < NT; ++j) load_x16(xa[XPF ? u : 0][j], xb[XPF ? u : 0][j], lp.px(j, o));
        }
      }
    }
  }

  __device__ __forceinline__ void compute(float (&acc)[NT][4], const LoadPtrs<NT>& lp, int d, int kb, int KB,
                                          int warps, uint32_t nkeep) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int o = d + u * warps;
      if (kb + o < KB) {
        uint4 ya[NT], yb[NT];
#pragma unroll
        for (int j = 0; j < NT; ++j) {
          if (XPF) {
            ya[j] = xa[XPF ? u : 0][j];
            yb[j] = xb[XPF ? u : 0][j];
          } else {
            load_x16(ya[j], yb[j], lp.px(j, o));
          }
        }
        record_mma<NT, VIEW>(acc, va[u], vb[u], na[u], nb[u], ya, yb, nkeep);
      }
    }
  }
};

// Split K (S > 1): publish this CTA's partial tile (n floats at red, n % 4 == 0) as split z of the tile's S
// partials in part and take the tile's ticket; true for the last CTA to arrive, which then adds the partials
// (splitk_last / splitk_last4) in the fixed order z = 0, 1, … (the same bits whatever the arrival order) into
// red and resets the ticket; the others return.
__device__ __forceinline__ bool splitk_arrive(const float* red, int n, float* part, int S, int z, int* ticket,
                                              int* s_last) {
  const int tid = threadIdx.x, nth = blockDim.x;
  __syncthreads();  // red complete
  for (int i = tid; i < n / 4; i += nth)
    reinterpret_cast<float4*>(part)[z * (n / 4) + i] = reinterpret_cast<const float4*>(red)[i];
  __threadfence();
  __syncthreads();
  if (tid == 0) *s_last = atomicAdd(ticket, 1) == S - 1;
  __syncthreads();
  if (!*s_last) return false;
  __threadfence();
  return true;
}

// The skinny kernel's: each output's S ≤ 8 partials are loaded before the adds (8 registers: a float4 per
// partial cost the skinny kernel 11 registers and an occupancy step).
__device__ __forceinline__ bool splitk_last(float* red, int n, float* part, int S, int z, int* ticket, int* s_last) {
  if (!splitk_arrive(red, n, part, S, z, ticket, s_last)) return false;
  const int tid = threadIdx.x, nth = blockDim.x;
  for (int i = tid; i < n; i += nth) {
    float v[8];
#pragma unroll
    for (int zz = 0; zz < 8; ++zz) v[zz] = zz < S ? __ldcg(part + zz * n + i) : 0.f;
    float sum = 0.f;
#pragma unroll
    for (int zz = 0; zz < 8; ++zz)
      if (zz < S) sum += v[zz];
    red[i] = sum;
  }
  if (tid == 0) *ticket = 0;
  return true;
}

// s += v, component by component (the split-K reductions' one add per partial)
__device__ __forceinline__ void add4(float4& s, const float4& v) {
  s.x += v.x;
  s.y += v.y;
  s.z += v.z;
  s.w += v.w;
}

// Eight outputs (channels c..c+7 of one X row, a then b) rounded to bf16 and stored with one 16-byte store at yr.
__device__ __forceinline__ void store_bf16x8(__nv_bfloat16* yr, float4 a, float4 b) {
  const __nv_bfloat162 h[4] = {__floats2bfloat162_rn(a.x, a.y), __floats2bfloat162_rn(a.z, a.w),
                               __floats2bfloat162_rn(b.x, b.y), __floats2bfloat162_rn(b.z, b.w)};
  *reinterpret_cast<uint4*>(yr) = *reinterpret_cast<const uint4*>(h);
}

// The ws kernel's (finish_tile): the same adds in the same order per output (0 + p0 + p1 + …, so the same bits), from
// float4 loads, R float4 outputs per thread per round with all R · S loads in flight: R = 8 / 4 / 2 for S ≤ 2 / 4 / 8,
// 16 float4 (64 registers; the accumulators are dead by then) in every case.  Each round is one L2 round trip: a
// 128 × 128 tile of S = 2 takes 2 rounds (it took 8 at R = 2, the epilogue's 6.4 µs median at 6144×4096 M = 128,
// 2026-12-03-ws-trace-h200-s24.md).  (R = 2 for every S measured: 4096² M = 64 split 4 42.0 → 34.2 µs against one
// output per round, in the tensor-core kernel it was written for, 2026-12-02-tc-configs-h200-s10.md.)
template <int R, int SMAX>
__device__ __forceinline__ void splitk_add(float4* red4, const float4* p4, int n4, int S) {
  const int tid = threadIdx.x, nth = blockDim.x;
  for (int i = tid; i < n4; i += R * nth) {
    float4 v[R][SMAX];
#pragma unroll
    for (int zz = 0; zz < SMAX; ++zz)
#pragma unroll
      for (int h = 0; h < R; ++h)
        v[h][zz] = zz < S && i + h * nth < n4 ? __ldcg(p4 + zz * n4 + i + h * nth) : make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
    for (int h = 0; h < R; ++h) {
      float4 sum = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
      for (int zz = 0; zz < SMAX; ++zz)
        if (zz < S) add4(sum, v[h][zz]);
      if (i + h * nth < n4) red4[i + h * nth] = sum;
    }
  }
}

__device__ __forceinline__ bool splitk_last4(float* red, int n, float* part, int S, int z, int* ticket, int* s_last) {
  if (!splitk_arrive(red, n, part, S, z, ticket, s_last)) return false;
  float4* red4 = reinterpret_cast<float4*>(red);
  const float4* p4 = reinterpret_cast<const float4*>(part);
  if (S <= 2)
    splitk_add<8, 2>(red4, p4, n / 4, S);
  else if (S <= 4)
    splitk_add<4, 4>(red4, p4, n / 4, S);
  else
    splitk_add<2, 8>(red4, p4, n / 4, S);
  if (threadIdx.x == 0) *ticket = 0;
  return true;
}

// TRACE (a diagnostic build of the same kernel, bench/trace_kernel.py): thread 0 of each CTA writes, to
// g_trace[8 · CTA], (%globaltimer ns, clock64) at entry, after the main loop (the barrier after the last warp's last
// record) and at its exit, then its SM; kept in shared memory until the exit, so that no register is held across
// the loop.  TRACE = false adds nothing.
__device__ unsigned long long* g_trace;
__device__ __forceinline__ unsigned long long globaltimer() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
__device__ __forceinline__ unsigned smid() {
  unsigned s;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(s));
  return s;
}

// A warp's MMA accumulators (the m16n8 / wgmma D layout: rows g and g + 8, columns 8j + 2t, +1) into its
// [16][8·NT] fp32 block red of shared memory, then __syncwarp.
template <int NT>
__device__ __forceinline__ void store_acc(float* red, const float (&acc)[NT][4], int g, int t) {
  constexpr int MT = 8 * NT;
#pragma unroll
  for (int j = 0; j < NT; ++j) {
    red[g * MT + 8 * j + 2 * t] = acc[j][0];
    red[g * MT + 8 * j + 2 * t + 1] = acc[j][1];
    red[(g + 8) * MT + 8 * j + 2 * t] = acc[j][2];
    red[(g + 8) * MT + 8 * j + 2 * t + 1] = acc[j][3];
  }
  __syncwarp();
}

// The end of a CTA that owns CH channels (rows n0 .. of y) × mcount X rows of a tile whose sums are cta_red
// [CH][MT]: with S > 1 the split-K reduction (splitk_last4; false for every CTA but the tile's last), then the
// bf16 store, consecutive threads at consecutive n.
// MMAJOR: cta_red is [MT][CH] instead (the ws kernel): the store loop's shared-memory reads, consecutive r across a
// warp, are then consecutive words, where [CH][MT] puts them MT words apart (one bank: 32-way conflicts at MT = 128).
template <int CH, int MT, int THREADS, bool MMAJOR = false>
__device__ __forceinline__ void finish_tile(float* cta_red, float* ws, int* tickets, int tile, int slot, int S, int z,
                                            int* s_last, __nv_bfloat16* y, int ldy, int N, int n0, int m0, int mcount) {
  if (S > 1 && !splitk_last4(cta_red, CH * MT, ws + (size_t)slot * S * CH * MT, S, z, tickets + tile, s_last))
    return;
  __syncthreads();
  if (MMAJOR && n0 + CH <= N && ldy % 8 == 0 && (reinterpret_cast<uintptr_t>(y) & 15) == 0) {
    // eight channels per thread: two 16-byte shared loads, one 16-byte store (the same roundings as below)
    for (int idx = threadIdx.x; idx < CH / 8 * mcount; idx += THREADS) {
      const int r = 8 * (idx % (CH / 8)), m = idx / (CH / 8);
      store_bf16x8(y + (size_t)(m0 + m) * ldy + n0 + r, *reinterpret_cast<const float4*>(cta_red + m * CH + r),
                   *reinterpret_cast<const float4*>(cta_red + m * CH + r + 4));
    }
    return;
  }
  for (int idx = threadIdx.x; idx < CH * mcount; idx += THREADS) {
    const int r = idx % CH, m = idx / CH, n = n0 + r;
    if (n < N) y[(size_t)(m0 + m) * ldy + n] = __float2bfloat16_rn(cta_red[MMAJOR ? m * CH + r : r * MT + m]);
  }
}

__device__ __forceinline__ uint32_t saddr(const void* p) { return (uint32_t)__cvta_generic_to_shared(p); }

// ---- split K inside a cluster (split 2 in both kernels, launched with cluster dims (1, 1, 2)): the two CTAs of a
// tile keep their partial sums in their own shared memory; after a cluster barrier CTA z adds, for its half of the
// tile's outputs, the partials read through distributed shared memory in the order z = 0, 1 (0 + p0 + p1: the bits of
// splitk_last / splitk_last4), stores them, and a second barrier keeps both CTAs' shared memory alive until all reads
// are done.  No partials in global memory, no tickets.  The ws kernel (finish_tile_cluster): 6144×4096 M = 128 (nt 16,
// split 2) 37.5 → 35.1 µs, the view 29.8 → 27.3.  Clusters of 3–6 (the other split entries) were much slower — a
// cluster waits for that many free SMs of one GPC: 4096×14336 M = 128 (split 4) 56.5 → 91.9 µs, 5120×25600 (split 3)
// 105.7 → 181.3; so S = 2 only (2026-12-04-ab-ws-cluster-splitk-h200-s32.md).  The skinny kernel: finish_pair.
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;" ::: "memory");
}
__device__ __forceinline__ uint32_t cluster_size() {
  uint32_t n;
  asm("mov.u32 %0, %%cluster_nctarank;" : "=r"(n));
  return n;
}
__device__ __forceinline__ uint32_t cluster_rank() {
  uint32_t r;
  asm("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
  return r;
}
__device__ __forceinline__ uint32_t cluster_addr(uint32_t local, uint32_t rank) {  // `local` in CTA `rank`'s memory
  uint32_t a;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(a) : "r"(local), "r"(rank));
  return a;
}
__device__ __forceinline__ float4 ld_cluster4(uint32_t local, uint32_t rank) {  // float4 at `local` in CTA `rank`
  float4 v;
  asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];" : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
               : "r"(cluster_addr(local, rank)) : "memory");
  return v;
}
__device__ __forceinline__ float ld_cluster1(uint32_t local, uint32_t rank) {  // float at `local` in CTA `rank`
  float v;
  asm volatile("ld.shared::cluster.f32 %0, [%1];" : "=f"(v) : "r"(cluster_addr(local, rank)) : "memory");
  return v;
}

// The skinny kernel's split 2 as a cluster pair: red[16][MT] holds each CTA's partial of the tile (channels n0 ..
// n0 + 15, X rows m0 ..); CTA z stores channels 8z .. 8z + 7 as 0 + p0 + p1, splitk_last's adds.
template <int MT>
__device__ __forceinline__ void finish_pair(const float* red, __nv_bfloat16* y, int ldy, int N, int n0, int m0,
                                            int mcount) {
  cluster_sync();  // both partials complete
  const int z = (int)cluster_rank();
  const uint32_t base = saddr(red);
  for (int idx = threadIdx.x; idx < 8 * mcount; idx += blockDim.x) {
    const int r = 8 * z + (idx & 7), m = idx >> 3, n = n0 + r;
    const uint32_t at = base + 4 * (r * MT + m);
    float sum = 0.f;
    sum += ld_cluster1(at, 0);
    sum += ld_cluster1(at, 1);
    if (n < N) y[(size_t)(m0 + m) * ldy + n] = __float2bfloat16_rn(sum);
  }
  cluster_sync();  // no CTA frees its shared memory while the other still reads it
}

// The skinny kernel's end for M ≤ 2 rows of X and ≤ 32 escapes (ne), in warp 0 after the barrier that
// completes red: lane l = 16m + r returns output (r, m) = (Σ_w red[w][r][m]) · 2^(E_r − 127), then
// + x[m, col] · (w − 2^(E_r − 142)) for row r's escapes in list order: the adds of the CTA-wide path, in the
// same order, so the same bits, without its barriers.  Lane j stages entry j (w − w_code and its X words, all
// entries' loads in flight at once) in s_esc[3][32]; one ballot per row gives lane r its row's entries.
template <int WARPS, int MT>
__device__ __forceinline__ float warp0_finish(const float (&red)[WARPS][16][MT], const uint8_t* s_e, const uint2* s_ent,
                                              float (&s_esc)[3][32], int ne, const __nv_bfloat16* x, int ldx, int m0,
                                              int mcount, int lane) {
  const int r = lane & 15, m = lane >> 4;
  int er = -1;
  if (lane < ne) {  // entry `lane`: (row in tile, column, w − w_code) -> s_esc[0] = w − w_code, [1 + m] = x[m0 + m, col]
    const uint2 en = s_ent[lane];
    const int col = (int)(en.x & 0xFFFFFFu);
    er = (int)(en.x >> 24);
    const float x0 = __bfloat162float(x[(size_t)m0 * ldx + col]);
    const float x1 = mcount > 1 ? __bfloat162float(x[(size_t)(m0 + 1) * ldx + col]) : 0.f;
    s_esc[0][lane] = esc_delta(en.y, s_e[er]);
    s_esc[1][lane] = x0;
    s_esc[2][lane] = x1;
  }
  float out = 0.f;
  if (m < mcount) {
#pragma unroll
    for (int w = 0; w < WARPS; ++w) out += red[w][r][m];
    out *= __int_as_float((int)s_e[r] << 23);  // 2^(E_n − 127), exact
  }
  if (ne <= 0) return out;
  uint32_t mine = 0;  // bit j: entry j belongs to this lane's row
#pragma unroll
  for (int rr = 0; rr < 16; ++rr) {
    const uint32_t bm = __ballot_sync(0xffffffffu, er == rr);
    if (r == rr) mine = bm;
  }
  __syncwarp();  // s_esc complete
  if (m < mcount)
    for (uint32_t bm = mine; bm; bm &= bm - 1) {
      const int j = __ffs(bm) - 1;
      out = fmaf(s_esc[1 + m][j], s_esc[0][j], out);
    }
  return out;
}

// The skinny kernel's escapes at nt ≥ 2 when there are ≤ 32 (ne): each warp has its own
// copy of the entries (s_entw[warp], by its own lanes' cp.async: visible after its own wait, no barrier), and before
// the CTA barrier warp w loads X[m0 + m, col_l] of entry l for the rows m ≡ w (mod WARPS) into s_xe[l][m] (all in
// flight at once); warp 0 also puts row r's entries in s_mask[r][0] (one ballot per row).  After the barrier each
// output adds its row's entries in list order, as the CTA-wide path does (the same adds: the same bits), without
// that path's two further barriers and its serial X loads.  !LOADX (the 4-warp builds: EX in the kernel): the X words
// came by cp.async in the prologue (s_xw); only warp 0's masks are left to do here.  (Issuing the X copies from inside
// the main loop once the entries are in raised the loop's registers, nt = 2 92 → 122 and nt = 4 125 → 138, a CTA per
// SM fewer: not timed, session 31.)
template <int MT, int WARPS, bool LOADX = true>
__device__ __forceinline__ void esc_x_prefetch(uint16_t (*s_xe)[MT], uint32_t (*s_mask)[WARPS], const uint2* my_ent,
                                               int ne, const __nv_bfloat16* x, int ldx, int m0, int mcount, int warp,
                                               int lane) {
  constexpr int R = (MT + WARPS - 1) / WARPS;  // rows per warp
  __syncwarp();  // the warp's own entry copies (each lane waited for its own) visible to the warp
  int rl = -1;
  if (lane < ne) {
    const uint2 en = my_ent[lane];
    rl = (int)(en.x >> 24);
    const int col = (int)(en.x & 0xFFFFFFu);
    if (LOADX) {
      uint16_t v[R];
#pragma unroll
      for (int i = 0; i < R; ++i) {
        const int m = warp + WARPS * i;
        v[i] = m < mcount ? __bfloat16_as_ushort(x[(size_t)(m0 + m) * ldx + col]) : (uint16_t)0;
      }
#pragma unroll
      for (int i = 0; i < R; ++i)
        if (warp + WARPS * i < MT) s_xe[lane][warp + WARPS * i] = v[i];
    }
  }
  if (warp == 0)
#pragma unroll
    for (int r = 0; r < 16; ++r) {
      const uint32_t bm = __ballot_sync(0xffffffffu, rl == r);
      if (lane == 0) s_mask[r][0] = bm;
    }
}

// (Measured and not kept: kernels/w12_gemv_tried.md, "Skinny kernel".)
// Launch bounds: the 8-warp XREG form ≤ 128 registers, which keeps the plain form's 2 CTAs per SM.
template <int NT, bool VIEW, int WARPS, int U, bool TRACE = false, bool XREG = false>
__global__ void __launch_bounds__(WARPS * 32, NT == 1 && !VIEW && WARPS == 4 && U == 1 && !TRACE ? 7
                                              : XREG && WARPS == 8                                 ? 2
                                                                                                   : 0) w12_gemv_kernel(
    const __nv_bfloat16* __restrict__ x, int M, int ldx, const uint8_t* __restrict__ rec,
    const uint8_t* __restrict__ expo, const int32_t* __restrict__ toff, const int32_t* __restrict__ tent,
    __nv_bfloat16* __restrict__ y, int ldy, int N, int KB, float* __restrict__ ws, int* __restrict__ tickets,
    int l2_pct) {
  constexpr int MT = 8 * NT;  // X rows per tile
  constexpr int THREADS = WARPS * 32;
  constexpr int STEP = WARPS * U;
  __shared__ __align__(16) float red[WARPS][16][MT];
  __shared__ int s_row[THREADS], s_col[THREADS];
  __shared__ float s_d[THREADS];
  __shared__ uint32_t s_mask[16][WARPS];  // bit l of s_mask[r][c]: entry 32c + l belongs to row r
  __shared__ uint2 s_ent[THREADS];            // the CTA's escape entries (row << 24 | column, h)
  __shared__ float s_esc[3][32];              // warp0_finish's staged entries
  constexpr bool XE = !VIEW && NT >= 2;          // esc_x_prefetch's path (nt = 1 keeps the CTA-wide one: see there)
  __shared__ uint16_t s_xe[XE ? 32 : 1][MT];      // X of the first 32 entries' columns, rows m0.. (esc_x_prefetch)
  constexpr bool EX = XE && WARPS == 4;            // the escapes' X copied in the prologue (see there)
  __shared__ uint32_t s_xw[EX ? 32 : 1][EX ? MT : 1];  // EX: the X word (2 columns) of entry l's column, row m0 + m
  __shared__ uint2 s_entw[XE ? WARPS : 1][32];    // each warp's own copy of the first 32 entries (esc_x_prefetch)
  __shared__ __align__(16) uint8_t s_e[16];    // E_n of the tile's 16 channels
  __shared__ int s_last;

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  __shared__ unsigned long long s_trace[TRACE ? 4 : 1];
  auto trace = [&](int at) {  // at = 0 entry, 1 after the main loop, 2 exit
    if (TRACE && tid == 0) {
      const unsigned long long gt = globaltimer(), ck = clock64();
      if (at < 2) {
        s_trace[2 * at] = gt;
        s_trace[2 * at + 1] = ck;
        return;
      }
      unsigned long long* o = *(unsigned long long* volatile*)&g_trace +
                              8 * (((size_t)blockIdx.z * gridDim.y + blockIdx.y) * gridDim.x + blockIdx.x);
      for (int i = 0; i < 4; ++i) o[i] = s_trace[i];
      o[4] = gt;
      o[5] = ck;
      o[6] = smid();
    }
  };
  trace(0);
  const int g = lane >> 2, t = lane & 3;
  const int v0 = g * 64 + 16 * t;  // in-record byte offsets of rows g (and g + 8: + 8·64, + 8·32) for r0 = 0
  const int n0 = VIEW_BYTES + g * 32 + 16 * (t & 1);
  const uint32_t nkeep = nib_keep(t);  // columns 32..63 sit in the high nibbles
  // grid (M tiles, 8·NB, S): a tile's M tiles are neighbours in launch order, so that they stream its records
  // together and the second reads them from L2 even where the grid takes several waves
  const int c = blockIdx.y, nb = c >> 3, r0 = (c & 7) * 16, m0 = blockIdx.x * MT;
  const int tau = c * gridDim.x + blockIdx.x, S = gridDim.z;
  const int kps = (KB + S - 1) / S;
  const int a = min(KB, (int)blockIdx.z * kps), b = min(KB, a + kps);
  // ---- issue: (PDL wait), the CTA's escape offsets, two pipeline stages of records (and X),
  // then (cp.async, no registers held) the tile's exponents and the first THREADS escape entries
  pdl_wait();  // all that the previous kernel wrote (X; the tables too, had it written them) is visible now
  int e_lo = 0, e_hi = 0;
  if (!VIEW) {
    e_lo = __ldg(toff + (long)c * KB + a);
    e_hi = __ldg(toff + (long)c * KB + b);
  }
  const uint8_t* base = rec + ((size_t)nb * KB) * REC;
  const int k0 = a + warp;  // the warp's first record
  LoadPtrs<NT> lp;           // at record k0
  lp.ox = (uint32_t)k0 * 64;
  lp.pv = base + (size_t)k0 * REC + v0 + r0 * 64;
  lp.pn = base + (size_t)k0 * REC + n0 + r0 * 32;
#pragma unroll
  for (int j = 0; j < NT; ++j) {
    const int m = m0 + 8 * j + g;
    lp.xr[j] = x + (size_t)(m < M ? m : 0) * ldx + 16 * t + (lp.XMOVE ? (size_t)k0 * 64 : 0);  // rows ≥ M: row 0 (load_x16)
  }
  float acc[NT][4];
#pragma unroll
  for (int j = 0; j < NT; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;
  const uint64_t pol = weight_policy(l2_pct);
  Group<NT, VIEW, U, NT <= 2 || XREG> ga, gb;
  ga.load(lp, 0, k0, b, WARPS, pol);
  gb.load(lp, STEP, k0, b, WARPS, pol);
  if (tid == 0) cp_async16(s_e, expo + nb * 128 + r0);
  if (!VIEW && e_lo + tid < e_hi) cp_async8(&s_ent[tid], tent + 2 * (long)(e_lo + tid));
  if (XE && e_hi - e_lo <= 32 && lane < e_hi - e_lo) cp_async8(&s_entw[warp][lane], tent + 2 * (long)(e_lo + lane));
  pdl_launch_dependents();
  // EX: the warp waits for its entries and copies their X words (rows m ≡ warp mod WARPS) while the main loop runs,
  // instead of loading them after it (esc_x_prefetch): the wait at the start overlaps the first records' loads, the
  // load at the end held every CTA's exit.  Same bits; 4-warp configs only: M = 16 6144×4096 22.6 → 20.3 µs,
  // 28672×4096 66.2 → 59.8, 5120×25600 70.5 → 65.8; the 8-warp ones lost 3 % (4096² 15.2 → 15.7)
  // (2026-12-04-ab-skinny-early-x-h200-s33.md; at nt = 1, warp 0 copying its X words the same way lost 2 % at M = 1:
  // kernels/w12_gemv_tried.md).
  if (EX && e_hi - e_lo <= 32) {
    cp_async_wait_all();
    __syncwarp();
    if (lane < e_hi - e_lo) {
      const int col = (int)(s_entw[warp][lane].x & 0xFFFFFEu);
#pragma unroll
      for (int i = 0; i < (MT + WARPS - 1) / WARPS; ++i) {
        const int m = warp + WARPS * i;
        if (m < MT && m0 + m < M) cp_async4(&s_xw[lane][m], x + (size_t)(m0 + m) * ldx + col);
      }
    }
  }

  // ---- main loop: group A's U records are decoded while group B's are in flight, and the other way
  for (int kb0 = k0; kb0 < b; kb0 += 2 * STEP) {
    ga.compute(acc, lp, 0, kb0, b, WARPS, nkeep);
    ga.load(lp, 2 * STEP, kb0, b, WARPS, pol);
    gb.compute(acc, lp, STEP, kb0, b, WARPS, nkeep);
    gb.load(lp, 3 * STEP, kb0, b, WARPS, pol);
    lp.advance(2 * STEP);
  }

  // ---- epilogue: fixed-order reduction over warps, per-channel 2^(E_n − 127), the segment's escapes
#pragma unroll
  for (int j = 0; j < NT; ++j) {
    red[warp][g][8 * j + 2 * t] = acc[j][0];
    red[warp][g][8 * j + 2 * t + 1] = acc[j][1];
    red[warp][g + 8][8 * j + 2 * t] = acc[j][2];
    red[warp][g + 8][8 * j + 2 * t + 1] = acc[j][3];
  }
  cp_async_wait_all();
  const int mcount = min(MT, M - m0);
  const bool pair = S == 2 && cluster_size() == 2;  // split 2 as a cluster pair (launch_t): finish_pair
  // nt ≥ 2, ≤ 32 escapes: their X fetched by every warp before the barrier, the corrections below from shared memory
  const bool xe = XE && e_hi - e_lo <= 32;
  if (xe) esc_x_prefetch<MT, WARPS, !EX>(s_xe, s_mask, s_entw[warp], e_hi - e_lo, x, ldx, m0, mcount, warp, lane);
  __syncthreads();
  trace(1);
  if (NT == 1 && mcount <= 2 && (VIEW || e_hi - e_lo <= 32)) {
    // one warp finishes the tile (M ≤ 2, ≤ 32 escapes: the usual decode case): no further CTA barrier
    if (warp != 0) {
      if (S == 1) return;
    } else {
      const float out = warp0_finish<WARPS, MT>(red, s_e, s_ent, s_esc, e_hi - e_lo, x, ldx, m0, mcount, lane);
      const int r = lane & 15, m = lane >> 4, n = nb * 128 + r0 + r;
      if (S == 1) {
        if (m < mcount && n < N) y[(size_t)(m0 + m) * ldy + n] = __float2bfloat16_rn(out);
        trace(2);
        return;
      }
      if (m < mcount) red[0][r][m] = out;
    }
    if (pair) {
      finish_pair<MT>(&red[0][0][0], y, ldy, N, nb * 128 + r0, m0, mcount);
      trace(2);
      return;
    }
    if (!splitk_last(&red[0][0][0], 16 * MT, ws + (size_t)tau * S * 16 * MT, S, blockIdx.z, tickets + tau, &s_last)) {
      trace(2);
      return;
    }
    __syncthreads();
    for (int idx = tid; idx < 16 * mcount; idx += THREADS) {
      int r = idx & 15, m = idx >> 4, n = nb * 128 + r0 + r;
      if (n < N) y[(size_t)(m0 + m) * ldy + n] = __float2bfloat16_rn(red[0][r][m]);
    }
    trace(2);
    return;
  }
  for (int idx = tid; idx < 16 * mcount; idx += THREADS) {
    int r = idx & 15, m = idx >> 4;
    float sum = 0.f;
#pragma unroll
    for (int w = 0; w < WARPS; ++w) sum += red[w][r][m];
    sum *= __int_as_float((int)s_e[r] << 23);  // 2^(E_n − 127), exact
    if (xe)  // row r's entries in list order: + x[m, col] · (w − w_code), X from s_xe
      for (uint32_t bm = s_mask[r][0]; bm; bm &= bm - 1) {
        const int j = __ffs(bm) - 1;
        const uint16_t xb = EX ? (uint16_t)(s_xw[j][m] >> (16 * (s_ent[j].x & 1u))) : s_xe[j][m];
        sum = fmaf(__bfloat162float(__ushort_as_bfloat16(xb)), esc_delta(s_ent[j].y, s_e[r]), sum);
      }
    red[0][r][m] = sum;
  }
  if (!VIEW && !xe && e_hi > e_lo) {
    for (int c0 = e_lo; c0 < e_hi; c0 += THREADS) {
      if (c0 != e_lo) {  // more escapes than threads: the next chunk (the first came with the loads)
        __syncthreads();   // the previous chunk's readers are done
        if (c0 + tid < e_hi) s_ent[tid] = *reinterpret_cast<const uint2*>(tent + 2 * (long)(c0 + tid));
        __syncthreads();
      }
      // entry -> (row in tile, column, w − w_code) with w_code = 2^(E_n − 142)
      s_row[tid] = -1;
      if (c0 + tid < e_hi) {
        const uint2 en = s_ent[tid];
        int rl = (int)(en.x >> 24);
        s_row[tid] = rl;
        s_col[tid] = (int)(en.x & 0xFFFFFFu);
        s_d[tid] = esc_delta(en.y, s_e[rl]);
      }
      __syncthreads();
      // per-row bit masks of the staged entries (one ballot per row and 32 entries), then one thread
      // per (row, X row) adds its row's entries in ascending order (deterministic, no search)
      {
        int rr = s_row[tid];
#pragma unroll
        for (int r = 0; r < 16; ++r) {
          uint32_t bm = __ballot_sync(0xffffffffu, rr == r);
          if (lane == 0) s_mask[r][warp] = bm;
        }
      }
      __syncthreads();
      for (int idx = tid; idx < 16 * mcount; idx += THREADS) {
        int r = idx & 15, m = idx >> 4;
        const __nv_bfloat16* xm = x + (size_t)(m0 + m) * ldx;
        float out = red[0][r][m];
        for (int cw = 0; cw < WARPS; ++cw) {
          for (uint32_t bm = s_mask[r][cw]; bm; bm &= bm - 1) {
            int jj = 32 * cw + __ffs(bm) - 1;
            out = fmaf(__bfloat162float(xm[s_col[jj]]), s_d[jj], out);
          }
        }
        red[0][r][m] = out;
      }
    }
  }
  if (pair) {
    finish_pair<MT>(&red[0][0][0], y, ldy, N, nb * 128 + r0, m0, mcount);
    trace(2);
    return;
  }
  if (S > 1 && !splitk_last(&red[0][0][0], 16 * MT, ws + (size_t)tau * S * 16 * MT, S, blockIdx.z, tickets + tau, &s_last)) {
    trace(2);
    return;
  }
  __syncthreads();
  for (int idx = tid; idx < 16 * mcount; idx += THREADS) {
    int r = idx & 15, m = idx >> 4, n = nb * 128 + r0 + r;
    if (n < N) y[(size_t)(m0 + m) * ldy + n] = __float2bfloat16_rn(red[0][r][m]);
  }
  trace(2);
}

// =================================================================================================
// wgmma pieces of the ws kernel (below)
// =================================================================================================

// ---- wgmma (sm_90a): D[64 channels, MT] += A[64, 16] · B[16, MT], A = the 4 warps' decoded fragments in
// registers (the mma.m16n8k16 A layout per warp: warp w of the group holds channels 16w..16w+15), B = the X
// tile of a ring slot in shared memory, K-major rows of 128 bytes with the 128-byte swizzle (chunk q of row m at
// q ^ (m & 7); slot base 1024-byte aligned).  Descriptor: start >> 4 | LBO 16 >> 4 << 16 | SBO 1024 >> 4
// << 32 (8 rows of 128 B per swizzle atom) | swizzle 128 B (1 << 62), built in 32-bit halves; k-step s starts 32·s
// bytes into the row: the low half + 2·s (the slot is 1024-byte aligned and below 2^18, so nothing carries out of the
// start field), one add per descriptor (ws_mma).
constexpr uint32_t WG_DESC_HI = 64u | (1u << 30);
__device__ __forceinline__ uint32_t wg_desc_lo(uint32_t saddr) { return ((saddr & 0x3FFFF) >> 4) | (1u << 16); }
__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wg_wait0() { asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory"); }
__device__ __forceinline__ void wg_wait1() { asm volatile("wgmma.wait_group.sync.aligned 1;" ::: "memory"); }

// Pins the accumulator registers at this point of the program (no copy of them is taken across a wgmma wait).
template <int NT>
__device__ __forceinline__ void fence_acc(float (&d)[NT][4]) {
#pragma unroll
  for (int j = 0; j < NT; ++j)
#pragma unroll
    for (int k = 0; k < 4; ++k) asm volatile("" : "+f"(d[j][k])::"memory");
}

// One wgmma.m64n(8·NT)k16 with A from registers; the operand lists are written out per N.
template <int NT>
__device__ __forceinline__ void wgmma_k16(float (&d)[NT][4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                          uint64_t desc);
template <>
__device__ __forceinline__ void wgmma_k16<2>(float (&d)[2][4], uint32_t a0, uint32_t a1, uint32_t a2,
                                               uint32_t a3, uint64_t desc) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %13, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7}, {%8, %9, %10, %11}, %12, p, 1, 1, 0;\n}"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(desc), "r"(1));
}
template <>
__device__ __forceinline__ void wgmma_k16<4>(float (&d)[4][4], uint32_t a0, uint32_t a1, uint32_t a2,
                                               uint32_t a3, uint64_t desc) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %21, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, {%16, %17, %18, %19}, %20, p, 1, 1, 0;\n}"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(desc), "r"(1));
}
template <>
__device__ __forceinline__ void wgmma_k16<6>(float (&d)[6][4], uint32_t a0, uint32_t a1, uint32_t a2,
                                              uint32_t a3, uint64_t desc) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %29, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n48k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23}, {%24, %25, %26, %27}, %28, p, 1, 1, 0;\n}"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(desc), "r"(1));
}
template <>
__device__ __forceinline__ void wgmma_k16<8>(float (&d)[8][4], uint32_t a0, uint32_t a1, uint32_t a2,
                                               uint32_t a3, uint64_t desc) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%32, %33, %34, %35}, %36, p, 1, 1, 0;\n}"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(desc), "r"(1));
}
template <>
__device__ __forceinline__ void wgmma_k16<16>(float (&d)[16][4], uint32_t a0, uint32_t a1, uint32_t a2,
                                               uint32_t a3, uint64_t desc) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, {%64, %65, %66, %67}, %68, p, 1, 1, 0;\n}"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3]), "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3]), "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]), "+f"(d[10][0]), "+f"(d[10][1]), "+f"(d[10][2]), "+f"(d[10][3]), "+f"(d[11][0]), "+f"(d[11][1]), "+f"(d[11][2]), "+f"(d[11][3]), "+f"(d[12][0]), "+f"(d[12][1]), "+f"(d[12][2]), "+f"(d[12][3]), "+f"(d[13][0]), "+f"(d[13][1]), "+f"(d[13][2]), "+f"(d[13][3]), "+f"(d[14][0]), "+f"(d[14][1]), "+f"(d[14][2]), "+f"(d[14][3]), "+f"(d[15][0]), "+f"(d[15][1]), "+f"(d[15][2]), "+f"(d[15][3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(desc), "r"(1));
}

// wgmma k order of a 64-column block: the lane (g, t) of k-step s holds the columns 16t + 4s + {0,1,2,3} at the
// MMA's k positions 2t, 2t+1, 2t+8, 2t+9 (the skinny kernel's order, one 16-byte load per lane), and wgmma reads
// B in k order, so the column pair P = 8t + 2s + h (h = 0: k 2t, h = 1: k 2t+8) goes to k-step s, k-pair t + 4h:
// 32-bit word d = 8s + t + 4h of the block (chunk d / 4 = 2s + h, word d % 4 = t).
__device__ __forceinline__ int wg_word(int P) {
  const int t = P >> 3, s = (P >> 1) & 3, h = P & 1;
  return 8 * s + t + 4 * h;
}

// Byte offset of X[m, col] (col < 64) in an X stage: word wg_word(col / 2) of row m, chunk swizzled (chunk q of
// row m at q ^ (m & 7)).
__device__ __forceinline__ int x_off(int m, int col) {
  const int d = wg_word(col >> 1);
  return m * 128 + (((d >> 2) ^ (m & 7)) << 4) + 4 * (d & 3) + 2 * (col & 1);
}
// =================================================================================================
// W12 GEMM for 9 ≤ M ≤ 128, warp-specialized (the "ws" kernel: bulk copies into a ring, mbarriers, wgmma)
// =================================================================================================
// CTA (nb, mb, z) = the 128 channels of record row nb × MT = 8·NT rows of X × the records [a, b) of split z, as
// 9 warps.  Warp 8 (the producer; lane 0) streams each record — 12 KB as it lies in memory — and its X tile (MT
// rows of 128 bytes) into slot i % WS_STAGES of a ring with two bulk copies (cp.async.bulk: the copy engine, no
// registers held, completion counted in bytes on the slot's `full` mbarrier).  Warps 0–7 (two warpgroups of 64
// channels; warp w owns the 16 channels 16w.., tile c = nb·8 + w) wait on `full`, decode their A fragments from
// the slot (the skinny kernel's lane layout and decode4), run four wgmma m64n(MT)k16 on the slot's X, add the record's escapes
// from the slot's X, wait for the wgmma and arrive on the slot's `empty` mbarrier, which the producer waits on
// before it refills the slot.  No CTA-wide barrier in the main loop: the producer runs up to WS_STAGES records
// ahead, a slow warp holds back only its own slot.  (The tensor-core kernel before it — removed in session 28 — had
// every thread issue cp.async copies and meet at a __syncthreads per record: latency-bound,
// 2026-12-02-kernels-ncu-h200-s9.md.)
// X reaches the slot already in wgmma k order and 128-byte swizzled: w12_x_ws_kernel writes it once per call as
// xq[kb][Mpad][64] (record-major, rows ≥ M zero), so that a slot's X tile is one contiguous copy.
// Escapes: a sparse correction — while record kb's X tile is in its slot, each consumer warp adds
// x[m, col] · (w − w_code) of its tile's entries of record kb, in list order, to its fp32 corr[MT][16] in shared
// memory (real units); the epilogue writes y = Σ acc · 2^(E_n − 127) + corr, then the entries past the WS_ECAP staged
// ones from global memory (still list order).  Split K as in the skinny kernel (partials in ws, tickets, fixed
// order), added by splitk_last4; at S = 2 the tile's two CTAs run as a cluster pair instead (finish_tile_cluster).
// The tail split (tsplit): without split K, the record rows past the last full wave run as tsplit CTAs each, launched
// last, so that they do not take a near-empty wave of whole-K CTAs (51200×5120 M = 128 216.2 → 198.2 µs,
// 2026-12-04-ws-configs-tail-h200-s33.md).
// The CTA's sums are laid out X row by X row ([MT][128]): the stores to y then read shared
// memory without bank conflicts (the [128][MT] layout cost ~15 % of the stall samples at M = 128,
// 2026-12-02-kernels-ncu-ws-sass-h200-s15.md).
// What bounds M = 128, and the alternatives measured and not kept (clusters, SS wgmma, stream-K, X staged in the
// kernel, escapes elsewhere, persistent and pipelined forms): kernels/w12_gemv_tried.md, "ws kernel".
constexpr int WS_ECAP = 64;  // escape entries per warp staged
// Threads: 8 consumer warps + the producer warp; at nt = 16 a whole producer warpgroup (warp 8 copies, 9–11 idle), so
// that setmaxnreg can move registers from it to the consumers: launched at 168 per thread (12 warps, 3 on each SM
// sub-partition), the producers drop to 40 and the consumers rise to 232 — room for the escape corrections in
// registers (ws_rcorr).  (Below nt = 16, two 9-warp CTAs per SM cap every thread at 96: 5 warps on one sub-partition.)
// At nt = 4 likewise (two CTAs of 12 warps per SM, launched at 80 registers): producers 32, consumers 104 — the CTA's
// own 384 · 80 registers hold 128 · 32 + 256 · 104 — room for W12's record pairs (at the 96 cap they spilled).
template <int NT>
__host__ __device__ constexpr bool ws_pwg() {
  return NT >= 16 || NT == 4;
}
template <int NT>
__host__ __device__ constexpr int ws_threads() {
  return ws_pwg<NT>() ? 384 : 288;
}
template <int NT>
__host__ __device__ constexpr int ws_reg_launch() {
  return NT >= 16 ? 168 : 80;
}
template <int NT>
__host__ __device__ constexpr int ws_reg_producer() {
  return NT >= 16 ? 40 : 32;
}
template <int NT>
__host__ __device__ constexpr int ws_reg_consumer() {
  return NT >= 16 ? 232 : 104;
}
template <int NT, bool VIEW>
__host__ __device__ constexpr bool ws_rcorr() {  // W12's escape corrections in registers, not in corr
  return !VIEW && NT >= 16;
}
__device__ __forceinline__ void bar_sync_all(int threads) { asm volatile("bar.sync 1, %0;" ::"r"(threads) : "memory"); }
template <int N>
__device__ __forceinline__ void setmaxnreg_inc() { asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(N)); }
template <int N>
__device__ __forceinline__ void setmaxnreg_dec() { asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(N)); }

// The tile's sums cta_red [MT][128] (X row-major, the ws kernel's layout), one partial per CTA of the cluster.
template <int MT, int THREADS>
__device__ __forceinline__ void finish_tile_cluster(const float* cta_red, __nv_bfloat16* y, int ldy, int N, int n0,
                                                    int m0, int mcount) {
  cluster_sync();  // every CTA's partial sums are complete
  const int S = (int)cluster_size(), z = (int)cluster_rank(), per = (mcount + S - 1) / S;
  const int mlo = min(mcount, z * per), mhi = min(mcount, mlo + per);
  const uint32_t base = saddr(cta_red);
  const bool vec = n0 + 128 <= N && ldy % 8 == 0 && (reinterpret_cast<uintptr_t>(y) & 15) == 0;
  for (int idx = threadIdx.x; idx < 16 * (mhi - mlo); idx += THREADS) {
    const int r = 8 * (idx & 15), m = mlo + (idx >> 4);
    float4 a = make_float4(0.f, 0.f, 0.f, 0.f), b = a;
    for (int zz = 0; zz < S; ++zz) {
      add4(a, ld_cluster4(base + 4 * (m * 128 + r), zz));
      add4(b, ld_cluster4(base + 4 * (m * 128 + r + 4), zz));
    }
    __nv_bfloat16* yr = y + (size_t)(m0 + m) * ldy + n0 + r;
    if (vec) {
      store_bf16x8(yr, a, b);
    } else {
      const float o[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
      for (int e = 0; e < 8; ++e)
        if (n0 + r + e < N) yr[e] = __float2bfloat16_rn(o[e]);
    }
  }
  cluster_sync();  // no CTA frees its shared memory while another still reads it
}
__device__ __forceinline__ void mbar_init(uint64_t* bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(saddr(bar)), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_init_fence() { asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory"); }
__device__ __forceinline__ void mbar_expect(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(saddr(bar)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(saddr(bar)) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
  asm volatile(
      "{\n.reg .pred P;\nW12_WAIT_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 P, [%0], %1;\n"
      "@!P bra W12_WAIT_%=;\n}" ::"r"(saddr(bar)), "r"(parity) : "memory");
}
__device__ __forceinline__ void bulk_g2s(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
               ::"r"(saddr(dst)), "l"(src), "r"(bytes), "r"(saddr(bar)) : "memory");
}
// The same copy with an L2 cache-hint policy (createpolicy).
__device__ __forceinline__ void bulk_g2s(void* dst, const void* src, uint32_t bytes, uint64_t* bar, uint64_t pol) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, [%3], %4;"
               ::"r"(saddr(dst)), "l"(src), "r"(bytes), "r"(saddr(bar)), "l"(pol) : "memory");
}

// X for the ws kernel: xq[kb][m][·] (m < Mpad, 128 bytes per row) = X[m, 64·kb .. 64·kb + 63] with the column pairs
// in wgmma k order (wg_word) and the 16-byte chunk q of row m at chunk q ^ (m & 7) — the image of a swizzled X stage;
// rows m ≥ M are zero.  One thread per 32-bit word.
__global__ void w12_x_ws_kernel(const __nv_bfloat16* __restrict__ x, int ldx, uint32_t* __restrict__ xq, int M,
                                int Mpad, int K) {
  const int words = K / 2;  // 32-bit column pairs per row
  for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < (long)Mpad * words; i += (long)gridDim.x * blockDim.x) {
    const int m = (int)(i / words), w = (int)(i % words), kb = w >> 5, d = wg_word(w & 31);
    const uint32_t v = m < M ? reinterpret_cast<const uint32_t*>(x + (size_t)m * ldx)[w] : 0u;
    xq[((size_t)kb * Mpad + m) * 32 + (((d >> 2) ^ (m & 7)) << 2) + (d & 3)] = v;
  }
}

// The escapes' shared memory — corr [8][16][MT] fp32, staged entries [8][ECAP], per-record offsets [8][kps + 1] — is
// W12's only: the 8-bit view has no escapes and spends it on a deeper ring.
template <int NT, bool VIEW>
__host__ __device__ constexpr int ws_corr_bytes() {
  return VIEW || ws_rcorr<NT, VIEW>() ? 0 : 8 * 16 * 8 * NT * 4;
}

// ring depth: two CTAs per SM up to NT = 8 (≤ ~105 KB each), one at NT = 16.  The view, in the escapes' place: 7
// stages at NT = 16 (its M = 128 geomean 0.906 → 0.961 against 5, same bits, 2026-12-04-ab-ws-view7-h200-s30.md;
// first seen in -ab-ws-rcorr-FAILED-h200-s30.md, where W12's corrections moved to registers spilled and were reverted),
// and up to NT = 8 as many as W12's ~100 KB hold.
template <int NT, bool VIEW>
__host__ __device__ constexpr int ws_stages() {
  if (VIEW) return NT <= 2 ? 7 : NT == 4 ? 6 : NT <= 8 ? 5 : 7;
  return NT <= 2 ? 6 : NT == 4 ? 5 : NT == 6 ? 4 : NT == 8 ? 3 : 7;  // nt = 16: corr in registers, the view's depth
}

template <int NT>
__host__ __device__ constexpr int ws_slot() {  // bytes of one slot: X tile (MT rows of 128 B), then the record
  return 8 * NT * 128 + REC;
}

template <int NT, bool VIEW>
size_t ws_smem(int kps) {  // 1024-aligned ring, (W12:) corr [8][16][MT] and entries [8][ECAP], barriers, (W12:) offsets [8][kps + 1]
  return 1024 + (size_t)ws_stages<NT, VIEW>() * ws_slot<NT>() + 2 * ws_stages<NT, VIEW>() * 8 +
         (VIEW ? 0 : ws_corr_bytes<NT, VIEW>() + 8 * WS_ECAP * 8 + 8 * (kps + 1) * 4);
}

// ---- the ws kernel's pieces

// The producer warp (lane 0 copies): record a + i and its X tile -> slot i % STAGES, once the slot's `empty` completed.
// wfirst: the record copies carry L2 evict_first (each record is read by the CTAs of one record row only, the X
// tiles by every CTA): 3–9 % faster at M = 32–64 on all but the LM heads, which lose 2–3 % at M = 16–32
// (2026-12-03-ab-ws-l2-h200-s26.md; evict_normal measured the same as no hint, X tiles evict_last no better:
// -ab-ws-x-evict-last-FAILED-s26.md).
template <int NT, bool VIEW, int STAGES>
__device__ __forceinline__ void ws_produce(uint8_t* ring, uint64_t* full, uint64_t* empty, const uint8_t* rec,
                                           const uint8_t* xq, int nb, int KB, int a, int nrec, int Mpad, int m0,
                                           int lane, bool wfirst) {
  uint64_t first;
  asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(first));
  constexpr int XB = 8 * NT * 128, SLOT = ws_slot<NT>();
  constexpr uint32_t WBYTES = VIEW ? VIEW_BYTES : REC;
  const uint8_t* wsrc = rec + ((size_t)nb * KB + a) * REC;
  const uint8_t* xsrc = xq + ((size_t)a * Mpad + m0) * 128;
  for (int i = 0; i < nrec; ++i) {
    const int s = i % STAGES;
    if (i >= STAGES) mbar_wait(empty + s, ((i / STAGES) - 1) & 1);  // the consumers are done with the slot
    if (lane == 0) {
      uint8_t* slot = ring + s * SLOT;
      mbar_expect(full + s, XB + WBYTES);
      bulk_g2s(slot, xsrc + (size_t)i * Mpad * 128, XB, full + s);
      if (wfirst)
        bulk_g2s(slot + XB, wsrc + (size_t)i * REC, WBYTES, full + s, first);
      else
        bulk_g2s(slot + XB, wsrc + (size_t)i * REC, WBYTES, full + s);
    }
    __syncwarp();
  }
}

// The warp's A fragments of the record in `slot` (the skinny kernel's lane layout and decode4): fa[k] = a0..a3 of k-step k.
template <bool VIEW>
__device__ __forceinline__ void ws_decode(const uint8_t* slot, int v0, int v1, int n0, int n1, uint32_t nkeep,
                                          uint32_t (&fa)[4][4]) {
  const uint4 va = *reinterpret_cast<const uint4*>(slot + v0), vb = *reinterpret_cast<const uint4*>(slot + v1);
  uint4 na = make_uint4(0, 0, 0, 0), nbw = na;
  if (!VIEW) {
    na = *reinterpret_cast<const uint4*>(slot + n0);
    nbw = *reinterpret_cast<const uint4*>(slot + n1);
  }
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    decode4<VIEW>(word(va, k), VIEW ? 0u : word(na, k), nkeep, fa[k][0], fa[k][2]);
    decode4<VIEW>(word(vb, k), VIEW ? 0u : word(nbw, k), nkeep, fa[k][1], fa[k][3]);
  }
}

// A record's four k-steps: acc += A (the warp's decoded fragments fa) · X (the slot's X tile at shared address xa).
template <int NT>
__device__ __forceinline__ void ws_mma(float (&acc)[NT][4], const uint32_t (&fa)[4][4], uint32_t xa) {
  const uint32_t lo = wg_desc_lo(xa);
#pragma unroll
  for (int k = 0; k < 4; ++k)
    wgmma_k16<NT>(acc, fa[k][0], fa[k][1], fa[k][2], fa[k][3], ((uint64_t)WG_DESC_HI << 32) | (uint64_t)(lo + 2 * k));
}

// Record a + i's escapes of the warp's tile: corr[m][r] += x[m, col] · (w − w_code) in list order, X from the slot
// (s_ew: the tile's 16 exponents).
template <int MT>
__device__ __forceinline__ void ws_escapes(const int* my_toff, const uint2* my_ent, int e_lo, int i, int a,
                                           const uint8_t* slot, const uint8_t* s_ew, float* my_corr, int lane) {
  const int i0 = my_toff[i] - e_lo, i1 = min(my_toff[i + 1] - e_lo, WS_ECAP);
  for (int e = i0; e < i1; ++e) {
    const uint2 en = my_ent[e];
    const int rl = (int)(en.x >> 24), col = (int)(en.x & 0xFFFFFFu) - (a + i) * 64;
    // esc_delta(en.y, s_ew[rl]) written out: with the call ptxas gave the nt = 2 build 4 more registers (72 → 76)
    const float d = __bfloat162float(__ushort_as_bfloat16((unsigned short)(en.y & 0xFFFFu))) - __int_as_float(((int)s_ew[rl] - 15) << 23);
    for (int m = lane; m < MT; m += 32) {
      const uint16_t xv = *reinterpret_cast<const uint16_t*>(slot + x_off(m, col));
      my_corr[m * 16 + rl] = fmaf(__bfloat162float(__ushort_as_bfloat16(xv)), d, my_corr[m * 16 + rl]);
    }
  }
}

// The same adds into registers (ws_rcorr): c has the accumulators' layout (lane (g, t) holds channels g, g + 8 of the
// warp's 16 and X rows 8j + 2t, +1), so entry (rl, col) goes to the four lanes with g = rl % 8, each adding its 2·NT
// rows: per (X row, channel) the same fmaf sequence in list order as ws_escapes, so the same bits.
template <int NT>
__device__ __forceinline__ void ws_escapes_r(const int* my_toff, const uint2* my_ent, int e_lo, int i, int a,
                                             const uint8_t* slot, const uint8_t* s_ew, float (&c)[NT][4], int g, int t) {
  const int i0 = my_toff[i] - e_lo, i1 = min(my_toff[i + 1] - e_lo, WS_ECAP);
  for (int e = i0; e < i1; ++e) {
    const uint2 en = my_ent[e];
    const int rl = (int)(en.x >> 24), col = (int)(en.x & 0xFFFFFFu) - (a + i) * 64;
    if ((rl & 7) != g) continue;
    const float d = __bfloat162float(__ushort_as_bfloat16((unsigned short)(en.y & 0xFFFFu))) - __int_as_float(((int)s_ew[rl] - 15) << 23);
    const bool hi = rl >= 8;
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
      for (int b = 0; b < 2; ++b) {
        const int m = 8 * j + 2 * t + b;
        const float xv = __bfloat162float(__ushort_as_bfloat16(*reinterpret_cast<const uint16_t*>(slot + x_off(m, col))));
        if (hi)
          c[j][2 + b] = fmaf(xv, d, c[j][2 + b]);
        else
          c[j][b] = fmaf(xv, d, c[j][b]);
      }
  }
}

// Record a + i's escapes into the warp's corrections: its registers cr (RC, ws_escapes_r) or its corr rows (ws_escapes).
template <int NT, bool RC>
__device__ __forceinline__ void ws_escapes_to(const int* my_toff, const uint2* my_ent, int e_lo, int i, int a,
                                              const uint8_t* slot, const uint8_t* s_ew, float* my_corr,
                                              float (&cr)[RC ? NT : 1][4], int g, int t, int lane) {
  if constexpr (RC)
    ws_escapes_r<NT>(my_toff, my_ent, e_lo, i, a, slot, s_ew, cr, g, t);
  else
    ws_escapes<8 * NT>(my_toff, my_ent, e_lo, i, a, slot, s_ew, my_corr, lane);
}

// A consumer warp's escape prologue (the second round trip left in flight): the per-record
// offsets my_toff[0..nrec] -> [e_lo, e_hi); the first WS_ECAP entries' loads issued into ent (lane l: entries l and
// l + 32), waited for only where ws_stage_entries stores them, after the first record's MMAs are issued; corr zeroed.
static_assert(WS_ECAP == 64, "two staged entries per lane");
template <int MT, bool VIEW>
__device__ __forceinline__ void ws_escape_prologue(int* my_toff, float* my_corr, const int32_t* toff, const int32_t* tent,
                                                   int c, int KB, int a, int nrec, int lane, int& e_lo, int& e_hi,
                                                   uint2 (&ent)[2]) {
  ent[0] = ent[1] = make_uint2(0u, 0u);
  if constexpr (!VIEW) {
    for (int i = lane; i <= nrec; i += 32) my_toff[i] = __ldg(toff + (long)c * KB + a + i);
    __syncwarp();
    e_lo = my_toff[0];
    e_hi = my_toff[nrec];
    const int cnt = min(WS_ECAP, e_hi - e_lo);
    if (lane < cnt) ent[0] = *reinterpret_cast<const uint2*>(tent + 2 * (long)(e_lo + lane));
    if (lane + 32 < cnt) ent[1] = *reinterpret_cast<const uint2*>(tent + 2 * (long)(e_lo + lane + 32));
  }
  if (ws_corr_bytes<MT / 8, VIEW>() > 0)
    for (int i = lane; i < 16 * MT; i += 32) my_corr[i] = 0.f;
  __syncwarp();
}

// The staged entries into shared memory (n = e_hi − e_lo), before the first record's escapes.
__device__ __forceinline__ void ws_stage_entries(uint2* my_ent, const uint2 (&ent)[2], int n, int lane) {
  if (lane < n) my_ent[lane] = ent[0];
  if (lane + 32 < n && lane + 32 < WS_ECAP) my_ent[lane + 32] = ent[1];
  __syncwarp();
}

// A warp's outputs before the late escapes: red[m·128 + channel] = sum · 2^(E_n − 127) + corr[m][channel] (the wgmma D
// layout: channels g, g + 8 of its 16, X rows 8j + 2t, +1; s_ew: its 16 exponents, my_corr [MT][16]; !CORR: + 0).
template <int NT, bool CORR>
__device__ __forceinline__ void ws_store_acc(float* red, const float (&acc)[NT][4], const uint8_t* s_ew,
                                             const float* my_corr, int g, int t) {
  const float s0 = __int_as_float((int)s_ew[g] << 23), s1 = __int_as_float((int)s_ew[g + 8] << 23);  // exact
#pragma unroll
  for (int j = 0; j < NT; ++j) {
    const int m = 8 * j + 2 * t;
    auto corr = [&](int mm, int r) { return CORR ? my_corr[mm * 16 + r] : 0.f; };  // + 0.f as with corr: same bits
    red[m * 128 + g] = acc[j][0] * s0 + corr(m, g);
    red[(m + 1) * 128 + g] = acc[j][1] * s0 + corr(m + 1, g);
    red[m * 128 + g + 8] = acc[j][2] * s1 + corr(m, g + 8);
    red[(m + 1) * 128 + g + 8] = acc[j][3] * s1 + corr(m + 1, g + 8);
  }
}

// The same with the corrections in registers (c: ws_escapes_r's layout): the same adds, so the same bits.
template <int NT>
__device__ __forceinline__ void ws_store_acc_r(float* red, const float (&acc)[NT][4], const uint8_t* s_ew,
                                               const float (&c)[NT][4], int g, int t) {
  const float s0 = __int_as_float((int)s_ew[g] << 23), s1 = __int_as_float((int)s_ew[g + 8] << 23);  // exact
#pragma unroll
  for (int j = 0; j < NT; ++j) {
    const int m = 8 * j + 2 * t;
    red[m * 128 + g] = acc[j][0] * s0 + c[j][0];
    red[(m + 1) * 128 + g] = acc[j][1] * s0 + c[j][1];
    red[m * 128 + g + 8] = acc[j][2] * s1 + c[j][2];
    red[(m + 1) * 128 + g + 8] = acc[j][3] * s1 + c[j][3];
  }
}

// The warp's escapes past WS_ECAP (rare: not staged by the prologue), from global memory in list order, onto red.
template <bool VIEW>
__device__ __forceinline__ void ws_late_escapes(float* red, const uint8_t* s_ew, int e_lo, int e_hi,
                                                const int32_t* tent, const __nv_bfloat16* x, int ldx, int m0,
                                                int mcount, int lane) {
  if constexpr (!VIEW) {
    for (int e = e_lo + WS_ECAP; e < e_hi; ++e) {
      const uint32_t e0 = (uint32_t)__ldg(tent + 2 * (long)e), e1 = (uint32_t)__ldg(tent + 2 * (long)e + 1);
      const int rl = (int)(e0 >> 24), col = (int)(e0 & 0xFFFFFFu);
      const float d = esc_delta(e1, s_ew[rl]);
      for (int m = lane; m < mcount; m += 32)
        red[m * 128 + rl] = fmaf(__bfloat162float(x[(size_t)(m0 + m) * ldx + col]), d, red[m * 128 + rl]);
      __syncwarp();
    }
  }
}

template <int NT, bool VIEW>
__global__ void __launch_bounds__(ws_threads<NT>(), NT >= 16 ? 1 : 2) w12_gemm_ws_kernel(
    const __nv_bfloat16* __restrict__ x, const uint8_t* __restrict__ xq, int Mpad, int M, int ldx,
    const uint8_t* __restrict__ rec, const uint8_t* __restrict__ expo, const int32_t* __restrict__ toff,
    const int32_t* __restrict__ tent, __nv_bfloat16* __restrict__ y, int ldy, int N, int KB, float* __restrict__ ws,
    int* __restrict__ tickets, int wfirst, int head, int tsplit) {
  constexpr int MT = 8 * NT, STAGES = ws_stages<NT, VIEW>(), SLOT = ws_slot<NT>(), XB = MT * 128;
  constexpr bool CORR = ws_corr_bytes<NT, VIEW>() > 0, RC = ws_rcorr<NT, VIEW>(), SMN = ws_pwg<NT>();
  constexpr int THREADS = ws_threads<NT>();
  extern __shared__ __align__(16) uint8_t smem_raw[];
  uint8_t* ring = smem_raw + ((1024 - (__cvta_generic_to_shared(smem_raw) & 1023)) & 1023);  // [STAGES][SLOT]
  float* corr = reinterpret_cast<float*>(ring + STAGES * SLOT);                              // [8][16][MT] (CORR)
  uint2* s_ent = reinterpret_cast<uint2*>(corr + (CORR ? 8 * 16 * MT : 0));                  // [8][WS_ECAP] (W12)
  uint64_t* full = reinterpret_cast<uint64_t*>(s_ent + (VIEW ? 0 : 8 * WS_ECAP));            // [STAGES]
  uint64_t* empty = full + STAGES;                                                           // [STAGES]
  int* s_toff = reinterpret_cast<int*>(empty + STAGES);                                      // [8][kps + 1]
  __shared__ __align__(16) uint8_t s_e[128];
  __shared__ int s_last;

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, t = lane & 3;
  // CTA -> (record row nb, split z of S).  The tail split (tsplit > 1, one M tile, no split along z): the record rows
  // past `head` — those that would leave the last wave part-empty — are cut into tsplit CTAs each, launched last; their
  // partials go to ws slot nb − head.
  const bool cut = tsplit > 1 && (int)blockIdx.x >= head;
  const int ci = blockIdx.x - head;  // a cut CTA's index among the cut rows' CTAs
  const int nb = cut ? head + ci / tsplit : blockIdx.x, z = cut ? ci % tsplit : blockIdx.z;
  const int S = cut ? tsplit : gridDim.z, mb = blockIdx.y, m0 = mb * MT;
  const int tile = mb * ((N + 127) / 128) + nb, slot = cut ? nb - head : tile;  // ticket, partials slot
  const int kps = (KB + S - 1) / S;
  const int a = min(KB, z * kps), b = min(KB, a + kps), nrec = b - a;
  if (tid == 0) {
    for (int s = 0; s < STAGES; ++s) {
      mbar_init(full + s, 1);
      mbar_init(empty + s, 8);
    }
    mbar_init_fence();
  }
  if (tid < 8) reinterpret_cast<uint4*>(s_e)[tid] = __ldg(reinterpret_cast<const uint4*>(expo + nb * 128) + tid);
  __syncthreads();

  float acc[NT][4];
#pragma unroll
  for (int j = 0; j < NT; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;
  int e_lo = 0, e_hi = 0;
  float* my_corr = CORR ? corr + (warp & 7) * 16 * MT : nullptr;  // [MT][16]: X row m, channel 16·warp + r at m·16 + r
  const int mcount = min(MT, M - m0);
  if (warp >= 8) {  // ---- producer (warp 8; at nt = 16 warps 9–11 only give their registers away)
    if constexpr (SMN) setmaxnreg_dec<ws_reg_producer<NT>()>();
    if (warp == 8)
    ws_produce<NT, VIEW, STAGES>(ring, full, empty, rec, xq, nb, KB, a, nrec, Mpad, m0, lane, wfirst != 0);
    bar_sync_all(THREADS);  // every slot consumed: the ring holds the CTA's sums from here on
    if constexpr (SMN) setmaxnreg_inc<ws_reg_launch<NT>()>();  // once the consumers have given theirs back
  } else {  // ---- consumers
    if constexpr (SMN) setmaxnreg_inc<ws_reg_consumer<NT>()>();
    float cr[RC ? NT : 1][4];  // RC: the warp's escape corrections in the accumulators' layout (ws_escapes_r)
#pragma unroll
    for (int j = 0; j < (RC ? NT : 1); ++j) cr[j][0] = cr[j][1] = cr[j][2] = cr[j][3] = 0.f;
    const int v0 = XB + (16 * warp + g) * 64 + 16 * t, v1 = v0 + 8 * 64;
    const int n0 = XB + VIEW_BYTES + (16 * warp + g) * 32 + 16 * (t & 1), n1 = n0 + 8 * 32;
    const uint32_t nkeep = nib_keep(t);
    int* my_toff = s_toff + warp * (kps + 1);
    uint2* my_ent = s_ent + warp * WS_ECAP;
    uint2 ent[2];  // the first WS_ECAP entries, loaded now, stored to my_ent after the first record's MMA issue
    ws_escape_prologue<MT, VIEW>(my_toff, my_corr, toff, tent, nb * 8 + warp, KB, a, nrec, lane, e_lo, e_hi, ent);
    int i = 0;
    // At nt = 16 and 4, records two at a time: a pair's eight wgmma in two commit groups, the first slot released after
    // `wgmma.wait_group 1` (its record's wgmma done) while the second record's run, the second after the last wait — the
    // chain's fixed latencies paid once per two records, in the same order as one at a time: the same sums and
    // corrections, bit for bit.  W12's pairs need the producer warpgroup's registers (ws_pwg): at the 96-register cap of
    // two 9-warp CTAs per SM its second fragment set spilled (nt = 8: 80 bytes, M = 64 0.981 → 0.797; nt = 4: 4 bytes,
    // M = 32 1.090 → 1.082), the view's did not (nt = 4: its M = 32 1.474 → 1.495; nt = 2, 8: no gain),
    // 2026-12-04-ab-ws-pairs-nt4-h200-s34.md.
    for (; (NT >= 16 || NT == 4) && i + 1 < nrec; i += 2) {
      const int s0 = i % STAGES, s1 = (i + 1) % STAGES;
      const uint8_t *slot0 = ring + s0 * SLOT, *slot1 = ring + s1 * SLOT;
      uint32_t fa[4][4], fb[4][4];
      mbar_wait(full + s0, (i / STAGES) & 1);
      ws_decode<VIEW>(slot0, v0, v1, n0, n1, nkeep, fa);
      mbar_wait(full + s1, ((i + 1) / STAGES) & 1);
      ws_decode<VIEW>(slot1, v0, v1, n0, n1, nkeep, fb);
      fence_acc(acc);
      wg_fence();
      ws_mma<NT>(acc, fa, saddr(slot0));
      wg_commit();
      ws_mma<NT>(acc, fb, saddr(slot1));
      wg_commit();
      if (!VIEW) {
        if (i == 0) ws_stage_entries(my_ent, ent, e_hi - e_lo, lane);
        ws_escapes_to<NT, RC>(my_toff, my_ent, e_lo, i, a, slot0, s_e + 16 * warp, my_corr, cr, g, t, lane);
      }
      wg_wait1();  // the first record's wgmma are done with slot 0: free it while the second record's run
      __syncwarp();
      if (lane == 0) mbar_arrive(empty + s0);
      if (!VIEW) {
        ws_escapes_to<NT, RC>(my_toff, my_ent, e_lo, i + 1, a, slot1, s_e + 16 * warp, my_corr, cr, g, t, lane);
      }
      wg_wait0();
      __syncwarp();
      if (lane == 0) mbar_arrive(empty + s1);  // this warp is done with both slots (A bytes, X by wgmma and escapes)
    }
    for (; i < nrec; ++i) {
      const int s = i % STAGES;
      mbar_wait(full + s, (i / STAGES) & 1);
      const uint8_t* slot = ring + s * SLOT;
      uint32_t fa[4][4];
      ws_decode<VIEW>(slot, v0, v1, n0, n1, nkeep, fa);
      fence_acc(acc);
      wg_fence();
      ws_mma<NT>(acc, fa, saddr(slot));
      wg_commit();
      if (!VIEW) {
        if (i == 0) ws_stage_entries(my_ent, ent, e_hi - e_lo, lane);
        ws_escapes_to<NT, RC>(my_toff, my_ent, e_lo, i, a, slot, s_e + 16 * warp, my_corr, cr, g, t, lane);
      }
      wg_wait0();
      __syncwarp();
      if (lane == 0) mbar_arrive(empty + s);  // this warp is done with the slot (A bytes, X by wgmma and escapes)
    }
    fence_acc(acc);  // the accumulators are read only after the last wait
    bar_sync_all(THREADS);  // every slot consumed: the ring holds the CTA's sums [MT][128] (X row-major) from here on
    // ---- epilogue per consumer warp: y = acc · 2^(E_n − 127) + corr (+ entries past WS_ECAP)
    float* red = reinterpret_cast<float*>(ring) + 16 * warp;  // its channels 16·warp + r of X row m at m·128 + r
    if constexpr (RC)
      ws_store_acc_r<NT>(red, acc, s_e + 16 * warp, cr, g, t);
    else
      ws_store_acc<NT, CORR>(red, acc, s_e + 16 * warp, my_corr, g, t);
    __syncwarp();
    ws_late_escapes<VIEW>(red, s_e + 16 * warp, e_lo, e_hi, tent, x, ldx, m0, mcount, lane);
    if constexpr (SMN) setmaxnreg_dec<ws_reg_launch<NT>()>();
  }
  if (S > 1 && cluster_size() == (uint32_t)S) {  // split K in a cluster pair (launch_ws: S = 2)
    finish_tile_cluster<MT, THREADS>(reinterpret_cast<float*>(ring), y, ldy, N, nb * 128, m0, mcount);
    return;
  }
  finish_tile<128, MT, THREADS, true>(reinterpret_cast<float*>(ring), ws, tickets, tile, slot, S, z, &s_last, y, ldy,
                                         N, nb * 128, m0, mcount);
}

// =================================================================================================
// W12 GEMM for M ≤ 32 as one stream per CTA (the "stream" kernel)
// =================================================================================================
// The matrix's T = NB·KB records lie in memory row after row (record i = row nb · KB + kb).  CTA p of P takes the
// records [g0, g1) = [⌊p·T/P⌋, ⌊(p+1)·T/P⌋): one contiguous byte range, streamed record by record into a ring of
// `stages` slots by warp W (the producer, after the W consumer warps): lane 0 copies the record (12 KB; the view its
// 8 KB of view bytes) with one bulk copy, as ws_produce does, and the 32 lanes copy its X tile — X[0 .. M), columns
// 64·kb .. +63 — with 16-byte cp.async in X's own column order, chunk q of row m at q ^ (m & 7) (stream_x_off), all
// counted on the slot's `full` mbarrier (no reorder kernel: the X tile is read from X as it lies; rows ≥ M are neither
// copied nor read, the consumers take zeros for them).  Consumer warp w takes the 16-channel tiles H·w .. H·w + H − 1
// (H = 8 / W) of every record: the skinny kernel's lane layout, decode4 and mma.sync m16n8k16 (X row 8j + g, columns
// 16t .. 16t + 15: chunks 2t, 2t + 1 of the row, conflict-free through the swizzle), and releases the slot once its
// record words and X words are read.  A row's records in one CTA are a segment; at a segment's end each warp, on its
// own (no CTA barrier), for each of its tiles: out = acc · 2^(E_n − 127), then + x[m, col] · (w − w_code) for the
// segment's escapes in list order (offsets, entries and X words fetched in three dependent steps while the segment's
// records stream: StreamEsc).  A whole row is stored; a part of one is published as partial j of the row's segments
// (CTAs p_lo .. p_hi hold it) and the warp that takes the row's ticket last adds them in the order j = 0, 1, … and
// stores: the same bits whatever the arrival order (the skinny kernel's split-K sums: each segment its own escapes).
// Why: at one row the skinny kernel streams the LM heads at ~4.1 TB/s, while a bare ring of bulk copies at two CTAs per
// SM streams the same bytes at ~4.3 (bench/tma_stream.py, 2026-12-04-tma-stream-shapes-h200-s32.md); at 32 rows the ws
// kernel pays an X reorder kernel, a per-CTA escape prologue and a split-K epilogue around a short loop
// (bench/ws_trace.py, 2026-12-05-ws-trace-h200-s39-call1.md); and one contiguous range per CTA leaves no part-empty
// last wave.  Prepared in sessions 40–41 without a GPU: bench/stream_model.py checks its index maths on the CPU,
// bench/stream_kernel.py checks and times it on the GPU.
__device__ __forceinline__ long stream_first(int p, int P, long T) { return (long)p * T / P; }  // CTA p's first record
__device__ __forceinline__ int stream_owner(long i, int P, long T) {  // the CTA whose range holds record i
  return (int)(((i + 1) * P - 1) / T);
}
// Byte offset of X row m's 16-byte chunk q (columns 8q .. 8q + 7 of the record) in a slot's X tile.
__device__ __forceinline__ int stream_x_off(int m, int q) { return m * 128 + ((q ^ (m & 7)) << 4); }

// cp.async of 16 bytes that bypasses L1 (.cg: each X chunk is read once per CTA)
__device__ __forceinline__ void cp_async16_cg(uint32_t dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(src) : "memory");
}
// one arrival on bar once all of this thread's cp.async so far have landed (counted in the barrier's arrivals)
__device__ __forceinline__ void cp_async_arrive(uint64_t* bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" ::"r"(saddr(bar)) : "memory");
}

constexpr int STREAM_ECH = 16;  // escape entries per chunk (lanes 0–15 each stage one)
// float4 loads of a split row's partials that its last-arriving warp has in flight: ⌊STREAM_LOADS / nt⌋ partials,
// each with its nt n-tiles.  A row spans ~KB·P/T + 1 CTAs: up to ~9 on the one-wave shapes (4096² at two CTAs per SM:
// ~7.8 records per CTA, KB = 64), 2 on the LM heads; loaded one at a time they were that many L2 round trips per
// n-tile at the kernel's end (session 34's stream-K, w12_gemv_tried.md); this way ⌈S / ⌊6 / nt⌋⌉ in all.  Not more:
// with 8, the 8-warp nt = 4 W12 build spilled into its record loop (96-register cap).
constexpr int STREAM_LOADS = 6;

// One 16-channel tile's escapes of a segment (tile c = nb·8 + tile, records [ka, kend) of row nb), staged in its
// warp's shared memory by cp.async (no registers held) in three steps whose loads depend on each other: the offsets
// (start, registers), the entries of a chunk (entries), their columns' X words for rows m < M (xwords, issued once
// the entries are in: the caller waits for them).
template <int MT>
struct StreamEsc {
  int e_lo, e_hi;  // the segment's entries: tent[e_lo .. e_hi)
  uint8_t* at;     // the staging: ent, xw, d

  static constexpr int BYTES = STREAM_ECH * (8 + 4 * MT + 4);  // the staging of one tile
  // [STREAM_ECH] the chunk's entries; [STREAM_ECH][MT] the X word (two columns) holding x[m, col] of each; [STREAM_ECH]
  // w − w_code of each (derived from `at` where used: a warp holds H of these across its record loop)
  __device__ __forceinline__ uint2* ent() const { return reinterpret_cast<uint2*>(at); }
  __device__ __forceinline__ uint32_t* xw() const { return reinterpret_cast<uint32_t*>(at + 8 * STREAM_ECH); }
  __device__ __forceinline__ float* d() const { return reinterpret_cast<float*>(at + (8 + 4 * MT) * STREAM_ECH); }
  __device__ __forceinline__ void start(const int32_t* toff, int c, int KB, int ka, int kend) {
    e_lo = __ldg(toff + (long)c * KB + ka);
    e_hi = __ldg(toff + (long)c * KB + kend);
  }
  __device__ __forceinline__ void entries(const int32_t* tent, int base, int lane) {
    if (lane < STREAM_ECH && base + lane < e_hi) cp_async8(ent() + lane, tent + 2 * (long)(base + lane));
  }
  __device__ __forceinline__ void xwords(const __nv_bfloat16* x, int ldx, int M, int base, int lane) {
    const int n = min(STREAM_ECH, e_hi - base);
    for (int i = lane; i < n * M; i += 32) {  // (entry e, row m): consecutive lanes, consecutive entries
      const int e = i % n, m = i / n;
      cp_async4(xw() + e * MT + m, x + (size_t)m * ldx + (ent()[e].x & 0xFFFFFEu));
    }
  }
};

// Every cp.async of the warp's lanes so far has landed and is visible to the whole warp.
__device__ __forceinline__ void warp_copies_in() {
  cp_async_wait_all();
  __syncwarp();
}

// The escapes of one chunk of ≤ STREAM_ECH entries (ent, xw complete) onto a tile's outputs (out: the m16n8 D
// layout per n-tile j, channels g, g + 8 of its 16 and X rows 8j + 2t, +1): each output adds its channel's entries in
// list order.  Eg, Eg8: the exponents of channels g, g + 8.
template <int NT>
__device__ __forceinline__ void stream_escape_chunk(float (&out)[NT][4], const StreamEsc<8 * NT>& e, int base, int Eg,
                                                    int Eg8, int M, int g, int t, int lane) {
  constexpr int MT = 8 * NT;
  const int n = min(STREAM_ECH, e.e_hi - base);
  const uint2* ent = e.ent();
  const uint32_t* xw = e.xw();
  float* d = e.d();
  const int er = lane < n ? (int)(ent[lane].x >> 24) : -1;
  const int ea = __shfl_sync(0xffffffffu, Eg, (er & 7) * 4), eb = __shfl_sync(0xffffffffu, Eg8, (er & 7) * 4);
  if (lane < n) d[lane] = esc_delta(ent[lane].y, er >= 8 ? eb : ea);
  uint32_t mine[2] = {0u, 0u};  // bit e: entry base + e belongs to channel g (mine[0]) or g + 8 (mine[1])
#pragma unroll
  for (int r = 0; r < 16; ++r) {
    const uint32_t bm = __ballot_sync(0xffffffffu, er == r);
    if (r == g) mine[0] = bm;
    if (r == g + 8) mine[1] = bm;
  }
  __syncwarp();  // d complete (and every lane's X word copies waited for by the caller)
#pragma unroll
  for (int j = 0; j < NT; ++j)
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int b = 0; b < 2; ++b) {
        const int m = 8 * j + 2 * t + b;
        if (m < M)
          for (uint32_t bm = mine[h]; bm; bm &= bm - 1) {
            const int q = __ffs(bm) - 1;
            const uint32_t w = xw[q * MT + m] >> (16 * (ent[q].x & 1u));
            out[j][2 * h + b] = fmaf(__bfloat162float(__ushort_as_bfloat16((uint16_t)w)), d[q], out[j][2 * h + b]);
          }
      }
  __syncwarp();  // read before the next chunk overwrites the staging
}

// A tile's outputs (the D layout above) of row nb, channels n0 + …, into y.
template <int NT>
__device__ __forceinline__ void stream_store(const float (&out)[NT][4], __nv_bfloat16* y, int ldy, int N, int M, int n0,
                                             int g, int t) {
#pragma unroll
  for (int j = 0; j < NT; ++j)
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const int n = n0 + g + 8 * (k >> 1), m = 8 * j + 2 * t + (k & 1);
      if (m < M && n < N) y[(size_t)m * ldy + n] = __float2bfloat16_rn(out[j][k]);
    }
}

template <int NT, bool VIEW>
__host__ __device__ constexpr int stream_slot() {  // X tile, then the record's bytes
  return 8 * NT * 128 + (VIEW ? VIEW_BYTES : REC);
}

// W consumer warps (8: 16 channels each, two CTAs per SM; 4: 32 channels each, up to three CTAs per SM).  With 8, two
// 9-warp CTAs put 5 warps on one SM sub-partition: 96 registers, which nt = 1 / 2 / 4 fill (92 / 96 / 96, the view
// 78 / 80 / 96; at nt = 4 W12 spills 16 bytes outside the record loop); each n-tile's X words are loaded just before its MMAs for that (all of them loaded
// first, nt = 4 took 118 registers, or spilled 40 bytes at this cap).  With 4, a warp runs both of its tiles' MMAs on
// each X word it loads: half the X tile's shared-memory reads per record (at 32 rows they are 32 of a record's ~60 KB
// of shared-memory traffic with 8 warps), with the CTA's four warps in the place of eight (127 / 128 / 152 registers,
// the view 110 / 110 / 136; no spills).
template <int W>
__host__ __device__ constexpr int stream_threads() { return 32 * (W + 1); }
template <int NT, int W>
__host__ __device__ constexpr int stream_min_ctas() { return W == 8 || NT == 4 ? 2 : 3; }

// The ring depth and the CTAs per SM are the config's (StreamConfig).
template <int NT, bool VIEW, int W>
__global__ void __launch_bounds__(stream_threads<W>(), stream_min_ctas<NT, W>()) w12_stream_kernel(
    const __nv_bfloat16* __restrict__ x, int M, int ldx, const uint8_t* __restrict__ rec,
    const uint8_t* __restrict__ expo, const int32_t* __restrict__ toff, const int32_t* __restrict__ tent,
    __nv_bfloat16* __restrict__ y, int ldy, int N, int KB, long T, float* __restrict__ ws, int* __restrict__ tickets,
    int stages, int wfirst) {
  static_assert(W == 8 || W == 4, "8 or 4 consumer warps");
  constexpr int MT = 8 * NT, XB = MT * 128, SLOT = stream_slot<NT, VIEW>(), H = 8 / W;  // H: tiles per warp
  constexpr uint32_t WBYTES = VIEW ? VIEW_BYTES : REC;
  extern __shared__ __align__(16) uint8_t smem_raw[];
  uint8_t* ring = smem_raw + ((128 - (__cvta_generic_to_shared(smem_raw) & 127)) & 127);  // [stages][SLOT]
  uint64_t* full = reinterpret_cast<uint64_t*>(ring + (size_t)stages * SLOT);             // [stages]
  uint64_t* empty = full + stages;                                                           // [stages]
  uint8_t* s_esc = reinterpret_cast<uint8_t*>(empty + stages);                               // (W12) [8 tiles][BYTES]
  int* s_next = reinterpret_cast<int*>(s_esc + 8 * StreamEsc<MT>::BYTES);  // (W12) [8 tiles][2]: next row's e_lo, e_hi
  const int P = gridDim.x, p = blockIdx.x, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const long g0 = stream_first(p, P, T), g1 = stream_first(p + 1, P, T);
  const int n = (int)(g1 - g0);
  if (n == 0) return;
  if (tid == 0) {
    for (int s = 0; s < stages; ++s) {
      mbar_init(full + s, 33);  // the producer's lane 0 (expect_tx, the record's bulk copy) + its 32 lanes' X copies
      mbar_init(empty + s, W);
    }
    mbar_init_fence();
  }
  __syncthreads();
  if (warp == W) {  // ---- producer: the CTA's records, in memory order, and their X tiles into the ring
    uint64_t first;
    asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(first));
    const uint8_t* src = rec + (size_t)g0 * REC;
    int s = 0, kb = (int)(g0 % KB);
    uint32_t ph = 0;  // the parity of the empty phase that slot s's next refill waits for (none in the first pass)
    for (int i = 0; i < n; ++i) {
      if (i >= stages) mbar_wait(empty + s, ph);
      uint8_t* slot = ring + (size_t)s * SLOT;
      if (lane == 0) {
        mbar_expect(full + s, WBYTES);
        if (wfirst)
          bulk_g2s(slot + XB, src + (size_t)i * REC, WBYTES, full + s, first);
        else
          bulk_g2s(slot + XB, src + (size_t)i * REC, WBYTES, full + s);
      }
      for (int c = lane; c < M * 8; c += 32) {  // chunk q of X row m < M (rows ≥ M are never read)
        const int m = c >> 3, q = c & 7;
        cp_async16_cg(saddr(slot + stream_x_off(m, q)), x + (size_t)m * ldx + kb * 64 + 8 * q);
      }
      cp_async_arrive(full + s);
      if (++s == stages) {
        s = 0;
        if (i >= stages) ph ^= 1u;
      }
      if (++kb == KB) kb = 0;
    }
    cp_async_wait_all();  // no copy outlives its thread
    return;
  }
  // ---- consumers: warp w takes the tiles H·w .. H·w + H − 1 of every record (tile u: channels 16u .. 16u + 15)
  const int g = lane >> 2, t = lane & 3, u0 = H * warp;
  const int v0 = XB + (16 * u0 + g) * 64 + 16 * t, v1 = v0 + 8 * 64;  // tile u0 + h: + h · 16 · 64
  const int n0 = XB + VIEW_BYTES + (16 * u0 + g) * 32 + 16 * (t & 1), n1 = n0 + 8 * 32;  // + h · 16 · 32
  const uint32_t nkeep = nib_keep(t);
  StreamEsc<MT> esc[H];
#pragma unroll
  for (int h = 0; h < H; ++h) esc[h].at = s_esc + (u0 + h) * StreamEsc<MT>::BYTES;
  int nb = (int)(g0 / KB), kb = (int)(g0 % KB), ka = kb;
  auto seg_end = [&](int row) { return (int)min((long)KB, g1 - (long)row * KB); };  // kend of row's segment
  int Eg[H], Eg8[H];  // the exponents of channels g, g + 8 of each tile
  // Row nb's segment, records [ka, seg_end(nb)): its exponents, its escape offsets (the CTA's first row: loaded here;
  // a later row: staged in s_next while the row before streamed) and its first chunk of entries, issued at once; the
  // next row's offsets staged in s_next.  A CTA whose range spans two rows otherwise waited at its mid-loop segment
  // end for those loads one after the other (the CTAs that end last: 2026-12-06-stream-trace-late-ctas-h100-s44).
  auto row_start = [&](bool first) {
    if (!VIEW && !first) warp_copies_in();  // s_next
#pragma unroll
    for (int h = 0; h < H; ++h) {
      Eg[h] = __ldg(expo + nb * 128 + 16 * (u0 + h) + g), Eg8[h] = __ldg(expo + nb * 128 + 16 * (u0 + h) + g + 8);
      if (VIEW) continue;
      const int c = nb * 8 + u0 + h;
      if (first)
        esc[h].start(toff, c, KB, ka, seg_end(nb));
      else
        esc[h].e_lo = s_next[2 * (u0 + h)], esc[h].e_hi = s_next[2 * (u0 + h) + 1];
    }
    if (VIEW) return;
    __syncwarp();  // s_next read by every lane before lane 0 refills it
#pragma unroll
    for (int h = 0; h < H; ++h) {
      const int c = nb * 8 + u0 + h;
      if (lane == 0 && (long)(nb + 1) * KB < g1) {
        cp_async4(s_next + 2 * (u0 + h), toff + (long)(c + 8) * KB);
        cp_async4(s_next + 2 * (u0 + h) + 1, toff + (long)(c + 8) * KB + seg_end(nb + 1));
      }
      esc[h].entries(tent, esc[h].e_lo, lane);
    }
  };
  row_start(true);
  // the segment's first chunk of escapes: its entries issued by row_start, its X words (xstaged) after record xat of
  // the segment (0 in the CTA's first row, whose entries had the first record's wait to land; 2 later)
  bool xstaged = false;
  int xat = 0;
  float acc[H][NT][4];
#pragma unroll
  for (int h = 0; h < H; ++h)
#pragma unroll
    for (int j = 0; j < NT; ++j) acc[h][j][0] = acc[h][j][1] = acc[h][j][2] = acc[h][j][3] = 0.f;
  int s = 0;
  uint32_t ph = 0;
  for (int i = 0; i < n; ++i) {
    mbar_wait(full + s, ph);
    const uint8_t* slot = ring + (size_t)s * SLOT;
    uint32_t fa[H][4][4];
#pragma unroll
    for (int h = 0; h < H; ++h) ws_decode<VIEW>(slot, v0 + h * 1024, v1 + h * 1024, n0 + h * 512, n1 + h * 512, nkeep,
                                                fa[h]);
#pragma unroll
    for (int j = 0; j < NT; ++j) {  // X row 8j + g, columns 16t .. 16t + 7 (xa) and 16t + 8 .. 16t + 15 (xb)
      const bool xok = 8 * j + g < M;  // rows ≥ M: zeros, not in the slot
      const uint4 xa = xok ? *reinterpret_cast<const uint4*>(slot + stream_x_off(8 * j + g, 2 * t)) : uint4{};
      const uint4 xb = xok ? *reinterpret_cast<const uint4*>(slot + stream_x_off(8 * j + g, 2 * t + 1)) : uint4{};
#pragma unroll
      for (int h = 0; h < H; ++h)
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          const uint4& q = k < 2 ? xa : xb;
          mma16816(acc[h][j], fa[h][k][0], fa[h][k][1], fa[h][k][2], fa[h][k][3], word(q, 2 * (k & 1)),
                   word(q, 2 * (k & 1) + 1));
        }
    }
    __syncwarp();  // every lane's words are read: the slot is free
    if (lane == 0) mbar_arrive(empty + s);
    if (++s == stages) s = 0, ph ^= 1u;
    const bool last = kb == KB - 1 || i == n - 1;  // the segment's last record
    const int seen = kb - ka;                     // records of the segment before this one
    if (!VIEW && !last && seen == xat && !xstaged) {  // the X words of the first chunk, under the records' stream
      warp_copies_in();  // the entries
#pragma unroll
      for (int h = 0; h < H; ++h) esc[h].xwords(x, ldx, M, esc[h].e_lo, lane);
      xstaged = true;
    }
    if (!last) {
      ++kb;
      continue;
    }
    // ---- the segment of row nb ends here: records [ka, kb] of it
    float out[H][NT][4];
#pragma unroll
    for (int h = 0; h < H; ++h) {
      const float s0 = __int_as_float(Eg[h] << 23), s1 = __int_as_float(Eg8[h] << 23);  // 2^(E_n − 127), exact
#pragma unroll
      for (int jj = 0; jj < NT; ++jj)
        out[h][jj][0] = acc[h][jj][0] * s0, out[h][jj][1] = acc[h][jj][1] * s0, out[h][jj][2] = acc[h][jj][2] * s1,
        out[h][jj][3] = acc[h][jj][3] * s1;
    }
    if (!VIEW) {
#pragma unroll
      for (int h = 0; h < H; ++h)
        for (int base = esc[h].e_lo; base < esc[h].e_hi; base += STREAM_ECH) {
          const bool staged = base == esc[h].e_lo;  // the first chunk: its entries staged, its X words if xstaged
          if (!staged) esc[h].entries(tent, base, lane);
          if (!staged || !xstaged) {
            warp_copies_in();
            esc[h].xwords(x, ldx, M, base, lane);
          }
          warp_copies_in();
          stream_escape_chunk<NT>(out[h], esc[h], base, Eg[h], Eg8[h], M, g, t, lane);
        }
    }
    const long row0 = (long)nb * KB;
    const int plo = stream_owner(row0, P, T), phi = stream_owner(row0 + KB - 1, P, T);
    if (plo == phi) {
#pragma unroll
      for (int h = 0; h < H; ++h) stream_store<NT>(out[h], y, ldy, N, M, nb * 128 + 16 * (u0 + h), g, t);
    } else {  // part of a row: partial (CTA p, its first or last row) into ws, then the warp's ticket for the row
      float4* ws4 = reinterpret_cast<float4*>(ws);
      // Row nb is the first row of each CTA q in plo + 1 .. phi (their ranges start inside it), and of plo when plo's
      // range starts at the row: partial slot 0 there, else 1 (plo's last row).
      const bool lo_first = stream_first(plo, P, T) == row0;
      auto part = [&](int q, int h, int jj) {  // CTA q's partial of row nb, tile u0 + h, n-tile jj, for this lane
        const int which = q > plo || lo_first ? 0 : 1;
        return ws4 + (((((size_t)q * 2 + which) * 8 + u0 + h) * NT + jj) * 32 + lane);
      };
#pragma unroll
      for (int h = 0; h < H; ++h)
#pragma unroll
        for (int jj = 0; jj < NT; ++jj)
          __stcg(part(p, h, jj), make_float4(out[h][jj][0], out[h][jj][1], out[h][jj][2], out[h][jj][3]));
      __threadfence();
      __syncwarp();
      int tk = 0;
      if (lane == 0) tk = atomicAdd(tickets + nb * 8 + u0, 1);
      tk = __shfl_sync(0xffffffffu, tk, 0);
      if (tk == phi - plo) {  // the last of the row's segments to arrive: add them in CTA order
        __threadfence();
#pragma unroll
        for (int h = 0; h < H; ++h) {
          constexpr int QB = STREAM_LOADS / NT > 0 ? STREAM_LOADS / NT : 1;  // partials per batch, loaded together
          float4 a[NT];
#pragma unroll
          for (int jj = 0; jj < NT; ++jj) a[jj] = make_float4(0.f, 0.f, 0.f, 0.f);
          for (int q0 = plo; q0 <= phi; q0 += QB) {  // each n-tile's partials added in CTA order
            float4 v[QB][NT];
#pragma unroll
            for (int k = 0; k < QB; ++k)
              if (q0 + k <= phi)
#pragma unroll
                for (int jj = 0; jj < NT; ++jj) v[k][jj] = __ldcg(part(q0 + k, h, jj));
#pragma unroll
            for (int k = 0; k < QB; ++k)
              if (q0 + k <= phi)
#pragma unroll
                for (int jj = 0; jj < NT; ++jj) add4(a[jj], v[k][jj]);
          }
          float sum[NT][4];
#pragma unroll
          for (int jj = 0; jj < NT; ++jj)
            sum[jj][0] = a[jj].x, sum[jj][1] = a[jj].y, sum[jj][2] = a[jj].z, sum[jj][3] = a[jj].w;
          stream_store<NT>(sum, y, ldy, N, M, nb * 128 + 16 * (u0 + h), g, t);
        }
        if (lane == 0) tickets[nb * 8 + u0] = 0;
      }
    }
    if (i + 1 == n) break;
    // ---- the next row's segment
    ++nb, kb = 0, ka = 0, xstaged = false, xat = 2;
#pragma unroll
    for (int h = 0; h < H; ++h)
#pragma unroll
      for (int jj = 0; jj < NT; ++jj) acc[h][jj][0] = acc[h][jj][1] = acc[h][jj][2] = acc[h][jj][3] = 0.f;
    row_start(false);
  }
}

// ring, barriers and (W12) the 8 tiles' escape staging
template <int NT, bool VIEW>
size_t stream_smem(int stages) {
  return 128 + (size_t)stages * (stream_slot<NT, VIEW>() + 16) + (VIEW ? 0 : 8 * StreamEsc<8 * NT>::BYTES + 64);
}

// Raises a kernel's dynamic shared-memory limit on the current device to smem the first time a launch there needs more
// (set: its limit so far, per device: a function's attributes belong to each device's context, so a process that runs
// layers on two GPUs sets them on each).
constexpr int MAX_DEVICES = 64;
template <typename Kern>
cudaError_t raise_smem(Kern kern, size_t smem, size_t* set) {  // set: [MAX_DEVICES]
  int dev = 0;
  if (cudaError_t e = cudaGetDevice(&dev)) return e;
  if (dev < 0 || dev >= MAX_DEVICES) return cudaErrorInvalidDevice;
  if (smem <= set[dev]) return cudaSuccess;
  cudaError_t e = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
  if (e == cudaSuccess) set[dev] = smem;
  return e;
}

// The stream kernel's dynamic shared-memory limit so far per device (raise_smem), one per instantiation: shared by its
// launches and its occupancy query, which must not lower it under a launch that set it higher.
template <int NT, bool VIEW, int W>
size_t* stream_smem_set() {
  static size_t set[MAX_DEVICES] = {};
  return set;
}

template <int NT, bool VIEW, int W>
cudaError_t launch_stream(const void* x, int M, int ldx, const void* rec, const void* expo, const void* toff,
                          const void* tent, void* y, int ldy, int N, int NB, int KB, int ctas, int stages, void* ws,
                          void* tickets, int wfirst, cudaStream_t st) {
  auto kern = w12_stream_kernel<NT, VIEW, W>;
  const size_t smem = stream_smem<NT, VIEW>(stages);
  if (cudaError_t e = raise_smem(kern, smem, stream_smem_set<NT, VIEW, W>())) return e;
  // at most one CTA per record: every CTA's range is then non-empty, so a row's segments are the CTAs p_lo .. p_hi
  kern<<<(int)min((long)ctas, (long)NB * KB), stream_threads<W>(), smem, st>>>(
      (const __nv_bfloat16*)x, M, ldx, (const uint8_t*)rec, (const uint8_t*)expo, (const int32_t*)toff,
      (const int32_t*)tent, (__nv_bfloat16*)y, ldy, N, KB, (long)NB * KB, (float*)ws, (int*)tickets, stages, wfirst);
  return cudaGetLastError();
}

template <int NT, bool VIEW>
cudaError_t launch_ws(const void* x, int M, int ldx, const void* rec, const void* expo, const void* toff,
                      const void* tent, void* y, int ldy, int N, int NB, int KB, int split, void* ws, void* tickets,
                      void* xq, cudaStream_t st, int wfirst, int head, int tsplit) {
  static_assert(128 * 8 * NT * 4 <= ws_stages<NT, VIEW>() * ws_slot<NT>(), "the sums fit in the ring");
  auto kern = w12_gemm_ws_kernel<NT, VIEW>;
  const int kps = (KB + split - 1) / split;
  const size_t smem = ws_smem<NT, VIEW>(kps);
  static size_t set[MAX_DEVICES] = {};  // this kernel's dynamic shared-memory limit so far, per device
  if (cudaError_t e = raise_smem(kern, smem, set)) return e;
  const int mtiles = (M + 8 * NT - 1) / (8 * NT), mpad = mtiles * 8 * NT;
  const long words = (long)mpad * KB * 32;
  w12_x_ws_kernel<<<(int)min(2048L, (words + 255) / 256), 256, 0, st>>>((const __nv_bfloat16*)x, ldx, (uint32_t*)xq,
                                                                        M, mpad, KB * 64);
  cudaLaunchConfig_t cfg = {};
  if (tsplit > 1 && (split != 1 || mtiles != 1 || head < 0 || head > NB)) return cudaErrorInvalidValue;
  cfg.gridDim = dim3(tsplit > 1 ? head + (NB - head) * tsplit : NB, mtiles, split);
  cfg.blockDim = dim3(ws_threads<NT>());
  cfg.dynamicSmemBytes = smem;
  cfg.stream = st;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;  // split K in a cluster pair (finish_tile_cluster)
  attr[0].val.clusterDim.x = 1;
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = split;
  cfg.attrs = attr;
  cfg.numAttrs = split == 2 ? 1 : 0;  // gemm_cuda.CLUSTER_SPLIT
  return cudaLaunchKernelEx(&cfg, kern, (const __nv_bfloat16*)x, (const uint8_t*)xq, mpad, M, ldx, (const uint8_t*)rec,
                            (const uint8_t*)expo, (const int32_t*)toff, (const int32_t*)tent, (__nv_bfloat16*)y, ldy,
                            N, KB, (float*)ws, (int*)tickets, wfirst, head, tsplit);
}

struct Args {
  const void *x, *rec, *expo, *toff, *tent;
  void *y, *ws, *tickets;
  int M, ldx, ldy, N, NB, KB, split;
  int* occupancy;  // non-null: report the kernel's resident CTAs per SM here instead of launching
  int pdl;         // 1: launch with programmatic stream serialization (PDL, see pdl_wait)
  int l2_pct;      // weight_policy: % of the weight lines loaded evict_normal (the rest evict_first)
};

template <int NT, bool VIEW, int WARPS, int U, bool TRACE = false, bool XREG = false>
cudaError_t launch_t(const Args& a, cudaStream_t stream) {
  if (a.occupancy)
    return cudaOccupancyMaxActiveBlocksPerMultiprocessor(a.occupancy, w12_gemv_kernel<NT, VIEW, WARPS, U, false, XREG>,
                                                         WARPS * 32, 0);
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3((a.M + 8 * NT - 1) / (8 * NT), a.NB * 8, a.split);  // see w12_gemv_kernel's c, m0
  cfg.blockDim = dim3(WARPS * 32);
  cfg.stream = stream;
  cudaLaunchAttribute attr[2];
  int n = 0;
  if (a.pdl) {
    attr[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[n++].val.programmaticStreamSerializationAllowed = 1;
  }
  if (a.split == 2) {  // split K in a cluster pair (finish_pair; gemm_cuda.CLUSTER_SPLIT)
    attr[n].id = cudaLaunchAttributeClusterDimension;
    attr[n].val.clusterDim.x = 1;
    attr[n].val.clusterDim.y = 1;
    attr[n++].val.clusterDim.z = 2;
  }
  cfg.attrs = attr;
  cfg.numAttrs = n;
  return cudaLaunchKernelEx(&cfg, w12_gemv_kernel<NT, VIEW, WARPS, U, TRACE, XREG>, (const __nv_bfloat16*)a.x, a.M, a.ldx,
                            (const uint8_t*)a.rec, (const uint8_t*)a.expo, (const int32_t*)a.toff,
                            (const int32_t*)a.tent, (__nv_bfloat16*)a.y, a.ldy, a.N, a.KB, (float*)a.ws,
                            (int*)a.tickets, a.l2_pct);
}

template <int NT, bool VIEW>
cudaError_t launch_wu(int warps, int unroll, int xreg, const Args& a, cudaStream_t st) {
  if (xreg) {  // the XREG form: nt = 4, unroll 1 only
    if constexpr (NT == 4)
      if (warps == 4 && unroll == 1) return launch_t<NT, VIEW, 4, 1, false, true>(a, st);
      else if (warps == 8 && unroll == 1) return launch_t<NT, VIEW, 8, 1, false, true>(a, st);
    return cudaErrorInvalidValue;
  }
#define W12_CASE(W, UU) \
  if (warps == W && unroll == UU) return launch_t<NT, VIEW, W, UU>(a, st);
  W12_CASE(4, 1) W12_CASE(4, 2) W12_CASE(8, 1) W12_CASE(8, 2)
#undef W12_CASE
  return cudaErrorInvalidValue;
}

// the launchers above by config (or, with a.occupancy set, the kernel's resident CTAs per SM)
int dispatch(const Args& a, int view, int nt, int warps, int unroll, int xreg, cudaStream_t st) {
#define W12_NT(NTV) \
  if (nt == NTV) \
    return view ? launch_wu<NTV, true>(warps, unroll, xreg, a, st) : launch_wu<NTV, false>(warps, unroll, xreg, a, st);
  W12_NT(1) W12_NT(2) W12_NT(4) W12_NT(8)
#undef W12_NT
  return (int)cudaErrorInvalidValue;
}

}  // namespace

// Returns a cudaError_t (0 = launched).  nt: X rows per tile / 8 (1, 2, 4, 8); warps: 4 or 8; unroll:
// records per pipeline stage per warp (1, 2; two stages in flight); split: CTAs along K (split > 1 needs
// ws: fp32 [NB·8 · ceil(M / 8nt) · split · 16 · 8nt] and tickets: int32 zeros [NB·8 · ceil(M / 8nt)], which
// the kernel leaves at zero).  toff/tent: the per-tile escape lists (gemm_cuda.tile_escapes; unused for the view).
// pdl: 1 = programmatic dependent launch (the kernel may start while the previous kernel in the stream
// finishes; it reads X only once that kernel is complete).  l2_pct: % of the weight lines loaded with L2 priority
// evict_normal, the rest evict_first (weight_policy; 0–100).  xreg: 1 = the XREG form (X words of the next
// records in registers; nt = 4, unroll 1 only).
// Preconditions (checked by the Python caller): K = 64·KB, x and ldx 16-byte aligned, records contiguous.
extern "C" int w12_gemv(const void* x, int M, int ldx, const void* rec, const void* expo, const void* toff,
                        const void* tent, void* y, int ldy, int N, int NB, int KB, int view, int nt, int warps,
                        int unroll, int split, void* ws, void* tickets, int pdl, void* stream, int l2_pct, int xreg) {
  if (split < 1 || split > KB || split > 8) return (int)cudaErrorInvalidValue;  // splitk_last: S ≤ 8
  if (l2_pct < 0 || l2_pct > 100) return (int)cudaErrorInvalidValue;
  Args a{x, rec, expo, toff, tent, y, ws, tickets, M, ldx, ldy, N, NB, KB, split, nullptr, pdl, l2_pct};
  return dispatch(a, view, nt, warps, unroll, xreg, (cudaStream_t)stream);
}

// The skinny kernel's resident CTAs per SM for a config (registers and shared memory), for the wave count
// CTAs / (blocks · SMs) that bench/kernels.py reports.  Returns a cudaError_t; *blocks gets the count.
extern "C" int w12_gemv_occupancy(int view, int nt, int warps, int unroll, int xreg, int* blocks) {
  Args a{};
  a.occupancy = blocks;
  return dispatch(a, view, nt, warps, unroll, xreg, nullptr);
}

// The skinny kernel's TRACE build for nt = 1 (M ≤ 8): as w12_gemv, plus trace: u64 [8 · CTAs] (CTAs = NB·8 ·
// ceil(M / 8) · split), which gets each CTA's (globaltimer, clock64) at entry, loop end and exit, and its SM.
extern "C" int w12_gemv_trace(const void* x, int M, int ldx, const void* rec, const void* expo, const void* toff,
                              const void* tent, void* y, int ldy, int N, int NB, int KB, int view, int warps,
                              int unroll, int split, void* ws, void* tickets, void* trace, void* stream, int l2_pct) {
  cudaStream_t st = (cudaStream_t)stream;
  if (split < 1 || split > KB || split > 8) return (int)cudaErrorInvalidValue;
  if (l2_pct < 0 || l2_pct > 100) return (int)cudaErrorInvalidValue;
  // g_trace is set only when the buffer changes: a copy from this stack frame captured into a CUDA graph would read
  // a dead host address on replay, so a graph replays the launches of a buffer set before the capture.
  static void* current = nullptr;
  if (trace != current) {
    cudaError_t e = cudaMemcpyToSymbol(g_trace, &trace, sizeof(trace));
    if (e != cudaSuccess) return (int)e;
    current = trace;
  }
  Args a{x, rec, expo, toff, tent, y, ws, tickets, M, ldx, ldy, N, NB, KB, split, nullptr, 0, l2_pct};
#define W12_TR(V, W, UU) \
  if (!!view == V && warps == W && unroll == UU) return launch_t<1, V, W, UU, true>(a, st);
  W12_TR(false, 4, 1) W12_TR(false, 4, 2) W12_TR(false, 8, 1) W12_TR(false, 8, 2)
  W12_TR(true, 4, 1) W12_TR(true, 4, 2) W12_TR(true, 8, 1) W12_TR(true, 8, 2)
#undef W12_TR
  return (int)cudaErrorInvalidValue;
}

// The warp-specialized W12 GEMM for 9 ≤ M ≤ 128 (w12_gemm_ws_kernel above).  nt: X rows per CTA / 8 (2, 4, 6, 8, 16);
// split: CTAs along K (split > 1 needs ws: fp32 [NB · ceil(M / 8nt) · split · 128 · 8nt] and tickets: int32 zeros
// [NB · ceil(M / 8nt)], left at zero).  xq: scratch of ceil(M / 8nt) · 8nt · K bf16 for X in the ring's order
// (w12_x_ws_kernel, launched first on the stream).  wfirst: 1 = the record copies with L2 evict_first (ws_produce).
// tsplit > 1 (split 1, one M tile): the tail split — record rows head .. NB − 1 run as tsplit CTAs each, launched after
// the first `head` rows' CTAs (ws: fp32 [(NB − head) · tsplit · 128 · 8nt]); tsplit ≤ 1: every row one CTA (head unused).
// Same tensors and preconditions as w12_gemv.
extern "C" int w12_gemm_ws(const void* x, int M, int ldx, const void* rec, const void* expo, const void* toff,
                           const void* tent, void* y, int ldy, int N, int NB, int KB, int view, int nt, int split,
                           void* ws, void* tickets, void* xq, void* stream, int wfirst, int head, int tsplit) {
  cudaStream_t st = (cudaStream_t)stream;
  if (split < 1 || split > KB || split > 8) return (int)cudaErrorInvalidValue;  // splitk_last4: S ≤ 8
  if (tsplit > 8 || tsplit > KB) return (int)cudaErrorInvalidValue;
#define W12_WS(NTV, V) \
  if (nt == NTV && !!view == V) \
    return launch_ws<NTV, V>(x, M, ldx, rec, expo, toff, tent, y, ldy, N, NB, KB, split, ws, tickets, xq, st, wfirst, \
                             head, tsplit);
#define W12_WS_NTS(V) W12_WS(2, V) W12_WS(4, V) W12_WS(6, V) W12_WS(8, V) W12_WS(16, V)
  W12_WS_NTS(false) W12_WS_NTS(true)
#undef W12_WS_NTS
#undef W12_WS
  return (int)cudaErrorInvalidValue;
}

// The stream kernel's resident CTAs per SM at M rows (view, `warps` consumer warps, a ring of `stages` slots): CUDA's
// occupancy calculator (registers, shared memory, threads); 0 where one CTA's shared memory is more than a CTA may
// have.  gemm_cuda.stream_fits is the same rule on the CPU.
template <int NT, bool VIEW, int W>
cudaError_t stream_occupancy(int stages, int* blocks) {
  auto kern = w12_stream_kernel<NT, VIEW, W>;
  const size_t smem = stream_smem<NT, VIEW>(stages);
  int dev = 0, most = 0;  // the most dynamic shared memory one CTA may have
  if (cudaError_t e = cudaGetDevice(&dev)) return e;
  if (cudaError_t e = cudaDeviceGetAttribute(&most, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev)) return e;
  *blocks = 0;
  if (smem > (size_t)most) return cudaSuccess;
  if (cudaError_t e = raise_smem(kern, smem, stream_smem_set<NT, VIEW, W>())) return e;
  return cudaOccupancyMaxActiveBlocksPerMultiprocessor(blocks, kern, stream_threads<W>(), smem);
}
// Returns a cudaError_t; *blocks gets the count.
extern "C" int w12_stream_occupancy(int M, int view, int warps, int stages, int* blocks) {
#define W12_SO(NTV, V, WV) \
  if (M <= 8 * NTV && !!view == V && warps == WV) return (int)stream_occupancy<NTV, V, WV>(stages, blocks);
#define W12_SOW(NTV) W12_SO(NTV, false, 8) W12_SO(NTV, true, 8) W12_SO(NTV, false, 4) W12_SO(NTV, true, 4)
  if (M >= 1 && M <= 32 && stages >= 2 && stages <= 16) {
    W12_SOW(1) W12_SOW(2) W12_SOW(4)
  }
#undef W12_SOW
#undef W12_SO
  return (int)cudaErrorInvalidValue;
}

// The stream kernel for M ≤ 32 (w12_stream_kernel above; 8·nt rows per CTA, nt the smallest of 1, 2, 4 that holds M):
// ctas CTAs (at most one per record), each streaming an equal contiguous range of the NB·KB records and their X tiles
// through a ring of `stages` slots, with `warps` consumer warps (8 or 4); ws: fp32 [ctas · 2 · 8 · nt · 32 · 4] for
// the partial rows' sums and tickets: int32 zeros [NB · 8] (left at zero).  wfirst: 1 = the record copies with L2
// evict_first.  Same tensors and preconditions as w12_gemv.
extern "C" int w12_stream(const void* x, int M, int ldx, const void* rec, const void* expo, const void* toff,
                          const void* tent, void* y, int ldy, int N, int NB, int KB, int view, int ctas, int stages,
                          int warps, void* ws, void* tickets, void* stream, int wfirst) {
  if (M < 1 || M > 32 || ctas < 1 || stages < 2 || stages > 16 || (warps != 8 && warps != 4))
    return (int)cudaErrorInvalidValue;
  cudaStream_t st = (cudaStream_t)stream;
#define W12_ST(NTV, V, WV)                                                                                         \
  if (M <= 8 * NTV && !!view == V && warps == WV)                                                                  \
    return launch_stream<NTV, V, WV>(x, M, ldx, rec, expo, toff, tent, y, ldy, N, NB, KB, ctas, stages, ws, tickets, \
                                     wfirst, st);
#define W12_STW(NTV) W12_ST(NTV, false, 8) W12_ST(NTV, true, 8) W12_ST(NTV, false, 4) W12_ST(NTV, true, 4)
  W12_STW(1) W12_STW(2) W12_STW(4)
#undef W12_STW
#undef W12_ST
  return (int)cudaErrorInvalidValue;
}
