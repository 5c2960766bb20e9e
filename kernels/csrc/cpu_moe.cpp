// CPU expert executor: a persistent pool of worker threads computing routed expert FFNs with the
// semantics of kernels/ref.py::moe_experts, reading weights straight from host expert banks.
// Plain C ABI loaded with ctypes: no torch/Python headers, so the first build takes seconds and
// ctypes releases the GIL during every call. One build holds every SIMD path (function-level
// target attributes); the Python side picks the path at run time from ftmoe_cpu_features().
//
// A job runs in two phases over the pool's threads, with a barrier between them:
//   1. units (expert, block of R1 intermediate rows): h[route, j] = silu(gate_j . x) * (up_j . x)
//   2. units (block of R2 output rows): out[t, r] = sum over routes of w * (down_r . h[route])
// At batch 1 this splits each expert's rows across all threads (a GEMV streaming the weights);
// phase 2 partitions out by rows, so there are no write races and no reduction step.
#include <immintrin.h>
#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace {

enum DType { F32 = 0, BF16 = 1, F16 = 2 };
enum Mode { DP_BF16 = 0, AVX2 = 1, SCALAR = 2 };  // DP_BF16: bf16 weights AND bf16 activations
constexpr int R1 = 16;  // gate/up row pairs per phase-1 unit (128 KiB of bf16 weights at H=2048)
constexpr int R2 = 16;  // down rows per phase-2 unit, over every expert of the job

using DotFn = float (*)(const void* w, const void* x, int n);  // fp32 dot of two length-n rows

float bf2f(uint16_t v) { uint32_t u = uint32_t(v) << 16; float f; memcpy(&f, &u, 4); return f; }
float h2f(uint16_t v) { _Float16 h; memcpy(&h, &v, 2); return float(h); }
uint16_t f2bf(float f) {  // round to nearest even, NaN kept a NaN
  uint32_t u; memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);
  return uint16_t((u + 0x7fffu + ((u >> 16) & 1)) >> 16);
}

template <int D> inline float ldw(const void* p, int i) {
  if constexpr (D == F32) return static_cast<const float*>(p)[i];
  else if constexpr (D == BF16) return bf2f(static_cast<const uint16_t*>(p)[i]);
  else return h2f(static_cast<const uint16_t*>(p)[i]);
}

template <int D> float dot_scalar(const void* w, const void* x, int n) {
  auto xf = static_cast<const float*>(x);
  float s = 0.f;
  for (int i = 0; i < n; ++i) s += ldw<D>(w, i) * xf[i];
  return s;
}

#define AVX2_T __attribute__((target("avx2,fma,f16c")))
template <int D> AVX2_T inline __m256 ld8(const void* p, int i) {  // 8 weights -> fp32
  if constexpr (D == F32) return _mm256_loadu_ps(static_cast<const float*>(p) + i);
  auto q = reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(p) + i);
  if constexpr (D == BF16)  // bf16 is the top half of an fp32: widen and shift
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(q)), 16));
  else return _mm256_cvtph_ps(_mm_loadu_si128(q));
}

template <int D> AVX2_T float dot_avx2(const void* w, const void* x, int n) {
  auto xf = static_cast<const float*>(x);
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;  // 4 chains hide FMA latency
  int i = 0;
  for (; i + 32 <= n; i += 32) {
    const char* ahead = static_cast<const char*>(w) + size_t(i) * (D == F32 ? 4 : 2) + 4096;
    _mm_prefetch(ahead, _MM_HINT_T0);  // a page ahead: ~the next row of this stream
    if constexpr (D == F32) _mm_prefetch(ahead + 64, _MM_HINT_T0);
    a0 = _mm256_fmadd_ps(ld8<D>(w, i), _mm256_loadu_ps(xf + i), a0);
    a1 = _mm256_fmadd_ps(ld8<D>(w, i + 8), _mm256_loadu_ps(xf + i + 8), a1);
    a2 = _mm256_fmadd_ps(ld8<D>(w, i + 16), _mm256_loadu_ps(xf + i + 16), a2);
    a3 = _mm256_fmadd_ps(ld8<D>(w, i + 24), _mm256_loadu_ps(xf + i + 24), a3);
  }
  for (; i + 8 <= n; i += 8) a0 = _mm256_fmadd_ps(ld8<D>(w, i), _mm256_loadu_ps(xf + i), a0);
  __m256 a = _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3));
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  s = _mm_hadd_ps(s, s);
  s = _mm_hadd_ps(s, s);
  float r = _mm_cvtss_f32(s);
  for (; i < n; ++i) r += ldw<D>(w, i) * xf[i];
  return r;
}

#define BF16_T __attribute__((target("avx512f,avx512bw,avx512bf16")))
BF16_T float dot_dpbf16(const void* w, const void* x, int n) {  // bf16 x bf16 pairs -> fp32
  auto wp = static_cast<const uint16_t*>(w), xp = static_cast<const uint16_t*>(x);
  __m512 a0 = _mm512_setzero_ps(), a1 = a0;
  int i = 0;
  for (; i + 64 <= n; i += 64) {
    const char* ahead = reinterpret_cast<const char*>(wp + i) + 4096;  // see dot_avx2
    _mm_prefetch(ahead, _MM_HINT_T0), _mm_prefetch(ahead + 64, _MM_HINT_T0);
    a0 = _mm512_dpbf16_ps(a0, (__m512bh)_mm512_loadu_si512(wp + i),
                          (__m512bh)_mm512_loadu_si512(xp + i));
    a1 = _mm512_dpbf16_ps(a1, (__m512bh)_mm512_loadu_si512(wp + i + 32),
                          (__m512bh)_mm512_loadu_si512(xp + i + 32));
  }
  for (; i < n; i += 32) {  // masked tail: zeroed lanes add nothing
    __mmask32 m = n - i >= 32 ? 0xffffffffu : (1u << (n - i)) - 1;
    a0 = _mm512_dpbf16_ps(a0, (__m512bh)_mm512_maskz_loadu_epi16(m, wp + i),
                          (__m512bh)_mm512_maskz_loadu_epi16(m, xp + i));
  }
  return _mm512_reduce_add_ps(_mm512_add_ps(a0, a1));
}

struct Job {
  uint64_t seq = 0;
  const char *x = nullptr, *wgu = nullptr, *wd = nullptr;  // x [T, H]; banks [E, 2I, H], [E, H, I]
  float* out = nullptr;                                    // [T, H]
  DotFn dot = nullptr;
  bool bf16act = false;         // activations (x, h) held as bf16 for the DP_BF16 path, else fp32
  int T = 0, H = 0, I = 0, E = 0;
  int64_t sgu = 0, sd = 0;      // bytes from one expert to the next in each bank (stride(0))
  size_t wsz = 0, asz = 0;      // bytes per weight / activation element
  std::vector<int64_t> eid;     // [G] expert of each group of routes
  std::vector<int> gstart;      // [G + 1] route range of each group, routes sorted by expert
  std::vector<int> tok;         // [R] token of each route
  std::vector<float> rw;        // [R] routing weight of each route
  std::unique_ptr<char[]> h;    // [R, I] silu(gate) * up
  int nb1 = 0, n1 = 0, n2 = 0;  // phase-1 blocks per expert, phase-1 units, phase-2 units
  std::atomic<int> next1{0}, done1{0}, next2{0};
  int active = 0;   // workers inside work(); guarded by Pool::m
  std::mutex m;
  std::condition_variable cv;
  std::atomic<bool> done{false};  // set under m; also read without it by the poller
  std::string err;  // first failure; read only after done
  std::chrono::steady_clock::time_point t0, t1;  // submitted, retired: the CPU branch's duration

  void fail(const char* msg) { std::lock_guard<std::mutex> g(m); if (err.empty()) err = msg; }
  const char* expert(const char* bank, int64_t stride, int64_t e) const {
    if (e < 0 || e >= E)
      throw std::out_of_range("expert id " + std::to_string(e) + " out of range [0, " +
                              std::to_string(E) + ") (-1 marks a route computed elsewhere)");
    return bank + e * stride;
  }
};

void unit1(Job& J, int u) {
  int g = u / J.nb1, j0 = (u % J.nb1) * R1, j1 = std::min(J.I, j0 + R1);
  const char* base = J.expert(J.wgu, J.sgu, J.eid[g]);
  size_t row = size_t(J.H) * J.wsz;
  for (int j = j0; j < j1; ++j)  // routes innermost: one weight row serves every token (L1 hit)
    for (int r = J.gstart[g]; r < J.gstart[g + 1]; ++r) {
      const char* xt = J.x + size_t(J.tok[r]) * J.H * J.asz;
      float a = J.dot(base + j * row, xt, J.H), b = J.dot(base + (J.I + j) * row, xt, J.H);
      float v = a / (1.f + std::exp(-a)) * b;
      char* dst = J.h.get() + (size_t(r) * J.I + j) * J.asz;
      if (J.bf16act) { uint16_t hv = f2bf(v); memcpy(dst, &hv, 2); } else memcpy(dst, &v, 4);
    }
}

void unit2(Job& J, int u) {
  int r0 = u * R2, r1 = std::min(J.H, r0 + R2);
  for (int t = 0; t < J.T; ++t) std::fill_n(J.out + size_t(t) * J.H + r0, r1 - r0, 0.f);
  size_t row = size_t(J.I) * J.wsz;
  for (size_t g = 0; g < J.eid.size(); ++g) {
    const char* base = J.expert(J.wd, J.sd, J.eid[g]);
    for (int r = r0; r < r1; ++r)
      for (int k = J.gstart[g]; k < J.gstart[g + 1]; ++k)
        J.out[size_t(J.tok[k]) * J.H + r] +=
            J.rw[k] * J.dot(base + r * row, J.h.get() + size_t(k) * J.I * J.asz, J.I);
  }
}

// Claims units until none is left; a throwing unit records the error and still counts as done,
// so the barrier and the job always complete.
void run_units(Job& J, std::atomic<int>& next, int n, void (*fn)(Job&, int),
               std::atomic<int>* done) {
  for (int u; (u = next.fetch_add(1)) < n;) {
    try { fn(J, u); }
    catch (const std::exception& ex) { J.fail(ex.what()); }
    catch (...) { J.fail("unknown error in a CPU expert worker"); }
    if (done) done->fetch_add(1, std::memory_order_release);
  }
}

void work(Job& J) {
  run_units(J, J.next1, J.n1, unit1, &J.done1);
  // Phase barrier: spin briefly, then yield, since the thread we wait for may be descheduled
  // (more threads than free cores), and a long pause-spin would keep it off the core.
  for (int spin = 0; J.done1.load(std::memory_order_acquire) < J.n1; ++spin)
    spin < 64 ? _mm_pause() : std::this_thread::yield();
  run_units(J, J.next2, J.n2, unit2, nullptr);
}

// Jobs run in submission order. Workers join the front job as they wake (a late one may find
// nothing left), and the last to leave retires it: every unit was claimed by a worker that was
// still inside, so when none is left inside, all units are done.
struct Pool {
  const int n;
  std::vector<std::thread> th;
  std::mutex m;
  std::condition_variable cv;
  std::deque<Job*> q;
  bool stop = false;
  uint64_t seq = 0;

  std::atomic<uint64_t> pub{0};  // last submitted seq, read by spinning workers without the lock
  std::chrono::microseconds spin;  // how long a worker spins for new work before sleeping

  Pool(int n_, const int* cpus, int spin_us) : n(n_), spin(spin_us) {
    for (int i = 0; i < n; ++i) th.emplace_back(&Pool::loop, this, cpus ? cpus[i] : -1);
  }
  ~Pool() {
    { std::lock_guard<std::mutex> g(m); stop = true; }
    cv.notify_all();
    for (auto& t : th) t.join();  // queued jobs are finished first
  }
  void submit(Job* J) {
    J->t0 = std::chrono::steady_clock::now();
    { std::lock_guard<std::mutex> g(m); J->seq = ++seq; q.push_back(J); pub.store(J->seq); }
    cv.notify_all();
  }
  void loop(int cpu) {
    if (cpu >= 0) {  // best effort: a container may forbid it, and that is fine
      cpu_set_t s; CPU_ZERO(&s); CPU_SET(cpu, &s);
      pthread_setaffinity_np(pthread_self(), sizeof s, &s);
    }
    for (uint64_t last = 0;;) {
      Job* J;
      // Decode submits a job every layer step or few (a few hundred microseconds each): spinning
      // for a while, by the clock (a pause lasts 10 to 140 cycles, by CPU), keeps the workers
      // awake for it instead of paying a condition-variable wake-up of every worker each time.
      for (auto until = std::chrono::steady_clock::now() + spin;
           pub.load(std::memory_order_acquire) <= last && std::chrono::steady_clock::now() < until;)
        for (int i = 0; i < 16; ++i) _mm_pause();
      {
        std::unique_lock<std::mutex> lk(m);
        cv.wait(lk, [&] { return (!q.empty() && q.front()->seq > last) || (stop && q.empty()); });
        if (q.empty()) return;
        J = q.front();
        last = J->seq;
        ++J->active;
      }
      work(*J);
      {
        std::lock_guard<std::mutex> g(m);
        if (--J->active > 0) continue;
        q.pop_front();
      }
      cv.notify_all();
      std::lock_guard<std::mutex> g(J->m);  // notify under the lock: the waiter may free J at once
      J->t1 = std::chrono::steady_clock::now();
      J->done = true;
      J->cv.notify_all();
    }
  }
};

}  // namespace

extern "C" {

// bit 0: AVX2 + FMA + F16C; bit 1: AVX-512 BF16 (+BW for the masked tail loads)
int ftmoe_cpu_features() {
  __builtin_cpu_init();
  int f = 0;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
      __builtin_cpu_supports("f16c"))
    f |= 1;
  if (__builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("avx512bw")) f |= 2;
  return f;
}

void* ftmoe_pool_create(int threads, const int* cpus, int spin_us) { return new Pool(threads, cpus, spin_us); }
void ftmoe_pool_destroy(void* pool) { delete static_cast<Pool*>(pool); }

// ids [T, K] int32/int64 (-1 = skip), rw [T, K] fp32, out [T, H] fp32; all contiguous.
// Returns the job, or null when it could not be set up (out of memory): no C++ exception may
// cross into ctypes.
void* ftmoe_submit(void* pool, const void* x, const void* wgu, const void* wd, const void* ids,
                   const float* rw, float* out, int T, int H, int I, int E, int K, int64_t sgu,
                   int64_t sd, int dtype, int ids64, int mode) {
  static const DotFn avx2[3] = {dot_avx2<F32>, dot_avx2<BF16>, dot_avx2<F16>};
  static const DotFn scalar[3] = {dot_scalar<F32>, dot_scalar<BF16>, dot_scalar<F16>};
  try {
    auto J = std::make_unique<Job>();
    J->x = static_cast<const char*>(x), J->wgu = static_cast<const char*>(wgu);
    J->wd = static_cast<const char*>(wd), J->out = out;
    J->T = T, J->H = H, J->I = I, J->E = E, J->sgu = sgu, J->sd = sd;
    J->dot = mode == DP_BF16 ? dot_dpbf16 : mode == AVX2 ? avx2[dtype] : scalar[dtype];
    J->bf16act = mode == DP_BF16;
    J->wsz = dtype == F32 ? 4 : 2, J->asz = J->bf16act ? 2 : 4;
    std::vector<std::pair<int64_t, int>> rs;  // (expert, route index); sorting groups by expert
    for (int i = 0; i < T * K; ++i) {
      int64_t e = ids64 ? static_cast<const int64_t*>(ids)[i] : static_cast<const int32_t*>(ids)[i];
      if (e != -1) rs.emplace_back(e, i);  // other bad ids fail inside the workers
    }
    std::sort(rs.begin(), rs.end());
    for (size_t i = 0; i < rs.size(); ++i) {
      if (i == 0 || rs[i].first != rs[i - 1].first)
        J->eid.push_back(rs[i].first), J->gstart.push_back(int(i));
      J->tok.push_back(rs[i].second / K);
      J->rw.push_back(rw[rs[i].second]);
    }
    J->gstart.push_back(int(rs.size()));
    J->h.reset(new char[rs.size() * size_t(I) * J->asz + 1]);
    J->nb1 = (I + R1 - 1) / R1, J->n1 = int(J->eid.size()) * J->nb1, J->n2 = (H + R2 - 1) / R2;
    static_cast<Pool*>(pool)->submit(J.get());
    return J.release();
  } catch (...) {
    return nullptr;
  }
}

// 0: done, 1: failed (see ftmoe_error), 2: timed out. timeout_s < 0 waits for ever.
int ftmoe_wait(void* job, double timeout_s) {
  auto* J = static_cast<Job*>(job);
  std::unique_lock<std::mutex> lk(J->m);
  auto ready = [J] { return J->done.load(); };
  if (timeout_s < 0) J->cv.wait(lk, ready);
  else if (!J->cv.wait_for(lk, std::chrono::duration<double>(timeout_s), ready)) return 2;
  return J->err.empty() ? 0 : 1;
}

const char* ftmoe_error(void* job) { return static_cast<Job*>(job)->err.c_str(); }
double ftmoe_seconds(void* job) {  // only once ftmoe_wait said done
  auto* J = static_cast<Job*>(job);
  return std::chrono::duration<double>(J->t1 - J->t0).count();
}
void ftmoe_free(void* job) { delete static_cast<Job*>(job); }  // only once ftmoe_wait said done

// In-graph CPU branch. A thread polls `go` in mapped pinned memory: the GPU stream, after
// staging x, ids, weights and the layer step's fill count, writes go = (layer + 1) | (T << 20);
// the thread clears go, runs that layer's CPU routes on the pool into `out`, then answers
// done = go, which the stream waits for. A failure still answers (with zeros) so the GPU never
// hangs; Python reads the error. The stream also writes fill = go once the step's expert fills
// have landed (before it waits for done); the thread timestamps that against go, so the fills
// inside a graph are timed too (B_P online), and clears it.
struct Poller {
  void* pool = nullptr;
  volatile uint32_t *go = nullptr, *done = nullptr, *fill = nullptr;
  const volatile int64_t* nfill = nullptr;  // experts the layer step fills
  const void *x = nullptr, *ids = nullptr;
  const float* rw = nullptr;
  float* out = nullptr;
  std::vector<const void*> wgu, wd;  // per MoE layer bank bases
  int H = 0, I = 0, E = 0, K = 0, dtype = 0, mode = 0;
  int64_t sgu = 0, sd = 0;
  std::atomic<bool> stop{false};
  std::atomic<int64_t> jobs{0}, experts{0}, nanos{0}, fills{0}, fill_nanos{0};
  bool fill_seen = false;
  std::chrono::steady_clock::time_point t_go, t_fill;
  std::mutex m;
  std::string err;
  std::thread th;

  void fail(const std::string& e, int T) {
    { std::lock_guard<std::mutex> g(m); if (err.empty()) err = e; }
    std::fill_n(out, size_t(T) * H, 0.f);
  }
  void serve(uint32_t v) {
    int layer = int(v & 0xFFFFF) - 1, T = int(v >> 20);
    if (layer < 0 || layer >= int(wgu.size())) return fail("bad layer in the CPU branch flag", T);
    const int64_t* id = static_cast<const int64_t*>(ids);
    if (std::all_of(id, id + size_t(T) * K, [](int64_t e) { return e == -1; })) {
      std::fill_n(out, size_t(T) * H, 0.f);  // no CPU route in this layer step: answer at once
      return;
    }
    auto t0 = std::chrono::steady_clock::now();
    auto* J = static_cast<Job*>(ftmoe_submit(pool, x, wgu[layer], wd[layer], ids, rw, out, T, H, I,
                                             E, K, sgu, sd, dtype, 1, mode));
    if (!J) return fail("could not allocate a CPU branch job", T);
    while (!J->done.load(std::memory_order_acquire)) watch_fill(v), _mm_pause();
    if (ftmoe_wait(J, -1.0)) fail(J->err, T);
    experts += int64_t(J->eid.size()), jobs += 1;
    nanos += std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count();
    ftmoe_free(J);
  }
  void watch_fill(uint32_t v) {
    if (!fill_seen && *fill == v) fill_seen = true, t_fill = std::chrono::steady_clock::now(), *fill = 0;
  }
  void loop() {
    for (int idle = 0; !stop.load(std::memory_order_relaxed);) {
      uint32_t v = *go;
      if (!v) {  // spin while busy, then back off so an idle server does not burn a core
        if (++idle < 200000) _mm_pause(); else std::this_thread::sleep_for(std::chrono::microseconds(50));
        continue;
      }
      idle = 0;
      t_go = std::chrono::steady_clock::now(), fill_seen = false;
      *go = 0;
      std::atomic_thread_fence(std::memory_order_acquire);
      int64_t nf = *nfill;
      bool late = *fill == v;  // seen go only after the fills landed (the thread slept): no timing
      serve(v);
      std::atomic_thread_fence(std::memory_order_seq_cst);
      *done = v;
      // The stream writes the next go only after this step's fill flag, so a new go means the
      // fills landed even if this thread, descheduled, never saw fill == v (the stream may have
      // written the next step's value over it by then): waiting on would hang both sides.
      while (!fill_seen && !*go && !stop.load(std::memory_order_relaxed)) watch_fill(v), _mm_pause();
      if (nf > 0 && fill_seen && !late)
        fills += nf, fill_nanos += std::chrono::duration_cast<std::chrono::nanoseconds>(t_fill - t_go).count();
    }
  }
};

// flags: uint32 [go, done, fill]; nfill: one int64.
void* ftmoe_poller_start(void* pool, void* flags, const void* nfill, const void* x, const void* ids,
                         const float* rw, float* out, const void** wgu, const void** wd, int L,
                         int H, int I, int E, int K, int64_t sgu, int64_t sd, int dtype, int mode) {
  try {
    auto* P = new Poller();
    auto* f = static_cast<uint32_t*>(flags);
    P->pool = pool, P->go = f, P->done = f + 1, P->fill = f + 2;
    P->nfill = static_cast<const int64_t*>(nfill);
    P->x = x, P->ids = ids, P->rw = rw, P->out = out, P->wgu.assign(wgu, wgu + L), P->wd.assign(wd, wd + L);
    P->H = H, P->I = I, P->E = E, P->K = K, P->sgu = sgu, P->sd = sd, P->dtype = dtype, P->mode = mode;
    P->th = std::thread(&Poller::loop, P);
    return P;
  } catch (...) {
    return nullptr;
  }
}

void ftmoe_poller_stop(void* p) {
  auto* P = static_cast<Poller*>(p);
  P->stop = true;
  P->th.join();
  delete P;
}

// out5 = (jobs, distinct experts, nanoseconds, experts filled, their nanoseconds) since the last
// call; returns 1 after a failure.
int ftmoe_poller_stats(void* p, int64_t* out5) {
  auto* P = static_cast<Poller*>(p);
  out5[0] = P->jobs.exchange(0), out5[1] = P->experts.exchange(0), out5[2] = P->nanos.exchange(0);
  out5[3] = P->fills.exchange(0), out5[4] = P->fill_nanos.exchange(0);
  std::lock_guard<std::mutex> g(P->m);
  return P->err.empty() ? 0 : 1;
}

const char* ftmoe_poller_error(void* p) { return static_cast<Poller*>(p)->err.c_str(); }

}  // extern "C"
