// g42 probe: does a core compute slower when more cores run the int4 row kernel? T threads, pinned one a core and
// started together (a spin barrier), each for `sec` seconds: (a) `regs`: VDPBF16PS on registers only (8 independent
// chains, no memory): a core's clock under AVX-512 load; (b) `add`: a scalar add chain (1 cycle an add): its clock
// without; (c) `l2`: the tree's int4 row kernel (g19/mb.cpp's v0, bf16 x, groups of 128) over a private 512 KiB
// region (L2-resident): compute without memory; (d) `dram`: the same over a private 256 MiB region. Prints per
// thread rate (median and min over threads) for T = each of the list. Threads on vCPUs FIRST .. FIRST + T - 1
// (FIRST 0 unless given); since g42 ran, a second line lists each vCPU's rate.
// g++ -O2 -pthread -o /tmp/freq freq.cpp && /tmp/freq 1,2,4,8,14,16 0.5 [FIRST]
#include <immintrin.h>
#include <pthread.h>
#include <sched.h>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

static double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }
alignas(64) static uint16_t tab8[32];
static uint16_t f2bf(float f) { uint32_t u; memcpy(&u, &f, 4); return uint16_t((u + 0x7fffu + ((u >> 16) & 1)) >> 16); }

__attribute__((target("avx512f,avx512bw,avx512bf16")))
static double regs(double sec) {  // Giga-VDPBF16PS a second
  __m512 a[8]; for (int i = 0; i < 8; ++i) a[i] = _mm512_set1_ps(float(i));
  __m512bh w = (__m512bh)_mm512_set1_epi16(0x3f80), x = (__m512bh)_mm512_set1_epi16(0x0001);
  long n = 0; double t0 = now(), t;
  do { for (int k = 0; k < 4096; ++k) for (int i = 0; i < 8; ++i) a[i] = _mm512_dpbf16_ps(a[i], w, x); n += 4096 * 8; } while ((t = now()) - t0 < sec);
  float s = 0; for (int i = 0; i < 8; ++i) s += _mm512_reduce_add_ps(a[i]);
  if (s == 1234.5f) printf("!");
  return n / (t - t0) / 1e9;
}
static double adds(double sec) {  // G dependent adds a second ~ the clock in GHz
  long n = 0; uint64_t v = 1; double t0 = now(), t;
  do { for (int k = 0; k < 1 << 16; ++k) asm volatile("add $1, %0\n\tadd $1, %0\n\tadd $1, %0\n\tadd $1, %0" : "+r"(v)); n += 4 << 16; } while ((t = now()) - t0 < sec);
  return n / (t - t0) / 1e9;
}
__attribute__((target("avx512f,avx512bw,avx512bf16")))
static float row(const uint8_t* q, const float* s, const uint16_t* x, int K) {  // g19/mb.cpp's v0
  const __m512i low = _mm512_set1_epi16(15); __m512i tab = _mm512_load_si512(tab8); __m512 acc = _mm512_setzero_ps();
  for (int g = 0; g < K / 128; ++g) {
    __m512 p0 = _mm512_setzero_ps(), p1 = _mm512_setzero_ps();
    for (int i = 0; i < 128; i += 64, q += 32) {
      _mm_prefetch((const char*)q + 4096, _MM_HINT_T0);
      __m512i c = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i*)q));
      __m512i we = _mm512_permutexvar_epi16(_mm512_and_si512(c, low), tab), wo = _mm512_permutexvar_epi16(_mm512_srli_epi16(c, 4), tab);
      p0 = _mm512_dpbf16_ps(p0, (__m512bh)we, (__m512bh)_mm512_loadu_si512(x + g * 128 + i));
      p1 = _mm512_dpbf16_ps(p1, (__m512bh)wo, (__m512bh)_mm512_loadu_si512(x + g * 128 + i + 32));
    }
    acc = _mm512_fmadd_ps(_mm512_add_ps(p0, p1), _mm512_set1_ps(s[g]), acc);
  }
  return _mm512_reduce_add_ps(acc);
}
struct Region {  // int4 rows of K = 2048 codes, their scales, a bf16 x
  static constexpr int K = 2048;
  size_t rows; std::vector<uint8_t> q; std::vector<float> s; std::vector<uint16_t> x;
  explicit Region(size_t bytes) : rows(bytes / (K / 2)), q(rows * (K / 2)), s(rows * (K / 128), 0.01f), x(K, 0x3f80) {
    uint64_t v = 88172645463325252ull ^ bytes;
    for (auto& b : q) v ^= v << 13, v ^= v >> 7, v ^= v << 17, b = uint8_t(v);
  }
  double stream(double sec) const {  // GB/s of int4 codes
    volatile float sink = 0; size_t n = 0; double t0 = now(), t;
    do { for (size_t i = 0; i < rows; ++i) sink = sink + row(q.data() + i * (K / 2), s.data() + i * (K / 128), x.data(), K); n += rows; } while ((t = now()) - t0 < sec);
    return n * (K / 2) / (t - t0) / 1e9;
  }
};

int main(int argc, char** argv) {
  for (int c = 0; c < 16; ++c) tab8[c] = f2bf(float(c - 8));
  std::vector<int> ts; for (char* p = strtok(argv[1], ","); p; p = strtok(nullptr, ",")) ts.push_back(atoi(p));
  double sec = argc > 2 ? atof(argv[2]) : 0.5;
  int first = argc > 3 ? atoi(argv[3]) : 0;
  const char* modes[] = {"add", "regs", "l2", "dram"};
  for (const char* mode : modes)
    for (int T : ts) {
      std::vector<double> r(T); std::atomic<int> ready{0}, go{0};
      std::vector<std::thread> th;
      for (int i = 0; i < T; ++i)
        th.emplace_back([&, i] {
          cpu_set_t cs; CPU_ZERO(&cs); CPU_SET(first + i, &cs); pthread_setaffinity_np(pthread_self(), sizeof cs, &cs);
          std::string m = mode;
          Region reg(m == "l2" ? 512 << 10 : m == "dram" ? size_t(256) << 20 : 1 << 12);
          reg.stream(0.0);  // faults the pages in, warms the code path
          ready++; while (!go.load()) _mm_pause();
          r[i] = m == "add" ? adds(sec) : m == "regs" ? regs(sec) : reg.stream(sec);
        });
      while (ready.load() < T) std::this_thread::yield();
      go = 1;
      for (auto& t : th) t.join();
      std::string each; for (int i = 0; i < T; ++i) each += " " + std::to_string(first + i) + ":" + std::to_string(r[i]).substr(0, 5);
      std::sort(r.begin(), r.end());
      double sum = 0; for (double v : r) sum += v;
      printf("%-5s T=%2d  per thread median %.3f min %.3f max %.3f  sum %.2f  (%s)\n", mode, T, r[T / 2], r[0], r[T - 1], sum,
             std::string(mode) == "add" ? "G adds/s ~ GHz" : std::string(mode) == "regs" ? "G VDPBF16PS/s" : "GB/s of int4 codes");
      printf("      vCPU:rate%s\n", each.c_str());
      fflush(stdout);
    }
}
