// CPU expert executor: a persistent pool of worker threads computing routed expert FFNs with the
// semantics of freetoken_kernels/ref.py::moe_experts, reading weights straight from host expert banks.
// Plain C ABI loaded with ctypes: no torch/Python headers, so the first build takes seconds and
// ctypes releases the GIL during every call. One build holds every SIMD path (function-level
// targets); the Python side picks the path at run time from ftmoe_cpu_features().
//
// A bank holds plain fp32/bf16/fp16 matrices, or quantized ones in the layout of freetoken_kernels/quant.py
// (codes, block scales, zero points), whose rows are dequantized in registers, and optionally a
// float32 bias per expert and row; every path accumulates in fp32.
//
// A job runs in two phases over the pool's threads, with a barrier between them:
//   1. units (expert, block of r1 intermediate rows): h[route, j] = act(gate_j . x + bg_j, up_j . x + bu_j)
//   2. units (block of R2 output rows): out[t, r] = sum over routes of w * (down_r . h[route] + bd_r)
// with act the gated activation of freetoken_kernels/ref.py::ExpertAct (SwiGLU, or gpt-oss's clamped one).
// At batch 1 this splits each expert's rows across all threads (a GEMV streaming the weights);
// phase 2 partitions out by rows, so there are no write races and no reduction step. The thread
// that completes the last phase-2 unit retires the job: a worker that woke late, or was
// descheduled before it claimed a unit, never holds a job back.
#include <immintrin.h>
#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace {

// Weight formats (cpu_executor.py mirrors the codes); E8M0 only names mxfp4's scale type.
enum Fmt { F32 = 0, BF16 = 1, F16 = 2, INT4 = 3, INT8 = 4, FP8 = 5, MXFP4 = 6, E8M0 = 7 };
// Kernel families. DP_BF16: bf16 weights AND bf16 activations; AVX512: quantized weights only;
// AVX512_BF16Q: quantized weights, int4 and mxfp4 through the BF16 dot products (else as AVX512).
enum Mode { DP_BF16 = 0, AVX2 = 1, SCALAR = 2, AVX512 = 3, AVX512_BF16Q = 4 };
// How a kernel reads its activation rows (x, h) of n elements: fp32; bf16; BF16X2: each value v
// as two bf16, hi = bf16(v) in the row's first n elements and lo = bf16(v - hi) in the next n,
// hi + lo within 2**-18 of v (relative; 16 significant bits), and exactly v where v is a bf16.
// A_BF16X2_HI is how rows are written, not read: the A_BF16X2 layout of bf16(v), lo halves zero.
enum Act { A_F32 = 0, A_BF16 = 1, A_BF16X2 = 2, A_BF16X2_HI = 3 };
constexpr int R1 = 16;  // gate/up row pairs per phase-1 unit, at least (128 KiB of bf16 weights at H=2048)
constexpr size_t U1 = 128 << 10;  // a phase-1 unit's weight bytes, at most, when it takes more rows (unit_rows)
constexpr int R2 = 16;  // down rows per phase-2 unit, over every expert of the job
constexpr int RC = 8;   // routes per call of a row kernel

// One bank [E, N, K] of expert matrices, each expert's parts contiguous (cpu_executor._Mat).
struct Mat {
  const char *q, *s, *z;  // weights or codes; scales [E, ceil(N/bn), ceil(K/bk)]; zero points
                          // uint8 in the blocks of s (int4/int8); s and z null for plain weights
  int64_t sq, ss, sz;        // bytes from one expert to the next
  int32_t fmt, sdt, bn, bk;  // Fmt of the weights and of the scales; block rows and columns
  const char* b;             // float32 bias [E, N], or null
  int64_t sb;                // its bytes from one expert to the next
};

// Expert e's bias row of a bank (N floats), or null.
inline const float* bias(const Mat& m, int64_t e) {
  return m.b ? reinterpret_cast<const float*>(m.b + e * m.sb) : nullptr;
}

// The gated activation (freetoken_kernels/ref.py::ExpertAct): g * sigmoid(alpha g) * (u + shift), g clamped
// from above and u on both sides at limit (infinite: no clamp; alpha 1, shift 0: SwiGLU).
struct ExpertAct {
  float alpha, limit, shift;
  float operator()(float g, float u) const {
    g = std::min(g, limit), u = std::min(std::max(u, -limit), limit);
    return g / (1.f + std::exp(-alpha * g)) * (u + shift);
  }
};

// One row of one expert's matrix: its K weights or codes, and for a quantized format the row's
// block scales and zero points.
struct Row {
  const uint8_t* q;
  const char* s;
  const uint8_t* z;
  int K, bk, sdt;
};

// The rows of expert e's matrix in a bank, of K columns each. The divisions are done once per
// expert, not per row: an integer division costs a fair share of a quantized row's kernel.
struct Rows {
  const uint8_t *q, *z = nullptr;
  const char* s = nullptr;
  size_t qb;            // bytes per row of weights or codes
  int K, bk, bn, sdt;
  int sb = 0, kb = 0;   // bytes per scale, blocks per row

  Rows(const Mat& m, int64_t e, int K_)
      : q(reinterpret_cast<const uint8_t*>(m.q + e * m.sq)), K(K_), bk(m.bk), bn(m.bn), sdt(m.sdt) {
    static const int bits[7] = {32, 16, 16, 4, 8, 8, 4};  // per weight, by Fmt
    qb = size_t(K) * bits[m.fmt] / 8;
    if (m.fmt >= INT4) {
      s = m.s + e * m.ss, sb = m.sdt == F32 ? 4 : m.sdt == E8M0 ? 1 : 2, kb = (K + bk - 1) / bk;
      if (m.z) z = reinterpret_cast<const uint8_t*>(m.z + e * m.sz);
    }
  }
  Row operator()(int n) const {
    Row r{q + n * qb, nullptr, nullptr, K, bk, sdt};
    if (s) {
      size_t blk = size_t(bn == 1 ? n : n / bn) * kb;  // the row's first block
      r.s = s + blk * sb;
      if (z) r.z = z + blk;
    }
    return r;
  }
};

using RowsFn = void (*)(const Row& w, const void* const* x, int nx, float* out);  // out[i] = w . x[i]
struct Kernel {
  RowsFn fn;
  int chunk;                  // activations in permute(.., chunk) order; 0: plain order
  int act = A_F32;            // Act of the activation rows
  RowsFn hi_only = nullptr;   // A_BF16X2: fn for rows whose lo halves are all zero
  bool sums = false;          // fp32 rows of K values carry their blocks' sums after them (block_sums)
};

// The sums of an fp32 activation row's blocks of bk values, written after its K values (a kernel
// with sums takes a zero point out once a block: sum (c - z) x = sum c x - z sum x). Positions, not
// columns: a chunk never crosses a block, so a block's values stay among its positions.
inline int n_sums(int K, int bk) { return (K + bk - 1) / bk; }
void block_sums(float* row, int K, int bk) {
  for (int g = 0; g * bk < K; ++g) {
    float a = 0.f;
    for (int k = g * bk; k < std::min(K, (g + 1) * bk); ++k) a += row[k];
    row[K + g] = a;
  }
}

// Position of element k of a length-K activation row read by a kernel of the given chunk c (a
// power of two): within each whole chunk of c, the even k first, then the odd ones (the low, then
// the high nibbles of c / 2 bytes of codes); the last K % c elements stay in place. (Masks, not
// divisions: this runs once per activation element of a job.)
inline int permute(int k, int K, int c) {
  if (c == 0 || k >= (K & -c)) return k;
  int o = k & (c - 1);
  return k - o + (o & 1) * (c >> 1) + (o >> 1);
}
using DotFn = float (*)(const void* w, const void* x, int n);  // fp32 dot of two length-n rows

float bf2f(uint16_t v) { uint32_t u = uint32_t(v) << 16; float f; memcpy(&f, &u, 4); return f; }
inline float h2f(uint16_t v) { _Float16 h; memcpy(&h, &v, 2); return float(h); }
uint16_t f2bf(float f) {  // round to nearest even, NaN kept a NaN
  uint32_t u; memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);
  return uint16_t((u + 0x7fffu + ((u >> 16) & 1)) >> 16);
}
int act_bytes(int act) { return act == A_BF16 ? 2 : 4; }
// Element p of an activation row of n elements (p: its position in the kernel's order) := v.
void put_act(char* row, int n, int p, float v, int act) {
  auto h = reinterpret_cast<uint16_t*>(row);
  if (act == A_F32) memcpy(row + size_t(p) * 4, &v, 4);
  else if (act == A_BF16) h[p] = f2bf(v);
  else if (act == A_BF16X2_HI) h[p] = f2bf(v), h[n + p] = 0;
  else h[p] = f2bf(v), h[n + p] = f2bf(std::isinf(bf2f(h[p])) ? 0.f : v - bf2f(h[p]));
}

// Element k of a quantized row before its block scale. int4/int8: code - zero point. fp8 (e4m3):
// the fp16 with the e4m3 bits below the sign, which is the value / 256 (exact, subnormals too;
// every path decodes it so, and block_scale puts the 256 back). mxfp4: the e2m1 value.
constexpr float kE2M1[16] = {0.f, .5f, 1.f, 1.5f, 2.f, 3.f, 4.f, 6.f,
                             -0.f, -.5f, -1.f, -1.5f, -2.f, -3.f, -4.f, -6.f};
template <int F> inline float code_value(const uint8_t* q, int k, float z) {
  if constexpr (F == INT4 || F == MXFP4) {
    int c = (q[k >> 1] >> ((k & 1) * 4)) & 15;  // the even k in the low nibble
    if constexpr (F == INT4) return float(c) - z; else return kE2M1[c];
  } else if constexpr (F == INT8) {
    return float(q[k]) - z;
  } else {
    return h2f(uint16_t(((q[k] & 0x80) << 8) | ((q[k] & 0x7f) << 7)));
  }
}
// The scale of block g of a row (fp8: times 256, see code_value).
template <int F> inline float block_scale(const Row& w, int g) {
  if constexpr (F == MXFP4) {  // e8m0: 2 ** (e - 127), e = 0 being the subnormal 2 ** -127
    uint32_t e = uint8_t(w.s[g]), u = e ? e << 23 : 0x400000u;
    float f; memcpy(&f, &u, 4); return f;
  } else {
    auto h = reinterpret_cast<const uint16_t*>(w.s);
    float s = w.sdt == F32 ? reinterpret_cast<const float*>(w.s)[g] : w.sdt == BF16 ? bf2f(h[g]) : h2f(h[g]);
    return F == FP8 ? s * 256.f : s;
  }
}

template <int D> inline float ldw(const void* p, int i) {
  if constexpr (D == F32) return static_cast<const float*>(p)[i];
  else if constexpr (D == BF16) return bf2f(static_cast<const uint16_t*>(p)[i]);
  else return h2f(static_cast<const uint16_t*>(p)[i]);
}

template <int D> float dot_scalar(const void* w, const void* x, int n) {
  auto xf = static_cast<const float*>(x);
  float s = 0.f;
  for (int i = 0; i < n; ++i) s += ldw<D>(w, i) * xf[i];
  return s;
}

// Vector traits of the quantized row kernel (cpu_moe_qrow.h), one per path: W fp32 lanes;
// dequant<F>(q): W int8/fp8 codes from q on; nibbles<F>(q, a, b): the low nibbles of W bytes from
// q on, then their high nibbles; each as code_value gives them for a zero point of 0 (the kernel
// takes zero points out once a block).
struct Scalar {
  static constexpr int W = 1;
  using R = float;
  static R zero() { return 0.f; }
  static R set1(float v) { return v; }
  static R load(const float* p) { return *p; }
  static R fma(R a, R b, R c) { return a * b + c; }
  static R mul(R a, R b) { return a * b; }
  static R add(R a, R b) { return a + b; }
  static float sum(R v) { return v; }
  template <int F> static R dequant(const uint8_t* q) { return code_value<F>(q, 0, 0.f); }
  template <int F> static void nibbles(const uint8_t* q, R& a, R& b) {
    a = code_value<F>(q, 0, 0.f), b = code_value<F>(q, 1, 0.f);
  }
};

namespace scalar {
using V = Scalar;
#include "cpu_moe_qrow.h"
}  // namespace scalar

#define AVX2_T __attribute__((target("avx2,fma,f16c")))
template <int D> AVX2_T inline __m256 ld8(const void* p, int i) {  // 8 weights -> fp32
  if constexpr (D == F32) return _mm256_loadu_ps(static_cast<const float*>(p) + i);
  auto q = reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(p) + i);
  if constexpr (D == BF16)  // bf16 is the top half of an fp32: widen and shift
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(q)), 16));
  else return _mm256_cvtph_ps(_mm_loadu_si128(q));
}

template <int D> AVX2_T float dot_avx2(const void* w, const void* x, int n) {
  auto xf = static_cast<const float*>(x);
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;  // 4 chains hide FMA latency
  int i = 0;
  for (; i + 32 <= n; i += 32) {
    const char* ahead = static_cast<const char*>(w) + size_t(i) * (D == F32 ? 4 : 2) + 4096;
    _mm_prefetch(ahead, _MM_HINT_T0);  // a page ahead: ~the next row of this stream
    if constexpr (D == F32) _mm_prefetch(ahead + 64, _MM_HINT_T0);
    a0 = _mm256_fmadd_ps(ld8<D>(w, i), _mm256_loadu_ps(xf + i), a0);
    a1 = _mm256_fmadd_ps(ld8<D>(w, i + 8), _mm256_loadu_ps(xf + i + 8), a1);
    a2 = _mm256_fmadd_ps(ld8<D>(w, i + 16), _mm256_loadu_ps(xf + i + 16), a2);
    a3 = _mm256_fmadd_ps(ld8<D>(w, i + 24), _mm256_loadu_ps(xf + i + 24), a3);
  }
  for (; i + 8 <= n; i += 8) a0 = _mm256_fmadd_ps(ld8<D>(w, i), _mm256_loadu_ps(xf + i), a0);
  __m256 a = _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3));
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  s = _mm_hadd_ps(s, s);
  s = _mm_hadd_ps(s, s);
  float r = _mm_cvtss_f32(s);
  for (; i < n; ++i) r += ldw<D>(w, i) * xf[i];
  return r;
}

// ---- quantized rows, AVX2 + FMA + F16C ----
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")

struct V256 {
  static constexpr int W = 8;
  using R = __m256;
  static R zero() { return _mm256_setzero_ps(); }
  static R set1(float v) { return _mm256_set1_ps(v); }
  static R load(const float* p) { return _mm256_loadu_ps(p); }
  static R fma(R a, R b, R c) { return _mm256_fmadd_ps(a, b, c); }
  static R mul(R a, R b) { return _mm256_mul_ps(a, b); }
  static R add(R a, R b) { return _mm256_add_ps(a, b); }
  static float sum(R v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_hadd_ps(s, s);
    return _mm_cvtss_f32(_mm_hadd_ps(s, s));
  }
  static __m128i load8(const uint8_t* q) { return _mm_loadl_epi64(reinterpret_cast<const __m128i*>(q)); }
  template <int F> static R dequant(const uint8_t* q) {
    if constexpr (F == INT8) return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(load8(q)));
    // fp8: sign-extended to 16 bits and shifted up 7, e4m3 keeps its sign at bit 15 and has its
    // exponent and mantissa under fp16's; clearing bit 14 leaves the fp16 of code_value
    __m128i h = _mm_slli_epi16(_mm_cvtepi8_epi16(load8(q)), 7);
    return _mm256_cvtph_ps(_mm_and_si128(h, _mm_set1_epi16(short(0xBF80))));
  }
  template <int F> static void nibbles(const uint8_t* q, R& a, R& b) {
    __m256i c = _mm256_cvtepu8_epi32(load8(q)), hi = _mm256_srli_epi32(c, 4);
    if constexpr (F == INT4) {
      a = _mm256_cvtepi32_ps(_mm256_and_si256(c, _mm256_set1_epi32(15))), b = _mm256_cvtepi32_ps(hi);
    } else {  // e2m1: the magnitude from a table by the low 3 bits, the nibble's top bit the sign
      const __m256 mag = _mm256_setr_ps(0.f, .5f, 1.f, 1.5f, 2.f, 3.f, 4.f, 6.f);
      const __m256i sign = _mm256_set1_epi32(INT32_MIN);
      a = _mm256_xor_ps(_mm256_permutevar8x32_ps(mag, c),
                        _mm256_castsi256_ps(_mm256_and_si256(_mm256_slli_epi32(c, 28), sign)));
      b = _mm256_xor_ps(_mm256_permutevar8x32_ps(mag, hi),
                        _mm256_castsi256_ps(_mm256_and_si256(_mm256_slli_epi32(c, 24), sign)));
    }
  }
};

namespace avx2 {
using V = V256;
#include "cpu_moe_qrow.h"
}  // namespace avx2

#pragma GCC pop_options

// ---- AVX-512 (F + BW; BF16 for the bf16 dot) ----
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,avx512f,avx512bw")

struct V512 {  // as V256
  static constexpr int W = 16;
  using R = __m512;
  static R zero() { return _mm512_setzero_ps(); }
  static R set1(float v) { return _mm512_set1_ps(v); }
  static R load(const float* p) { return _mm512_loadu_ps(p); }
  static R fma(R a, R b, R c) { return _mm512_fmadd_ps(a, b, c); }
  static R mul(R a, R b) { return _mm512_mul_ps(a, b); }
  static R add(R a, R b) { return _mm512_add_ps(a, b); }
  static float sum(R v) { return _mm512_reduce_add_ps(v); }
  static __m128i load16(const uint8_t* q) { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(q)); }
  template <int F> static R dequant(const uint8_t* q) {
    if constexpr (F == INT8) return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(load16(q)));
    __m256i h = _mm256_slli_epi16(_mm256_cvtepi8_epi16(load16(q)), 7);
    return _mm512_cvtph_ps(_mm256_and_si256(h, _mm256_set1_epi16(short(0xBF80))));
  }
  template <int F> static void nibbles(const uint8_t* q, R& a, R& b) {
    __m512i c = _mm512_cvtepu8_epi32(load16(q)), hi = _mm512_srli_epi32(c, 4);
    if constexpr (F == INT4) {
      a = _mm512_cvtepi32_ps(_mm512_and_si512(c, _mm512_set1_epi32(15))), b = _mm512_cvtepi32_ps(hi);
    } else {  // e2m1: a 16-entry table by the low 4 bits, sign included
      const __m512 v = _mm512_setr_ps(0.f, .5f, 1.f, 1.5f, 2.f, 3.f, 4.f, 6.f,
                                      -0.f, -.5f, -1.f, -1.5f, -2.f, -3.f, -4.f, -6.f);
      a = _mm512_permutexvar_ps(c, v), b = _mm512_permutexvar_ps(hi, v);
    }
  }
};

namespace avx512 {
using V = V512;
#include "cpu_moe_qrow.h"
}  // namespace avx512

#pragma GCC pop_options

#define BF16_T __attribute__((target("avx512f,avx512bw,avx512bf16")))
// RowsFn of bf16 rows and bf16 activations (bf16 pairs -> fp32 by VDPBF16PS): the row's dots with
// up to NB activation rows at once, each with two accumulators (even and odd 32-column steps). One
// dot alone is bound by the latency of its two accumulator chains; NB of them share the weight
// loads and keep 2 * NB chains in flight; each result is the same as the dot's alone.
template <int NB> BF16_T void dpbf16_block(const uint16_t* wp, const uint16_t* const* xp, int n, float* out) {
  __m512 a0[NB], a1[NB];
  for (int r = 0; r < NB; ++r) a0[r] = a1[r] = _mm512_setzero_ps();
  int i = 0;
  for (; i + 64 <= n; i += 64) {
    const char* ahead = reinterpret_cast<const char*>(wp + i) + 4096;  // see dot_avx2
    _mm_prefetch(ahead, _MM_HINT_T0), _mm_prefetch(ahead + 64, _MM_HINT_T0);
    __m512bh w0 = (__m512bh)_mm512_loadu_si512(wp + i), w1 = (__m512bh)_mm512_loadu_si512(wp + i + 32);
    for (int r = 0; r < NB; ++r) {
      a0[r] = _mm512_dpbf16_ps(a0[r], w0, (__m512bh)_mm512_loadu_si512(xp[r] + i));
      a1[r] = _mm512_dpbf16_ps(a1[r], w1, (__m512bh)_mm512_loadu_si512(xp[r] + i + 32));
    }
  }
  for (; i < n; i += 32) {  // masked tail: zeroed lanes add nothing
    __mmask32 m = n - i >= 32 ? 0xffffffffu : (1u << (n - i)) - 1;
    __m512bh w0 = (__m512bh)_mm512_maskz_loadu_epi16(m, wp + i);
    for (int r = 0; r < NB; ++r)
      a0[r] = _mm512_dpbf16_ps(a0[r], w0, (__m512bh)_mm512_maskz_loadu_epi16(m, xp[r] + i));
  }
  for (int r = 0; r < NB; ++r) out[r] = _mm512_reduce_add_ps(_mm512_add_ps(a0[r], a1[r]));
}

BF16_T void rows_dpbf16(const Row& w, const void* const* x, int nx, float* out) {
  auto wp = reinterpret_cast<const uint16_t*>(w.q);
  auto xp = reinterpret_cast<const uint16_t* const*>(x);
  int i = 0;
  for (; i + 4 <= nx; i += 4) dpbf16_block<4>(wp, xp + i, w.K, out + i);
  for (; i + 2 <= nx; i += 2) dpbf16_block<2>(wp, xp + i, w.K, out + i);
  if (i < nx) dpbf16_block<1>(wp, xp + i, w.K, out + i);
}

// The int4 code tables of the BF16 dot products below, built when the library loads: outside every
// target region, so that the loader runs no instruction the CPU may lack.
struct CodeTables {
  alignas(64) uint16_t t[17][32] = {};
  CodeTables() {
    for (int z = 0; z < 17; ++z)
      for (int c = 0; c < 16; ++c) t[z][c] = f2bf(float(c - z));
  }
};
const CodeTables kCodeTables;

// ---- int4 and mxfp4 rows through the AVX-512 BF16 dot products ----
// A code minus its zero point (int4: an integer of at most 8 bits) and an e2m1 value are exact in
// bf16, and the product of two bf16 is exact in fp32: the codes' dots with the activations' hi and
// lo halves (A_BF16X2) are accumulated in fp32 by VDPBF16PS, then scaled. 64 columns a step: 32
// bytes of codes widened to 16-bit lanes give the even columns' codes (low nibbles) and the odd
// columns' (high nibbles), each turned into bf16 by one table lookup (VPERMW) and meeting 32
// activations in the chunked order of permute(.., 64). fp32 lane l of a dot sums columns 4l ..
// 4l + 3 of the step, so mxfp4's blocks of 32 columns have lanes of their own, scaled lane by lane
// once a step; blocks of 64 columns or more are summed unscaled and scaled once a block.
// Activations whose lo halves are all zero (exactly bf16: a bf16 model's x) take the variant that
// skips them.
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,avx512f,avx512bw,avx512bf16")
namespace bf16q {
constexpr int kChunk = 64;

// Whether rows of format F in blocks of bk columns run here.
inline bool fits(int F, int bk) { return (F == INT4 || F == MXFP4) && (bk % kChunk == 0 || (F == MXFP4 && bk == 32)); }

inline __m512i bf16_table(__m512 v) {  // bf16 of v's lane c in 16-bit lane c, c < 16
  return _mm512_castsi256_si512((__m256i)_mm512_cvtneps_pbh(v));
}
// int4: bf16 (c - z) in 16-bit lane c. Zero points up to 16 (a gptq-format zero is stored minus one)
// come from tables built once (kCodeTables): a row whose zero points change from block to block (AWQ,
// asymmetric GPTQ) loads its table instead of computing it (a row with a new zero point every block: 1.2x).
inline __m512i code_table(int z) {
  if (z < 17) return _mm512_load_si512(kCodeTables.t[z]);
  const __m512 c = _mm512_setr_ps(0.f, 1.f, 2.f, 3.f, 4.f, 5.f, 6.f, 7.f, 8.f, 9.f, 10.f, 11.f, 12.f, 13.f, 14.f, 15.f);
  return bf16_table(_mm512_sub_ps(c, _mm512_set1_ps(float(z))));
}

inline __m512 dp(__m512 acc, __m512i w, const uint16_t* x) {
  return _mm512_dpbf16_ps(acc, (__m512bh)w, (__m512bh)_mm512_loadu_si512(x));
}

// out[r] = W_row . x[r] for NR activation rows (A_BF16X2; LO: their lo halves too). Whole spans
// (a block, or two of mxfp4's) run vectorized; a last span short of that, if any, runs scalar.
template <int F, int NR, bool LO>
void qrow(const Row& w, const uint16_t* const* xr, float* out) {
  const int K = w.K, bk = w.bk, span = std::max(bk, kChunk), ns = K / span, nv = ns * span;
  const __m512i low = _mm512_set1_epi16(15);
  const uint16_t* x[NR];
  __m512 acc[NR];
  for (int r = 0; r < NR; ++r) x[r] = xr[r], acc[r] = _mm512_setzero_ps();
  __m512i tab = F == MXFP4 ? bf16_table(_mm512_loadu_ps(kE2M1)) : _mm512_setzero_si512();  // int4's: per block
  int ztab = -1;  // the zero point of int4's table
  const uint8_t* q = w.q;
  for (int g = 0; g < ns; ++g) {  // spans of one table and scales: a block, or two of 32 columns
    if constexpr (F == INT4)
      if (w.z[g] != ztab) ztab = w.z[g], tab = code_table(ztab);
    __m512 p[NR][LO ? 4 : 2];  // hi . even columns, hi . odd, lo . even, lo . odd
    for (int r = 0; r < NR; ++r)
      for (auto& v : p[r]) v = _mm512_setzero_ps();
    for (int i = 0; i < span; i += kChunk, q += kChunk / 2) {
      _mm_prefetch(reinterpret_cast<const char*>(q) + 4096, _MM_HINT_T0);  // see dot_avx2
      const __m512i c = _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(q)));
      const __m512i we = _mm512_permutexvar_epi16(_mm512_and_si512(c, low), tab);
      const __m512i wo = _mm512_permutexvar_epi16(_mm512_srli_epi16(c, 4), tab);
      for (int r = 0; r < NR; ++r) {
        const uint16_t* xk = x[r] + g * span + i;
        p[r][0] = dp(p[r][0], we, xk), p[r][1] = dp(p[r][1], wo, xk + 32);
        if constexpr (LO) p[r][2] = dp(p[r][2], we, xk + K), p[r][3] = dp(p[r][3], wo, xk + K + 32);
      }
    }
    __m512 sv;
    if (F == MXFP4 && bk < kChunk)  // two blocks, of 8 lanes each
      sv = _mm512_mask_mov_ps(_mm512_set1_ps(block_scale<F>(w, 2 * g)), 0xFF00, _mm512_set1_ps(block_scale<F>(w, 2 * g + 1)));
    else
      sv = _mm512_set1_ps(block_scale<F>(w, g));
    for (int r = 0; r < NR; ++r) {
      __m512 t = _mm512_add_ps(p[r][0], p[r][1]);
      if constexpr (LO) t = _mm512_add_ps(t, _mm512_add_ps(p[r][2], p[r][3]));
      acc[r] = _mm512_fmadd_ps(t, sv, acc[r]);
    }
  }
  for (int r = 0; r < NR; ++r) out[r] = _mm512_reduce_add_ps(acc[r]);
  for (int k = nv; k < K; ++k) {  // the short last span
    const float v = code_value<F>(w.q, k, F == INT4 ? float(w.z[k / bk]) : 0.f) * block_scale<F>(w, k / bk);
    const int p = permute(k, K, kChunk);
    for (int r = 0; r < NR; ++r) out[r] += v * (bf2f(x[r][p]) + (LO ? bf2f(x[r][K + p]) : 0.f));
  }
}

template <int F, bool LO>
void rows(const Row& w, const void* const* x, int nx, float* out) {
  auto xh = reinterpret_cast<const uint16_t* const*>(x);
  int i = 0;
  for (; i + 4 <= nx; i += 4) qrow<F, 4, LO>(w, xh + i, out + i);
  for (; i + 2 <= nx; i += 2) qrow<F, 2, LO>(w, xh + i, out + i);
  if (i < nx) qrow<F, 1, LO>(w, xh + i, out + i);
}

template <int F> const Kernel kernel{rows<F, true>, kChunk, A_BF16X2, rows<F, false>};

// bf16 of 16 fp32 values as f2bf rounds them (to nearest even, a NaN kept a NaN), each in the low
// half of its 32-bit lane.
inline __m512i round_bf16(__m512i u) {
  const __m512i r = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)),
                                                       _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1))), 16);
  const __mmask16 nan = _mm512_cmpgt_epi32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)), _mm512_set1_epi32(0x7f800000));
  return _mm512_mask_mov_epi32(r, nan, _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40)));
}

// put_act of a whole row of K values as A_BF16X2 in permute(.., 64) order, the same bits, 64 values
// a step (an int4 job's set-up at H = 2048: 9.3 -> 2.6 us on the 2-core dev box, 10-11 -> 6 us on
// the H200 host).
void put_row(uint16_t* h, const float* x, int K) {
  alignas(64) uint16_t ix[32];
  for (int i = 0; i < 32; ++i) ix[i] = uint16_t(2 * i);
  const __m512i even = _mm512_load_si512(ix), odd = _mm512_add_epi16(even, _mm512_set1_epi16(1));  // 16-bit lanes
  const int nv = K & -kChunk;
  for (int c = 0; c < nv; c += kChunk) {
    __m512i hi[2], lo[2];  // the chunk's 64 values in order, 32 a register
    for (int j = 0; j < 2; ++j) {
      __m256i hh[2], ll[2];
      for (int k = 0; k < 2; ++k) {
        const __m512 v = _mm512_loadu_ps(x + c + 32 * j + 16 * k);
        const __m512i b = round_bf16(_mm512_castps_si512(v));
        const __m512 bv = _mm512_castsi512_ps(_mm512_slli_epi32(b, 16));
        const __mmask16 inf = _mm512_cmpeq_epi32_mask(_mm512_and_si512(b, _mm512_set1_epi32(0x7fff)), _mm512_set1_epi32(0x7f80));
        hh[k] = _mm512_cvtepi32_epi16(b);
        ll[k] = _mm512_cvtepi32_epi16(round_bf16(_mm512_castps_si512(_mm512_maskz_sub_ps(~inf, v, bv))));
      }
      hi[j] = _mm512_inserti64x4(_mm512_castsi256_si512(hh[0]), hh[1], 1);
      lo[j] = _mm512_inserti64x4(_mm512_castsi256_si512(ll[0]), ll[1], 1);
    }
    _mm512_storeu_si512(h + c, _mm512_permutex2var_epi16(hi[0], even, hi[1]));
    _mm512_storeu_si512(h + c + 32, _mm512_permutex2var_epi16(hi[0], odd, hi[1]));
    _mm512_storeu_si512(h + K + c, _mm512_permutex2var_epi16(lo[0], even, lo[1]));
    _mm512_storeu_si512(h + K + c + 32, _mm512_permutex2var_epi16(lo[0], odd, lo[1]));
  }
  for (int k = nv; k < K; ++k) put_act(reinterpret_cast<char*>(h), K, k, x[k], A_BF16X2);
}
}  // namespace bf16q
#pragma GCC pop_options

// RowsFn of plain weights: one dot per activation row (the row stays in L1 for the next ones).
template <DotFn D> void frows(const Row& w, const void* const* x, int nx, float* out) {
  for (int i = 0; i < nx; ++i) out[i] = D(w.q, x[i], w.K);
}

// The row kernel of a bank under a mode; {null, 0} where the pair makes no sense. A nibble
// format whose blocks do not hold whole chunks of a path takes the next narrower path.
Kernel kernel(int mode, const Mat& m) {
  static const RowsFn avx2f[3] = {frows<dot_avx2<F32>>, frows<dot_avx2<BF16>>, frows<dot_avx2<F16>>};
  static const RowsFn scalarf[3] = {frows<dot_scalar<F32>>, frows<dot_scalar<BF16>>, frows<dot_scalar<F16>>};
  if (m.fmt < 0 || m.fmt > MXFP4) return {nullptr, 0};
  if (m.fmt >= INT4) {
    if (mode == AVX512_BF16Q && bf16q::fits(m.fmt, m.bk))
      return m.fmt == INT4 ? bf16q::kernel<INT4> : bf16q::kernel<MXFP4>;
    static const Kernel* paths[3] = {avx512::qkernels, avx2::qkernels, scalar::qkernels};
    for (int p = mode >= AVX512 ? 0 : mode == AVX2 ? 1 : mode == SCALAR ? 2 : 3; p < 3; ++p) {
      const Kernel& k = paths[p][m.fmt - INT4];
      if (!k.chunk || m.bk % k.chunk == 0) return k;
    }
    return {nullptr, 0};
  }
  if (mode == DP_BF16) return {m.fmt == BF16 ? rows_dpbf16 : nullptr, 0, A_BF16};
  return {mode == SCALAR ? scalarf[m.fmt] : avx2f[m.fmt], 0};
}

// A row of K activations as a kernel reading (act, chunk) takes it (ftmoe_submit's x, one row).
// A_BF16X2 rows in 64-value chunks are the BF16 dot products' (bf16q), which run only where the
// CPU has AVX-512 BF16 (ftmoe_cpu_features bit 1).
void put_x(char* row, const float* x, int K, int act, int chunk) {
  if (act == A_BF16X2 && chunk == bf16q::kChunk) return bf16q::put_row(reinterpret_cast<uint16_t*>(row), x, K);
  for (int k = 0; k < K; ++k) put_act(row, K, permute(k, K, chunk), x[k], act);
}

struct Pool;

struct Job {
  uint64_t seq = 0;
  const char* x = nullptr;      // [T, H], in the order of kgu
  Mat gu{}, d{};                // banks [E, 2I, H], [E, H, I]
  Kernel kgu{}, kd{};           // their row kernels
  ExpertAct act{1.f, INFINITY, 0.f};  // the gated activation
  std::unique_ptr<char[]> xp;   // x permuted (and converted) for kgu, where it needs that
  float* out = nullptr;         // [T, H]
  int T = 0, H = 0, I = 0, E = 0;
  size_t xsz = 0, hsz = 0;      // bytes per element of x (kgu.act) and of h (kd.act)
  int hact = A_F32;             // how h is written: kd.act, or A_BF16X2_HI (below)
  std::vector<int64_t> eid;     // [G] expert of each group of routes
  std::vector<int> gstart;      // [G + 1] route range of each group, routes sorted by expert
  std::vector<int> tok;         // [R] token of each route
  std::vector<float> rw;        // [R] routing weight of each route
  std::unique_ptr<char[]> h;    // [R, I] act(gate, up), in the order (and layout) of kd
  size_t xn = 0, hn = 0;        // elements from one row of x, of h, to the next (their block sums too)
  std::vector<const void*> xr, hr;  // [R] each route's row of x and of h
  int r1 = R1, nb1 = 0, n1 = 0, n2 = 0;  // a phase-1 unit's rows, its blocks an expert, phase-1 and phase-2 units
  std::atomic<int> next1{0}, done1{0}, next2{0}, done2{0};
  std::atomic<int> refs{1};  // the submitter's (ftmoe_free) and one per worker inside work()
  Pool* pool = nullptr;
  std::mutex m;
  std::condition_variable cv;
  std::atomic<bool> done{false};  // set under m; also read without it by the poller
  std::string err;  // first failure; read only after done
  std::chrono::steady_clock::time_point t0, t1;  // submitted, retired: the CPU branch's duration

  void fail(const char* msg) { std::lock_guard<std::mutex> g(m); if (err.empty()) err = msg; }
  void h_sums() {  // every route's h: its block sums after it (kd.sums; a few thousand additions)
    for (size_t i = 0; i < hr.size(); ++i) block_sums(reinterpret_cast<float*>(h.get() + i * hn * hsz), I, d.bk);
  }
  int64_t expert(int g) const {
    int64_t e = eid[g];
    if (e < 0 || e >= E)
      throw std::out_of_range("expert id " + std::to_string(e) + " out of range [0, " +
                              std::to_string(E) + ") (-1 marks a route computed elsewhere)");
    return e;
  }
};

// Rows of a phase-1 unit: R1 pairs of gate/up rows of `pair` bytes, doubled while a unit stays within
// U1 bytes and I rows and the job keeps four units for each of `threads` threads. Quantized rows are
// short (an int4 pair at H=2048: 2 KiB), and a unit is a stream the hardware prefetchers start on
// again: int4 jobs of eight experts ran 12% faster at 64 pairs than at 16 (H200 host, 14 threads).
// Jobs of few experts keep R1, their units spread over every thread.
int unit_rows(size_t pair, int I, int experts, int threads) {
  int r = R1;
  while (size_t(2 * r) * pair <= U1 && 2 * r <= I && int64_t(experts) * ((I + 2 * r - 1) / (2 * r)) >= 4 * threads)
    r *= 2;
  return r;
}

void unit1(Job& J, int u) {
  int g = u / J.nb1, j0 = (u % J.nb1) * J.r1, j1 = std::min(J.I, j0 + J.r1);
  int64_t e = J.expert(g);
  const Rows gu(J.gu, e, J.H);
  const float* bgu = bias(J.gu, e);
  float a[RC], b[RC];
  // RC routes' x rows stay in L1 while the unit's weight rows (r1 gate/up pairs, from L2) meet them
  for (int r0 = J.gstart[g]; r0 < J.gstart[g + 1]; r0 += RC)
    for (int j = j0; j < j1; ++j) {
      int n = std::min(RC, J.gstart[g + 1] - r0);
      J.kgu.fn(gu(j), &J.xr[r0], n, a);
      J.kgu.fn(gu(J.I + j), &J.xr[r0], n, b);
      float bg = bgu ? bgu[j] : 0.f, bu = bgu ? bgu[J.I + j] : 0.f;
      for (int i = 0; i < n; ++i) {
        float v = J.act(a[i] + bg, b[i] + bu);
        put_act(J.h.get() + size_t(r0 + i) * J.hn * J.hsz, J.I, permute(j, J.I, J.kd.chunk), v, J.hact);
      }
    }
}

void unit2(Job& J, int u) {
  int r0 = u * R2, r1 = std::min(J.H, r0 + R2);
  for (int t = 0; t < J.T; ++t) std::fill_n(J.out + size_t(t) * J.H + r0, r1 - r0, 0.f);
  float y[RC];
  for (int g = 0; g < int(J.eid.size()); ++g) {
    int64_t e = J.expert(g);
    const Rows d(J.d, e, J.I);
    const float* bd = bias(J.d, e);
    for (int r = r0; r < r1; ++r)
      for (int k0 = J.gstart[g]; k0 < J.gstart[g + 1]; k0 += RC) {
        int n = std::min(RC, J.gstart[g + 1] - k0);
        float br = bd ? bd[r] : 0.f;
        J.kd.fn(d(r), &J.hr[k0], n, y);
        for (int i = 0; i < n; ++i) J.out[size_t(J.tok[k0 + i]) * J.H + r] += J.rw[k0 + i] * (y[i] + br);
      }
  }
}

void release(Job* J) {  // drop a reference; the last one frees the job
  if (J->refs.fetch_sub(1, std::memory_order_acq_rel) == 1) delete J;
}

// Jobs start in submission order: workers join the front job of the queue as they wake (a late
// one may find nothing left), and leave the queue's front to the next job once its last unit is
// done. The thread that submitted a job may also compute it (the poller does, see Poller::serve).
struct Pool {
  const int n;
  std::vector<std::thread> th;
  std::mutex m;
  std::condition_variable cv;
  std::deque<Job*> q;
  bool stop = false;
  uint64_t seq = 0;

  std::atomic<uint64_t> pub{0};  // last submitted seq, read by spinning workers without the lock
  std::chrono::microseconds spin;  // how long a worker spins for new work before sleeping

  Pool(int n_, const int* cpus, int spin_us) : n(n_), spin(spin_us) {
    for (int i = 0; i < n; ++i) th.emplace_back(&Pool::loop, this, cpus ? cpus[i] : -1);
  }
  ~Pool() {
    { std::lock_guard<std::mutex> g(m); stop = true; }
    cv.notify_all();
    for (auto& t : th) t.join();  // queued jobs are finished first
  }
  void submit(Job* J) {
    J->pool = this;
    J->t0 = std::chrono::steady_clock::now();
    { std::lock_guard<std::mutex> g(m); J->seq = ++seq; q.push_back(J); pub.store(J->seq); }
    cv.notify_all();
  }
  // Every unit of J is done: take it off the queue and wake its waiter.
  void retire(Job* J) {
    { std::lock_guard<std::mutex> g(m); q.erase(std::find(q.begin(), q.end(), J)); }
    cv.notify_all();
    std::lock_guard<std::mutex> g(J->m);
    J->t1 = std::chrono::steady_clock::now();
    J->done = true;
    J->cv.notify_all();
  }
  void loop(int cpu);
};

// Claims units until none is left, calling tick() between them; a throwing unit records the
// error and still counts as done, so the barrier and the job always complete.
template <class Tick>
void run_units(Job& J, std::atomic<int>& next, int n, void (*fn)(Job&, int), std::atomic<int>& done,
               Tick tick) {
  for (int u; (u = next.fetch_add(1)) < n;) {
    try { fn(J, u); }
    catch (const std::exception& ex) { J.fail(ex.what()); }
    catch (...) { J.fail("unknown error in a CPU expert worker"); }
    // the last phase-2 unit retires the job; the last phase-1 unit writes h's block sums where the
    // row kernels take them (counted as one more unit: the barrier waits for them too); the counts
    // publish the units' results
    if (done.fetch_add(1, std::memory_order_acq_rel) + 1 == n) {
      if (&done == &J.done2) J.pool->retire(&J);
      else if (J.kd.sums) J.h_sums(), done.fetch_add(1, std::memory_order_release);
    }
    tick();
  }
}

template <class Tick>
void work(Job& J, Tick tick) {
  run_units(J, J.next1, J.n1, unit1, J.done1, tick);
  // Phase barrier: spin briefly, then yield, since the thread we wait for may be descheduled
  // (more threads than free cores), and a long pause-spin would keep it off the core.
  for (int spin = 0; J.done1.load(std::memory_order_acquire) < J.n1 + (J.n1 && J.kd.sums); ++spin)
    tick(), spin < 64 ? _mm_pause() : std::this_thread::yield();
  run_units(J, J.next2, J.n2, unit2, J.done2, tick);
}

void Pool::loop(int cpu) {
  pthread_setname_np(pthread_self(), "ft-cpu-worker");  // what a thread census shows
  if (cpu >= 0) {  // best effort: a container may forbid it, and that is fine
    cpu_set_t s; CPU_ZERO(&s); CPU_SET(cpu, &s);
    pthread_setaffinity_np(pthread_self(), sizeof s, &s);
  }
  for (uint64_t last = 0;;) {
    Job* J;
    // Decode submits a job every layer step or few (a few hundred microseconds each): spinning
    // for a while, by the clock (a pause lasts 10 to 140 cycles, by CPU), keeps the workers
    // awake for it instead of paying a condition-variable wake-up of every worker each time.
    for (auto until = std::chrono::steady_clock::now() + spin;
         pub.load(std::memory_order_acquire) <= last && std::chrono::steady_clock::now() < until;)
      for (int i = 0; i < 16; ++i) _mm_pause();
    {
      std::unique_lock<std::mutex> lk(m);
      cv.wait(lk, [&] { return (!q.empty() && q.front()->seq > last) || (stop && q.empty()); });
      if (q.empty()) return;
      J = q.front();
      last = J->seq;
      J->refs.fetch_add(1, std::memory_order_relaxed);  // on the queue, so not yet released
    }
    work(*J, [] {});
    release(J);
  }
}

}  // namespace

extern "C" {

// bit 0: AVX2 + FMA + F16C; bit 1: AVX-512 BF16 (+BW for the masked tail loads); bit 2: AVX-512
// F + BW (the quantized AVX-512 path)
int ftmoe_cpu_features() {
  __builtin_cpu_init();
  int f = 0;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
      __builtin_cpu_supports("f16c"))
    f |= 1;
  if (__builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("avx512bw")) f |= 2;
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw")) f |= 4;
  return f;
}

void* ftmoe_pool_create(int threads, const int* cpus, int spin_us) { return new Pool(threads, cpus, spin_us); }
void ftmoe_pool_destroy(void* pool) { delete static_cast<Pool*>(pool); }

// gu, dn: the banks (see Mat); ids [T, K] int32/int64 (-1 = skip), rw [T, K] fp32, out [T, H]
// fp32; all contiguous; act: the gated activation; hbf16: the model computes in bf16, so a path
// that reads h in two bf16 halves may round it to one, as the model does (where x is bf16 too:
// half the down's dot products). Returns the job, or null when it could not be
// set up (out of memory, or a format the mode has no kernel for): no C++ exception may cross into
// ctypes.
void* ftmoe_submit(void* pool, const void* x, const Mat* gu, const Mat* dn, const void* ids,
                   const float* rw, float* out, int T, int H, int I, int E, int K, int ids64, int mode,
                   const ExpertAct* act, int hbf16) {
  try {
    auto J = std::make_unique<Job>();
    J->x = static_cast<const char*>(x), J->gu = *gu, J->d = *dn, J->out = out, J->act = *act;
    J->T = T, J->H = H, J->I = I, J->E = E;
    J->kgu = kernel(mode, *gu), J->kd = kernel(mode, *dn);
    if (!J->kgu.fn || !J->kd.fn) return nullptr;
    J->xsz = act_bytes(J->kgu.act), J->hsz = act_bytes(J->kd.act), J->hact = J->kd.act;
    J->xn = H + (J->kgu.sums ? n_sums(H, gu->bk) : 0), J->hn = I + (J->kd.sums ? n_sums(I, dn->bk) : 0);
    if (J->kgu.chunk || J->kgu.sums) {  // fp32 x (the chunked kernels are quantized ones)
      J->xp.reset(new char[size_t(T) * J->xn * J->xsz]);
      for (int t = 0; t < T; ++t) {
        char* row = J->xp.get() + size_t(t) * J->xn * J->xsz;
        put_x(row, static_cast<const float*>(x) + size_t(t) * H, H, J->kgu.act, J->kgu.chunk);
        if (J->kgu.sums) block_sums(reinterpret_cast<float*>(row), H, gu->bk);
      }
      J->x = J->xp.get();
      if (J->kgu.hi_only) {  // x of a bf16 model: every lo half zero
        auto xh = reinterpret_cast<const uint16_t*>(J->x);
        bool exact = true;
        for (int t = 0; t < T && exact; ++t)
          exact = std::all_of(xh + (2 * t + 1) * size_t(H), xh + (2 * t + 2) * size_t(H),
                              [](uint16_t v) { return v == 0; });
        if (exact) J->kgu.fn = J->kgu.hi_only;
        if (exact && hbf16 && J->kd.hi_only) J->kd.fn = J->kd.hi_only, J->hact = A_BF16X2_HI;
      }
    }
    std::vector<std::pair<int64_t, int>> rs;  // (expert, route index); sorting groups by expert
    for (int i = 0; i < T * K; ++i) {
      int64_t e = ids64 ? static_cast<const int64_t*>(ids)[i] : static_cast<const int32_t*>(ids)[i];
      if (e != -1) rs.emplace_back(e, i);  // other bad ids fail inside the workers
    }
    std::sort(rs.begin(), rs.end());
    J->h.reset(new char[rs.size() * J->hn * J->hsz + 1]);
    for (size_t i = 0; i < rs.size(); ++i) {
      if (i == 0 || rs[i].first != rs[i - 1].first)
        J->eid.push_back(rs[i].first), J->gstart.push_back(int(i));
      J->tok.push_back(rs[i].second / K);
      J->rw.push_back(rw[rs[i].second]);
      J->xr.push_back(J->x + size_t(J->tok.back()) * J->xn * J->xsz);
      J->hr.push_back(J->h.get() + i * J->hn * J->hsz);
    }
    J->gstart.push_back(int(rs.size()));
    J->r1 = unit_rows(2 * Rows(*gu, 0, H).qb, I, int(J->eid.size()), static_cast<Pool*>(pool)->n + 1);
    J->nb1 = (I + J->r1 - 1) / J->r1, J->n1 = int(J->eid.size()) * J->nb1, J->n2 = (H + R2 - 1) / R2;
    static_cast<Pool*>(pool)->submit(J.get());
    return J.release();
  } catch (...) {
    return nullptr;
  }
}

// 0: done, 1: failed (see ftmoe_error), 2: timed out. timeout_s < 0 waits for ever.
int ftmoe_wait(void* job, double timeout_s) {
  auto* J = static_cast<Job*>(job);
  std::unique_lock<std::mutex> lk(J->m);
  auto ready = [J] { return J->done.load(); };
  if (timeout_s < 0) J->cv.wait(lk, ready);
  else if (!J->cv.wait_for(lk, std::chrono::duration<double>(timeout_s), ready)) return 2;
  return J->err.empty() ? 0 : 1;
}

const char* ftmoe_error(void* job) { return static_cast<Job*>(job)->err.c_str(); }
double ftmoe_seconds(void* job) {  // only once ftmoe_wait said done
  auto* J = static_cast<Job*>(job);
  return std::chrono::duration<double>(J->t1 - J->t0).count();
}
void ftmoe_free(void* job) { release(static_cast<Job*>(job)); }  // only once ftmoe_wait said done
// One row of K activations in the layout a job gives a kernel reading (act, chunk) (tests; A_BF16X2
// in 64-value chunks needs ftmoe_cpu_features bit 1).
void ftmoe_put_x(void* row, const float* x, int K, int act, int chunk) { put_x(static_cast<char*>(row), x, K, act, chunk); }

// In-graph CPU branch. A thread polls `go` in mapped pinned memory: the GPU stream, after
// staging x, ids, weights and the layer step's fill count, writes go = (layer + 1) | (T << 20);
// the thread clears go, runs that layer's CPU routes on the pool into `out`, then answers
// done = go, which the merge kernel waits for. A failure still answers (with zeros) so the GPU never
// hangs; Python reads the error. The stream also writes fill = go once the step's expert fills
// have landed (before the merge waits for done); the thread timestamps that against go, so the fills
// inside a graph are timed too (B_P online), and clears it.
constexpr std::chrono::milliseconds kPollerSpin{10};  // spin for the next go this long after the last

struct Poller {
  void* pool = nullptr;
  volatile uint32_t *go = nullptr, *done = nullptr, *fill = nullptr;
  const volatile int64_t* nfill = nullptr;  // experts the layer step fills
  const void *x = nullptr, *ids = nullptr;
  const float* rw = nullptr;
  float* out = nullptr;
  std::vector<Mat> gu, dn;  // per MoE layer banks
  ExpertAct act{1.f, INFINITY, 0.f};
  int H = 0, I = 0, E = 0, K = 0, mode = 0, hbf16 = 0;
  std::atomic<bool> stop{false};
  std::atomic<int64_t> jobs{0}, experts{0}, nanos{0}, fills{0}, fill_nanos{0};
  bool fill_seen = false;
  std::chrono::steady_clock::time_point t_go, t_fill;
  std::mutex m;
  std::string err;
  std::thread th;

  void fail(const std::string& e, int T) {
    { std::lock_guard<std::mutex> g(m); if (err.empty()) err = e; }
    std::fill_n(out, size_t(T) * H, 0.f);
  }
  void serve(uint32_t v) {
    int layer = int(v & 0xFFFFF) - 1, T = int(v >> 20);
    if (layer < 0 || layer >= int(gu.size())) return fail("bad layer in the CPU branch flag", T);
    const int64_t* id = static_cast<const int64_t*>(ids);
    if (std::all_of(id, id + size_t(T) * K, [](int64_t e) { return e == -1; })) {
      std::fill_n(out, size_t(T) * H, 0.f);  // no CPU route in this layer step: answer at once
      return;
    }
    auto t0 = std::chrono::steady_clock::now();
    auto* J = static_cast<Job*>(ftmoe_submit(pool, x, &gu[layer], &dn[layer], ids, rw, out, T, H, I,
                                             E, K, 1, mode, &act, hbf16));
    if (!J) return fail("could not allocate a CPU branch job", T);
    // This thread computes units of its job beside the workers instead of spinning while they
    // do (one busy thread less than cores in use), watching for the fill flag between units.
    work(*J, [&] { watch_fill(v); });
    for (int spin = 0; !J->done.load(std::memory_order_acquire); ++spin)  // units still on workers
      watch_fill(v), spin < 64 ? _mm_pause() : std::this_thread::yield();
    if (ftmoe_wait(J, -1.0)) fail(J->err, T);
    experts += int64_t(J->eid.size()), jobs += 1;
    nanos += std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count();
    ftmoe_free(J);
  }
  void watch_fill(uint32_t v) {
    if (!fill_seen && *fill == v) fill_seen = true, t_fill = std::chrono::steady_clock::now(), *fill = 0;
  }
  void loop() {
    pthread_setname_np(pthread_self(), "ft-cpu-poller");
    for (auto last = std::chrono::steady_clock::now(); !stop.load(std::memory_order_relaxed);) {
      uint32_t v = *go;
      if (!v) {  // spin while decoding (steps come ms apart), then back off so an idle server does not burn a core
        if (std::chrono::steady_clock::now() - last < kPollerSpin) for (int i = 0; i < 16; ++i) _mm_pause();
        else std::this_thread::sleep_for(std::chrono::microseconds(50));
        continue;
      }
      t_go = last = std::chrono::steady_clock::now(), fill_seen = false;
      *go = 0;
      std::atomic_thread_fence(std::memory_order_acquire);
      int64_t nf = *nfill;
      bool late = *fill == v;  // seen go only after the fills landed (the thread slept): no timing
      serve(v);
      std::atomic_thread_fence(std::memory_order_seq_cst);
      *done = v;
      // The stream writes the next go only after this step's fill flag, so a new go means the
      // fills landed even if this thread, descheduled, never saw fill == v (the stream may have
      // written the next step's value over it by then): waiting on would hang both sides.
      while (!fill_seen && !*go && !stop.load(std::memory_order_relaxed)) watch_fill(v), _mm_pause();
      if (nf > 0 && fill_seen && !late)
        fills += nf, fill_nanos += std::chrono::duration_cast<std::chrono::nanoseconds>(t_fill - t_go).count();
    }
  }
};

// flags: uint32 [go, done, fill]; nfill: one int64; gu, dn: L banks each, one per MoE layer.
void* ftmoe_poller_start(void* pool, void* flags, const void* nfill, const void* x, const void* ids,
                         const float* rw, float* out, const Mat* gu, const Mat* dn, int L,
                         int H, int I, int E, int K, int mode, const ExpertAct* act, int hbf16) {
  try {
    auto* P = new Poller();
    auto* f = static_cast<uint32_t*>(flags);
    P->pool = pool, P->go = f, P->done = f + 1, P->fill = f + 2;
    P->nfill = static_cast<const int64_t*>(nfill);
    P->x = x, P->ids = ids, P->rw = rw, P->out = out, P->gu.assign(gu, gu + L), P->dn.assign(dn, dn + L);
    P->H = H, P->I = I, P->E = E, P->K = K, P->mode = mode, P->act = *act, P->hbf16 = hbf16;
    P->th = std::thread(&Poller::loop, P);
    return P;
  } catch (...) {
    return nullptr;
  }
}

void ftmoe_poller_stop(void* p) {
  auto* P = static_cast<Poller*>(p);
  P->stop = true;
  P->th.join();
  delete P;
}

// out5 = (jobs, distinct experts, nanoseconds, experts filled, their nanoseconds) since the last
// call; returns 1 after a failure.
int ftmoe_poller_stats(void* p, int64_t* out5) {
  auto* P = static_cast<Poller*>(p);
  out5[0] = P->jobs.exchange(0), out5[1] = P->experts.exchange(0), out5[2] = P->nanos.exchange(0);
  out5[3] = P->fills.exchange(0), out5[4] = P->fill_nanos.exchange(0);
  std::lock_guard<std::mutex> g(P->m);
  return P->err.empty() ? 0 : 1;
}

const char* ftmoe_poller_error(void* p) { return static_cast<Poller*>(p)->err.c_str(); }

}  // extern "C"
