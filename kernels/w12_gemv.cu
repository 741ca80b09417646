// W12 GEMMs on Hopper: Y[M, N] = X[M, K] · Wᵀ, W stored as W12 records (SPEC.md), weights decoded in
// registers straight into mma.sync fragments: the skinny kernel (below; M ≤ 64) and the tensor-core kernel
// (w12_gemm_tc_kernel, further down; 9 ≤ M ≤ 128).  gemm_cuda.use_tc says which one the host runs.  Built by kernels/cuda_build.py (nvcc, sm_90a);
// called through kernels/gemm_cuda.py.  No torch headers: raw pointers and a cudaStream_t.
//
// Work split
//   tile  = 16 output channels (rows r0..r0+15 of the record row nb) × 8·NT rows of X; CTA (c, mb, z) =
//           tile (c = nb · 8 + r0 / 16, mb) × the records [z·⌈KB/S⌉, (z+1)·⌈KB/S⌉) of split z of S.
//           With S > 1 each CTA writes its partial to ws and takes a ticket; the last of the tile's CTAs
//           adds the partials in the order z = 0, 1, … (the same bits whatever the arrival order), stores
//           the tile and resets the ticket.  (A stream-K grid — one wave, equal records per CTA — was
//           measured slower at M = 1: every tile then pays the partial/ticket round trip.)
//   warp  = the CTA's records kb = a + warp, a + warp + WARPS, ... (fixed, interleaved); U records per
//           pipeline stage, two stages in flight.  The WARPS partial sums are added in the fixed order
//           0..WARPS−1 in shared memory: no atomics, so every run gives the same bits.
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
//   t = prmt(v, 0, 0x1404) = [b1 0 b0 0];  s = t >> 4;  s = (t & 0x80008000) | s;
//   c = prmt(nib, 0x38383838, 0x4140) = [38 n1 38 n0];  h = s | (c & 0x380F380F)       (5 ops / 2 weights)
// 8-bit view: lo = 8 (midpoint of the discarded bits), escapes keep their code value (SPEC.md §4).
// Epilogue: y = (Σ_warps acc) · 2^(E_n − 127)  (exact power of two, fp32 bits E_n << 23), then the
// exact sparse escape correction y += x[m, col] · (w − 2^(E_n − 142)) for the CTA's escapes in list
// order (SPEC.md §7), one rounding to bf16 when the tile is complete.  The escapes come from the per-tile
// lists of gemm_cuda.tile_escapes (load time): entry (row in tile << 24 | column, h), offsets per
// (channel tile, kb), so a CTA's escapes are one contiguous range, fetched while its first records load.

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>

namespace {

constexpr int REC = 12288;   // bytes per 128 × 64 record
constexpr int VIEW_BYTES = 8192;

__device__ __forceinline__ uint4 ld_stream(const uint8_t* p) {
  uint4 r;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p));
  return r;
}

// cp.async: global -> shared without holding registers (completed by cp_async_wait_all)
__device__ __forceinline__ void cp_async8(void* smem, const void* gmem) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8;" ::"r"((uint32_t)__cvta_generic_to_shared(smem)), "l"(gmem));
}
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 16;" ::"r"((uint32_t)__cvta_generic_to_shared(smem)), "l"(gmem));
}
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.commit_group;\ncp.async.wait_all;" ::: "memory"); }

__device__ __forceinline__ uint32_t lop3_and_or(uint32_t a, uint32_t b, uint32_t c) {  // (a & b) | c
  uint32_t d;
  asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
}

__device__ __forceinline__ uint32_t lop3_or_and(uint32_t a, uint32_t b, uint32_t c) {  // a | (b & c)
  uint32_t d;
  asm("lop3.b32 %0, %1, %2, %3, 0xF8;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
}

// Four weights (view word v = columns c..c+3, nibble word n with lo in each byte's low nibble) ->
// two bf16x2: lo01 = columns c, c+1; lo23 = columns c+2, c+3 (lower address in the low lane).
template <bool VIEW>
__device__ __forceinline__ void decode4(uint32_t v, uint32_t n, uint32_t& w01, uint32_t& w23) {
  uint32_t t0 = __byte_perm(v, 0u, 0x1404), t1 = __byte_perm(v, 0u, 0x3424);
  uint32_t s0 = lop3_and_or(t0, 0x80008000u, t0 >> 4), s1 = lop3_and_or(t1, 0x80008000u, t1 >> 4);
  if (VIEW) {
    w01 = s0 | 0x38083808u;
    w23 = s1 | 0x38083808u;
  } else {
    w01 = lop3_or_and(s0, __byte_perm(n, 0x38383838u, 0x4140), 0x380F380Fu);
    w23 = lop3_or_and(s1, __byte_perm(n, 0x38383838u, 0x4342), 0x380F380Fu);
  }
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

// U records of one warp's 16 channels: view (and nibble) words of rows g and g+8 for columns
// 16t..16t+15, plus the matching X words when they fit in registers (XPF: NT ≤ 2).
template <int NT, bool VIEW, int U>
struct Group {
  static constexpr bool XPF = NT <= 2;
  uint4 va[U], vb[U], na[U], nb[U];
  uint4 xa[XPF ? U : 1][NT], xb[XPF ? U : 1][NT];

  __device__ __forceinline__ static void load_x(uint4& a, uint4& b, const __nv_bfloat16* xr, bool ok, int kb) {
    if (ok) {
      const uint4* p = reinterpret_cast<const uint4*>(xr + kb * 64);
      a = __ldg(p);
      b = __ldg(p + 1);
    } else {
      a = b = make_uint4(0, 0, 0, 0);
    }
  }

  __device__ __forceinline__ void load(const uint8_t* base, int kb0, int KB, int warps, int v0, int v1, int n0,
                                       int n1, const __nv_bfloat16* const (&xr)[NT], const bool (&xok)[NT]) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      int kb = kb0 + u * warps;
      if (kb < KB) {
        const uint8_t* r = base + (size_t)kb * REC;
        va[u] = ld_stream(r + v0);
        vb[u] = ld_stream(r + v1);
        if (!VIEW) {
          na[u] = ld_stream(r + n0);
          nb[u] = ld_stream(r + n1);
        }
        if (XPF) {
#pragma unroll
          for (int j = 0; j < NT; ++j) load_x(xa[XPF ? u : 0][j], xb[XPF ? u : 0][j], xr[j], xok[j], kb);
        }
      }
    }
  }

  __device__ __forceinline__ void compute(float (&acc)[NT][4], int kb0, int KB, int warps, int nsh,
                                          const __nv_bfloat16* const (&xr)[NT], const bool (&xok)[NT]) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      int kb = kb0 + u * warps;
      if (kb < KB) {
        uint4 ya[NT], yb[NT];
#pragma unroll
        for (int j = 0; j < NT; ++j) {
          if (XPF) {
            ya[j] = xa[XPF ? u : 0][j];
            yb[j] = xb[XPF ? u : 0][j];
          } else {
            load_x(ya[j], yb[j], xr[j], xok[j], kb);
          }
        }
#pragma unroll
        for (int s = 0; s < 4; ++s) {
          uint32_t a0, a1, a2, a3;
          uint32_t nwa = VIEW ? 0u : word(na[u], s) >> nsh, nwb = VIEW ? 0u : word(nb[u], s) >> nsh;
          decode4<VIEW>(word(va[u], s), nwa, a0, a2);
          decode4<VIEW>(word(vb[u], s), nwb, a1, a3);
#pragma unroll
          for (int j = 0; j < NT; ++j) {
            const uint4& q = s < 2 ? ya[j] : yb[j];
            mma16816(acc[j], a0, a1, a2, a3, word(q, 2 * (s & 1)), word(q, 2 * (s & 1) + 1));
          }
        }
      }
    }
  }
};

template <int NT, bool VIEW, int WARPS, int U>
__global__ void __launch_bounds__(WARPS * 32) w12_gemv_kernel(
    const __nv_bfloat16* __restrict__ x, int M, int ldx, const uint8_t* __restrict__ rec,
    const uint8_t* __restrict__ expo, const int32_t* __restrict__ toff, const int32_t* __restrict__ tent,
    __nv_bfloat16* __restrict__ y, int ldy, int N, int KB, float* __restrict__ ws, int* __restrict__ tickets) {
  constexpr int MT = 8 * NT;  // X rows per tile
  constexpr int THREADS = WARPS * 32;
  constexpr int STEP = WARPS * U;
  __shared__ float red[WARPS][16][MT];
  __shared__ int s_row[THREADS], s_col[THREADS];
  __shared__ float s_d[THREADS];
  __shared__ uint32_t s_mask[16][WARPS];  // bit l of s_mask[r][c]: entry 32c + l belongs to row r
  __shared__ uint2 s_ent[THREADS];            // the CTA's escape entries (row << 24 | column, h)
  __shared__ __align__(16) uint8_t s_e[16];    // E_n of the tile's 16 channels
  __shared__ int s_last;

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int v0 = g * 64 + 16 * t, v1 = v0 + 8 * 64;  // in-record byte offsets for r0 = 0
  const int n0 = VIEW_BYTES + g * 32 + 16 * (t & 1), n1 = n0 + 8 * 32;
  const int nsh = (t >> 1) * 4;  // columns 32..63 sit in the high nibbles
  const int c = blockIdx.x, nb = c >> 3, r0 = (c & 7) * 16, m0 = blockIdx.y * MT;
  const int tau = blockIdx.y * gridDim.x + c, S = gridDim.z;
  const int kps = (KB + S - 1) / S;
  const int a = min(KB, (int)blockIdx.z * kps), b = min(KB, a + kps);
  // ---- issue, in this order: the CTA's escape offsets, two pipeline stages of records (and X),
  // then (cp.async, no registers held) the tile's exponents and the first THREADS escape entries
  int e_lo = 0, e_hi = 0;
  if (!VIEW) {
    e_lo = __ldg(toff + (long)c * KB + a);
    e_hi = __ldg(toff + (long)c * KB + b);
  }
  const uint8_t* base = rec + ((size_t)nb * KB) * REC;
  const int va0 = v0 + r0 * 64, va1 = v1 + r0 * 64, na0 = n0 + r0 * 32, na1 = n1 + r0 * 32;
  const __nv_bfloat16* xr[NT];  // X row m0 + 8j + g, column 16t (rows ≥ M read as zeros)
  bool xok[NT];
#pragma unroll
  for (int j = 0; j < NT; ++j) {
    int m = m0 + 8 * j + g;
    xok[j] = m < M;
    xr[j] = x + (size_t)(xok[j] ? m : 0) * ldx + 16 * t;
  }
  float acc[NT][4];
#pragma unroll
  for (int j = 0; j < NT; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;
  Group<NT, VIEW, U> ga, gb;
  ga.load(base, a + warp, b, WARPS, va0, va1, na0, na1, xr, xok);
  gb.load(base, a + warp + STEP, b, WARPS, va0, va1, na0, na1, xr, xok);
  if (tid == 0) cp_async16(s_e, expo + nb * 128 + r0);
  if (!VIEW && e_lo + tid < e_hi) cp_async8(&s_ent[tid], tent + 2 * (long)(e_lo + tid));

  // ---- main loop: group A's U records are decoded while group B's are in flight, and the other way
  for (int kb0 = a + warp; kb0 < b; kb0 += 2 * STEP) {
    ga.compute(acc, kb0, b, WARPS, nsh, xr, xok);
    ga.load(base, kb0 + 2 * STEP, b, WARPS, va0, va1, na0, na1, xr, xok);
    gb.compute(acc, kb0 + STEP, b, WARPS, nsh, xr, xok);
    gb.load(base, kb0 + 3 * STEP, b, WARPS, va0, va1, na0, na1, xr, xok);
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
  __syncthreads();
  const int mcount = min(MT, M - m0);
  for (int idx = tid; idx < 16 * mcount; idx += THREADS) {
    int r = idx & 15, m = idx >> 4;
    float sum = 0.f;
#pragma unroll
    for (int w = 0; w < WARPS; ++w) sum += red[w][r][m];
    red[0][r][m] = sum * __int_as_float((int)s_e[r] << 23);  // 2^(E_n − 127), exact
  }
  if (!VIEW && e_hi > e_lo) {
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
        float w = __bfloat162float(__ushort_as_bfloat16((unsigned short)(en.y & 0xFFFFu)));
        s_row[tid] = rl;
        s_col[tid] = (int)(en.x & 0xFFFFFFu);
        s_d[tid] = w - __int_as_float(((int)s_e[rl] - 15) << 23);
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
  if (S > 1) {
    // Split K: publish this CTA's partial, take a ticket; the last of the tile's CTAs adds the partials in
    // the order z = 0, 1, … and finishes.
    float* part = ws + (size_t)tau * S * 16 * MT;
    for (int idx = tid; idx < 16 * mcount; idx += THREADS) part[blockIdx.z * 16 * MT + idx] = red[0][idx & 15][idx >> 4];
    __threadfence();
    __syncthreads();
    if (tid == 0) s_last = atomicAdd(tickets + tau, 1) == S - 1;
    __syncthreads();
    if (!s_last) return;
    __threadfence();
    for (int idx = tid; idx < 16 * mcount; idx += THREADS) {
      float sum = 0.f;
      for (int z = 0; z < S; ++z) sum += __ldcg(part + z * 16 * MT + idx);
      red[0][idx & 15][idx >> 4] = sum;
    }
    if (tid == 0) tickets[tau] = 0;
  }
  __syncthreads();
  for (int idx = tid; idx < 16 * mcount; idx += THREADS) {
    int r = idx & 15, m = idx >> 4, n = nb * 128 + r0 + r;
    if (n < N) y[(size_t)(m0 + m) * ldy + n] = __float2bfloat16_rn(red[0][r][m]);
  }
}

// =================================================================================================
// W12 GEMM for 9 ≤ M ≤ 128 (tensor cores, X shared through shared memory)
// =================================================================================================
// CTA (cx, mb, z) = TC_CH = 16·TC_WARPS output channels (rows r0.. of record row nb = cx / (128 / TC_CH)) ×
// MT = 8·NT rows of X × the records [z·⌈KB/S⌉, …) of split z.  Warp w owns the 16 channels r0 + 16w ..
// (its tile c = nb·8 + r0/16 + w) and every record of the CTA.  Each record's TC_CH rows of W bytes (view
// and nibbles, each contiguous in the record) and its X tile go through a STAGES-deep cp.async ring in
// shared memory (one barrier per record; STAGES − 1 records in flight); a warp reads its A bytes from
// there (the same lane layout and decode as the skinny kernel) and the X fragments the four warps share.  X rows are 128 bytes; the 16-byte chunk q of row m sits at chunk q ^ (m & 7), so
// the fragment loads (row 8j + g, chunks 2t and 2t+1) hit eight distinct chunks per quarter-warp.
// Escapes: while record kb's X tile is in shared memory, each warp adds x[m, col] · (w − w_code) of its
// tile's entries of record kb, in list order, to a per-warp fp32 correction corr[16][MT] (real units);
// the epilogue writes y = Σ acc · 2^(E_n − 127) + corr (entries past the per-warp prefetch of ECAP are
// added in the epilogue from global memory, after the others: still list order).  Split K as in the
// skinny kernel (partials in ws, tickets, fixed order).
constexpr int TC_WARPS = 8, TC_THREADS = 256, TC_CH = 16 * TC_WARPS, ECAP = 128;

// X: through L1 (.ca), where the CTAs of an SM that read the same X tile meet; W: L2 only (.cg), read once
__device__ __forceinline__ void cp_async16_zfill(void* smem, const void* gmem, bool ok) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 16, %2;" ::"r"((uint32_t)__cvta_generic_to_shared(smem)),
               "l"(gmem), "r"(ok ? 16 : 0));
}
__device__ __forceinline__ void cp_async16_cg(void* smem, const void* gmem) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"((uint32_t)__cvta_generic_to_shared(smem)), "l"(gmem));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory"); }

template <int NT, bool VIEW, int STAGES>
__global__ void __launch_bounds__(TC_THREADS) w12_gemm_tc_kernel(
    const __nv_bfloat16* __restrict__ x, int M, int ldx, const uint8_t* __restrict__ rec,
    const uint8_t* __restrict__ expo, const int32_t* __restrict__ toff, const int32_t* __restrict__ tent,
    __nv_bfloat16* __restrict__ y, int ldy, int N, int KB, float* __restrict__ ws, int* __restrict__ tickets) {
  constexpr int MT = 8 * NT;
  constexpr int XST = MT * 128;           // bytes of one X stage
  constexpr int WST = TC_CH * 96;          // bytes of one W stage: view [TC_CH][64], then nibbles [TC_CH][32]
  extern __shared__ __align__(16) uint8_t smem[];
  uint8_t* xs = smem;                                                   // [STAGES][MT][128], swizzled
  uint8_t* wsm = smem + STAGES * XST;                                   // [STAGES][WST]
  float* corr = reinterpret_cast<float*>(wsm + STAGES * WST);           // [4][16][MT]
  uint2* s_ent = reinterpret_cast<uint2*>(corr + TC_WARPS * 16 * MT);   // [4][ECAP]
  int* s_toff = reinterpret_cast<int*>(s_ent + TC_WARPS * ECAP);        // [4][kps + 1]
  __shared__ __align__(16) uint8_t s_e[TC_CH];
  __shared__ int s_last;

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int nb = blockIdx.x / (128 / TC_CH), r0 = (blockIdx.x % (128 / TC_CH)) * TC_CH, m0 = blockIdx.y * MT;
  const int c = nb * 8 + r0 / 16 + warp;  // this warp's 16-channel tile
  const int S = gridDim.z, kps = (KB + S - 1) / S;
  const int a = min(KB, (int)blockIdx.z * kps), b = min(KB, a + kps), nrec = b - a;
  const uint8_t* base = rec + (size_t)nb * KB * REC;
  const int rw = 16 * warp;  // the warp's first row in the W stage
  const int v0 = (rw + g) * 64 + 16 * t, v1 = v0 + 8 * 64;
  const int n0 = TC_CH * 64 + (rw + g) * 32 + 16 * (t & 1), n1 = n0 + 8 * 32;
  const int nsh = (t >> 1) * 4;

  // stage loader: X (chunk q of row m of record kb, rows ≥ M zero-filled) and W of record kb -> slot
  auto load_stage = [&](int kb, int slot) {
    uint8_t* dst = xs + slot * XST;
    for (int i = tid; i < MT * 8; i += TC_THREADS) {
      const int m = i >> 3, q = i & 7;
      const bool ok = m0 + m < M;
      const __nv_bfloat16* src = x + (size_t)(ok ? m0 + m : 0) * ldx + kb * 64 + q * 8;
      cp_async16_zfill(dst + m * 128 + ((q ^ (m & 7)) << 4), src, ok);
    }
    // W: rows r0..r0+63 of record (nb, kb): 4 KB of view bytes and 2 KB of nibbles, both contiguous
    const uint8_t* r = base + (size_t)kb * REC;
    uint8_t* wd = wsm + slot * WST;
    for (int i = tid; i < WST / 16; i += TC_THREADS) {
      const uint8_t* src = i < 4 * TC_CH ? r + r0 * 64 + 16 * i : r + VIEW_BYTES + r0 * 32 + 16 * (i - 4 * TC_CH);
      if (!VIEW || i < 4 * TC_CH) cp_async16_cg(wd + 16 * i, src);
    }
  };

  // ---- prologue: W and X of the first STAGES − 1 records, the warp's escape offsets, exponents and
  // (after the offsets arrive) its first ECAP entries
  if (tid < TC_CH / 16) cp_async16(s_e + 16 * tid, expo + nb * 128 + r0 + 16 * tid);  // in group 0, with X of record a
#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) {
    if (s < nrec) load_stage(a + s, s);
    cp_async_commit();
  }
  int e_lo = 0, e_hi = 0;
  int* my_toff = s_toff + warp * (kps + 1);
  if (!VIEW) {
    for (int i = lane; i <= nrec; i += 32) my_toff[i] = __ldg(toff + (long)c * KB + a + i);
    __syncwarp();
    e_lo = my_toff[0];
    e_hi = my_toff[nrec];
    for (int i = lane; i < min(ECAP, e_hi - e_lo); i += 32)
      s_ent[warp * ECAP + i] = *reinterpret_cast<const uint2*>(tent + 2 * (long)(e_lo + i));
  }
  float* my_corr = corr + warp * 16 * MT;
  for (int i = lane; i < 16 * MT; i += 32) my_corr[i] = 0.f;

  float acc[NT][4];
#pragma unroll
  for (int j = 0; j < NT; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;

  // ---- one record: wait for its X stage, refill the ring, MMAs, this record's escapes
  auto step = [&](int i) {
    cp_async_wait<STAGES - 2>();
    __syncthreads();  // X of record a + i visible to all; everyone is done with the slot refilled below
    if (i + STAGES - 1 < nrec) load_stage(a + i + STAGES - 1, (i + STAGES - 1) % STAGES);
    cp_async_commit();
    const uint8_t* xsl = xs + (i % STAGES) * XST;
    const uint8_t* wsl = wsm + (i % STAGES) * WST;
    const uint4 va = *reinterpret_cast<const uint4*>(wsl + v0), vb = *reinterpret_cast<const uint4*>(wsl + v1);
    uint4 na = make_uint4(0, 0, 0, 0), nbw = na;
    if (!VIEW) {
      na = *reinterpret_cast<const uint4*>(wsl + n0);
      nbw = *reinterpret_cast<const uint4*>(wsl + n1);
    }
#pragma unroll
    for (int s = 0; s < 4; ++s) {
      uint32_t a0, a1, a2, a3;
      const uint32_t nwa = VIEW ? 0u : word(na, s) >> nsh, nwb = VIEW ? 0u : word(nbw, s) >> nsh;
      decode4<VIEW>(word(va, s), nwa, a0, a2);
      decode4<VIEW>(word(vb, s), nwb, a1, a3);
#pragma unroll
      for (int j = 0; j < NT; ++j) {
        // X row 8j + g, columns 16t + 4s .. : words 2(s&1), 2(s&1)+1 of chunk 2t + (s >> 1)
        const uint2 q = *reinterpret_cast<const uint2*>(xsl + (8 * j + g) * 128 + (((2 * t + (s >> 1)) ^ g) << 4) +
                                                         8 * (s & 1));
        mma16816(acc[j], a0, a1, a2, a3, q.x, q.y);
      }
    }
    if (!VIEW) {
      const int i0 = my_toff[i] - e_lo, i1 = min(my_toff[i + 1] - e_lo, ECAP);
      for (int e = i0; e < i1; ++e) {
        const uint2 en = s_ent[warp * ECAP + e];
        const int rl = (int)(en.x >> 24), col = (int)(en.x & 0xFFFFFFu) - (a + i) * 64;
        const float wv = __bfloat162float(__ushort_as_bfloat16((unsigned short)(en.y & 0xFFFFu)));
        const float d = wv - __int_as_float(((int)s_e[16 * warp + rl] - 15) << 23);
        for (int m = lane; m < MT; m += 32) {
          const uint16_t xb = *reinterpret_cast<const uint16_t*>(xsl + m * 128 + ((((col >> 3) ^ (m & 7))) << 4) + 2 * (col & 7));
          my_corr[rl * MT + m] = fmaf(__bfloat162float(__ushort_as_bfloat16(xb)), d, my_corr[rl * MT + m]);
        }
      }
    }
  };
  for (int i = 0; i < nrec; ++i) step(i);
  cp_async_wait<0>();
  __syncthreads();  // the X ring is free: reuse it for the warps' sums

  // ---- epilogue: y = acc · 2^(E_n − 127) + corr (+ entries past ECAP), per warp; split K; store
  float* red = reinterpret_cast<float*>(xs) + warp * 16 * MT;  // [16][MT] of this warp (the X and W rings)
#pragma unroll
  for (int j = 0; j < NT; ++j) {
    red[g * MT + 8 * j + 2 * t] = acc[j][0];
    red[g * MT + 8 * j + 2 * t + 1] = acc[j][1];
    red[(g + 8) * MT + 8 * j + 2 * t] = acc[j][2];
    red[(g + 8) * MT + 8 * j + 2 * t + 1] = acc[j][3];
  }
  __syncwarp();
  const int mcount = min(MT, M - m0);
  for (int idx = lane; idx < 16 * MT; idx += 32) {
    const int r = idx / MT;
    red[idx] = red[idx] * __int_as_float((int)s_e[16 * warp + r] << 23) + my_corr[idx];
  }
  __syncwarp();
  if (!VIEW && e_hi - e_lo > ECAP) {  // rare: entries past the prefetch, from global memory, in order
    for (int e = e_lo + ECAP; e < e_hi; ++e) {
      const uint32_t e0 = (uint32_t)__ldg(tent + 2 * (long)e), e1 = (uint32_t)__ldg(tent + 2 * (long)e + 1);
      const int rl = (int)(e0 >> 24), col = (int)(e0 & 0xFFFFFFu);
      const float wv = __bfloat162float(__ushort_as_bfloat16((unsigned short)(e1 & 0xFFFFu)));
      const float d = wv - __int_as_float(((int)s_e[16 * warp + rl] - 15) << 23);
      for (int m = lane; m < mcount; m += 32)
        red[rl * MT + m] = fmaf(__bfloat162float(x[(size_t)(m0 + m) * ldx + col]), d, red[rl * MT + m]);
      __syncwarp();
    }
  }
  const int tile = blockIdx.y * gridDim.x + blockIdx.x;
  float* cta_red = reinterpret_cast<float*>(xs);  // [TC_CH][MT]: row 16w + r
  if (S > 1) {
    __syncthreads();
    float* part = ws + (size_t)tile * S * TC_CH * MT;
    for (int idx = tid; idx < TC_CH * MT; idx += TC_THREADS) part[blockIdx.z * TC_CH * MT + idx] = cta_red[idx];
    __threadfence();
    __syncthreads();
    if (tid == 0) s_last = atomicAdd(tickets + tile, 1) == S - 1;
    __syncthreads();
    if (!s_last) return;
    __threadfence();
    for (int idx = tid; idx < TC_CH * MT; idx += TC_THREADS) {
      float sum = 0.f;
      for (int z = 0; z < S; ++z) sum += __ldcg(part + z * TC_CH * MT + idx);
      cta_red[idx] = sum;
    }
    if (tid == 0) tickets[tile] = 0;
  }
  __syncthreads();
  for (int idx = tid; idx < TC_CH * mcount; idx += TC_THREADS) {
    const int r = idx % TC_CH, m = idx / TC_CH, n = nb * 128 + r0 + r;  // consecutive threads: consecutive n
    if (n < N) y[(size_t)(m0 + m) * ldy + n] = __float2bfloat16_rn(cta_red[r * MT + m]);
  }
}

// ring depth: as deep as two CTAs per SM allow (the W bytes in flight are what M ≤ 32 needs)
template <int NT>
constexpr int tc_stages() {
  return NT >= 8 ? 3 : 4;
}

template <int NT>
size_t tc_smem(int kps) {
  constexpr int STAGES = tc_stages<NT>();
  return (size_t)STAGES * (8 * NT * 128 + TC_CH * 96) + TC_WARPS * 16 * 8 * NT * 4 + TC_WARPS * ECAP * 8 +
         TC_WARPS * (kps + 1) * 4;
}

template <int NT, bool VIEW>
cudaError_t launch_tc(const void* x, int M, int ldx, const void* rec, const void* expo, const void* toff,
                      const void* tent, void* y, int ldy, int N, int NB, int KB, int split, void* ws, void* tickets,
                      cudaStream_t st) {
  auto kern = w12_gemm_tc_kernel<NT, VIEW, tc_stages<NT>()>;
  const int kps = (KB + split - 1) / split;
  const size_t smem = tc_smem<NT>(kps);
  static size_t set = 0;
  if (smem > set) {
    cudaError_t e = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (e != cudaSuccess) return e;
    set = smem;
  }
  dim3 grid(NB * (128 / TC_CH), (M + 8 * NT - 1) / (8 * NT), split);
  kern<<<grid, TC_THREADS, smem, st>>>((const __nv_bfloat16*)x, M, ldx, (const uint8_t*)rec, (const uint8_t*)expo,
                                        (const int32_t*)toff, (const int32_t*)tent, (__nv_bfloat16*)y, ldy, N, KB,
                                        (float*)ws, (int*)tickets);
  return cudaGetLastError();
}

struct Args {
  const void *x, *rec, *expo, *toff, *tent;
  void *y, *ws, *tickets;
  int M, ldx, ldy, N, NB, KB, split;
};

template <int NT, bool VIEW, int WARPS, int U>
cudaError_t launch_t(const Args& a, cudaStream_t stream) {
  dim3 grid(a.NB * 8, (a.M + 8 * NT - 1) / (8 * NT), a.split);
  w12_gemv_kernel<NT, VIEW, WARPS, U><<<grid, WARPS * 32, 0, stream>>>(
      (const __nv_bfloat16*)a.x, a.M, a.ldx, (const uint8_t*)a.rec, (const uint8_t*)a.expo,
      (const int32_t*)a.toff, (const int32_t*)a.tent, (__nv_bfloat16*)a.y, a.ldy, a.N, a.KB, (float*)a.ws,
      (int*)a.tickets);
  return cudaGetLastError();
}

template <int NT, bool VIEW>
cudaError_t launch_wu(int warps, int unroll, const Args& a, cudaStream_t st) {
#define W12_CASE(W, UU) \
  if (warps == W && unroll == UU) return launch_t<NT, VIEW, W, UU>(a, st);
  W12_CASE(4, 1) W12_CASE(4, 2) W12_CASE(8, 1) W12_CASE(8, 2)
#undef W12_CASE
  return cudaErrorInvalidValue;
}

}  // namespace

// Returns a cudaError_t (0 = launched).  nt: X rows per tile / 8 (1, 2, 4, 8); warps: 4 or 8; unroll:
// records per pipeline stage per warp (1, 2; two stages in flight); split: CTAs along K (split > 1 needs
// ws: fp32 [NB·8 · ceil(M / 8nt) · split · 16 · 8nt] and tickets: int32 zeros [NB·8 · ceil(M / 8nt)], which
// the kernel leaves at zero).  toff/tent: the per-tile escape lists (gemm_cuda.tile_escapes; unused for the view).
// Preconditions (checked by the Python caller): K = 64·KB, x and ldx 16-byte aligned, records contiguous.
extern "C" int w12_gemv(const void* x, int M, int ldx, const void* rec, const void* expo, const void* toff,
                        const void* tent, void* y, int ldy, int N, int NB, int KB, int view, int nt, int warps,
                        int unroll, int split, void* ws, void* tickets, void* stream) {
  cudaStream_t st = (cudaStream_t)stream;
  if (split < 1 || split > KB) return (int)cudaErrorInvalidValue;
  Args a{x, rec, expo, toff, tent, y, ws, tickets, M, ldx, ldy, N, NB, KB, split};
#define W12_NT(NTV) \
  if (nt == NTV) return view ? launch_wu<NTV, true>(warps, unroll, a, st) : launch_wu<NTV, false>(warps, unroll, a, st);
  W12_NT(1) W12_NT(2) W12_NT(4) W12_NT(8)
#undef W12_NT
  return (int)cudaErrorInvalidValue;
}

// The tensor-core W12 GEMM for 9 ≤ M ≤ 128 (w12_gemm_tc_kernel above).  nt: X rows per CTA / 8 (2, 4, 8, 16);
// split: CTAs along K (split > 1 needs ws: fp32 [NB·128/TC_CH · ceil(M / 8nt) · split · TC_CH · 8nt] and
// tickets: int32 zeros [NB·128/TC_CH · ceil(M / 8nt)], left at zero); TC_CH = 128 (gemm_cuda.TC_CHANNELS).  Same tensors and preconditions as w12_gemv.
extern "C" int w12_gemm_tc(const void* x, int M, int ldx, const void* rec, const void* expo, const void* toff,
                           const void* tent, void* y, int ldy, int N, int NB, int KB, int view, int nt, int split,
                           void* ws, void* tickets, void* stream) {
  cudaStream_t st = (cudaStream_t)stream;
  if (split < 1 || split > KB) return (int)cudaErrorInvalidValue;
#define W12_TC(NTV)                                                                                          \
  if (nt == NTV)                                                                                             \
    return view ? launch_tc<NTV, true>(x, M, ldx, rec, expo, toff, tent, y, ldy, N, NB, KB, split, ws, tickets, st) \
                : launch_tc<NTV, false>(x, M, ldx, rec, expo, toff, tent, y, ldy, N, NB, KB, split, ws, tickets, st);
  W12_TC(2) W12_TC(4) W12_TC(8) W12_TC(16)
#undef W12_TC
  return (int)cudaErrorInvalidValue;
}
