// Multiply-adds of 8-bit codes a second with each instruction the GGUF kernel's paths multiply with,
// nothing else in the loop (scripts/lab/gguf_kernel_bench.py --floor): the CPU's peak for the products.
// Each thread runs 16 independent accumulator chains held in named registers. (An array of accumulators
// bound to inline asm stays on the stack: every chain then waits on a store and a load, and the rate
// halves; an earlier version of this probe measured that.)
#include <immintrin.h>
#include <omp.h>
#include <torch/extension.h>

#include <chrono>
#include <cstdint>

namespace {

constexpr int kChains = 16;

// Sixteen named accumulators of type V, each stepped once by STEP(acc) in the loop body.
#define SIXTEEN(STEP) \
  STEP(a0) STEP(a1) STEP(a2) STEP(a3) STEP(a4) STEP(a5) STEP(a6) STEP(a7) \
  STEP(a8) STEP(a9) STEP(a10) STEP(a11) STEP(a12) STEP(a13) STEP(a14) STEP(a15)
#define DECLARE(acc) V acc = start;
#define SUM(acc) sum = add(sum, acc);

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512vnni")
// vpdpbusd zmm: 64 products an instruction.
// Broadcast: the activation dword from memory ({1to16}), as in the interleaved tiles
// (gguf_avx512_interleaved.cpp); else both operands in registers.
template <bool Broadcast>
int64_t vnni512(int64_t iters) {
  using V = __m512i;
  alignas(64) static const int32_t codes[16] = {0x01020304};
  const V start = _mm512_set1_epi32(1), w = _mm512_set1_epi8(3), a = _mm512_set1_epi8(2);
  SIXTEEN(DECLARE)
  for (int64_t i = 0; i < iters; ++i) {
#define STEP(acc)                                                                              \
  if constexpr (Broadcast)                                                                     \
    asm volatile("vpdpbusd %1%{1to16%}, %2, %0" : "+v"(acc) : "m"(codes[0]), "v"(w));          \
  else                                                                                         \
    asm volatile("vpdpbusd %1, %2, %0" : "+v"(acc) : "v"(a), "v"(w));
    SIXTEEN(STEP)
#undef STEP
  }
  auto add = [](V x, V y) { return _mm512_add_epi32(x, y); };
  V sum = _mm512_setzero_si512();
  SIXTEEN(SUM)
  return _mm512_reduce_add_epi32(sum);
}
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx2")
// AVX2 without VNNI: vpmaddubsw, vpmaddwd and vpaddd, 32 products for the three.
int64_t maddubs256(int64_t iters) {
  using V = __m256i;
  const V start = _mm256_set1_epi32(1), w = _mm256_set1_epi8(3), a = _mm256_set1_epi8(2), ones = _mm256_set1_epi16(1);
  SIXTEEN(DECLARE)
  for (int64_t i = 0; i < iters; ++i) {
#define STEP(acc)                                                          \
  {                                                                        \
    V p;                                                                   \
    asm volatile("vpmaddubsw %1, %2, %0" : "=v"(p) : "v"(a), "v"(w));      \
    asm volatile("vpmaddwd %1, %0, %0" : "+v"(p) : "v"(ones));             \
    asm volatile("vpaddd %1, %0, %0" : "+v"(acc) : "v"(p));                \
  }
    SIXTEEN(STEP)
#undef STEP
  }
  auto add = [](V x, V y) { return _mm256_add_epi32(x, y); };
  V sum = _mm256_setzero_si256();
  SIXTEEN(SUM)
  return _mm256_extract_epi32(sum, 0);
}
#pragma GCC pop_options

// Products per second summed over `threads` threads, each running `iters` rounds of kChains instructions.
double rate(const std::string& kind, int64_t iters, int threads) {
  const bool vnni = kind == "vnni512" || kind == "vnni512reg";
  TORCH_CHECK(vnni || kind == "maddubs256", "kind must be vnni512, vnni512reg or maddubs256");
  const double per_instruction = vnni ? 64 : 32;
  volatile int64_t sink = 0;
  const auto start = std::chrono::steady_clock::now();
#pragma omp parallel num_threads(threads)
  { sink += kind == "vnni512" ? vnni512<true>(iters) : vnni ? vnni512<false>(iters) : maddubs256(iters); }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return per_instruction * kChains * static_cast<double>(iters) * threads / seconds;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("rate", &rate, "products a second over `threads` threads");
}
