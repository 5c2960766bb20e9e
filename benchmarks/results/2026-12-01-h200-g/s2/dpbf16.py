"""Probe: VDPBF16PS throughput per core with C independent accumulator chains, operands in L1 (a
row of K bf16 weights against NB activation rows, as the executor's rows_dpbf16), and the same
with the weight row streamed from a large bank (L2 / DRAM), single thread. GFLOP/s."""
import time, sys
import torch
from torch.utils.cpp_extension import load_inline

src = r'''
#include <torch/extension.h>
#include <immintrin.h>
#include <chrono>
template <int C> __attribute__((target("avx512f,avx512bw,avx512bf16")))
double chains(int64_t iters) {
  __m512 a[C]; for (int c = 0; c < C; ++c) a[c] = _mm512_set1_ps(0.f);
  __m512bh w = (__m512bh)_mm512_set1_epi16(0x3f80), x = (__m512bh)_mm512_set1_epi16(0x3c00);
  auto t0 = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < iters; ++i)
    for (int c = 0; c < C; ++c) a[c] = _mm512_dpbf16_ps(a[c], w, x);
  double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  float sink = 0; for (int c = 0; c < C; ++c) sink += _mm512_reduce_add_ps(a[c]);
  if (sink == 12345.f) printf("!");
  return double(iters) * C * 64 / s / 1e9;
}
template <int NB> __attribute__((target("avx512f,avx512bw,avx512bf16")))
double rows(torch::Tensor bank, torch::Tensor xs, int64_t reps) {
  // bank [N, K] bf16 rows, xs [NB, K]: every row against the NB activation rows, reps passes
  auto wp0 = reinterpret_cast<const uint16_t*>(bank.data_ptr());
  auto xp0 = reinterpret_cast<const uint16_t*>(xs.data_ptr());
  int64_t N = bank.size(0), K = bank.size(1);
  float out = 0;
  auto t0 = std::chrono::steady_clock::now();
  for (int64_t r = 0; r < reps; ++r)
    for (int64_t n = 0; n < N; ++n) {
      const uint16_t* wp = wp0 + n * K;
      __m512 a0[NB], a1[NB];
      for (int b = 0; b < NB; ++b) a0[b] = a1[b] = _mm512_setzero_ps();
      for (int64_t i = 0; i + 64 <= K; i += 64) {
        __m512bh w0 = (__m512bh)_mm512_loadu_si512(wp + i), w1 = (__m512bh)_mm512_loadu_si512(wp + i + 32);
        for (int b = 0; b < NB; ++b) {
          a0[b] = _mm512_dpbf16_ps(a0[b], w0, (__m512bh)_mm512_loadu_si512(xp0 + b * K + i));
          a1[b] = _mm512_dpbf16_ps(a1[b], w1, (__m512bh)_mm512_loadu_si512(xp0 + b * K + i + 32));
        }
      }
      for (int b = 0; b < NB; ++b) out += _mm512_reduce_add_ps(_mm512_add_ps(a0[b], a1[b]));
    }
  double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (out == 12345.f) printf("!");
  return double(reps) * N * K * NB * 2 / s / 1e9;
}
std::vector<double> run_chains(int64_t iters) {
  return {chains<1>(iters), chains<2>(iters), chains<4>(iters), chains<8>(iters), chains<16>(iters), chains<24>(iters)};
}
std::vector<double> run_rows(torch::Tensor bank, torch::Tensor xs, int64_t reps) {
  return {rows<1>(bank, xs, reps), rows<2>(bank, xs, reps), rows<4>(bank, xs, reps), rows<8>(bank, xs, reps)};
}
'''
m = load_inline("dpbf16_probe", cpp_sources=src, functions=["run_chains", "run_rows"],
                extra_cflags=["-O3", "-march=native"], verbose=False)
print("chains C=1,2,4,8,16,24 (GFLOP/s, one thread, registers only):", [round(v, 1) for v in m.run_chains(20_000_000)], flush=True)
K = 2048
xs = torch.randn(8, K).bfloat16()
for name, rows_n, reps in (("L1-L2 (16 rows, 64 KiB)", 16, 20000), ("L2 (256 rows, 1 MiB)", 256, 1000),
                           ("DRAM (65536 rows, 256 MiB)", 65536, 3)):
    bank = torch.randn(rows_n, K).bfloat16()
    print(f"rows NB=1,2,4,8, weights from {name}:", [round(v, 1) for v in m.run_rows(bank, xs, reps)], flush=True)
