// int4 row dots on AVX-512 BF16: the executor's table path (VPERMW) against the magic path
// (code | 0x4300 = bf16 128 + code; 128 + z times the block's x sum taken out once a block).
// int4mb THREADS REPS: GB/s of codes for one activation row against N x K int4 rows.
#include <immintrin.h>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>
static float bf2f(uint16_t v) { uint32_t u = uint32_t(v) << 16; float f; memcpy(&f, &u, 4); return f; }
static uint16_t f2bf(float f) { uint32_t u; memcpy(&u, &f, 4); return uint16_t((u + 0x7fffu + ((u >> 16) & 1)) >> 16); }
constexpr int K = 2048, BK = 128, NG = K / BK;
#pragma GCC target("avx2,fma,avx512f,avx512bw,avx512bf16")
static inline __m512 dp(__m512 acc, __m512i w, const uint16_t* x) {
  return _mm512_dpbf16_ps(acc, (__m512bh)w, (__m512bh)_mm512_loadu_si512(x));
}
alignas(64) static uint16_t tabs[17][32];
// table path: x in permute(.., 64) order (per 64: even columns, then odd)
#pragma GCC target("avx2,fma,avx512f,avx512bw,avx512bf16")
static float row_tab(const uint8_t* q, const uint8_t* z, const float* s, const uint16_t* x) {
  const __m512i low = _mm512_set1_epi16(15);
  __m512 acc = _mm512_setzero_ps();
  for (int g = 0; g < NG; ++g) {
    const __m512i tab = _mm512_load_si512(tabs[z[g]]);
    __m512 p0 = _mm512_setzero_ps(), p1 = _mm512_setzero_ps();
    for (int i = 0; i < BK; i += 64, q += 32) {
      const __m512i c = _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(q)));
      const __m512i we = _mm512_permutexvar_epi16(_mm512_and_si512(c, low), tab);
      const __m512i wo = _mm512_permutexvar_epi16(_mm512_srli_epi16(c, 4), tab);
      const uint16_t* xk = x + g * BK + i;
      p0 = dp(p0, we, xk), p1 = dp(p1, wo, xk + 32);
    }
    acc = _mm512_fmadd_ps(_mm512_add_ps(p0, p1), _mm512_set1_ps(s[g]), acc);
  }
  return _mm512_reduce_add_ps(acc);
}
// magic path: x in the order (per 128: columns 4l + m in block m of 32), xs[g] the block sums
#pragma GCC target("avx2,fma,avx512f,avx512bw,avx512bf16")
static float row_magic(const uint8_t* q, const uint8_t* z, const float* s, const uint16_t* x, const float* xs) {
  const __m512i m4 = _mm512_set1_epi16(15), mg = _mm512_set1_epi16(0x4300);
  __m512 acc = _mm512_setzero_ps();
  float corr = 0.f;
  for (int g = 0; g < NG; ++g, q += 64) {
    const __m512i c = _mm512_loadu_si512(q);
    const uint16_t* xk = x + g * BK;
    __m512 p0 = dp(_mm512_setzero_ps(), _mm512_ternarylogic_epi32(c, m4, mg, 0xEA), xk);        // (c & m4) | mg
    __m512 p1 = dp(_mm512_setzero_ps(), _mm512_ternarylogic_epi32(_mm512_srli_epi16(c, 4), m4, mg, 0xEA), xk + 32);
    p0 = dp(p0, _mm512_ternarylogic_epi32(_mm512_srli_epi16(c, 8), m4, mg, 0xEA), xk + 64);
    p1 = dp(p1, _mm512_or_si512(_mm512_srli_epi16(c, 12), mg), xk + 96);
    acc = _mm512_fmadd_ps(_mm512_add_ps(p0, p1), _mm512_set1_ps(s[g]), acc);
    corr += (128.f + z[g]) * xs[g] * s[g];
  }
  return _mm512_reduce_add_ps(acc) - corr;
}
int main(int argc, char** argv) {
  int threads = argc > 1 ? atoi(argv[1]) : 1, reps = argc > 2 ? atoi(argv[2]) : 20;
  const int N = 16384;  // 16 MiB of codes
  for (int zz = 0; zz < 17; ++zz) for (int c = 0; c < 32; ++c) tabs[zz][c] = c < 16 ? f2bf(float(c - zz)) : 0;
  std::vector<uint8_t> q(size_t(N) * K / 2), z(size_t(N) * NG);
  std::vector<float> s(size_t(N) * NG), x(K);
  srand(1);
  for (auto& v : q) v = rand() & 255;
  for (auto& v : z) v = 8 + (rand() % 3) - 1;
  for (auto& v : s) v = 0.01f * (1 + rand() % 7);
  for (auto& v : x) v = bf2f(f2bf((rand() / float(RAND_MAX) - 0.5f) * 4));
  std::vector<uint16_t> xt(K), xm(K);
  std::vector<float> xs(NG, 0.f);
  for (int k = 0; k < K; ++k) {
    int o = k & 63; xt[k - o + (o & 1) * 32 + (o >> 1)] = f2bf(x[k]);
    int o2 = k & 127; xm[k - o2 + (o2 & 3) * 32 + (o2 >> 2)] = f2bf(x[k]);
    xs[k / BK] += x[k];
  }
  std::vector<float> ya(N), yb(N);
  auto run = [&](int which) {
    auto t0 = std::chrono::steady_clock::now();
    for (int r = 0; r < reps; ++r) {
      std::vector<std::thread> th;
      for (int t = 0; t < threads; ++t)
        th.emplace_back([&, t] {
          for (int n = t * N / threads; n < (t + 1) * N / threads; ++n) {
            const uint8_t* qr = q.data() + size_t(n) * K / 2;
            if (which == 0) ya[n] = row_tab(qr, &z[size_t(n) * NG], &s[size_t(n) * NG], xt.data());
            else yb[n] = row_magic(qr, &z[size_t(n) * NG], &s[size_t(n) * NG], xm.data(), xs.data());
          }
        });
      for (auto& t : th) t.join();
    }
    double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return q.size() * double(reps) / sec / 1e9;
  };
  run(0); run(1);
  double a = 0, b = 0;
  for (int i = 0; i < 3; ++i) { a += run(0); b += run(1); }
  double err = 0, mx = 0;
  for (int n = 0; n < N; ++n) {
    double exact = 0;
    for (int k = 0; k < K; ++k) {
      int c = (q[size_t(n) * K / 2 + k / 2] >> (4 * (k & 1))) & 15;
      exact += double(c - z[size_t(n) * NG + k / BK]) * s[size_t(n) * NG + k / BK] * x[k];
    }
    err = fmax(err, fabs(yb[n] - exact) - fabs(ya[n] - exact)); mx = fmax(mx, fabs(exact));
    if (n == 0) printf("row0 exact %.7f table %.7f magic %.7f\n", exact, ya[n], yb[n]);
  }
  printf("threads %d: table %.1f GB/s, magic %.1f GB/s (%.2fx); magic's extra error at most %.2e of max %.3f\n",
         threads, a / 3, b / 3, b / a, err, mx);
}
