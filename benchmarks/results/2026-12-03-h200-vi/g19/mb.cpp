// int4 row-kernel microbenchmark: v0 = the tree's qrow (NR=1, LO=false, symmetric zero 8, bk 128),
// v1 = table-free (nibble | 0x4300 = bf16 128+c; zero point via block sums of x), v2 = v0 over 2 rows at once.
#include <immintrin.h>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cstdint>
#include <vector>
static uint16_t f2bf(float f){uint32_t u;memcpy(&u,&f,4);return uint16_t((u+0x7fffu+((u>>16)&1))>>16);}
static float bf2f(uint16_t v){uint32_t u=uint32_t(v)<<16;float f;memcpy(&f,&u,4);return f;}
alignas(64) static uint16_t tab8[32];
__attribute__((target("avx512f,avx512bw,avx512bf16")))
static inline __m512 dp(__m512 acc, __m512i w, const uint16_t* x){return _mm512_dpbf16_ps(acc,(__m512bh)w,(__m512bh)_mm512_loadu_si512(x));}
// q: K/2 bytes, s: K/128 floats, x: K bf16 (permuted: per 64 chunk evens then odds)
__attribute__((target("avx512f,avx512bw,avx512bf16")))
float v0(const uint8_t* q, const float* s, const uint16_t* x, int K){
  const __m512i low=_mm512_set1_epi16(15); __m512i tab=_mm512_load_si512(tab8); __m512 acc=_mm512_setzero_ps();
  for(int g=0; g<K/128; ++g){ __m512 p0=_mm512_setzero_ps(), p1=_mm512_setzero_ps();
    for(int i=0;i<128;i+=64,q+=32){ _mm_prefetch((const char*)q+4096,_MM_HINT_T0);
      __m512i c=_mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i*)q));
      __m512i we=_mm512_permutexvar_epi16(_mm512_and_si512(c,low),tab), wo=_mm512_permutexvar_epi16(_mm512_srli_epi16(c,4),tab);
      const uint16_t* xk=x+g*128+i; p0=dp(p0,we,xk); p1=dp(p1,wo,xk+32);}
    acc=_mm512_fmadd_ps(_mm512_add_ps(p0,p1),_mm512_set1_ps(s[g]),acc);}
  return _mm512_reduce_add_ps(acc);}
// v1: table-free; xs: per block the sum of x (float); zero point 8: sum (128+c) x - 136 sum x
__attribute__((target("avx512f,avx512bw,avx512bf16")))
float v1(const uint8_t* q, const float* s, const uint16_t* x, const float* xs, int K){
  const __m512i low=_mm512_set1_epi16(15), bias=_mm512_set1_epi16(0x4300); __m512 acc=_mm512_setzero_ps();
  for(int g=0; g<K/128; ++g){ __m512 p0=_mm512_setzero_ps(), p1=_mm512_setzero_ps();
    for(int i=0;i<128;i+=64,q+=32){ _mm_prefetch((const char*)q+4096,_MM_HINT_T0);
      __m512i c=_mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i*)q));
      __m512i we=_mm512_ternarylogic_epi32(c,low,bias,0xEA), wo=_mm512_ternarylogic_epi32(_mm512_srli_epi16(c,4),low,bias,0xEA);
      const uint16_t* xk=x+g*128+i; p0=dp(p0,we,xk); p1=dp(p1,wo,xk+32);}
    __m512 t=_mm512_add_ps(p0,p1);
    // subtract 136*xs[g] spread over lanes: add to lane 0 only
    t=_mm512_mask_sub_ps(t,1,t,_mm512_set1_ps(136.f*xs[g]));
    acc=_mm512_fmadd_ps(t,_mm512_set1_ps(s[g]),acc);}
  return _mm512_reduce_add_ps(acc);}
// v3: v1 but codes loaded 64 bytes at a time (128 codes), no cvtepu8: even/odd bytes via and/shift on 16-bit lanes
__attribute__((target("avx512f,avx512bw,avx512bf16")))
float v3(const uint8_t* q, const float* s, const uint16_t* x, const float* xs, int K){
  // a 16-bit lane holds 2 bytes = 4 codes: nibbles n0 (bits 0-3), n1 (4-7), n2 (8-11), n3 (12-15).
  // layout assumption (a different code permutation): lane l of word k gives columns 4 per lane; x permuted to match.
  const __m512i low=_mm512_set1_epi16(15), bias=_mm512_set1_epi16(0x4300); __m512 acc=_mm512_setzero_ps();
  for(int g=0; g<K/128; ++g, q+=64){ _mm_prefetch((const char*)q+4096,_MM_HINT_T0);
      __m512i c=_mm512_loadu_si512(q);
      __m512i w0=_mm512_ternarylogic_epi32(c,low,bias,0xEA);
      __m512i w1=_mm512_ternarylogic_epi32(_mm512_srli_epi16(c,4),low,bias,0xEA);
      __m512i w2=_mm512_ternarylogic_epi32(_mm512_srli_epi16(c,8),low,bias,0xEA);
      __m512i w3=_mm512_ternarylogic_epi32(_mm512_srli_epi16(c,12),low,bias,0xEA);
      const uint16_t* xk=x+g*128;
      __m512 p0=_mm512_dpbf16_ps(_mm512_setzero_ps(),(__m512bh)w0,(__m512bh)_mm512_loadu_si512(xk));
      __m512 p1=_mm512_dpbf16_ps(_mm512_setzero_ps(),(__m512bh)w1,(__m512bh)_mm512_loadu_si512(xk+32));
      p0=_mm512_dpbf16_ps(p0,(__m512bh)w2,(__m512bh)_mm512_loadu_si512(xk+64));
      p1=_mm512_dpbf16_ps(p1,(__m512bh)w3,(__m512bh)_mm512_loadu_si512(xk+96));
    __m512 t=_mm512_add_ps(p0,p1);
    t=_mm512_mask_sub_ps(t,1,t,_mm512_set1_ps(136.f*xs[g]));
    acc=_mm512_fmadd_ps(t,_mm512_set1_ps(s[g]),acc);}
  return _mm512_reduce_add_ps(acc);}
// v2: v0 over two rows at once (the gate and the up row of a unit), sharing the x loads
__attribute__((target("avx512f,avx512bw,avx512bf16")))
void v2(const uint8_t* qa, const uint8_t* qb, const float* sa, const float* sb, const uint16_t* x, int K, float* out){
  const __m512i low=_mm512_set1_epi16(15); __m512i tab=_mm512_load_si512(tab8); __m512 acca=_mm512_setzero_ps(), accb=_mm512_setzero_ps();
  for(int g=0; g<K/128; ++g){ __m512 a0=_mm512_setzero_ps(), a1=a0, b0=a0, b1=a0;
    for(int i=0;i<128;i+=64,qa+=32,qb+=32){ _mm_prefetch((const char*)qa+4096,_MM_HINT_T0); _mm_prefetch((const char*)qb+4096,_MM_HINT_T0);
      __m512i ca=_mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i*)qa)), cb=_mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i*)qb));
      __m512i xe=_mm512_loadu_si512(x+g*128+i), xo=_mm512_loadu_si512(x+g*128+i+32);
      a0=_mm512_dpbf16_ps(a0,(__m512bh)_mm512_permutexvar_epi16(_mm512_and_si512(ca,low),tab),(__m512bh)xe);
      a1=_mm512_dpbf16_ps(a1,(__m512bh)_mm512_permutexvar_epi16(_mm512_srli_epi16(ca,4),tab),(__m512bh)xo);
      b0=_mm512_dpbf16_ps(b0,(__m512bh)_mm512_permutexvar_epi16(_mm512_and_si512(cb,low),tab),(__m512bh)xe);
      b1=_mm512_dpbf16_ps(b1,(__m512bh)_mm512_permutexvar_epi16(_mm512_srli_epi16(cb,4),tab),(__m512bh)xo);}
    acca=_mm512_fmadd_ps(_mm512_add_ps(a0,a1),_mm512_set1_ps(sa[g]),acca); accb=_mm512_fmadd_ps(_mm512_add_ps(b0,b1),_mm512_set1_ps(sb[g]),accb);}
  out[0]=_mm512_reduce_add_ps(acca); out[1]=_mm512_reduce_add_ps(accb);}
int main(int argc,char**argv){
  size_t bytes=size_t(atol(argv[1]))<<20; int K=atoi(argv[2]); int reps=atoi(argv[3]);
  for(int c=0;c<16;++c) tab8[c]=f2bf(float(c-8));
  size_t rows=bytes/(K/2); std::vector<uint8_t> q(rows*(K/2)); for(auto&b:q) b=rand();
  std::vector<float> s(rows*(K/128),0.01f); std::vector<uint16_t> x(K); for(auto&v:x) v=f2bf((rand()%100)/100.f);
  std::vector<float> xs(K/128,0.f);
  volatile float sink=0; const char* names[4]={"v0 table","v1 tablefree","v3 wide","v2 tworows"};
  for(int v=0;v<4;++v){ auto t0=std::chrono::steady_clock::now();
    if(v==3){ float o[2]; for(int r=0;r<reps;++r) for(size_t i=0;i+1<rows;i+=2){ v2(q.data()+i*(K/2),q.data()+(i+1)*(K/2),s.data()+i*(K/128),s.data()+(i+1)*(K/128),x.data(),K,o); sink+=o[0]+o[1];} }
    else for(int r=0;r<reps;++r) for(size_t i=0;i<rows;++i){const uint8_t* qi=q.data()+i*(K/2); const float* si=s.data()+i*(K/128);
      sink+= v==0? v0(qi,si,x.data(),K): v==1? v1(qi,si,x.data(),xs.data(),K): v3(qi,si,x.data(),xs.data(),K);}
    double sec=std::chrono::duration<double>(std::chrono::steady_clock::now()-t0).count();
    printf("%s K=%d region %zu MiB: %.2f GB/s of codes, %.2f Gcodes/s\n",names[v],K,bytes>>20,reps*rows*(K/2)/sec/1e9,reps*rows*K/sec/1e9);}
}
