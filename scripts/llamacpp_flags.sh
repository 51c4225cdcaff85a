#!/usr/bin/env bash
# The CMake arguments that build llama.cpp at its best on this CPU, for both yardsticks
# (llama-cpp-python through scripts/install.sh --llamacpp, llama-server through
# scripts/build_llama_server.sh). Prints them on one line.
#
# Native everywhere, except on CPUs with AMX: there the pinned llama.cpp's AMX weight repacking
# crashes on its first pass of more than one row (a segmentation fault with GCC 12; SIGILL in
# two-thread runs with clang), so the build names the CPU's AVX-512 features itself and leaves the
# AMX kernels out. Its CPU_REPACK buffer type (the interleaved Q4_K / Q4_0 / IQ4_NL layouts) stays
# on, and nothing turns repacking off at run time: that build is the fair one there (docs/BENCHMARKS.md).
set -euo pipefail
# CPUINFO: another cpuinfo file to read (the tests' way to ask what an AMX host would get).
flags=$(grep -m1 '^flags' "${CPUINFO:-/proc/cpuinfo}" 2>/dev/null || true)
has() { [[ " $flags " == *" $1 "* ]]; }
common="-DCMAKE_BUILD_TYPE=Release"
if ! has amx_int8; then
    echo "$common -DGGML_NATIVE=ON"
    exit 0
fi
args=(-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON)
has avx512f && args+=(-DGGML_AVX512=ON)
# Linux spells this flag avx512vbmi (no underscore, unlike avx512_vnni and avx512_bf16).
has avx512vbmi && args+=(-DGGML_AVX512_VBMI=ON)
has avx512_vnni && args+=(-DGGML_AVX512_VNNI=ON)
has avx512_bf16 && args+=(-DGGML_AVX512_BF16=ON)
has avx_vnni && args+=(-DGGML_AVX_VNNI=ON)
args+=(-DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF)
echo "$common ${args[*]}"
