// The quantized-row kernel of one SIMD path. cpu_moe.cpp includes this file once per path, inside
// a namespace that defines V, that path's vector traits, under that path's target pragma; so the
// loop below is written once and compiled for AVX-512, AVX2 and plain scalar code alike.
// (No include guard: it is meant to be included more than once.)

// Nibble formats (int4, mxfp4) read activations in the chunked order of permute(): a byte of codes
// widened to one lane gives its low nibbles in one vector and its high nibbles in the next, with
// no shuffle across lanes.
constexpr int kChunk = V::W > 1 ? 2 * V::W : 0;

// Vectors k .. k + 2W - 1 of a row in its activation order, as code_value gives them (a, b).
template <int F>
inline void dequant_pair(const uint8_t* q, int k, typename V::R zv, typename V::R& a, typename V::R& b) {
  if constexpr (F == INT4 || F == MXFP4) V::template nibbles<F>(q + k / 2, zv, a, b);
  else a = V::template dequant<F>(q + k, zv), b = V::template dequant<F>(q + k + V::W, zv);
}

// out[m][r] = W_m . x[r] for MR rows of one matrix and NR activation rows, W dequantized in
// registers: each vector of codes becomes (code - zero) * scale and is accumulated in fp32 over the
// whole row, so a block costs its scale and zero point, and no reduction. Each (row, activation)
// dot runs the same operations whatever MR and NR.
template <int F, int NR, int MR>
void qrow(const Row* const* w, const float* const* xr, float* const* out) {
  using R = typename V::R;
  // two vector pairs a step, four FMA chains a dot, whatever NR: a token's bits do not depend on its batch
  constexpr int W = V::W, P = 2;
  constexpr bool nib = F == INT4 || F == MXFP4;
  const int K = w[0]->K, bk = w[0]->bk;
  const bool vec = !nib || bk % 2 == 0;  // else blocks may start mid-byte
  const float* x[NR];
  R p[MR][2 * P][NR];
  float tail[MR][NR];
  for (int r = 0; r < NR; ++r) x[r] = xr[r];
  for (int m = 0; m < MR; ++m)
    for (int r = 0; r < NR; ++r) {
      tail[m][r] = 0.f;
      for (int u = 0; u < 2 * P; ++u) p[m][u][r] = V::zero();
    }
  for (int g = 0, k0 = 0; k0 < K; ++g, k0 += bk) {
    const int k1 = std::min(K, k0 + bk);
    float z[MR], s[MR];
    R sv[MR], zv[MR];
    for (int m = 0; m < MR; ++m) {
      z[m] = F == INT4 || F == INT8 ? float(w[m]->z[g]) : 0.f, s[m] = block_scale<F>(*w[m], g);
      sv[m] = V::set1(s[m]), zv[m] = V::set1(V::kZeroBias + z[m]);
    }
    auto pair = [&](int m, int k, int u) {  // row m's columns k .. k + 2W - 1 into chains 2u and 2u + 1
      R a, b;
      dequant_pair<F>(w[m]->q, k, zv[m], a, b);
      a = V::mul(a, sv[m]), b = V::mul(b, sv[m]);
      for (int r = 0; r < NR; ++r) {
        p[m][2 * u][r] = V::fma(a, V::load(x[r] + k), p[m][2 * u][r]);
        p[m][2 * u + 1][r] = V::fma(b, V::load(x[r] + k + W), p[m][2 * u + 1][r]);
      }
    };
    int k = k0;
    if (vec) {
      for (; k + 2 * P * W <= k1; k += 2 * P * W)
        for (int m = 0; m < MR; ++m) {  // the rows' loads in flight together (the prefetch: see dot_avx2)
          _mm_prefetch(reinterpret_cast<const char*>(w[m]->q) + (nib ? k / 2 : k) + 4096, _MM_HINT_T0);
          for (int u = 0; u < P; ++u) pair(m, k + 2 * u * W, u);
        }
      for (; k + 2 * W <= k1; k += 2 * W)
        for (int m = 0; m < MR; ++m) pair(m, k, 0);
      if constexpr (!nib)  // (a nibble row's last columns short of a chunk are in plain order)
        for (; k + W <= k1; k += W)
          for (int m = 0; m < MR; ++m) {
            const R a = V::mul(V::template dequant<F>(w[m]->q + k, zv[m]), sv[m]);
            for (int r = 0; r < NR; ++r) p[m][0][r] = V::fma(a, V::load(x[r] + k), p[m][0][r]);
          }
    }
    for (; k < k1; ++k)  // the block's last columns, fewer than a step
      for (int m = 0; m < MR; ++m) {
        const float v = code_value<F>(w[m]->q, k, z[m]) * s[m];
        for (int r = 0; r < NR; ++r) tail[m][r] += v * x[r][k];
      }
  }
  for (int m = 0; m < MR; ++m)
    for (int r = 0; r < NR; ++r) {
      for (int u = 1; u < 2 * P; ++u) p[m][0][r] = V::add(p[m][0][r], p[m][u][r]);
      out[m][r] = V::sum(p[m][0][r]) + tail[m][r];
    }
}

// RowsFn of a quantized format: activation rows four at a time (two on 256-bit paths, whose 16
// registers hold fewer chains), so one dequantized vector serves them all (a prefill chunk's
// routes: the dequantization costs more than the FMAs it feeds).
template <int F>
void qrows(const Row& w, const void* const* x, int nx, float* out) {
  auto xf = reinterpret_cast<const float* const*>(x);
  const Row* wp = &w;
  int i = 0;
  if constexpr (V::W >= 16)
    for (float* o; i + 4 <= nx; i += 4) o = out + i, qrow<F, 4, 1>(&wp, xf + i, &o);
  for (float* o; i + 2 <= nx; i += 2) o = out + i, qrow<F, 2, 1>(&wp, xf + i, &o);
  if (float* o = out + i; i < nx) qrow<F, 1, 1>(&wp, xf + i, &o);
}

// Rows2Fn: two rows against one activation row (decode), twice the loads in flight of one row,
// which on its own waits on memory; more activation rows take qrows() a row at a time.
template <int F>
void qrows2(const Row& w0, const Row& w1, const void* const* x, int nx, float* out0, float* out1) {
  const Row* wp[2] = {&w0, &w1};
  float* o[2] = {out0, out1};
  if (nx == 1) qrow<F, 1, 2>(wp, reinterpret_cast<const float* const*>(x), o);
  else qrows<F>(w0, x, nx, out0), qrows<F>(w1, x, nx, out1);
}

const Kernel qkernels[4] = {{qrows<INT4>, kChunk, A_F32, nullptr, qrows2<INT4>},
                            {qrows<INT8>, 0, A_F32, nullptr, qrows2<INT8>},
                            {qrows<FP8>, 0, A_F32, nullptr, qrows2<FP8>},
                            {qrows<MXFP4>, kChunk, A_F32, nullptr, qrows2<MXFP4>}};
