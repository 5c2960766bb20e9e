// instruction throughput / latency probe: ns per instruction for chains of 1 and 8 accumulators
#include <immintrin.h>
#include <chrono>
#include <cstdio>
#define T __attribute__((target("avx512f,avx512bw,avx512bf16")))
template <int N, int OP> T double run(long iters) {
  __m512 a[N]; __m512i b = _mm512_set1_epi16(0x3f80), c = _mm512_set1_epi16(0x3f81);
  for (int i = 0; i < N; ++i) a[i] = _mm512_set1_ps(1e-30f * i);
  __m512 f = _mm512_set1_ps(1.0000001f), g = _mm512_set1_ps(1e-30f);
  __m512i p = _mm512_set1_epi16(3);
  auto t0 = std::chrono::steady_clock::now();
  for (long it = 0; it < iters; ++it)
_Pragma("GCC unroll 16")
    for (int i = 0; i < N; ++i) {
      if (OP == 0) a[i] = _mm512_dpbf16_ps(a[i], (__m512bh)b, (__m512bh)c);
      if (OP == 1) a[i] = _mm512_fmadd_ps(a[i], f, g);
      if (OP == 2) a[i] = _mm512_castsi512_ps(_mm512_permutexvar_epi16(p, _mm512_castps_si512(a[i])));

    }
  double ns = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count();
  float s = 0; for (int i = 0; i < N; ++i) s += _mm512_reduce_add_ps(a[i]);
  if (s == 12345.f) printf("x");
  return ns / (double(iters) * N);
}
int main() {
  long n = 50000000;
  run<8, 1>(n);  // warm the clock
  printf("ns/instr  chain1  chain8  chain16\n");
  printf("vdpbf16ps %.3f %.3f %.3f\n", run<1, 0>(n), run<8, 0>(n / 8), run<16, 0>(n / 16));
  printf("vfmadd    %.3f %.3f %.3f\n", run<1, 1>(n), run<8, 1>(n / 8), run<16, 1>(n / 16));
  printf("vpermw    %.3f %.3f %.3f\n", run<1, 2>(n), run<8, 2>(n / 8), run<16, 2>(n / 16));
}
