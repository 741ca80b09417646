// Certified INT8 LM head on Hopper: INT8 pass + bounds, candidate selection with exact rescoring, argmax.
// The maths and the contract are in kernels/lm_head_int8.py (steps 1-6); this file only computes them.
//
// Inputs (device pointers, row-major, contiguous rows):
//   q   i8   [V, ldq]   per-row INT8 copy (K % 16 == 0, rows 16-byte aligned)
//   s   f32  [V]        scales s_v;  d f32 [V] radii D_v (step 3, rounded up)
//   W   bf16 [V, ldw]   the exact weights (rows 16-byte aligned)
//   x   bf16 [M, ldx]   hidden states (rows 16-byte aligned)
// Outputs (written by w12_lmh_certified, no host synchronisation, graph-capturable):
//   ids i64 [M]  cand i64 [M, cap] (-1 padded, arrival order)  cand_logit bf16 [M, cap] (-inf padded)
//   counts i64 [M] (the full count, may exceed cap)  amb u8 [M]  fb u8 [M]  best bf16 [M] (winner's logit)
//
// Two kernels on one stream, no memset, no host synchronisation:
//   1. int8_bounds   A_v = s_v·Σ q_vk x_k (fp32 FMA, exact products), U_v, L_v (step 4), rne to bf16;
//                    stores rne(U) [M, ldu] and, per block and token, the key of max rne(L) with a
//                    non-finite flag (blockval); block (0, 0) zeroes the counters of kernel 2
//   2. select_rescore  best = max over the blocks' keys (a max: order-independent, deterministic);
//                    C = {v : rne(U_v) ≥ best} (every v when the token's bounds are not finite); each
//                    block rescores the candidates it found with the fixed-order exact head: F_c = rne(z_c),
//                    [lo_c, hi_c] for any other order (step 6), atomicMax of (F_c, −c); the first `cap`
//                    candidates are listed; the last block of a token to finish (threadfence + counter)
//                    finalizes it: ids, best, counts, fallback (non-finite bounds or count > cap: every
//                    candidate was rescored, so ids is still the exact argmax, but the list is incomplete
//                    and no ambiguity is computed), ambiguity (step 6), padding
// Bounds are compared as order-preserving integer keys of their bf16 values (exact, and immune to the
// flush-to-zero compares of --use_fast_math).
//
// The fixed-order exact head (the "exact head" of the CUDA path; dot_fixed_global, full_head_kernel):
//   z = Σ_k w_k x_k for one (row, token): lane l of a warp owns the 8-element chunks c = 32·j + l
//   (k = 256·j + 8·l + e), j ascending, e ascending, acc ← fma.rn(w, x, acc) from acc = +0, chunks past K
//   skipped (products of two bf16 are exact in fp32), then the xor butterfly 16, 8, 4, 2, 1 (commutative
//   adds: every lane holds the same bits).  F = cvt.rn.bf16(z).  The bits of F depend on nothing but
//   (w_v, x_m): not on M, V, which rows are computed, nor on the launch.
//
// Arithmetic: the build uses --use_fast_math (flush-to-zero), so every fp32 operation that matters is
// inline PTX without .ftz (IEEE RNE, denormals kept), and fp64 for ‖x‖₂.
//
// Napkin (H200, ~4.0 TB/s achievable): 128256×4096 int8 = 525 MB → 131 µs; rne(U) write + read
// 2·2·M·V bytes (0.5 MB at M = 1); rescoring reads 2K bytes per survivor.

#include <cuda_runtime.h>
#include <stdint.h>
#include <stdlib.h>

namespace {

constexpr int WARPS = 8;
constexpr int THREADS = WARPS * 32;
constexpr float REL_PAD = 0x1p-20f;   // 2^-20 |A| (lm_head_int8.py REL_PAD)
constexpr float ABS_PAD = 0x1p-96f;   // 2^-96      (lm_head_int8.py ABS_PAD)
constexpr float Q_MAGIC = 8388736.0f; // 2^23 + 128: float(0x4B0000bb) − Q_MAGIC = bb − 128 = q
constexpr uint16_t BF16_NEG_INF = 0xFF80;
constexpr int MAX_BLOCKS = 2048;      // INT8-pass blocks per token tile (one wave: ≤ SMs × 8)

// ---- IEEE fp32 without flush-to-zero -----------------------------------------------------------
__device__ __forceinline__ float fma_rn(float a, float b, float c) {
  float d;
  asm("fma.rn.f32 %0, %1, %2, %3;" : "=f"(d) : "f"(a), "f"(b), "f"(c));
  return d;
}
__device__ __forceinline__ float add_rn(float a, float b) {
  float d;
  asm("add.rn.f32 %0, %1, %2;" : "=f"(d) : "f"(a), "f"(b));
  return d;
}
__device__ __forceinline__ float sub_rn(float a, float b) {
  float d;
  asm("sub.rn.f32 %0, %1, %2;" : "=f"(d) : "f"(a), "f"(b));
  return d;
}
__device__ __forceinline__ float mul_rn(float a, float b) {
  float d;
  asm("mul.rn.f32 %0, %1, %2;" : "=f"(d) : "f"(a), "f"(b));
  return d;
}
__device__ __forceinline__ float abs_f(float a) { return __uint_as_float(__float_as_uint(a) & 0x7FFFFFFFu); }

// ---- bf16 bits ----------------------------------------------------------------------------------
__device__ __forceinline__ uint16_t bf16_rn(float a) {  // round to nearest even; NaN stays NaN
  uint16_t r;
  asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(r) : "f"(a));
  return r;
}
__device__ __forceinline__ float bf16_to_f(uint32_t b) { return __uint_as_float((b & 0xFFFFu) << 16); }
__device__ __forceinline__ bool bf16_nonfinite(uint16_t b) { return (b & 0x7F80u) == 0x7F80u; }
__device__ __forceinline__ bool bf16_isnan(uint16_t b) { return (b & 0x7FFFu) > 0x7F80u; }

// order-preserving 16-bit key of a bf16 value: −inf < … < −0 = +0 < … < +inf < NaN (torch.argmax: NaN wins)
__device__ __forceinline__ uint32_t ord16(uint16_t b) {
  if (bf16_isnan(b)) return 0xFFFFu;
  if (b == 0x8000u) b = 0;  // −0 ties with +0 (torch compares values)
  return (b & 0x8000u) ? (~b & 0xFFFFu) : (b | 0x8000u);
}

// x[tok, k .. k+3] (bf16) as fp32, exact; zeros outside [M, K).
__device__ __forceinline__ float4 load_x4(const uint16_t* __restrict__ x, int tok, long ldx, int k, int M, int K) {
  if (tok >= M || k >= K) return make_float4(0.f, 0.f, 0.f, 0.f);
  const uint2 raw = *reinterpret_cast<const uint2*>(x + tok * ldx + k);
  return make_float4(bf16_to_f(raw.x), bf16_to_f(raw.x >> 16), bf16_to_f(raw.y), bf16_to_f(raw.y >> 16));
}
__device__ __forceinline__ uint16_t unord16(uint32_t k) {
  return (k & 0x8000u) ? (uint16_t)(k & 0x7FFFu) : (uint16_t)(~k & 0xFFFFu);
}
// argmax key: larger value first, then the lower index (first maximum, as torch.argmax)
__device__ __forceinline__ unsigned long long argkey(uint16_t f, uint32_t v) {
  return ((unsigned long long)ord16(f) << 32) | (0xFFFFFFFFu - v);
}

// ---- loads --------------------------------------------------------------------------------------
__device__ __forceinline__ uint4 ld_stream(const void* p) {  // read once: bypass L1
  uint4 r;
  asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p));
  return r;
}
__device__ __forceinline__ uint32_t word(const uint4& u, int j) {
  return j == 0 ? u.x : j == 1 ? u.y : j == 2 ? u.z : u.w;
}
__device__ __forceinline__ float comp(const float4& f, int i) {
  return i == 0 ? f.x : i == 1 ? f.y : i == 2 ? f.z : f.w;
}
// int8 byte i of u (u = word ^ 0x80808080, i.e. q + 128) → q as fp32, exactly: 2^23 + bb − (2^23 + 128)
__device__ __forceinline__ float q_at(uint32_t u, int i) {
  return sub_rn(__uint_as_float(__byte_perm(u, 0x4B000000u, 0x7540u + i)), Q_MAGIC);
}

__device__ __forceinline__ float warp_sum(float v) {  // xor butterfly: every lane gets the same bits
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = add_rn(v, __shfl_xor_sync(0xFFFFFFFFu, v, o));
  return v;
}

// =================================================================================================
// 1. INT8 pass + bounds
// =================================================================================================
// Block: 8 warps; a warp takes every (gridDim.x · 8)-th group of R rows and computes it for MT tokens.
// x tile in shared memory, fp32, permuted so that lane l's float4 for (step s, word j) is at
// ((s·4 + j)·32 + l): one LDS.128 per warp reads 512 contiguous bytes (no bank conflicts).
// Step s covers bytes [512 s, 512 s + 512) of a row: lane l loads 16 bytes at 512 s + 16 l.
template <int MT, int R, int D>
__global__ void __launch_bounds__(THREADS, MT == 1 && R == 1 && D < 8 ? 3 : 2) int8_bounds_kernel(
    const int8_t* __restrict__ q, const float* __restrict__ scale, const float* __restrict__ radius,
    const uint16_t* __restrict__ x, int M, int V, int K, long ldq, long ldx, int ns, long ngroups,
    float mul_pad, uint16_t* __restrict__ U, long ldu, unsigned* __restrict__ blockval,
    unsigned* __restrict__ zero32, unsigned long long* __restrict__ zero64) {
  extern __shared__ float4 xs[];  // [MT][ns·128]
  __shared__ double red[THREADS];
  __shared__ float nx_s[MT];
  __shared__ unsigned wkey[WARPS][MT];
  __shared__ unsigned wbad[WARPS][MT];
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int m0 = blockIdx.y * MT;
  const int xs_stride = ns * 128;
  if (blockIdx.x == 0 && blockIdx.y == 0)  // the counters of select_rescore (which runs after this kernel)
    for (int i = tid; i < M; i += THREADS) {
      zero32[i] = 0;
      zero32[M + i] = 0;
      zero64[i] = 0;
    }
  {  // start the first group's reads into L2 while x is staged (the stream would otherwise wait for it)
    const long v0 = ((long)blockIdx.x * WARPS + warp) * R;
#pragma unroll
    for (int d = 0; d < D; ++d)
#pragma unroll
      for (int r = 0; r < R; ++r)
        if (d < ns && v0 + r < V && 512 * d + 16 * lane < K)
          asm volatile("prefetch.global.L2 [%0];" ::"l"(q + (v0 + r) * ldq + 512 * d + 16 * lane));
  }

  // ---- stage x (bf16 → fp32, exact) and N_x = ‖x‖₂ rounded up (fp64, fixed order) ----------------
#pragma unroll 1
  for (int m = 0; m < MT; ++m) {
    const int tok = m0 + m;
    double ss = 0.0;
    for (int f = tid; f < xs_stride; f += THREADS) {
      const int k = 4 * f;
      const float4 v = load_x4(x, tok, ldx, k, M, K);
      ss = __fma_rn((double)v.x, (double)v.x, ss);  // squares of bf16 are exact in fp64
      ss = __fma_rn((double)v.y, (double)v.y, ss);
      ss = __fma_rn((double)v.z, (double)v.z, ss);
      ss = __fma_rn((double)v.w, (double)v.w, ss);
      const int s = k >> 9, w = k & 511;
      xs[m * xs_stride + ((s * 4 + ((w >> 2) & 3)) * 32 + (w >> 4))] = v;
    }
    red[tid] = ss;
    __syncthreads();
    for (int h = THREADS / 2; h > 0; h >>= 1) {  // fixed tree: deterministic
      if (tid < h) red[tid] = __dadd_rn(red[tid], red[tid + h]);
      __syncthreads();
    }
    if (tid == 0) {  // fp64 sum of K ≤ 2^20 exact squares errs < 2^-32 relative: × (1 + 2^-30), round up
      nx_s[m] = __double2float_ru(__dmul_ru(__dsqrt_ru(red[0]), 1.0 + 0x1p-30));
    }
    __syncthreads();
  }
  // ---- stream the rows ---------------------------------------------------------------------------
  const int t = lane;  // lane t < R·MT evaluates the bound of (row r = t / MT, token m = t % MT)
  unsigned kmax = 0, bad = 0;
  const long nwarps = (long)gridDim.x * WARPS;  // groups g ≡ this warp (mod nwarps): ≤ gpw each
  // One continuous stream per warp: a row's steps are padded to nsp (a multiple of D, padded steps load
  // and compute nothing), so step s always sits in slot s % D, and the last D steps of a group load the
  // first D steps of the warp's next group: D steps stay in flight across row boundaries.
  const int nsp = (ns + D - 1) / D * D;
  auto row_ptrs = [&](long gg, const int8_t* (&rows)[R], bool (&rok)[R]) {
#pragma unroll
    for (int r = 0; r < R; ++r) {
      rok[r] = gg < ngroups && gg * R + r < V;
      rows[r] = q + (rok[r] ? gg * R + r : 0) * ldq + 16 * lane;
    }
  };
  auto load_step = [&](const int8_t* const (&rows)[R], const bool (&rok)[R], int s, uint4 (&dst)[R]) {
#pragma unroll
    for (int r = 0; r < R; ++r)
      dst[r] = (s < ns && rok[r] && 512 * s + 16 * lane < K) ? ld_stream(rows[r] + 512 * s) : make_uint4(0, 0, 0, 0);
  };
  uint4 buf[D][R];
  {
    const int8_t* rows[R];
    bool rok[R];
    row_ptrs((long)blockIdx.x * WARPS + warp, rows, rok);
#pragma unroll
    for (int d = 0; d < D; ++d) load_step(rows, rok, d, buf[d]);
  }
  for (long g = (long)blockIdx.x * WARPS + warp; g < ngroups; g += nwarps) {
    const long v0 = g * R;
    const int8_t* rows[R];
    const int8_t* nrows[R];
    bool rok[R], nrok[R];
    row_ptrs(g, rows, rok);
    row_ptrs(g + nwarps, nrows, nrok);
    // lane t's scale and radius, fetched now so that their latency hides behind the stream
    float sv = 0.f, dv = 0.f;
    if (t < R * MT && v0 + t / MT < V) {
      sv = __ldg(scale + v0 + t / MT);
      dv = __ldg(radius + v0 + t / MT);
    }
    float acc[R][MT];
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int m = 0; m < MT; ++m) acc[r][m] = 0.f;
    for (int s0 = 0; s0 < nsp; s0 += D) {
#pragma unroll
      for (int d = 0; d < D; ++d) {
        const int s = s0 + d;
        uint4 cur[R];
#pragma unroll
        for (int r = 0; r < R; ++r) cur[r] = buf[d][r];
        const int sn = s + D;  // keep D steps of loads in flight: this row's, then the next group's
        if (sn < nsp) load_step(rows, rok, sn, buf[d]);
        else load_step(nrows, nrok, sn - nsp, buf[d]);
        if (s < ns) {
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            float4 xv[MT];
#pragma unroll
            for (int m = 0; m < MT; ++m) xv[m] = xs[m * xs_stride + (s * 4 + j) * 32 + lane];
#pragma unroll
            for (int r = 0; r < R; ++r) {
              const uint32_t u = word(cur[r], j) ^ 0x80808080u;
#pragma unroll
              for (int i = 0; i < 4; ++i) {
                const float qf = q_at(u, i);  // exact; q·x exact in fp32 (7 + 8 significant bits)
#pragma unroll
                for (int m = 0; m < MT; ++m) acc[r][m] = fma_rn(qf, comp(xv[m], i), acc[r][m]);
              }
            }
          }
        }
      }
    }
    // ---- A, U, L (step 4), all lanes hold the sums -----------------------------------------------
    float tsum = 0.f;
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int m = 0; m < MT; ++m) {
        const float v = warp_sum(acc[r][m]);
        if (t == r * MT + m) tsum = v;
      }
    const int r = t / MT, m = t % MT;
    const long v = v0 + r;
    const int tok = m0 + m;
    if (t < R * MT && v < V && tok < M) {
      const float a = mul_rn(sv, tsum);
      const float p = add_rn(add_rn(mul_rn(mul_rn(nx_s[m], dv), mul_pad), mul_rn(REL_PAD, abs_f(a))),
                             ABS_PAD);
      const uint16_t ub = bf16_rn(add_rn(a, p)), lb = bf16_rn(sub_rn(a, p));
      U[tok * ldu + v] = ub;
      if (bf16_nonfinite(ub) || bf16_nonfinite(lb)) bad = 1;
      else kmax = max(kmax, ord16(lb));
    }
  }
  // ---- per-token maximum of rne(L) and the non-finite flag: lanes t ≡ m (mod MT) → block → blockval
#pragma unroll
  for (int o = 16; o >= MT; o >>= 1) {
    kmax = max(kmax, __shfl_xor_sync(0xFFFFFFFFu, kmax, o));
    bad |= __shfl_xor_sync(0xFFFFFFFFu, bad, o);
  }
  if (lane < MT) {
    wkey[warp][lane] = kmax;
    wbad[warp][lane] = bad;
  }
  __syncthreads();
  if (tid < MT && m0 + tid < M) {
    unsigned k = 0, b = 0;
    for (int w = 0; w < WARPS; ++w) {
      k = max(k, wkey[w][tid]);
      b |= wbad[w][tid];
    }
    blockval[(long)(m0 + tid) * MAX_BLOCKS + blockIdx.x] = (b << 31) | k;  // key in bits 0-15
  }
}

// =================================================================================================
// 2. Selection + exact rescoring: C = {v : rne(U_v) ≥ best}; each block rescores what it found
// =================================================================================================
// z and S = Σ|w_k x_k| of one (row, token) in the fixed order; x read from global memory; 16 chunks
// (K = 4096: the whole row) of loads in flight per lane.
constexpr int DOT_BATCH = 16;

__device__ __forceinline__ void dot_fixed_global(const uint16_t* __restrict__ w, const uint16_t* __restrict__ x,
                                                 int K, int lane, float& z, float& sabs) {
  float acc = 0.f, sa = 0.f;
  const int nj = (K + 255) / 256;
  for (int j0 = 0; j0 < nj; j0 += DOT_BATCH) {
    uint4 wv[DOT_BATCH];
#pragma unroll
    for (int t = 0; t < DOT_BATCH; ++t) {
      const int k = 256 * (j0 + t) + 8 * lane;
      wv[t] = (j0 + t < nj && k < K) ? ld_stream(w + k) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int t = 0; t < DOT_BATCH; ++t) {
      const int k = 256 * (j0 + t) + 8 * lane;
      if (j0 + t < nj && k < K) {  // the same chunks as full_head_kernel
        const uint4 xv = __ldg(reinterpret_cast<const uint4*>(x + k));
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          const float a = bf16_to_f(word(wv[t], e >> 1) >> (16 * (e & 1)));
          const float b = bf16_to_f(word(xv, e >> 1) >> (16 * (e & 1)));
          acc = fma_rn(a, b, acc);
          sa = fma_rn(abs_f(a), abs_f(b), sa);
        }
      }
    }
  }
  z = warp_sum(acc);
  sabs = warp_sum(sa);
}

constexpr int SEL_ITEMS = 8;  // rne(U) values per thread (one 16-byte load)

// Finalize one token (run by the last of its select blocks): reads other blocks' results from L2.
__device__ void finalize_token(int tok, bool every, int cap, const unsigned* counts,
                               const unsigned long long* winkey, const unsigned* cand_lo, const unsigned* cand_hi,
                               int64_t* cand, uint16_t* cand_logit, int64_t* ids, int64_t* counts64, uint8_t* amb,
                               uint8_t* fb, uint16_t* best) {
  __shared__ unsigned lo_a;
  const int tid = threadIdx.x;
  const unsigned n = __ldcg(counts + tok);
  const unsigned long long key = __ldcg(winkey + tok);
  const bool fall = every || n > (unsigned)cap || key == 0;  // key == 0: no candidate (cannot happen)
  const int64_t id = key ? (int64_t)(0xFFFFFFFFu - (uint32_t)(key & 0xFFFFFFFFu)) : 0;
  const long row = (long)tok * cap;
  const int listed = (int)min(n, (unsigned)cap);
  for (int i = listed + tid; i < cap; i += THREADS) {
    cand[row + i] = -1;
    cand_logit[row + i] = BF16_NEG_INF;
  }
  if (tid == 0) {
    ids[tok] = id;
    best[tok] = unord16((uint32_t)(key >> 32));
    counts64[tok] = n;
    fb[tok] = fall;
    lo_a = 0;
  }
  __syncthreads();
  // winner a, any c ≠ a: ambiguous iff hi_c > lo_a, or hi_c == lo_a and c < a (c would win a tie);
  // compared as order-preserving keys (exact; −0 = +0)
  bool bad = false;
  if (!fall) {
    for (int i = tid; i < listed; i += THREADS)
      if (__ldcg(reinterpret_cast<const long long*>(cand) + row + i) == id) lo_a = __ldcg(cand_lo + row + i);
    __syncthreads();
    for (int i = tid; i < listed; i += THREADS) {
      const int64_t c = __ldcg(reinterpret_cast<const long long*>(cand) + row + i);
      const unsigned hi = __ldcg(cand_hi + row + i);
      bad |= c != id && (hi > lo_a || (hi == lo_a && c < id));
    }
  }
  bad = __syncthreads_or(bad);
  if (tid == 0) amb[tok] = bad;
}

__global__ void __launch_bounds__(THREADS) select_rescore_kernel(
    const uint16_t* __restrict__ U, long ldu, int V, const unsigned* __restrict__ blockval, int nbx,
    const uint16_t* __restrict__ W, long ldw, const uint16_t* __restrict__ x, long ldx, int K, float amb_coef,
    int cap, unsigned* counts, unsigned* done, unsigned long long* winkey, int64_t* cand, uint16_t* cand_logit,
    unsigned* cand_lo, unsigned* cand_hi, int64_t* ids, int64_t* counts64, uint8_t* amb, uint8_t* fb,
    uint16_t* best) {
  __shared__ int list[THREADS * SEL_ITEMS];
  __shared__ int woff[WARPS];
  __shared__ unsigned wkey[WARPS];
  __shared__ int total_s, last_s;
  __shared__ unsigned base_s, best_s, every_s;
  const int tok = blockIdx.y, tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  // ---- best = max over the INT8 blocks' keys of rne(L); every = some bound was not finite -----------
  unsigned k = 0, nf = 0;
  for (int i = tid; i < nbx; i += THREADS) {
    const unsigned bv = blockval[(long)tok * MAX_BLOCKS + i];
    k = max(k, bv & 0xFFFFu);
    nf |= bv >> 31;
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    k = max(k, __shfl_xor_sync(0xFFFFFFFFu, k, o));
    nf |= __shfl_xor_sync(0xFFFFFFFFu, nf, o);
  }
  if (lane == 0) {
    wkey[warp] = k;
    woff[warp] = (int)nf;
  }
  __syncthreads();
  if (tid == 0) {
    unsigned bk = 0, e = 0;
    for (int w = 0; w < WARPS; ++w) {
      bk = max(bk, wkey[w]);
      e |= (unsigned)woff[w];
    }
    best_s = bk;
    every_s = e;
  }
  __syncthreads();
  const unsigned bestk = best_s;
  const bool every = every_s != 0;
  // ---- which of my 8 rows are candidates (all of them when the bounds are not finite) -------------
  const long v0 = ((long)blockIdx.x * THREADS + tid) * SEL_ITEMS;
  unsigned mask = 0;
  if (v0 < V) {
    const uint4 u = *reinterpret_cast<const uint4*>(U + tok * ldu + v0);  // ldu % 8 == 0
#pragma unroll
    for (int e = 0; e < SEL_ITEMS; ++e) {
      const uint32_t b = word(u, e >> 1) >> (16 * (e & 1));
      if (v0 + e < V && (every || ord16((uint16_t)b) >= bestk)) mask |= 1u << e;
    }
  }
  // ---- block compaction into shared memory (ascending), one atomic per block for the global slots ---
  const int c = __popc(mask);
  int incl = c;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int y = __shfl_up_sync(0xFFFFFFFFu, incl, o);
    if (lane >= o) incl += y;
  }
  if (lane == 31) woff[warp] = incl;  // (tid 0 read the flags from woff before the last barrier)
  __syncthreads();
  if (tid == 0) {
    int run = 0;
    for (int w = 0; w < WARPS; ++w) {
      const int t = woff[w];
      woff[w] = run;
      run += t;
    }
    total_s = run;
    base_s = run ? atomicAdd(counts + tok, (unsigned)run) : 0u;
  }
  __syncthreads();
  int pos = woff[warp] + incl - c;
  for (int e = 0; e < SEL_ITEMS; ++e)
    if (mask & (1u << e)) list[pos++] = (int)(v0 + e);
  __syncthreads();
  // ---- rescoring: one warp per candidate ------------------------------------------------------------
  const int total = total_s;
  const unsigned base = base_s;
  for (int i = warp; i < total; i += WARPS) {
    const int v = list[i];
    float z, sabs;
    dot_fixed_global(W + v * ldw, x + tok * ldx, K, lane, z, sabs);
    // any other fp32 order: |z' − z| ≤ 2γ_K Σ|w x| ≤ amb_coef · sabs (host: rounded up, padded);
    // + 2^-20|z| + 2^-96 cover the fp32 evaluation of z ± d and underflow
    const float d = add_rn(add_rn(mul_rn(amb_coef, sabs), mul_rn(REL_PAD, abs_f(z))), ABS_PAD);
    if (lane == 0) {
      const uint16_t f = bf16_rn(z);
      const unsigned slot = base + i;
      if (slot < (unsigned)cap) {
        const long o = (long)tok * cap + slot;
        cand[o] = v;
        cand_logit[o] = f;
        cand_lo[o] = ord16(bf16_rn(sub_rn(z, d)));  // keys of rne(z ∓ d)
        cand_hi[o] = ord16(bf16_rn(add_rn(z, d)));
      }
      atomicMax(winkey + tok, argkey(f, (uint32_t)v));
    }
  }
  // ---- the last block of this token finalizes it ---------------------------------------------------
  __threadfence();  // this block's results are visible device-wide before it is counted as done
  __syncthreads();
  if (tid == 0) last_s = atomicAdd(done + tok, 1u) == gridDim.x - 1;
  __syncthreads();
  if (last_s) {
    __threadfence();
    finalize_token(tok, every, cap, counts, winkey, cand_lo, cand_hi, cand, cand_logit, ids, counts64, amb, fb,
                   best);
  }
}

// =================================================================================================
// 4. The fixed-order exact head over all rows (w12_lmh_exact_logits: the reference of the CUDA path)
// =================================================================================================
// x tile of FULL_MT tokens in shared memory, fp32, lane l's float4 h of step j at ((j·2 + h)·32 + l).
constexpr int FULL_MT = 4;

__global__ void __launch_bounds__(THREADS) full_head_kernel(const uint16_t* __restrict__ W, long ldw,
                                                            const uint16_t* __restrict__ x, long ldx, int M, int V,
                                                            int K, int nj, uint16_t* __restrict__ out, long ldo) {
  extern __shared__ float4 xs[];  // [FULL_MT][nj·64]
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int m0 = blockIdx.y * FULL_MT;
  const int xs_stride = nj * 64;
  for (int m = 0; m < FULL_MT; ++m) {
    const int tok = m0 + m;
    for (int f = tid; f < xs_stride; f += THREADS) {
      const int k = 4 * f;
      const float4 v = load_x4(x, tok, ldx, k, M, K);
      const int j = k >> 8, w = k & 255;  // w = 8·lane + 4·h + (0..3)
      xs[m * xs_stride + (j * 2 + ((w >> 2) & 1)) * 32 + (w >> 3)] = v;
    }
  }
  __syncthreads();
  for (long v = (long)blockIdx.x * WARPS + warp; v < V; v += (long)gridDim.x * WARPS) {
    float acc[FULL_MT];
#pragma unroll
    for (int m = 0; m < FULL_MT; ++m) acc[m] = 0.f;
    const uint16_t* wr = W + v * ldw;
#pragma unroll 4
    for (int j = 0; j < nj; ++j) {
      const int k = 256 * j + 8 * lane;
      if (k < K) {  // the same chunks as dot_fixed_global
        const uint4 wv = ld_stream(wr + k);
#pragma unroll
        for (int m = 0; m < FULL_MT; ++m) {
          const float4 xa = xs[m * xs_stride + (j * 2) * 32 + lane];
          const float4 xb = xs[m * xs_stride + (j * 2 + 1) * 32 + lane];
#pragma unroll
          for (int e = 0; e < 8; ++e)  // the sequence of dot_fixed_global
            acc[m] = fma_rn(bf16_to_f(word(wv, e >> 1) >> (16 * (e & 1))), comp(e < 4 ? xa : xb, e & 3), acc[m]);
        }
      }
    }
#pragma unroll
    for (int m = 0; m < FULL_MT; ++m) {
      const float z = warp_sum(acc[m]);
      if (lane == m && m0 + m < M) out[(m0 + m) * ldo + v] = bf16_rn(z);
    }
  }
}

// ---- launch helpers ----------------------------------------------------------------------------
// Per device, as a function's attributes are (each device has its own context): a process may run the head on two GPUs.
constexpr int MAX_DEVICES = 64;
int device() {  // the current device, clamped into the per-device tables
  int dev = 0;
  cudaGetDevice(&dev);
  return dev >= 0 && dev < MAX_DEVICES ? dev : 0;
}
int sm_count() {
  static int n[MAX_DEVICES] = {};
  const int dev = device();
  if (n[dev] == 0) cudaDeviceGetAttribute(&n[dev], cudaDevAttrMultiProcessorCount, dev);
  return n[dev];
}

template <int MT, int R, int D>
cudaError_t launch_int8(const int8_t* q, const float* s, const float* d, const uint16_t* x, int M, int V, int K,
                        long ldq, long ldx, float mul_pad, uint16_t* U, long ldu, unsigned* blockval,
                        unsigned* zero32, unsigned long long* zero64, int* nbx, cudaStream_t st) {
  auto kern = int8_bounds_kernel<MT, R, D>;
  const int ns = (K + 511) / 512;
  const size_t smem = (size_t)MT * ns * 512 * sizeof(float);
  // attributes and occupancy once per (instantiation, shared-memory size, device)
  static size_t set_smem_of[MAX_DEVICES] = {};
  static int per_sm_of[MAX_DEVICES] = {};
  const int dev = device();
  size_t& set_smem = set_smem_of[dev];
  int& per_sm = per_sm_of[dev];
  if (set_smem != smem) {
    cudaError_t e = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    // the grid is sized to one wave from the occupancy below: make sure the carveout can hold it
    if (e == cudaSuccess)
      e = cudaFuncSetAttribute(kern, cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutMaxShared);
    if (e == cudaSuccess) e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kern, THREADS, smem);
    if (e != cudaSuccess) return e;
    if (per_sm < 1) return cudaErrorInvalidConfiguration;
    set_smem = smem;
  }
  // one wave; each warp takes every nwarps-th group, ⌈groups / warps⌉ of them (balanced to one group)
  const long ngroups = (V + R - 1) / R;
  const long warps = (long)sm_count() * per_sm * WARPS;
  const int gpw = (int)((ngroups + warps - 1) / warps);
  const long blocks = (ngroups + (long)WARPS * gpw - 1) / ((long)WARPS * gpw);
  if (blocks > MAX_BLOCKS) return cudaErrorInvalidConfiguration;
  *nbx = (int)blocks;
  const dim3 grid((unsigned)blocks, (unsigned)((M + MT - 1) / MT));
  kern<<<grid, THREADS, smem, st>>>(q, s, d, x, M, V, K, ldq, ldx, ns, ngroups, mul_pad, U, ldu, blockval,
                                     zero32, zero64);
  return cudaGetLastError();
}

cudaError_t launch_full(const uint16_t* W, long ldw, const uint16_t* x, long ldx, int M, int V, int K,
                        uint16_t* out, long ldo, cudaStream_t st) {
  const int nj = (K + 255) / 256;
  const size_t smem = (size_t)FULL_MT * nj * 256 * sizeof(float);
  static size_t set_smem_of[MAX_DEVICES] = {};
  static int per_sm_of[MAX_DEVICES] = {};
  const int dev = device();
  size_t& set_smem = set_smem_of[dev];
  int& per_sm = per_sm_of[dev];
  if (set_smem != smem) {
    cudaError_t e = cudaFuncSetAttribute(full_head_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (e == cudaSuccess) e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, full_head_kernel, THREADS, smem);
    if (e != cudaSuccess) return e;
    if (per_sm < 1) return cudaErrorInvalidConfiguration;
    set_smem = smem;
  }
  const long blocks = min((long)sm_count() * per_sm, (long)(V + WARPS - 1) / WARPS);
  const dim3 grid((unsigned)blocks, (unsigned)((M + FULL_MT - 1) / FULL_MT));
  full_head_kernel<<<grid, THREADS, smem, st>>>(W, ldw, x, ldx, M, V, K, nj, out, ldo);
  return cudaGetLastError();
}

}  // namespace

// =================================================================================================
// C entry points (ctypes): raw device pointers + the caller's stream; return a cudaError_t code.
// =================================================================================================
extern "C" {

// Workspace (bytes, 8-aligned): winkey u64[M] | counts u32[M] | done u32[M] | blockval u32[M·MAX_BLOCKS]
//                               | cand_lo u32[M·cap] | cand_hi u32[M·cap] (ord16 keys).  No initialisation
//                               needed (int8_bounds zeroes what must start at 0).
// U: bf16 [M, ldu], ldu ≥ V, ldu % 8 == 0.  stages: 1 = the INT8 pass only (timing), else everything.
size_t w12_lmh_workspace_bytes(int M, int cap) {
  return (size_t)M * 16 + (size_t)M * MAX_BLOCKS * 4 + (size_t)M * cap * 8;
}

int w12_lmh_certified(const void* q, const void* scale, const void* radius, const void* W, const void* x, int M,
                      int V, int K, long ldq, long ldw, long ldx, float mul_pad, float amb_coef, int cap, void* U,
                      long ldu, void* ws, int64_t* ids, int64_t* cand, void* cand_logit, int64_t* counts64,
                      uint8_t* amb, uint8_t* fb, void* best, int stages, cudaStream_t st) {
  if (M <= 0 || V <= 0 || K <= 0 || K % 16 || ldu % 8 || ldu < V || cap <= 0) return (int)cudaErrorInvalidValue;
  auto* winkey = static_cast<unsigned long long*>(ws);
  auto* counts = reinterpret_cast<unsigned*>(winkey + M);
  unsigned* done = counts + M;
  unsigned* blockval = done + M;
  unsigned* cand_lo = blockval + (long)M * MAX_BLOCKS;
  unsigned* cand_hi = cand_lo + (long)M * cap;
  auto q8 = static_cast<const int8_t*>(q);
  auto sc = static_cast<const float*>(scale);
  auto rd = static_cast<const float*>(radius);
  auto xb = static_cast<const uint16_t*>(x);
  auto wb = static_cast<const uint16_t*>(W);
  auto ub = static_cast<uint16_t*>(U);
  int nbx = 0;
  cudaError_t e;
  // M = 1: R rows per warp share each x load from shared memory; R·D steps of 512 bytes in flight per warp.
  // W12_LMH_M1 = 10·R + D picks another shape for measurements (R = 1: D from the row length, below).
  static int m1 = -1;
  if (m1 < 0) {
    const char* env = getenv("W12_LMH_M1");
    m1 = env ? atoi(env) : 42;
  }
  const int ns = (K + 511) / 512;
  int d1 = 8;  // R = 1: the one of 8, 7, 6, 5 that pads a row's ns steps least
  for (int d = 7; d >= 5; --d)
    if ((ns + d - 1) / d * d - ns < (ns + d1 - 1) / d1 * d1 - ns) d1 = d;
  if (M == 1 && m1 == 42)
    e = launch_int8<1, 4, 2>(q8, sc, rd, xb, M, V, K, ldq, ldx, mul_pad, ub, ldu, blockval, counts, winkey, &nbx, st);
  else if (M == 1 && m1 == 24)
    e = launch_int8<1, 2, 4>(q8, sc, rd, xb, M, V, K, ldq, ldx, mul_pad, ub, ldu, blockval, counts, winkey, &nbx, st);
  else if (M == 1 && d1 == 8)
    e = launch_int8<1, 1, 8>(q8, sc, rd, xb, M, V, K, ldq, ldx, mul_pad, ub, ldu, blockval, counts, winkey, &nbx, st);
  else if (M == 1 && d1 == 7)
    e = launch_int8<1, 1, 7>(q8, sc, rd, xb, M, V, K, ldq, ldx, mul_pad, ub, ldu, blockval, counts, winkey, &nbx, st);
  else if (M == 1 && d1 == 6)
    e = launch_int8<1, 1, 6>(q8, sc, rd, xb, M, V, K, ldq, ldx, mul_pad, ub, ldu, blockval, counts, winkey, &nbx, st);
  else if (M == 1)
    e = launch_int8<1, 1, 5>(q8, sc, rd, xb, M, V, K, ldq, ldx, mul_pad, ub, ldu, blockval, counts, winkey, &nbx, st);
  else if (M == 2)
    e = launch_int8<2, 2, 4>(q8, sc, rd, xb, M, V, K, ldq, ldx, mul_pad, ub, ldu, blockval, counts, winkey, &nbx, st);
  else
    e = launch_int8<4, 4, 2>(q8, sc, rd, xb, M, V, K, ldq, ldx, mul_pad, ub, ldu, blockval, counts, winkey, &nbx, st);
  if (e != cudaSuccess || stages <= 1) return (int)e;
  const dim3 sgrid((unsigned)((V + THREADS * SEL_ITEMS - 1) / (THREADS * SEL_ITEMS)), (unsigned)M);
  select_rescore_kernel<<<sgrid, THREADS, 0, st>>>(ub, ldu, V, blockval, nbx, wb, ldw, xb, ldx, K, amb_coef, cap,
                                                   counts, done, winkey, cand, static_cast<uint16_t*>(cand_logit),
                                                   cand_lo, cand_hi, ids, counts64, amb, fb,
                                                   static_cast<uint16_t*>(best));
  return (int)cudaGetLastError();
}

// The fixed-order exact head: out bf16 [M, ldo] = rne(z) for every row (the reference of the CUDA path).
int w12_lmh_exact_logits(const void* W, const void* x, int M, int V, int K, long ldw, long ldx, void* out, long ldo,
                         cudaStream_t st) {
  if (M <= 0 || V <= 0 || K <= 0 || K % 8) return (int)cudaErrorInvalidValue;
  return (int)launch_full(static_cast<const uint16_t*>(W), ldw, static_cast<const uint16_t*>(x), ldx, M, V, K,
                          static_cast<uint16_t*>(out), ldo, st);
}

}  // extern "C"
