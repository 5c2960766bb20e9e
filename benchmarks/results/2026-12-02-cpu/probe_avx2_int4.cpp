// AVX2 int4 rows, one route, one core: main against per-block variants (unscaled codes with the zero point
// taken out by block sums of x; the zero point subtracted as integers; as floats). ./probe_avx2_int4 K
#include "cpu_moe.cpp"
#include <cstdio>
#include <random>
#include <vector>
using namespace std::chrono;
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
namespace a2 {
// int4 row, one route: per block the codes' unscaled dot with x (codes widened and converted, no zero
// point), then s * (dot - z * sum_x[block]) once a block; four chains.
inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_hadd_ps(s, s);
  return _mm_cvtss_f32(_mm_hadd_ps(s, s));
}
void row(const Row& w, const float* x, const float* xs, float* out) {
  const int K = w.K, bk = w.bk, ns = K / bk;
  const __m256i m15 = _mm256_set1_epi32(15);
  __m256 acc0 = _mm256_setzero_ps(), acc1 = acc0;
  float corr = 0.f;
  const uint8_t* q = w.q;
  for (int g = 0; g < ns; ++g) {
    __m256 p0 = _mm256_setzero_ps(), p1 = p0, p2 = p0, p3 = p0;
    const float* xb = x + g * bk;
    for (int i = 0; i < bk; i += 32, q += 16) {
      _mm_prefetch(reinterpret_cast<const char*>(q) + 4096, _MM_HINT_T0);
      const __m256i c0 = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(q)));
      const __m256i c1 = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(q + 8)));
      p0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_and_si256(c0, m15)), _mm256_loadu_ps(xb + i), p0);
      p1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(c0, 4)), _mm256_loadu_ps(xb + i + 8), p1);
      p2 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_and_si256(c1, m15)), _mm256_loadu_ps(xb + i + 16), p2);
      p3 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(c1, 4)), _mm256_loadu_ps(xb + i + 24), p3);
    }
    const float s = block_scale<INT4>(w, g);
    const __m256 t = _mm256_add_ps(_mm256_add_ps(p0, p1), _mm256_add_ps(p2, p3));
    if (g & 1) acc1 = _mm256_fmadd_ps(t, _mm256_set1_ps(s), acc1); else acc0 = _mm256_fmadd_ps(t, _mm256_set1_ps(s), acc0);
    corr += s * float(w.z[g]) * xs[g];
  }
  out[0] = hsum(_mm256_add_ps(acc0, acc1)) - corr;
}
void row_zi(const Row& w, const float* x, float* out) {
  const int K = w.K, bk = w.bk, ns = K / bk;
  const __m256i m15 = _mm256_set1_epi32(15);
  __m256 acc0 = _mm256_setzero_ps(), acc1 = acc0;
  const uint8_t* q = w.q;
  for (int g = 0; g < ns; ++g) {
    __m256 p0 = _mm256_setzero_ps(), p1 = p0, p2 = p0, p3 = p0;
    const __m256i zv = _mm256_set1_epi32(w.z[g]);
    const float* xb = x + g * bk;
    for (int i = 0; i < bk; i += 32, q += 16) {
      _mm_prefetch(reinterpret_cast<const char*>(q) + 4096, _MM_HINT_T0);
      const __m256i c0 = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(q)));
      const __m256i c1 = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(q + 8)));
      p0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_and_si256(c0, m15), zv)), _mm256_loadu_ps(xb + i), p0);
      p1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_srli_epi32(c0, 4), zv)), _mm256_loadu_ps(xb + i + 8), p1);
      p2 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_and_si256(c1, m15), zv)), _mm256_loadu_ps(xb + i + 16), p2);
      p3 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_srli_epi32(c1, 4), zv)), _mm256_loadu_ps(xb + i + 24), p3);
    }
    const float s = block_scale<INT4>(w, g);
    const __m256 t = _mm256_add_ps(_mm256_add_ps(p0, p1), _mm256_add_ps(p2, p3));
    if (g & 1) acc1 = _mm256_fmadd_ps(t, _mm256_set1_ps(s), acc1); else acc0 = _mm256_fmadd_ps(t, _mm256_set1_ps(s), acc0);
  }
  out[0] = hsum(_mm256_add_ps(acc0, acc1));
}
void row_zf(const Row& w, const float* x, float* out) {
  const int K = w.K, bk = w.bk, ns = K / bk;
  const __m256i m15 = _mm256_set1_epi32(15);
  __m256 acc0 = _mm256_setzero_ps(), acc1 = acc0;
  const uint8_t* q = w.q;
  for (int g = 0; g < ns; ++g) {
    __m256 p0 = _mm256_setzero_ps(), p1 = p0, p2 = p0, p3 = p0;
    const __m256 zv = _mm256_set1_ps(8388608.f + w.z[g]);
    const float* xb = x + g * bk;
    for (int i = 0; i < bk; i += 32, q += 16) {
      _mm_prefetch(reinterpret_cast<const char*>(q) + 4096, _MM_HINT_T0);
      const __m256i c0 = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(q)));
      const __m256i c1 = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(q + 8)));
      p0 = _mm256_fmadd_ps(V256::minus_zero(_mm256_and_si256(c0, m15), zv), _mm256_loadu_ps(xb + i), p0);
      p1 = _mm256_fmadd_ps(V256::minus_zero(_mm256_srli_epi32(c0, 4), zv), _mm256_loadu_ps(xb + i + 8), p1);
      p2 = _mm256_fmadd_ps(V256::minus_zero(_mm256_and_si256(c1, m15), zv), _mm256_loadu_ps(xb + i + 16), p2);
      p3 = _mm256_fmadd_ps(V256::minus_zero(_mm256_srli_epi32(c1, 4), zv), _mm256_loadu_ps(xb + i + 24), p3);
    }
    const float s = block_scale<INT4>(w, g);
    const __m256 t = _mm256_add_ps(_mm256_add_ps(p0, p1), _mm256_add_ps(p2, p3));
    if (g & 1) acc1 = _mm256_fmadd_ps(t, _mm256_set1_ps(s), acc1); else acc0 = _mm256_fmadd_ps(t, _mm256_set1_ps(s), acc0);
  }
  out[0] = hsum(_mm256_add_ps(acc0, acc1));
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
  for (auto& v : xv) v = std::normal_distribution<float>(0.f, 1.f)(rng);
  std::vector<float> xp(K), xs(K / bk);  // x in the avx2 kernel's chunk order (chunk 16)
  for (int k = 0; k < K; ++k) xp[permute(k, K, 16)] = xv[k];
  for (int g = 0; g < K / bk; ++g) { double a = 0; for (int k = g * bk; k < (g + 1) * bk; ++k) a += xv[k]; xs[g] = a; }
  const size_t rb = K / 2; const int n = 16, nb = K / bk;
  std::vector<uint8_t> q(n * rb), z(n * nb);
  std::vector<uint16_t> s(n * nb);
  for (auto& b : q) b = rng();
  for (auto& b : z) b = rng() % 16;
  for (auto& b : s) b = 0x2000 + rng() % 256;
  auto rowf = [&](int j) { return Row{q.data() + j * rb, reinterpret_cast<const char*>(s.data() + j * nb), z.data() + j * nb, K, bk, F16}; };
  const void* xpp[1] = {xp.data()};
  // the new kernel reads x in 32-column steps: codes of byte j -> columns 2j (low) and 2j+1 (high);
  // a 16-byte step gives low nibbles of bytes 0-7, high of 0-7, low of 8-15, high of 8-15
  std::vector<float> xn(K);
  for (int k = 0; k < K; ++k) { int st = k / 32 * 32, o = k % 32, byte = o / 2, hi = o % 2; xn[st + (byte / 8) * 16 + hi * 8 + byte % 8] = xv[k]; }
  float o1, o2; double maxrel = 0;
  for (int j = 0; j < n; ++j) {
    avx2::qkernels[0].fn(rowf(j), xpp, 1, &o1);
    a2::row(rowf(j), xn.data(), xs.data(), &o2);
    float o3; a2::row_zi(rowf(j), xn.data(), &o3);
    if (j < 2) printf("zi %.6f\n", o3);
    double ref = 0;
    for (int k = 0; k < K; ++k) ref += double(code_value<INT4>(q.data() + j * rb, k, z[j * nb + k / bk]) * block_scale<INT4>(rowf(j), k / bk)) * xv[k];
    maxrel = std::max(maxrel, std::max(std::abs(o1 - ref) / std::abs(ref), std::abs(o2 - ref) / std::abs(ref)));
    if (j < 2) printf("ref %.6f avx2 %.6f new %.6f\n", ref, o1, o2);
  }
  printf("max rel err %.2e\n", maxrel);
  for (int r = 0; r < 3; ++r) {
    double a = rate([&](long i) { avx2::qkernels[0].fn(rowf(i % n), xpp, 1, &o1); }, K);
    double b = rate([&](long i) { a2::row(rowf(i % n), xn.data(), xs.data(), &o2); }, K);
    double c = rate([&](long i) { a2::row_zi(rowf(i % n), xn.data(), &o2); }, K);
    double d = rate([&](long i) { a2::row_zf(rowf(i % n), xn.data(), &o2); }, K);
    printf("float zero %.2f (%.2fx)\n", d, d / a);
    printf("K %d g%d AVX2 int4 one route, G weights/s: main %.2f, per-block unscaled %.2f (%.2fx), int zero %.2f (%.2fx)\n", K, bk, a, b, b / a, c, c / a);
  }
}
