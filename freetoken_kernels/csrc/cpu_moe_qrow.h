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
inline void dequant_pair(const uint8_t* q, size_t k, typename V::R& a, typename V::R& b) {
  if constexpr (F == INT4 || F == MXFP4) V::template nibbles<F>(q + k / 2, a, b);
  else a = V::template dequant<F>(q + k), b = V::template dequant<F>(q + k + V::W);
}

// out[r] = W_row . x[r] for NR activation rows, W dequantized in registers: each vector of codes
// meets x in fp32 chains that start afresh every block, and a block's sum is scaled once into the
// row's accumulator (rows 4-14% faster than scaling every vector on the CPU machine). int4 / int8
// codes go in as they are, their zero point taken out once a block with the block's sum of x,
// which the rows carry (Kernel::sums). mxfp4's blocks of 32 columns, a step or less, scale every
// vector and keep their chains.
template <int F, int NR>
void qrow(const Row& w, const float* const* xr, float* out) {
  using R = typename V::R;
  // two vector pairs a step, four FMA chains a block, whatever NR: a token's bits do not depend on its batch
  constexpr int W = V::W, P = 2;
  constexpr bool nib = F == INT4 || F == MXFP4, each = F == MXFP4, zs = F == INT4 || F == INT8;
  const int K = w.K, bk = w.bk;
  const bool vec = !nib || bk % 2 == 0;  // else blocks may start mid-byte
  const float* x[NR];
  R acc[NR], p[2 * P][NR];
  float tail[NR];
  auto chains = [&](int r) { return V::add(V::add(p[0][r], p[1][r]), V::add(p[2][r], p[3][r])); };
  for (int r = 0; r < NR; ++r) {
    x[r] = xr[r], tail[r] = 0.f, acc[r] = V::zero();
    for (int u = 0; u < 2 * P; ++u) p[u][r] = V::zero();
  }
  for (int g = 0, k0 = 0; k0 < K; ++g, k0 += bk) {
    const size_t k1 = std::min(K, k0 + bk);  // (unsigned columns: a nibble row's byte offset is a shift)
    const float s = block_scale<F>(w, g);
    const R sv = V::set1(s);
    if constexpr (!each)
      for (int r = 0; r < NR; ++r)
        for (int u = 0; u < 2 * P; ++u) p[u][r] = V::zero();
    auto pair = [&](size_t k, int u) {  // columns k .. k + 2W - 1 into chains 2u and 2u + 1
      R a, b;
      dequant_pair<F>(w.q, k, a, b);
      if constexpr (each) a = V::mul(a, sv), b = V::mul(b, sv);
      for (int r = 0; r < NR; ++r) {
        p[2 * u][r] = V::fma(a, V::load(x[r] + k), p[2 * u][r]);
        p[2 * u + 1][r] = V::fma(b, V::load(x[r] + k + W), p[2 * u + 1][r]);
      }
    };
    size_t k = k0;
    if (vec) {
      for (; k + 2 * P * W <= k1; k += 2 * P * W) {  // (the prefetch: see dot_avx2)
        _mm_prefetch(reinterpret_cast<const char*>(w.q) + (nib ? k / 2 : k) + 4096, _MM_HINT_T0);
        for (int u = 0; u < P; ++u) pair(k + 2 * u * W, u);
      }
      for (; k + 2 * W <= k1; k += 2 * W) pair(k, 0);
      if constexpr (!nib)  // (a nibble row's last columns short of a chunk are in plain order)
        for (; k + W <= k1; k += W) {
          const R a = V::template dequant<F>(w.q + k);
          for (int r = 0; r < NR; ++r) p[0][r] = V::fma(a, V::load(x[r] + k), p[0][r]);
        }
    }
    if constexpr (!each)
      for (int r = 0; r < NR; ++r) acc[r] = V::fma(chains(r), sv, acc[r]);
    for (; k < k1; ++k) {  // the block's last columns, fewer than a step
      const float v = code_value<F>(w.q, k, 0.f) * s;
      for (int r = 0; r < NR; ++r) tail[r] += v * x[r][k];
    }
    if constexpr (zs)
      for (int r = 0; r < NR; ++r) tail[r] -= s * float(w.z[g]) * x[r][K + g];
  }
  for (int r = 0; r < NR; ++r)
    out[r] = V::sum(each ? chains(r) : acc[r]) + tail[r];
}

// RowsFn of a quantized format: activation rows four at a time (two on the 256-bit path, whose 16
// registers hold fewer chains), so one dequantized vector serves them all (a prefill chunk's
// routes: the dequantization costs more than the FMAs it feeds).
template <int F>
void qrows(const Row& w, const void* const* x, int nx, float* out) {
  auto xf = reinterpret_cast<const float* const*>(x);
  int i = 0;
  if constexpr (V::W >= 16)
    for (; i + 4 <= nx; i += 4) qrow<F, 4>(w, xf + i, out + i);
  for (; i + 2 <= nx; i += 2) qrow<F, 2>(w, xf + i, out + i);
  if (i < nx) qrow<F, 1>(w, xf + i, out + i);
}

const Kernel qkernels[4] = {{qrows<INT4>, kChunk, A_F32, nullptr, true}, {qrows<INT8>, 0, A_F32, nullptr, true},
                            {qrows<FP8>, 0}, {qrows<MXFP4>, kChunk}};
