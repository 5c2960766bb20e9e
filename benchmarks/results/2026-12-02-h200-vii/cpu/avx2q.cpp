// AVX2 int4 rows, one route, one core: main's kernel against variants, on R rows (16: L1/L2-resident; 2048: L3)
#include "cpu_moe.cpp"
#include <cstdio>
#include <random>
#include <vector>
using namespace std::chrono;
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
namespace var {
using V = V256;
// P pairs a step (2P chains), otherwise main's qrow<INT4, 1>
template <int P>
void qrow(const Row& w, const float* const* xr, float* out) {
  using R = __m256;
  constexpr int W = 8;
  const int K = w.K, bk = w.bk;
  const float* x = xr[0];
  R acc = V::zero(), p[2 * P];
  float tail = 0.f;
  for (int g = 0, k0 = 0; k0 < K; ++g, k0 += bk) {
    const size_t k1 = std::min(K, k0 + bk);
    const float s = block_scale<INT4>(w, g);
    for (auto& v : p) v = V::zero();
    size_t k = k0;
    for (; k + 2 * P * W <= k1; k += 2 * P * W) {
      _mm_prefetch(reinterpret_cast<const char*>(w.q) + k / 2 + 4096, _MM_HINT_T0);
#pragma GCC unroll 8
      for (int u = 0; u < P; ++u) {
        R a, b;
        V::nibbles<INT4>(w.q + (k + 2 * u * W) / 2, a, b);
        p[2 * u] = V::fma(a, V::load(x + k + 2 * u * W), p[2 * u]);
        p[2 * u + 1] = V::fma(b, V::load(x + k + 2 * u * W + W), p[2 * u + 1]);
      }
    }
    R t = p[0];
    for (int u = 1; u < 2 * P; ++u) t = V::add(t, p[u]);
    acc = V::fma(t, V::set1(s), acc);
    tail -= s * float(w.z[g]) * x[K + g];
  }
  out[0] = V::sum(acc) + tail;
}
// 16 bytes of codes a load: low nibbles of bytes 0-7, 8-15 and high nibbles, by 128-bit halves
template <int P>
void qrow16(const Row& w, const float* const* xr, float* out) {
  using R = __m256;
  const int K = w.K, bk = w.bk;
  const float* x = xr[0];
  R acc = V::zero(), p[4 * P];
  float tail = 0.f;
  const __m256i m15 = _mm256_set1_epi32(15);
  for (int g = 0, k0 = 0; k0 < K; ++g, k0 += bk) {
    const size_t k1 = std::min(K, k0 + bk);
    const float s = block_scale<INT4>(w, g);
    for (auto& v : p) v = V::zero();
    size_t k = k0;
    for (; k + 32 * P <= k1; k += 32 * P) {
      _mm_prefetch(reinterpret_cast<const char*>(w.q) + k / 2 + 4096, _MM_HINT_T0);
#pragma GCC unroll 8
      for (int u = 0; u < P; ++u) {
        const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w.q + (k + 32 * u) / 2));
        const __m256i c0 = _mm256_cvtepu8_epi32(q), c1 = _mm256_cvtepu8_epi32(_mm_unpackhi_epi64(q, q));
        const size_t kk = k + 32 * u;
        p[4 * u] = V::fma(_mm256_cvtepi32_ps(_mm256_and_si256(c0, m15)), V::load(x + kk), p[4 * u]);
        p[4 * u + 1] = V::fma(_mm256_cvtepi32_ps(_mm256_srli_epi32(c0, 4)), V::load(x + kk + 8), p[4 * u + 1]);
        p[4 * u + 2] = V::fma(_mm256_cvtepi32_ps(_mm256_and_si256(c1, m15)), V::load(x + kk + 16), p[4 * u + 2]);
        p[4 * u + 3] = V::fma(_mm256_cvtepi32_ps(_mm256_srli_epi32(c1, 4)), V::load(x + kk + 24), p[4 * u + 3]);
      }
    }
    R t = p[0];
    for (int u = 1; u < 4 * P; ++u) t = V::add(t, p[u]);
    acc = V::fma(t, V::set1(s), acc);
    tail -= s * float(w.z[g]) * x[K + g];
  }
  out[0] = V::sum(acc) + tail;
}
}  // namespace var
#pragma GCC pop_options

int main(int argc, char** argv) {
  const int K = argc > 1 ? atoi(argv[1]) : 2048, R = argc > 2 ? atoi(argv[2]) : 16, bk = 128;
  std::mt19937 rng(1);
  std::vector<uint8_t> q(size_t(R) * K / 2), z(size_t(R) * K / bk);
  std::vector<uint16_t> s(size_t(R) * K / bk);
  for (auto& v : q) v = rng();
  for (auto& v : z) v = 8;
  for (auto& v : s) v = f2bf(0.01f + (rng() % 100) * 1e-4f);
  std::vector<float> x(K + K / bk);
  for (int k = 0; k < K; ++k) x[k] = (rng() % 2000) * 1e-3f - 1.f;
  block_sums(x.data(), K, bk);
  const float* xr[1] = {x.data()};
  auto row = [&](int r) { return Row{q.data() + size_t(r) * K / 2, reinterpret_cast<const char*>(s.data() + size_t(r) * K / bk), z.data() + size_t(r) * K / bk, K, bk, BF16}; };
  using Fn = void (*)(const Row&, const float* const*, float*);
  auto mainfn = [](const Row& w, const float* const* x, float* o) { avx2::qkernels[0].fn(w, reinterpret_cast<const void* const*>(x), 1, o); };
  struct { const char* name; Fn fn; } fns[] = {{"main", mainfn}, {"P2", var::qrow<2>}, {"P4", var::qrow<4>}, {"P1", var::qrow<1>},
                                               {"q16x1", var::qrow16<1>}, {"q16x2", var::qrow16<2>}};
  float ref = 0; mainfn(row(0), xr, &ref);
  for (int round = 0; round < 3; ++round)
    for (auto& f : fns) {
      float o = 0; f.fn(row(0), xr, &o);
      double best = 1e30;
      for (int rep = 0; rep < 40; ++rep) {
        auto t0 = steady_clock::now();
        for (int it = 0; it < (R >= 256 ? 1 : 64); ++it)
          for (int r = 0; r < R; ++r) { float y; f.fn(row(r), xr, &y); asm volatile("" ::"x"(y)); }
        best = std::min(best, duration<double>(steady_clock::now() - t0).count());
      }
      double n = double(R) * K * (R >= 256 ? 1 : 64);
      printf("%s K=%d R=%d: %.2f G weights/s (rel err %.1e)\n", f.name, K, R, n / best / 1e9, std::abs(o - ref) / std::abs(ref));
    }
}
