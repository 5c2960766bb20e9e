// int4 rows (BF16 dot products, one route, one core) in variants of their dependency chains, against main's
// kernel, on an L1-resident set of 16 rows; min over 64-call windows. Build from the repository root:
//   g++ -O3 -std=c++17 -pthread -I kernels/csrc -o pc .probe/probe_chains.cpp && ./pc 2048 && ./pc 768
// u<CH, NA>: the block's chunk loop unrolled (span = the block, g128 / g256); CH accumulator pairs per
// block (chunks alternate among them), NA accumulators across blocks (blocks alternate, two a step).
#include "cpu_moe.cpp"
#include <cstdio>
#include <random>
#include <vector>
using namespace std::chrono;
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,avx512f,avx512bw,avx512bf16")
namespace u {
using namespace bf16q;
template <int S, int CH>
inline __m512 block(const uint8_t* q, const uint16_t* x, __m512i tab) {
  const __m512i low = _mm512_set1_epi16(15);
  __m512 p[2 * CH];
  for (auto& v : p) v = _mm512_setzero_ps();
#pragma GCC unroll 8
  for (int i = 0; i < S; i += kChunk) {
    const int c = (i / kChunk) % CH;
    _mm_prefetch(reinterpret_cast<const char*>(q + i / 2) + 4096, _MM_HINT_T0);
    const __m512i cc = _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + i / 2)));
    p[2 * c] = dp(p[2 * c], _mm512_permutexvar_epi16(_mm512_and_si512(cc, low), tab), x + i);
    p[2 * c + 1] = dp(p[2 * c + 1], _mm512_permutexvar_epi16(_mm512_srli_epi16(cc, 4), tab), x + i + 32);
  }
  __m512 t = _mm512_add_ps(p[0], p[1]);
  for (int c = 1; c < CH; ++c) t = _mm512_add_ps(t, _mm512_add_ps(p[2 * c], p[2 * c + 1]));
  return t;
}
template <int S, int CH, int NA>
void qrow(const Row& w, const uint16_t* const* xr, float* out) {
  const int ns = w.K / S;
  __m512 acc[NA];
  for (auto& a : acc) a = _mm512_setzero_ps();
  __m512i tab = code_table(w.z[0]);
  int ztab = w.z[0];
  const uint16_t* x = xr[0];
  int g = 0;
  for (; g + NA <= ns; g += NA)
#pragma GCC unroll 2
    for (int a = 0; a < NA; ++a) {
      if (w.z[g + a] != ztab) ztab = w.z[g + a], tab = code_table(ztab);
      acc[a] = _mm512_fmadd_ps(block<S, CH>(w.q + size_t(g + a) * S / 2, x + (g + a) * S, tab),
                               _mm512_set1_ps(block_scale<INT4>(w, g + a)), acc[a]);
    }
  for (; g < ns; ++g) {
    if (w.z[g] != ztab) ztab = w.z[g], tab = code_table(ztab);
    acc[0] = _mm512_fmadd_ps(block<S, CH>(w.q + size_t(g) * S / 2, x + g * S, tab), _mm512_set1_ps(block_scale<INT4>(w, g)), acc[0]);
  }
  for (int a = 1; a < NA; ++a) acc[0] = _mm512_add_ps(acc[0], acc[a]);
  out[0] = _mm512_reduce_add_ps(acc[0]);
}
}
#pragma GCC pop_options
template <class F> double rate(F f, long wpc) {
  double best = 1e9; long calls = 0; auto t00 = steady_clock::now();
  while (duration<double>(steady_clock::now() - t00).count() < 0.3) {
    auto t0 = steady_clock::now();
    for (int i = 0; i < 64; ++i) f(calls++);
    best = std::min(best, duration<double>(steady_clock::now() - t0).count());
  }
  return 64 * double(wpc) / best / 1e9;
}
using Fn = void (*)(const Row&, const uint16_t* const*, float*);
template <int S> void table(int K) {
  std::mt19937 rng(1);
  std::vector<float> xv(K);
  for (auto& v : xv) v = bf2f(f2bf(std::normal_distribution<float>(0.f, 1.f)(rng)));
  std::vector<uint16_t> xa(2 * K, 0);
  for (int k = 0; k < K; ++k) xa[permute(k, K, 64)] = f2bf(xv[k]);
  const void* xp[1] = {xa.data()};
  const size_t rb = K / 2; const int n = 16, nb = K / S;
  std::vector<uint8_t> q(n * rb), z(n * nb, 8);
  std::vector<uint16_t> s(n * nb);
  for (auto& b : q) b = rng();
  for (auto& b : s) b = 0x2000 + rng() % 256;
  struct V { const char* name; Fn fn; } vs[] = {
      {"u<1,1>", u::qrow<S, 1, 1>}, {"u<2,1>", u::qrow<S, 2, 1>}, {"u<1,2>", u::qrow<S, 1, 2>},
      {"u<2,2>", u::qrow<S, 2, 2>}, {"u<4,2>", u::qrow<S, 4, 2>}};
  auto row = [&](int j) { return Row{q.data() + j * rb, reinterpret_cast<const char*>(s.data() + j * nb), z.data() + j * nb, K, S, F16}; };
  float ref, o;
  bf16q::kernel<INT4>.hi_only(row(0), xp, 1, &ref);
  printf("K %d g%d, G weights/s (min of 64-call windows), three rounds:\n", K, S);
  for (int rep = 0; rep < 3; ++rep) {
    printf("  main %6.2f", rate([&](long i) { bf16q::kernel<INT4>.hi_only(row(i % n), xp, 1, &o); }, K));
    for (auto& v : vs) {
      v.fn(row(0), reinterpret_cast<const uint16_t* const*>(xp), &o);
      if (std::abs(o - ref) > 1e-3f * std::abs(ref) + 1e-3f) printf(" [%s wrong: %g vs %g]", v.name, o, ref);
      printf(" | %s %6.2f", v.name, rate([&](long i) { v.fn(row(i % n), reinterpret_cast<const uint16_t* const*>(xp), &o); }, K));
    }
    printf("\n");
  }
}
int main(int argc, char** argv) {
  const int K = argc > 1 ? atoi(argv[1]) : 2048;
  table<128>(K);
  table<256>(K);
}
