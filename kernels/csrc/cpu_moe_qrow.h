// The quantized-row kernel of one SIMD path. cpu_moe.cpp includes this file once per path, inside
// a namespace that defines V, that path's vector traits, under that path's target pragma; so the
// group loop below is written once and compiled for AVX-512, AVX2 and plain scalar code alike.
// (No include guard: it is meant to be included more than once.)

// out[r] = W_row . x[r] for NR activation rows, W dequantized in registers: per block of bk
// columns, p = sum_k code_k * x_k (int formats: code - zero, exact in fp32), then acc += p * scale,
// so the scale costs one FMA per block and the zero point one integer subtract per vector.
template <int F, int NR>
void qrow(const Row& w, const float* const* x, float* out) {
  using R = typename V::R;
  const int K = w.K, bk = w.bk;
  const bool vec = !(F == INT4 || F == MXFP4) || bk % 2 == 0;  // else blocks may start mid-byte
  R acc[NR];
  float tail[NR];
  for (int r = 0; r < NR; ++r) acc[r] = V::zero(), tail[r] = 0.f;
  for (int g = 0, k0 = 0; k0 < K; ++g, k0 += bk) {
    const int k1 = std::min(K, k0 + bk), z = zero_point<F>(w, g);
    const auto zv = V::zero_point(z);
    R p0[NR], p1[NR];  // two chains per row hide the FMA latency
    for (int r = 0; r < NR; ++r) p0[r] = p1[r] = V::zero();
    int k = k0;
    if (vec) {
      for (; k + 2 * V::W <= k1; k += 2 * V::W) {
        const R w0 = V::template dequant<F>(w.q, k, zv), w1 = V::template dequant<F>(w.q, k + V::W, zv);
        for (int r = 0; r < NR; ++r)
          p0[r] = V::fma(w0, V::load(x[r] + k), p0[r]), p1[r] = V::fma(w1, V::load(x[r] + k + V::W), p1[r]);
      }
      for (; k + V::W <= k1; k += V::W) {
        const R w0 = V::template dequant<F>(w.q, k, zv);
        for (int r = 0; r < NR; ++r) p0[r] = V::fma(w0, V::load(x[r] + k), p0[r]);
      }
    }
    const float s = block_scale<F>(w, g);
    const R sv = V::set1(s);
    for (int r = 0; r < NR; ++r) acc[r] = V::fma(V::add(p0[r], p1[r]), sv, acc[r]);
    for (; k < k1; ++k) {  // the block's last columns, fewer than a vector
      const float v = code_value<F>(w.q, k, z) * s;
      for (int r = 0; r < NR; ++r) tail[r] += v * x[r][k];
    }
  }
  for (int r = 0; r < NR; ++r) out[r] = V::sum(acc[r]) + tail[r];
}

// RowsFn of a quantized format: activation rows two at a time, so one dequantized vector serves both.
template <int F>
void qrows(const Row& w, const void* const* x, int nx, float* out) {
  auto xf = reinterpret_cast<const float* const*>(x);
  int i = 0;
  for (; i + 2 <= nx; i += 2) qrow<F, 2>(w, xf + i, out + i);
  if (i < nx) qrow<F, 1>(w, xf + i, out + i);
}

const RowsFn qrows_by_fmt[4] = {qrows<INT4>, qrows<INT8>, qrows<FP8>, qrows<MXFP4>};
