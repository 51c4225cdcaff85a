// The pass's attention alone in a loop: 16 queries of head_dim 128 over the same 136 cache entries (a
// 16-row block at a context of 120), through the AVX2 and the AVX-512 tables of gguf_pass_kernels.h, with
// the keys and values 64-byte aligned as the pass's caches are. Prints the time per query and entry.
// The kernel files need no PyTorch, so it builds alone, from the repository root:
//
//   g++ -O3 -ffp-contract=off -Ispecwise/kernels scripts/lab/attend_loop.cpp specwise/kernels/gguf_pass_avx2.cpp \
//       specwise/kernels/gguf_pass_avx512.cpp specwise/kernels/gguf_pass_scalar.cpp -o /tmp/attend_loop && /tmp/attend_loop
//
// An earlier build's AVX-512 table: `git show COMMIT:specwise/kernels/gguf_pass_avx512.cpp > /tmp/old.cpp`
// and the same command with /tmp/old.cpp in place of specwise/kernels/gguf_pass_avx512.cpp.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "gguf_pass_kernels.h"

using namespace specwise_pass;

int main() {
  constexpr int d = 128, slots = 160, nq = 16, count = 136, calls = 2000;
  std::mt19937 gen(0);
  std::normal_distribution<float> normal;
  std::vector<float> q(nq * d);
  float* keys = static_cast<float*>(std::aligned_alloc(64, slots * d * sizeof(float)));
  float* values = static_cast<float*>(std::aligned_alloc(64, slots * d * sizeof(float)));
  for (auto& x : q) x = normal(gen);
  for (int i = 0; i < slots * d; ++i) keys[i] = normal(gen), values[i] = normal(gen);
  std::vector<int32_t> rows(count);
  for (int i = 0; i < count; ++i) rows[i] = i;
  std::vector<float> scores(nq * (count + 8)), sums(nq * d), out(nq * d);
  for (int wide = 0; wide < 2; ++wide) {
    if (wide && !avx512::usable()) break;
    const Kernels& table = wide ? avx512::kernels : avx2::kernels;
    double best = 1e9;
    for (int round = 0; round < 7; ++round) {
      const auto start = std::chrono::steady_clock::now();
      for (int call = 0; call < calls; ++call) {
        Query batch[kBatch];
        for (int i = 0; i < nq; ++i)
          batch[i] = {q.data() + i * d, rows.data(), count, scores.data() + i * (count + 8), sums.data() + i * d,
                      out.data() + i * d, 0.f, 0.f};
        table.attend(batch, nq, keys, values, d, 0.088f, 0.f);
      }
      best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    }
    std::printf("%s: %.2f ns per query and entry\n", wide ? "avx512" : "avx2", best / calls / (nq * count) * 1e9);
  }
  std::free(keys);
  std::free(values);
}
