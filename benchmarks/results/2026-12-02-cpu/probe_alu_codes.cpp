// int4 rows with the codes turned into bf16 by shifts and one ternary-logic op (8 + c / 2 = 0x4100 | c << 3,
// four nibble planes of a 64-byte load) instead of table lookups, the block sums of x correcting the offset;
// against main and main with the chunk loop unrolled. ./probe_alu_codes K [x offset in bytes]
#include "cpu_moe.cpp"
#include <cstdio>
#include <random>
#include <vector>
using namespace std::chrono;
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,avx512f,avx512bw,avx512bf16")
namespace mg {
using bf16q::dp;
// 128 columns a step: 64 bytes of codes as 32 u16 lanes, nibble k of lane j = column 4j + k, turned into
// bf16 (8 + c / 2) = 0x4100 | (c << 3) by a shift and a ternary logic op; x plane k at 32k + j.
// dot(x, c - z) = 2 dot(x, 8 + c/2) - (16 + z) sum(x).  xs: per block sums of x (hi).
template <int NR>
void qrow(const Row& w, const uint16_t* const* xr, const float* const* xs, float* out) {
  const int K = w.K, bk = w.bk, ns = K / bk;
  const __m512i m78 = _mm512_set1_epi16(0x78), bias = _mm512_set1_epi16(0x4100);
  __m512 acc[NR]; float corr[NR];
  for (int r = 0; r < NR; ++r) acc[r] = _mm512_setzero_ps(), corr[r] = 0.f;
  const uint8_t* q = w.q;
  for (int g = 0; g < ns; ++g) {
    __m512 p[NR][4];
    for (int r = 0; r < NR; ++r) for (auto& v : p[r]) v = _mm512_setzero_ps();
    for (int i = 0; i < bk; i += 128, q += 64) {
      _mm_prefetch(reinterpret_cast<const char*>(q) + 4096, _MM_HINT_T0);
      const __m512i v = _mm512_loadu_si512(q);
      const __m512i n0 = _mm512_ternarylogic_epi32(_mm512_slli_epi16(v, 3), m78, bias, 0xEA);
      const __m512i n1 = _mm512_ternarylogic_epi32(_mm512_srli_epi16(v, 1), m78, bias, 0xEA);
      const __m512i n2 = _mm512_ternarylogic_epi32(_mm512_srli_epi16(v, 5), m78, bias, 0xEA);
      const __m512i n3 = _mm512_ternarylogic_epi32(_mm512_srli_epi16(v, 9), m78, bias, 0xEA);
      for (int r = 0; r < NR; ++r) {
        const uint16_t* xk = xr[r] + g * bk + i;
        p[r][0] = dp(p[r][0], n0, xk), p[r][1] = dp(p[r][1], n1, xk + 32);
        p[r][2] = dp(p[r][2], n2, xk + 64), p[r][3] = dp(p[r][3], n3, xk + 96);
      }
    }
    const float s = block_scale<INT4>(w, g), zc = 16.f + w.z[g];
    const __m512 sv = _mm512_set1_ps(2 * s);
    for (int r = 0; r < NR; ++r) {
      acc[r] = _mm512_fmadd_ps(_mm512_add_ps(_mm512_add_ps(p[r][0], p[r][1]), _mm512_add_ps(p[r][2], p[r][3])), sv, acc[r]);
      corr[r] += s * zc * xs[r][g];
    }
  }
  for (int r = 0; r < NR; ++r) out[r] = _mm512_reduce_add_ps(acc[r]) - corr[r];
}
}
namespace mu {
using namespace bf16q;
// main's qrow<INT4, NR, false> with the chunk loop unrolled for a compile-time span S
template <int NR, int S>
void qrow(const Row& w, const uint16_t* const* xr, float* out) {
  const int K = w.K, ns = K / S;
  const __m512i low = _mm512_set1_epi16(15);
  __m512 acc[NR];
  for (int r = 0; r < NR; ++r) acc[r] = _mm512_setzero_ps();
  __m512i tab = _mm512_setzero_si512();
  int ztab = -1;
  const uint8_t* q = w.q;
  for (int g = 0; g < ns; ++g) {
    if (w.z[g] != ztab) ztab = w.z[g], tab = code_table(ztab);
    __m512 p[NR][2];
    for (int r = 0; r < NR; ++r) p[r][0] = p[r][1] = _mm512_setzero_ps();
#pragma GCC unroll 8
    for (int i = 0; i < S; i += kChunk) {
      _mm_prefetch(reinterpret_cast<const char*>(q + i / 2) + 4096, _MM_HINT_T0);
      const __m512i c = _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + i / 2)));
      const __m512i we = _mm512_permutexvar_epi16(_mm512_and_si512(c, low), tab);
      const __m512i wo = _mm512_permutexvar_epi16(_mm512_srli_epi16(c, 4), tab);
      for (int r = 0; r < NR; ++r) {
        const uint16_t* xk = xr[r] + g * S + i;
        p[r][0] = dp(p[r][0], we, xk), p[r][1] = dp(p[r][1], wo, xk + 32);
      }
    }
    q += S / 2;
    const __m512 sv = _mm512_set1_ps(block_scale<INT4>(w, g));
    for (int r = 0; r < NR; ++r) acc[r] = _mm512_fmadd_ps(_mm512_add_ps(p[r][0], p[r][1]), sv, acc[r]);
  }
  for (int r = 0; r < NR; ++r) out[r] = _mm512_reduce_add_ps(acc[r]);
}
}
#pragma GCC pop_options
template <class F> double rate(F f, long wpc) {
  double best = 1e9; long calls = 0; auto t00 = steady_clock::now();
  while (duration<double>(steady_clock::now() - t00).count() < 0.4) {
    auto t0 = steady_clock::now();
    for (int i = 0; i < 64; ++i) f(calls++);
    best = std::min(best, duration<double>(steady_clock::now() - t0).count());
  }
  return 64 * double(wpc) / best / 1e9;
}
int main(int argc, char** argv) {
  const int K = argc > 1 ? atoi(argv[1]) : 2048, bk = 128;
  std::mt19937 rng(1);
  std::vector<float> xv(K);
  for (auto& v : xv) v = bf2f(f2bf(std::normal_distribution<float>(0.3f, 1.f)(rng)));
  // main's layout: permute(k, K, 64), A_BF16X2 hi; magic: plane layout in 128-chunks
  std::vector<uint16_t> xa(2 * K, 0), xm(K);
  for (int k = 0; k < K; ++k) xa[permute(k, K, 64)] = f2bf(xv[k]);
  for (int k = 0; k < K; ++k) { int c = k / 128 * 128, o = k % 128; xm[c + (o % 4) * 32 + o / 4] = f2bf(xv[k]); }
  std::vector<float> xs(K / bk);
  for (int g = 0; g < K / bk; ++g) { float a = 0; for (int k = g * bk; k < (g + 1) * bk; ++k) a += xv[k]; xs[g] = a; }
  const size_t rb = K / 2; const int n = 16;
  std::vector<uint8_t> q(n * rb), z(n * (K / bk));
  std::vector<uint16_t> s(n * (K / bk));
  for (auto& b : q) b = rng();
  for (auto& b : z) b = rng() % 16;
  for (auto& b : s) b = 0x2000 + rng() % 256;
  const int off = argc > 2 ? atoi(argv[2]) : 0;  // bytes past a 64-byte boundary
  uint16_t* xal = reinterpret_cast<uint16_t*>(static_cast<char*>(aligned_alloc(64, 4 * K + 128)) + off);
  std::copy(xa.begin(), xa.end(), xal);
  const void* xp[1] = {xal}; const uint16_t* xmp[1] = {xm.data()}; const float* xsp[1] = {xs.data()};
  float o1, o2; double maxrel = 0;
  for (int j = 0; j < n; ++j) {
    Row w{q.data() + j * rb, reinterpret_cast<const char*>(s.data() + j * (K / bk)), z.data() + j * (K / bk), K, bk, F16};
    bf16q::kernel<INT4>.hi_only(w, xp, 1, &o1);
    mg::qrow<1>(w, xmp, xsp, &o2);
    double ref = 0;
    for (int k = 0; k < K; ++k) ref += double(code_value<INT4>(w.q, k, w.z[k / bk]) * block_scale<INT4>(w, k / bk)) * xv[k];
    maxrel = std::max(maxrel, std::max(std::abs(o1 - ref), std::abs(o2 - ref)) / std::abs(ref));
    if (j < 3) printf("ref %.6f main %.6f magic %.6f\n", ref, o1, o2);
  }
  printf("max rel err %.2e\n", maxrel);
  for (int rep = 0; rep < 3; ++rep) {
    double a = rate([&](long i) { int j = i % n; Row w{q.data() + j * rb, reinterpret_cast<const char*>(s.data() + j * (K / bk)), z.data() + j * (K / bk), K, bk, F16}; bf16q::kernel<INT4>.hi_only(w, xp, 1, &o1); }, K);
    double b = rate([&](long i) { int j = i % n; Row w{q.data() + j * rb, reinterpret_cast<const char*>(s.data() + j * (K / bk)), z.data() + j * (K / bk), K, bk, F16}; mg::qrow<1>(w, xmp, xsp, &o2); }, K);
    double c = rate([&](long i) { int j = i % n; Row w{q.data() + j * rb, reinterpret_cast<const char*>(s.data() + j * (K / bk)), z.data() + j * (K / bk), K, bk, F16}; mu::qrow<1, 128>(w, (const uint16_t* const*)xp, &o2); }, K);
    printf("unrolled %.2f (%.2fx)\n", c, c / a);
    printf("K %d g%d one route, G weights/s: main %.2f magic %.2f (%.2fx)\n", K, bk, a, b, b / a);
  }
}
