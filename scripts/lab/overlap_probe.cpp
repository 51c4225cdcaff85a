// Does arithmetic hide behind a stream of weights? Each thread reads its share of a buffer block by block
// (2304 bytes, a Q4_K group block of the interleaved layout: 36 lines xor-ed together) and after each block
// runs `rounds` rounds of 8 independent vpdpbusd in registers, nothing else. Software prefetch as the
// kernel's tiles can issue it: bit 0 the next block into L1 (prefetcht0), bit 1 the block `ahead` blocks on
// into L2 (prefetcht2). scripts/lab/overlap_probe.py times it streamed and with the buffer in cache.
#include <immintrin.h>
#include <omp.h>
#include <torch/extension.h>

#include <chrono>
#include <cstdint>

namespace {

constexpr int64_t kBlock = 2304;

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vnni")
double stream(const torch::Tensor& buffer, int64_t bytes, int64_t rounds, int64_t prefetch, int64_t ahead,
              int64_t threads, int64_t repeats) {
  TORCH_CHECK(buffer.dtype() == torch::kUInt8 && buffer.numel() >= bytes + (ahead + 1) * kBlock, "buffer too small");
  const uint8_t* base = buffer.data_ptr<uint8_t>();
  const auto t0 = std::chrono::steady_clock::now();
  int64_t sink = 0;
#pragma omp parallel num_threads(threads) reduction(+ : sink)
  {
    const int64_t blocks = bytes / kBlock / threads;
    const uint8_t* first = base + omp_get_thread_num() * blocks * kBlock;
    __m512i a0 = _mm512_set1_epi32(1), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
    const __m512i q = _mm512_set1_epi32(0x01020304);
    for (int64_t r = 0; r < repeats; ++r) {
      for (int64_t b = 0; b < blocks; ++b) {
        const uint8_t* p = first + b * kBlock;
        if (prefetch & 1)
          for (int64_t o = 0; o < kBlock; o += 64) _mm_prefetch(reinterpret_cast<const char*>(p + kBlock + o), _MM_HINT_T0);
        if (prefetch & 2)
          for (int64_t o = 0; o < kBlock; o += 64)
            _mm_prefetch(reinterpret_cast<const char*>(p + ahead * kBlock + o), _MM_HINT_T2);
        __m512i x = _mm512_setzero_si512();
        for (int64_t o = 0; o < kBlock; o += 64) x = _mm512_xor_si512(x, _mm512_load_si512(p + o));
        for (int64_t c = 0; c < rounds; ++c) {
          a0 = _mm512_dpbusd_epi32(a0, x, q), a1 = _mm512_dpbusd_epi32(a1, x, q);
          a2 = _mm512_dpbusd_epi32(a2, x, q), a3 = _mm512_dpbusd_epi32(a3, x, q);
          a4 = _mm512_dpbusd_epi32(a4, x, q), a5 = _mm512_dpbusd_epi32(a5, x, q);
          a6 = _mm512_dpbusd_epi32(a6, x, q), a7 = _mm512_dpbusd_epi32(a7, x, q);
          asm volatile("" : "+v"(a0), "+v"(a1), "+v"(a2), "+v"(a3), "+v"(a4), "+v"(a5), "+v"(a6), "+v"(a7));
        }
      }
    }
    const __m512i s = _mm512_add_epi32(_mm512_add_epi32(_mm512_add_epi32(a0, a1), _mm512_add_epi32(a2, a3)),
                                       _mm512_add_epi32(_mm512_add_epi32(a4, a5), _mm512_add_epi32(a6, a7)));
    sink += _mm512_reduce_add_epi32(s);
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return sink == 42 ? seconds + 1e-12 : seconds;  // keeps the sums live
}
#pragma GCC pop_options

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("stream", &stream); }
