// The kernel's paths as the dispatch (gguf_linear.cpp) sees them: the path ids, the entry of each path
// (gguf_scalar.cpp, gguf_avx2.cpp, gguf_avx512.cpp: one instruction set a file), and the row-tile loops the
// two SIMD paths share. No PyTorch here: the path files compile without it.
#pragma once

#include <algorithm>
#include <cstdint>

namespace {
// kAmx: the AVX-512 path with AMX tiles for calls of many rows of the types that have them.
enum Path : int64_t { kScalar = 0, kAvx2 = 1, kAvx512 = 2, kAmx = 3 };
// Which quantizer and row tiles a path runs (the AMX path is the AVX-512 one outside its AMX tiles).
inline int64_t simd_path(int64_t path) { return path == kAmx ? kAvx512 : path; }
// Rows a tile loop takes per call (the dispatch splits larger calls): their quantized activations stay in L2
// while the weights stream by (the panel tiles take every row: their weights stay in cache while the
// activations stream by).
constexpr int64_t kRowChunk = 64;
}  // namespace

// Each path's entry: y[r * ldy + o] = row o of the weight (from w, row_bytes per row, nb blocks) . activation
// row r (from act, `stride` bytes per row), for o in [o0, o1) and r in [0, nrows), nrows <= 64 (any with
// avx512::panel), on the calling thread. Called once per call and thread (never per block), so that it lies
// in another file costs nothing.
namespace scalar {
void rows(int64_t type, const uint8_t* w, int64_t row_bytes, int64_t o0, int64_t o1, int64_t nb, const uint8_t* act,
          int64_t stride, int64_t nrows, float* y, int64_t ldy);
}  // namespace scalar

namespace avx2 {
void rows(int64_t type, const uint8_t* w, int64_t row_bytes, int64_t o0, int64_t o1, int64_t nb, const uint8_t* act,
          int64_t stride, int64_t nrows, float* y, int64_t ldy);
// Whether `type` has AVX2 tiles over the interleaved layout (gguf_avx2_interleaved.cpp), and rows() for a
// weight in that layout; o0 and o1 need not fall on a group's bounds.
bool has_interleaved(int64_t type);
void rows_interleaved(int64_t type, const uint8_t* w, int64_t row_bytes, int64_t o0, int64_t o1, int64_t nb,
                      const uint8_t* act, int64_t stride, int64_t nrows, float* y, int64_t ldy);
}  // namespace avx2

namespace avx512 {
void rows(int64_t type, const uint8_t* w, int64_t row_bytes, int64_t o0, int64_t o1, int64_t nb, const uint8_t* act,
          int64_t stride, int64_t nrows, float* y, int64_t ldy);
// Whether nrows rows of `type` take a panel tile, which copies its 16 weight rows into a panel once per
// call and then reads them for every activation row: such a call takes any number of rows at once.
bool panel(int64_t type, int64_t nrows);
// Whether `type` has AVX-512 tiles of its own (rows() runs the others through avx2::rows).
bool has_tiles(int64_t type);
// rows() for a weight in the interleaved layout (gguf_interleaved.h; gguf_avx512_interleaved.cpp); o0 and o1
// need not fall on a group's bounds.
void rows_interleaved(int64_t type, const uint8_t* w, int64_t row_bytes, int64_t o0, int64_t o1, int64_t nb,
                      const uint8_t* act, int64_t stride, int64_t nrows, float* y, int64_t ldy);
}  // namespace avx512

// AMX intrinsics need GCC 11 or clang 12; an older compiler builds the module without the amx path.
#if defined(__x86_64__) && ((defined(__clang__) && __clang_major__ >= 12) || \
                            (!defined(__clang__) && defined(__GNUC__) && __GNUC__ >= 11))
#define SPECWISE_AMX 1
#else
#define SPECWISE_AMX 0
#endif

namespace amx {
// Whether this CPU has AMX-INT8 (with AVX-512 VNNI) and the operating system lets this process use it.
bool usable();
// Whether nrows rows of `type` take the AMX tiles: such a call takes any number of rows at once.
bool takes(int64_t type, int64_t nrows);
void rows(int64_t type, const uint8_t* w, int64_t row_bytes, int64_t o0, int64_t o1, int64_t nb, const uint8_t* act,
          int64_t stride, int64_t nrows, float* y, int64_t ldy);
// Whether nrows rows of an interleaved weight of `type` take the AMX tiles of that layout
// (gguf_amx_interleaved.cpp), and rows() for them: any number of rows; o0 and o1 need not fall on a group's
// bounds.
bool takes_interleaved(int64_t type, int64_t nrows);
void rows_interleaved(int64_t type, const uint8_t* w, int64_t row_bytes, int64_t o0, int64_t o1, int64_t nb,
                      const uint8_t* act, int64_t stride, int64_t nrows, float* y, int64_t ldy);
}  // namespace amx

// The row-tile loop shared by the SIMD paths (a macro because each instruction set's copy must be
// compiled under that set's target options). Output rows go in groups of 16, and each tile of MAX
// activation rows (full tiles, then one smaller) passes over the whole group, whose weight rows stay in
// cache for the next tile: the activations of many rows (a prompt) are then read once per group
// rather than once per output row. Every activation row goes through the same instructions whichever
// tile it lands in.
#define SPECWISE_ROW_TILES(MAX)                                                                          \
  template <class K, int M>                                                                              \
  inline void tail(int rem, const uint8_t* w, int64_t nb, const uint8_t* act, int64_t stride, float* out) { \
    if constexpr (M > 0) {                                                                               \
      if (rem == M) K::template tile<M>(w, nb, act, stride, out);                                        \
      else tail<K, M - 1>(rem, w, nb, act, stride, out);                                                 \
    }                                                                                                    \
  }                                                                                                      \
  template <class K>                                                                                     \
  void run(const uint8_t* w, int64_t row_bytes, int64_t o0, int64_t o1, int64_t nb, const uint8_t* act,  \
           int64_t stride, int64_t nrows, float* y, int64_t ldy) {                                       \
    float tmp[MAX];                                                                                      \
    constexpr int64_t kGroup = 16;                                                                       \
    for (int64_t g0 = o0; g0 < o1; g0 += kGroup) {                                                       \
      for (int64_t r = 0; r < nrows; r += MAX) {                                                         \
        const int mb = static_cast<int>(std::min<int64_t>(MAX, nrows - r));                              \
        for (int64_t o = g0; o < std::min(o1, g0 + kGroup); ++o) {                                       \
          const uint8_t* wr = w + o * row_bytes;                                                         \
          if (mb == MAX) K::template tile<MAX>(wr, nb, act + r * stride, stride, tmp);                   \
          else tail<K, MAX - 1>(mb, wr, nb, act + r * stride, stride, tmp);                              \
          for (int i = 0; i < mb; ++i) y[(r + i) * ldy + o] = tmp[i];                                    \
        }                                                                                                \
      }                                                                                                  \
    }                                                                                                    \
  }

// The loop of the eight-output-row tiles (lanes = output rows: the 32-value types and IQ4_XS on AVX2,
// Q4_0 on AVX-512 too), a macro for the same reason. Output rows go in groups of eight (the last
// repeating its last row), every tile of up to eight activation rows over each group; groups of 32 output
// rows share each activation tile while it is in cache. K::tile<MB>(rows, ahead, nb, act, stride, out)
// writes out[8 * m + k] = weight row k . activation row m; `ahead` is the next group's first row, which
// the tile prefetches.
#define SPECWISE_EIGHT_ROW_TILES                                                                          \
  template <class K, int M = 8>                                                                          \
  inline void tile32(int mb, const uint8_t* const* rw, const uint8_t* ahead, int64_t nb, const uint8_t* act, \
                     int64_t stride, float* out) {                                                       \
    if constexpr (M > 0) {                                                                               \
      if (mb == M) K::template tile<M>(rw, ahead, nb, act, stride, out);                                 \
      else tile32<K, M - 1>(mb, rw, ahead, nb, act, stride, out);                                        \
    }                                                                                                    \
  }                                                                                                      \
  template <class K>                                                                                     \
  void run32(const uint8_t* w, int64_t row_bytes, int64_t o0, int64_t o1, int64_t nb, const uint8_t* act, \
             int64_t stride, int64_t nrows, float* y, int64_t ldy) {                                     \
    constexpr int64_t kSpan = 32;                                                                        \
    alignas(32) float out[64];                                                                           \
    for (int64_t s0 = o0; s0 < o1; s0 += kSpan) {                                                        \
      const int64_t s1 = std::min(o1, s0 + kSpan);                                                       \
      for (int64_t r = 0; r < nrows; r += 8) {                                                           \
        const int mb = static_cast<int>(std::min<int64_t>(8, nrows - r));                                \
        for (int64_t g = s0; g < s1; g += 8) {                                                           \
          const int n = static_cast<int>(std::min<int64_t>(8, s1 - g));                                  \
          const uint8_t* rw[8];                                                                          \
          for (int k = 0; k < 8; ++k) rw[k] = w + (g + std::min(k, n - 1)) * row_bytes;                  \
          const uint8_t* next = g + 8 < o1 ? w + (g + 8) * row_bytes : rw[0];                            \
          tile32<K>(mb, rw, next, nb, act + r * stride, stride, out);                                    \
          for (int i = 0; i < mb; ++i)                                                                   \
            for (int k = 0; k < n; ++k) y[(r + i) * ldy + g + k] = out[8 * i + k];                       \
        }                                                                                                \
      }                                                                                                  \
    }                                                                                                    \
  }
