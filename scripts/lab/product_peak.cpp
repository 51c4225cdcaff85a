// Multiply-adds of 8-bit codes a second with each instruction the GGUF kernel's paths multiply with,
// nothing else in the loop (scripts/lab/gguf_kernel_bench.py --floor). Each thread runs 16 independent
// accumulator chains; the activation dword comes broadcast from memory as in the interleaved tiles
// (gguf_avx512_interleaved.cpp). On Zen 4 these chains ran slower than the interleaved tiles themselves,
// for reasons not found, so the rate is a reference and not the CPU's peak.
#include <immintrin.h>
#include <omp.h>
#include <torch/extension.h>

#include <chrono>
#include <cstdint>

namespace {

constexpr int kChains = 16;

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512vnni")
// vpdpbusd zmm: 64 products an instruction.
// Broadcast: the activation dword from memory ({1to16}); else both operands in registers.
template <bool Broadcast>
int64_t vnni512(int64_t iters) {
  alignas(64) static const uint8_t codes[64] = {1, 2, 3, 4};
  __m512i acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = _mm512_set1_epi32(c);
  const __m512i w = _mm512_set1_epi8(3), a = _mm512_set1_epi8(2);
  for (int64_t i = 0; i < iters; ++i) {
#pragma GCC unroll 16
    for (int c = 0; c < kChains; ++c) {
      if constexpr (Broadcast)
        asm volatile("vpdpbusd %1%{1to16%}, %2, %0" : "+v"(acc[c]) : "m"(*reinterpret_cast<const int32_t*>(codes + 4 * (c & 7))), "v"(w));
      else
        asm volatile("vpdpbusd %1, %2, %0" : "+v"(acc[c]) : "v"(a), "v"(w));
    }
  }
  __m512i sum = acc[0];
  for (int c = 1; c < kChains; ++c) sum = _mm512_add_epi32(sum, acc[c]);
  return _mm512_reduce_add_epi32(sum);
}
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx2")
// AVX2 without VNNI: vpmaddubsw, vpmaddwd and vpaddd, 32 products for the three.
int64_t maddubs256(int64_t iters) {
  __m256i acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = _mm256_set1_epi32(c);
  const __m256i w = _mm256_set1_epi8(3), ones = _mm256_set1_epi16(1);
  __m256i a = _mm256_set1_epi8(2);
  for (int64_t i = 0; i < iters; ++i) {
#pragma GCC unroll 16
    for (int c = 0; c < kChains; ++c) {
      __m256i p;
      asm volatile("vpmaddubsw %1, %2, %0" : "=v"(p) : "v"(a), "v"(w));
      asm volatile("vpmaddwd %1, %0, %0" : "+v"(p) : "v"(ones));
      asm volatile("vpaddd %1, %0, %0" : "+v"(acc[c]) : "v"(p));
    }
  }
  __m256i sum = acc[0];
  for (int c = 1; c < kChains; ++c) sum = _mm256_add_epi32(sum, acc[c]);
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
