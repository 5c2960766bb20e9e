// The generic quantized rows (cpu_moe_qrow.h) per path and format, one core, L1-resident 16 rows,
// min over 64-call windows; x fp32 rows with their block sums after them (932fab8 reads them; the
// kernels before it ignore them, as the first table of RESULTS was measured). ./probe_generic_rows K
#include "cpu_moe.cpp"
#include <cstdio>
#include <random>
#include <vector>
using namespace std::chrono;
template <class F> double rate(F f, long wpc) {
  double best = 1e9; long calls = 0; auto t00 = steady_clock::now();
  while (duration<double>(steady_clock::now() - t00).count() < 0.25) {
    auto t0 = steady_clock::now();
    for (int i = 0; i < 64; ++i) f(calls++);
    best = std::min(best, duration<double>(steady_clock::now() - t0).count());
  }
  return 64 * double(wpc) / best / 1e9;
}
int main(int argc, char** argv) {
  const int K = argc > 1 ? atoi(argv[1]) : 2048;
  std::mt19937 rng(1);
  const char* fn[4] = {"int4", "int8", "fp8", "mxfp4"};
  for (int path = 0; path < 2; ++path)
    for (int f = INT4; f <= MXFP4; ++f) {
      const Kernel& kn = path == 0 ? avx512::qkernels[f - INT4] : avx2::qkernels[f - INT4];
      const int bk = f == MXFP4 ? 32 : 128, nb = K / bk;
      const size_t rb = (f == INT4 || f == MXFP4) ? K / 2 : K;
      const int n = 16;
      std::vector<uint8_t> q(n * rb), z(n * nb);
      std::vector<float> sf(n * nb);
      std::vector<uint16_t> sh(n * nb);
      std::vector<uint8_t> se(n * nb);
      for (auto& b : q) b = rng() & (f == FP8 ? 0xF7 : 0xFF);
      for (auto& b : z) b = f == INT4 ? rng() % 16 : rng() % 256;
      for (auto& v : sh) v = 0x2000 + rng() % 256;
      for (auto& v : sf) v = 1e-2f * (1 + rng() % 100);
      for (auto& v : se) v = 120 + rng() % 8;
      const char* sp = f == FP8 ? reinterpret_cast<const char*>(sf.data()) : f == MXFP4 ? reinterpret_cast<const char*>(se.data()) : reinterpret_cast<const char*>(sh.data());
      const size_t ss = f == FP8 ? 4 : f == MXFP4 ? 1 : 2;
      auto row = [&](int j) { return Row{q.data() + j * rb, sp + j * nb * ss, z.data() + j * nb, K, bk, f == FP8 ? F32 : F16}; };
      std::vector<std::vector<float>> xs(4, std::vector<float>(K + nb));  // each row's block sums after it
      for (auto& x : xs) {
        for (int k = 0; k < K; ++k) x[k] = std::normal_distribution<float>(0.f, 1.f)(rng);
        for (int g = 0; g < nb; ++g) { float a = 0; for (int k = g * bk; k < (g + 1) * bk; ++k) a += x[k]; x[K + g] = a; }
      }
      const void* xp[4] = {xs[0].data(), xs[1].data(), xs[2].data(), xs[3].data()};
      float o[4];
      double r1 = rate([&](long i) { kn.fn(row(i % n), xp, 1, o); }, K);
      double r4 = rate([&](long i) { kn.fn(row(i % n), xp, 4, o); }, 4 * K);
      kn.fn(row(0), xp, 1, o);
      printf("%-7s %-6s K %d: 1 route %6.2f, 4 routes %6.2f G weight-routes/s  (row 0: %.6f)\n", path ? "avx2" : "avx512", fn[f - INT4], K, r1, r4, o[0]);
    }
}
