// What the two AMX files share (gguf_amx.cpp, gguf_amx_interleaved.cpp): the tile configuration and the
// per-thread buffers their calls reuse. Plain C++: no instruction set of its own.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <vector>

namespace {

// The palette-1 configuration of up to 8 tiles, tile t holding tile_rows[t] rows of 64 bytes (0: unused).
struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
  explicit TileConfig(std::initializer_list<int> tile_rows) {
    int t = 0;
    for (int r : tile_rows) {
      if (r > 0) colsb[t] = 64, rows[t] = static_cast<uint8_t>(r);
      ++t;
    }
  }
};

// At least `bytes` of `store`, 64-byte aligned: a buffer per thread that only grows (a prompt's calls reuse it).
// ldtilecfg with the whole configuration as its memory operand. GCC 12's _tile_loadconfig names only its first
// 8 bytes, so the compiler may drop the stores of the rest as dead: it did for a configuration changed after
// its constructor (Blocks32's, gguf_amx_interleaved.cpp), and the instruction then faulted.
inline void load_tile_config(const TileConfig& config) { asm volatile("ldtilecfg %0" : : "m"(config)); }

inline uint8_t* scratch(std::vector<uint8_t>& store, size_t bytes) {
  if (store.size() < bytes + 64) store.resize(bytes + 64);
  return reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(store.data()) + 63) & ~uintptr_t{63});
}

}  // namespace
