// y = x @ W.T (+ bias) where W is a GGUF tensor kept in its stored block format: Q4_0, Q4_1, Q5_0, Q5_1,
// Q8_0, IQ4_NL (32-value blocks), Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS (256-value blocks).
//
// Why: a decoding pass over a few rows is bound by reading the weights. Executing the stored 2-8 bit
// blocks reads a third of the bytes of a bfloat16 copy or less, and unpacking each block once for every
// row held in registers keeps each extra row cheap (what speculative verification needs).
//
// How: every activation row is quantized to int8, per 256 values for the 256-value types and per 32 for
// the others, with a float scale and the block sums that offsets and mins need (the llama.cpp "Q8_K"
// idea). A weight block is unpacked once to bytes (unsigned, or signed with the sign moved onto the
// activation), then each row takes integer dot products with it (AVX-512 VNNI: vpdpbusd / vpdpwssd;
// AVX2: vpmaddubsw + vpmaddwd; a portable scalar path), applies the weight's integer sub-block scales in
// integers and the block's float scales (and min) once per block.
//
// Paths: Q4_0, Q4_K, Q5_K, Q6_K, Q5_0, Q8_0 and IQ4_XS have AVX-512 tiles (Q4_0 a panel tile for many
// rows besides); on AVX-512 CPUs the other types run their AVX2 tiles, on the same activations.
//
// Row independence: a row's activation scales come from that row alone, and its arithmetic is the same
// sequence of operations whatever the number of rows in the call, so out[i] is bit-identical to a call
// with row i alone. Threads split output features only, never one dot product's reduction. The three
// paths quantize activations identically and compute the same integer sums per block; they add the
// float terms in different orders, so they agree with each other only to float32 rounding.
//
// The SIMD paths are compiled for their instruction sets with target pragmas and chosen at run time, so
// one binary runs on any x86-64 CPU. The build must not use -ffast-math (it would reassociate sums) and
// uses -ffp-contract=off so that scalar float expressions round the same way everywhere.
//
// The files, one job each:
//   gguf_linear.cpp      this one: the module's entry points, the checks of their arguments, the choice of path
//   gguf_blocks.h        the block types: ids, sizes, decoders of the packed fields
//   gguf_activations.h   the quantized activation layouts every path reads, the SIMD tiles' side data
//   gguf_paths.h         the path ids, each path's entry, the row-tile loops of the SIMD paths
//   gguf_interleaved.h   the interleaved layout: 16 output rows' blocks field by field
//   gguf_amx_tiles.h     the AMX files' tile configuration and per-thread buffers
//   gguf_k_side.h        a Q4_K group block's scales, mins and d in 16 lanes (AVX-512 and AMX tiles of the layout)
//   gguf_eight_rows.h    the 256-bit pieces of the eight-output-row tiles (AVX2, and AVX-512's Q4_0)
//   gguf_kernel.h        what the module's files call across files (gguf_pass.cpp among them)
//   gguf_quantize.h      the entry points of gguf_quantize.cpp (gguf_kernel.h includes it)
//   gguf_dequantize.h    the entry points of gguf_dequantize.cpp
//   gguf_quantize.cpp    activation quantization: the reference and its AVX2 and AVX-512 copies
//   gguf_scalar.cpp      the portable scalar path (the reference semantics)
//   gguf_avx2.cpp        the AVX2 tiles
//   gguf_avx2_interleaved.cpp    the AVX2 tiles of the interleaved layout (gguf_interleaved.h)
//   gguf_avx512.cpp      the AVX-512 VNNI tiles
//   gguf_avx512_interleaved.cpp  the AVX-512 tiles of the interleaved layout
//   gguf_amx.cpp         the AMX tiles (many rows of Q4_K, Q5_K, Q6_K)
//   gguf_amx_interleaved.cpp  the AMX tiles of the interleaved layout (a few rows and more of Q4_K)
//   gguf_dequantize.cpp  the weights back to float32 / bfloat16, a row at a time
//   gguf_pass.cpp        a whole decoding pass in one call, on the same tiles
//   gguf_pass.h          the pass's model and rows, as gguf_pass.cpp hands them to its layer loop
//   gguf_pass_layers.cpp the pass's layer loop
//   gguf_pass_kernels.h  the pass's norms, activations and attention: a table of them per instruction set
//   gguf_pass_scalar.cpp, gguf_pass_avx2.cpp, gguf_pass_avx512.cpp   those tables, one instruction set a file
// The headers' helpers are inline, with internal linkage and outside any target pragma, so that each file
// inlines them into its own tiles; only each path's entry (once per call and thread), the quantizer (once per
// call) and the dequantizer (once per row) are called across files, never a per-block function.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "gguf_blocks.h"
#include "gguf_dequantize.h"
#include "gguf_interleaved.h"
#include "gguf_kernel.h"
#include "gguf_paths.h"
#include "gguf_quantize.h"

namespace {

bool cpu_has_avx2() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
}

bool cpu_has_avx512() {
  __builtin_cpu_init();
  return cpu_has_avx2() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni");
}

void check_type(int64_t type) {
  TORCH_CHECK(!interleaved(type) || interleavable(base_type(type)), "ggml type ", base_type(type),
              " has no interleaved layout");
  TORCH_CHECK(block_bytes(type) > 0, "ggml type ", type, " is not supported (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, "
              "Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS are)");
}

void check_weight(const torch::Tensor& w, int64_t type, int64_t out_features, int64_t in_features) {
  check_type(type);
  TORCH_CHECK(w.scalar_type() == torch::kByte && w.is_contiguous(), "weight bytes must be a contiguous uint8 tensor");
  TORCH_CHECK(in_features > 0 && in_features % block_values(type) == 0, "in_features (", in_features,
              ") must be a positive multiple of ", block_values(type));
  TORCH_CHECK(out_features > 0, "out_features must be positive");
  TORCH_CHECK(!interleaved(type) || out_features % kGroupRows == 0, "an interleaved weight has a multiple of ",
              kGroupRows, " rows, not ", out_features);
  TORCH_CHECK(w.numel() == out_features * (in_features / block_values(type)) * block_bytes(type), "weight has ",
              w.numel(), " bytes, expected ", out_features * (in_features / block_values(type)) * block_bytes(type),
              " for [", out_features, ", ", in_features, "]");
}

// Row o's raw blocks: in place, or for an interleaved weight gathered into `raw` (row_bytes).
const uint8_t* row_at(const uint8_t* w, int64_t type, int64_t row_bytes, int64_t nb, int64_t o, uint8_t* raw) {
  if (!interleaved(type)) return w + o * row_bytes;
  raw_row(type, w, row_bytes, nb, o, raw);
  return raw;
}

}  // namespace

std::vector<std::string> supported_paths() {
  std::vector<std::string> paths;
  if (cpu_has_avx512() && amx::usable()) paths.emplace_back("amx");
  if (cpu_has_avx512()) paths.emplace_back("avx512");
  if (cpu_has_avx2()) paths.emplace_back("avx2");
  paths.emplace_back("scalar");
  return paths;
}

namespace {

// The path named, whatever this CPU runs.
Path path_of(const std::string& path) {
  if (path == "amx") return kAmx;
  if (path == "avx512") return kAvx512;
  if (path == "avx2") return kAvx2;
  TORCH_CHECK(path == "scalar", "unknown kernel path '", path, "' (amx, avx512, avx2, scalar)");
  return kScalar;
}

Path parse_path(const std::string& path) {
  const Path p = path_of(path);
  TORCH_CHECK(p != kAmx || (cpu_has_avx512() && amx::usable()), "this CPU (or its operating system) offers no AMX-INT8");
  TORCH_CHECK(p < kAvx512 || cpu_has_avx512(), "this CPU lacks AVX-512 VNNI");
  TORCH_CHECK(p != kAvx2 || cpu_has_avx2(), "this CPU lacks AVX2");
  return p;
}

// Rows of x quantized for weights of `type`: a buffer, its 64-byte aligned start, the bytes per row.
struct Activations {
  torch::Tensor buffer;
  uint8_t* data;
  int64_t stride;
};

Activations quantize(const torch::Tensor& x, int64_t type, int64_t in_features, Path p) {
  TORCH_CHECK(x.dim() == 2 && x.size(1) == in_features, "x must be [rows, ", in_features, "], got ", x.sizes());
  TORCH_CHECK(x.scalar_type() == torch::kFloat || x.scalar_type() == torch::kBFloat16 ||
                  x.scalar_type() == torch::kHalf,
              "x must be float32, bfloat16 or float16");
  const int64_t n = x.size(0), stride = specwise_gguf::activation_stride(type, in_features);
  Activations a{torch::empty({n * stride + 64}, x.options().dtype(torch::kByte)), nullptr, stride};
  a.data = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(a.buffer.data_ptr<uint8_t>()) + 63) & ~uintptr_t(63));
  const auto xf = x.to(torch::kFloat).contiguous();
  const float* xp = xf.data_ptr<float>();
  specwise_gguf::quantize_rows(p, type, xp, n, in_features, a.data, stride);
  return a;
}

}  // namespace

// The kernel's int8 activations as raw bytes [rows, bytes per row] (for tests: every path must agree).
torch::Tensor quantize_activations(const torch::Tensor& x, int64_t type, int64_t in_features, const std::string& path) {
  check_type(type);
  TORCH_CHECK(in_features > 0 && in_features % block_values(type) == 0, "in_features must be a multiple of ",
              block_values(type));
  const Activations a = quantize(x, type, in_features, parse_path(path));
  const int64_t offset = a.data - a.buffer.data_ptr<uint8_t>();
  return a.buffer.narrow(0, offset, x.size(0) * a.stride).view({x.size(0), a.stride}).clone();
}

torch::Tensor gguf_linear(const torch::Tensor& x, const torch::Tensor& w, int64_t type, int64_t out_features,
                          int64_t in_features, const c10::optional<torch::Tensor>& bias, const std::string& path) {
  check_weight(w, type, out_features, in_features);
  const Path p = parse_path(path);
  if (bias.has_value()) TORCH_CHECK(bias->numel() == out_features, "bias must have ", out_features, " values");
  const Activations a = quantize(x, base_type(type), in_features, p);
  const int64_t n = x.size(0);
  auto y = torch::empty({n, out_features}, x.options().dtype(torch::kFloat));
  if (n == 0) return y.to(x.scalar_type());
  const int64_t nb = in_features / block_values(type);
  uint8_t* act = a.data;
  const int64_t act_stride = a.stride;

  const uint8_t* wp = w.data_ptr<uint8_t>();
  const int64_t row_bytes = nb * block_bytes(type);
  float* yp = y.data_ptr<float>();
  at::parallel_for(0, out_features, 16, [&](int64_t o0, int64_t o1) {
    specwise_gguf::dot_rows(p, type, wp, row_bytes, o0, o1, nb, act, act_stride, n, yp, out_features);
  });
  if (bias.has_value()) y.add_(bias->to(torch::kFloat).view({1, out_features}));  // float32, before one rounding
  return y.to(x.scalar_type());
}

// Selected rows of the weight as float32, computed as gguf's reference dequantizer does, for embedding lookups.
torch::Tensor dequantize_rows(const torch::Tensor& w, int64_t type, int64_t out_features, int64_t in_features,
                              const torch::Tensor& ids) {
  check_weight(w, type, out_features, in_features);
  TORCH_CHECK(ids.dim() == 1 && ids.scalar_type() == torch::kLong, "ids must be a 1-D int64 tensor");
  const auto idc = ids.contiguous();
  const int64_t* idp = idc.data_ptr<int64_t>();
  const int64_t n = idc.numel();
  for (int64_t i = 0; i < n; ++i)
    TORCH_CHECK(idp[i] >= 0 && idp[i] < out_features, "row id ", idp[i], " out of range [0, ", out_features, ")");
  auto y = torch::empty({n, in_features}, torch::kFloat);
  const int64_t nb = in_features / block_values(type), row_bytes = nb * block_bytes(type);
  const uint8_t* wp = w.data_ptr<uint8_t>();
  float* yp = y.data_ptr<float>();
  at::parallel_for(0, n, 1, [&](int64_t i0, int64_t i1) {
    std::vector<uint8_t> raw(interleaved(type) ? row_bytes : 0);
    for (int64_t i = i0; i < i1; ++i)
      specwise_gguf::dequantize_row(base_type(type), row_at(wp, type, row_bytes, nb, idp[i], raw.data()), nb,
                                    yp + i * in_features);
  });
  return y;
}

// Rows [o0, o1) of the weight as bfloat16 into out [o1 - o0, in_features] (each value dequantized in float32,
// then rounded to nearest even): slabs of a temporary copy for a many-row matmul by PyTorch, never kept.
void dequantize_bf16_rows(const torch::Tensor& w, int64_t type, int64_t out_features, int64_t in_features, int64_t o0,
                          int64_t o1, torch::Tensor& out, bool use_simd) {
  check_weight(w, type, out_features, in_features);
  TORCH_CHECK(0 <= o0 && o0 <= o1 && o1 <= out_features, "rows [", o0, ", ", o1, ") are outside [0, ", out_features, ")");
  TORCH_CHECK(out.scalar_type() == torch::kBFloat16 && out.is_contiguous() && out.dim() == 2 && out.size(0) == o1 - o0 &&
                  out.size(1) == in_features, "out must be contiguous bfloat16 [", o1 - o0, ", ", in_features, "]");
  const int64_t nb = in_features / block_values(type), row_bytes = nb * block_bytes(type);
  const uint8_t* wp = w.data_ptr<uint8_t>();
  auto* yp = reinterpret_cast<uint16_t*>(out.data_ptr<at::BFloat16>());
  const bool simd = use_simd && specwise_gguf::dequantize_bf16_simd(base_type(type));
  at::parallel_for(o0, o1, 16, [&](int64_t r0, int64_t r1) {
    std::vector<float> row(in_features);
    std::vector<uint8_t> raw(interleaved(type) ? row_bytes : 0);
    for (int64_t o = r0; o < r1; ++o)
      specwise_gguf::dequantize_row_bf16(base_type(type), row_at(wp, type, row_bytes, nb, o, raw.data()), nb, simd,
                                         row.data(), yp + (o - o0) * in_features);
  });
}

// The weight rearranged in place into the interleaved layout (gguf_interleaved.h): the same bytes, moved.
void interleave_(torch::Tensor& w, int64_t type, int64_t out_features, int64_t in_features) {
  check_weight(w, type | kInterleaved, out_features, in_features);
  const int64_t nb = in_features / block_values(type), row_bytes = nb * block_bytes(type);
  uint8_t* wp = w.data_ptr<uint8_t>();
  at::parallel_for(0, out_features / kGroupRows, 1, [&](int64_t g0, int64_t g1) {
    std::vector<uint8_t> scratch(kGroupRows * row_bytes);
    interleave_weight(type, wp + g0 * kGroupRows * row_bytes, (g1 - g0) * kGroupRows, row_bytes, nb, scratch.data());
  });
}

// An interleaved weight's raw blocks, as stored in the file (a new tensor).
torch::Tensor raw_blocks(const torch::Tensor& w, int64_t type, int64_t out_features, int64_t in_features) {
  check_weight(w, type, out_features, in_features);
  TORCH_CHECK(interleaved(type), "the weight is not interleaved");
  const int64_t nb = in_features / block_values(type), row_bytes = nb * block_bytes(type);
  auto out = torch::empty({out_features, row_bytes}, torch::kByte);
  const uint8_t* wp = w.data_ptr<uint8_t>();
  uint8_t* op = out.data_ptr<uint8_t>();
  at::parallel_for(0, out_features, 16, [&](int64_t o0, int64_t o1) {
    for (int64_t o = o0; o < o1; ++o) raw_row(type, wp, row_bytes, nb, o, op + o * row_bytes);
  });
  return out;
}

// ---------------------------------------------------------------------------------------------
// The internal API of gguf_kernel.h, for the module's other files.

namespace specwise_gguf {

// dot_rows for an interleaved weight: the AMX tiles where they take the call, else its own AVX-512 or AVX2
// tiles; elsewhere (the scalar path, and Q5_K
// on AVX2) each group's rows gathered back into raw blocks for the path's tiles of the base type.
void dot_rows_interleaved(int64_t path, int64_t type, const uint8_t* w, int64_t row_bytes, int64_t o0, int64_t o1,
                          int64_t nb, const uint8_t* act, int64_t stride, int64_t nrows, float* y, int64_t ldy) {
  if (path == kAmx && amx::takes_interleaved(type, nrows))
    return amx::rows_interleaved(type, w, row_bytes, o0, o1, nb, act, stride, nrows, y, ldy);
  if (path == kAmx && amx::takes(type, nrows)) return amx::rows(type, w, row_bytes, o0, o1, nb, act, stride, nrows, y, ldy);
  const int64_t p = simd_path(path);
  if (p == kAvx512 || (p == kAvx2 && avx2::has_interleaved(type))) {
    const auto tiles = p == kAvx512 ? avx512::rows_interleaved : avx2::rows_interleaved;
    for (int64_t c0 = 0; c0 < nrows; c0 += kRowChunk)
      tiles(type, w, row_bytes, o0, o1, nb, act + c0 * stride, stride, std::min(nrows - c0, kRowChunk), y + c0 * ldy, ldy);
    return;
  }
  std::vector<uint8_t> raw(kGroupRows * row_bytes);
  for (int64_t g0 = o0 / kGroupRows * kGroupRows; g0 < o1; g0 += kGroupRows) {
    const int64_t lo = std::max(o0, g0), hi = std::min(o1, g0 + kGroupRows);
    for (int64_t o = lo; o < hi; ++o) raw_row(type, w, row_bytes, nb, o, raw.data() + (o - lo) * row_bytes);
    dot_rows(path, base_type(type), raw.data(), row_bytes, 0, hi - lo, nb, act, stride, nrows, y + lo, ldy);
  }
}

int64_t parse_path(const std::string& path) { return ::parse_path(path); }
int64_t block_values(int64_t type) { return ::block_values(type); }
int64_t block_bytes(int64_t type) { return ::block_bytes(type); }

void dot_rows(int64_t path, int64_t type, const uint8_t* w, int64_t row_bytes, int64_t o0, int64_t o1, int64_t nb,
              const uint8_t* act, int64_t stride, int64_t nrows, float* y, int64_t ldy) {
  if (interleaved(type)) return dot_rows_interleaved(path, type, w, row_bytes, o0, o1, nb, act, stride, nrows, y, ldy);
  if (path == kAmx && amx::takes(type, nrows)) return amx::rows(type, w, row_bytes, o0, o1, nb, act, stride, nrows, y, ldy);
  const int64_t p = simd_path(path);
  const int64_t chunk = p == kAvx512 && avx512::panel(type, nrows) ? nrows : kRowChunk;
  for (int64_t c0 = 0; c0 < nrows; c0 += chunk) {
    const int64_t n = std::min(nrows - c0, chunk);
    const uint8_t* a = act + c0 * stride;
    float* out = y + c0 * ldy;
    if (p == kAvx512) avx512::rows(type, w, row_bytes, o0, o1, nb, a, stride, n, out, ldy);
    else if (p == kAvx2) avx2::rows(type, w, row_bytes, o0, o1, nb, a, stride, n, out, ldy);
    else scalar::rows(type, w, row_bytes, o0, o1, nb, a, stride, n, out, ldy);
  }
}

// Whose tiles run calls of few rows of `type` on the path named (any CPU's): the AVX-512 paths run the
// types without AVX-512 tiles through their AVX2 tiles, and the AMX path is the AVX-512 one outside its
// AMX tiles (amx::takes).
std::string type_path(int64_t type, const std::string& path) {
  TORCH_CHECK(block_bytes(type) > 0, "ggml type ", type, " is not supported");
  const int64_t p = simd_path(path_of(path));
  if (p == kAvx512) return interleaved(type) || avx512::has_tiles(type) ? "avx512" : "avx2";
  return p == kAvx2 ? "avx2" : "scalar";
}

// Whether a weight of `type` in the interleaved layout runs tiles of that layout on the path named (else its
// groups are read back into stored blocks for the stored tiles).
bool interleaved_tiles(int64_t type, const std::string& path) {
  TORCH_CHECK(interleavable(base_type(type)), "ggml type ", base_type(type), " has no interleaved layout");
  const int64_t p = simd_path(path_of(path));
  return p == kAvx512 || (p == kAvx2 && avx2::has_interleaved(type));
}

}  // namespace specwise_gguf

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("gguf_linear", &gguf_linear, "y = x @ W.T (+ bias) for GGUF block-quantized W (raw bytes)");
  m.def("dequantize_rows", &dequantize_rows, "selected rows of a GGUF block-quantized weight as float32");
  m.def("dequantize_bf16_rows", &dequantize_bf16_rows, "rows of a GGUF block-quantized weight as bfloat16, into out");
  m.def("quantize_activations", &quantize_activations, "the kernel's quantized activation rows as raw bytes");
  m.def("supported_paths", &supported_paths, "kernel paths this CPU can run, fastest first");
  m.def("interleave_", &interleave_, "a Q4_K weight rearranged in place into 16-row interleaved groups");
  m.def("raw_blocks", &raw_blocks, "an interleaved weight's blocks as stored in the file (a copy)");
  m.def("interleaved_tiles", &specwise_gguf::interleaved_tiles, "whether an interleaved weight runs tiles of its layout on a path");
  m.def("type_path", &specwise_gguf::type_path, "whose tiles run a block type's calls of few rows on a path");
  specwise_gguf::bind_pass(m);
}
