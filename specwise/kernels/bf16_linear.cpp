// y = x @ w.T (+ bias) for bfloat16 (or int8 + per-row scale) weights on AVX2 CPUs with few rows of x.
//
// Why: PyTorch's bfloat16 matmul on CPUs without native bf16 instructions (AVX2
// only) is compute-bound at a few rows: scoring 8 tokens costs ~5x one token,
// which removes the cheap verification speculative decoding depends on. This
// kernel streams each block of weight rows from memory once, widens it to
// float32 in registers and multiplies it with every row of x (float32, exact
// for bfloat16 inputs), accumulating in float32 as PyTorch does; the result is
// rounded to bfloat16 once, so it differs from PyTorch's only by summation order.
// The int8 variant (drafters only: specwise never quantizes a target) reads half
// the bytes and applies the row's scale after the float32 sum.
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>

namespace {

inline __m256 load_bf16x8(const uint16_t* p) {
  __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

inline __m256 load8(const uint16_t* p) { return load_bf16x8(p); }
inline __m256 load8(const int8_t* p) {
  __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b));
}

// MB rows of x times NB rows of w; K is a multiple of 8.
template <int MB, int NB, typename W>
inline void tile(const float* x, const W* w, float* y, int64_t K, int64_t N) {
  __m256 acc[MB][NB];
  for (int m = 0; m < MB; ++m)
    for (int n = 0; n < NB; ++n) acc[m][n] = _mm256_setzero_ps();
  for (int64_t k = 0; k < K; k += 8) {
    __m256 wv[NB];
    for (int n = 0; n < NB; ++n) wv[n] = load8(w + n * K + k);
    for (int m = 0; m < MB; ++m) {
      const __m256 xv = _mm256_loadu_ps(x + m * K + k);
      for (int n = 0; n < NB; ++n) acc[m][n] = _mm256_fmadd_ps(xv, wv[n], acc[m][n]);
    }
  }
  for (int m = 0; m < MB; ++m)
    for (int n = 0; n < NB; ++n) y[m * N + n] = hsum(acc[m][n]);
}

// All M rows of x against NB rows of w (which stay in cache across the row tiles).
template <int NB, typename W>
void block(const float* x, const W* w, float* y, int64_t M, int64_t K, int64_t N) {
  int64_t m = 0;
  for (; m + 3 <= M; m += 3) tile<3, NB>(x + m * K, w, y + m * N, K, N);
  if (M - m == 2) tile<2, NB>(x + m * K, w, y + m * N, K, N);
  else if (M - m == 1) tile<1, NB>(x + m * K, w, y + m * N, K, N);
}

template <typename W>
torch::Tensor matmul_rows(const torch::Tensor& x, const W* wp, int64_t N) {
  const int64_t M = x.size(0), K = x.size(1);
  TORCH_CHECK(K % 8 == 0, "K must be a multiple of 8");
  const auto xf = x.to(torch::kFloat).contiguous();
  auto y = torch::empty({M, N}, x.options().dtype(torch::kFloat));
  const float* xp = xf.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  constexpr int NB = 4;
  const int64_t blocks = N / NB;
  at::parallel_for(0, blocks, 8, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) block<NB>(xp, wp + b * NB * K, yp + b * NB, M, K, N);
  });
  for (int64_t n = blocks * NB; n < N; ++n) block<1>(xp, wp + n * K, yp + n, M, K, N);
  return y;
}

}  // namespace

torch::Tensor linear_bf16(const torch::Tensor& x, const torch::Tensor& w,
                          const c10::optional<torch::Tensor>& bias) {
  TORCH_CHECK(x.dim() == 2 && w.dim() == 2 && x.size(1) == w.size(1), "shapes: x [M, K], w [N, K]");
  TORCH_CHECK(w.scalar_type() == torch::kBFloat16 && w.is_contiguous(), "w must be contiguous bfloat16");
  auto y = matmul_rows(x, reinterpret_cast<const uint16_t*>(w.data_ptr<at::BFloat16>()), w.size(0));
  if (bias.has_value()) y.add_(bias->to(torch::kFloat));  // in float32, before the one rounding
  return y.to(torch::kBFloat16);
}

torch::Tensor linear_int8(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& scale,
                          const c10::optional<torch::Tensor>& bias) {
  TORCH_CHECK(x.dim() == 2 && w.dim() == 2 && x.size(1) == w.size(1), "shapes: x [M, K], w [N, K]");
  TORCH_CHECK(w.scalar_type() == torch::kChar && w.is_contiguous(), "w must be contiguous int8");
  TORCH_CHECK(scale.numel() == w.size(0), "one scale per output row");
  auto y = matmul_rows(x, w.data_ptr<int8_t>(), w.size(0));
  y.mul_(scale.to(torch::kFloat));
  if (bias.has_value()) y.add_(bias->to(torch::kFloat));
  return y.to(x.scalar_type());
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("linear_bf16", &linear_bf16, "y = x @ w.T (+ bias), bfloat16 weights, AVX2");
  m.def("linear_int8", &linear_int8, "y = (x @ w.T) * scale (+ bias), int8 weights, AVX2");
}
