#!/usr/bin/env bash
# One row of the published results table (README "Results", docs/BENCHMARKS.md "Headline"), measured on
# this machine into OUT: the six tasks × QUESTIONS beside llama.cpp (scripts/bench_tasks.sh gguf-short,
# one folder per task), T(n) of the default target beside llama.cpp at context 128 (cost.json), and a
# 700-token prompt's reading (prefill-700.json). Every file records its provenance (commit, machine,
# read bandwidth, the llama.cpp build and its buffer types). Then add the row to docs/results/headline.json
# ({"bench": "OUT-relative-to-docs/results", "cost": ".../cost.json", "prefill": ".../prefill-700.json"})
# and regenerate the tables: specwise bench table docs/results/headline.json --write README.md docs/BENCHMARKS.md
# Needs `bash scripts/install.sh --test --llamacpp`; nothing else should run meanwhile (2 cores).
# Usage: QUESTIONS=5 bash scripts/bench_headline.sh OUT
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: QUESTIONS=5 bash scripts/bench_headline.sh OUT}
.venv/bin/python -c 'import llama_cpp' 2>/dev/null || {
    echo "llama.cpp, the yardstick, is not installed: bash scripts/install.sh --test --llamacpp" >&2; exit 2; }
QUESTIONS=${QUESTIONS:-5} bash scripts/bench_tasks.sh gguf-short "$out"
if [ ! -f "$out/cost.json" ]; then
    .venv/bin/specwise bench cost --formats gguf --runners lean --drafter-model none --contexts 128 \
        --n 1,2,4,5,8,16 --repeats 5 --no-save-home --no-progress --out "$out"
fi
if [ ! -f "$out/prefill-700.json" ]; then
    .venv/bin/python scripts/lab/prefill_speed.py --readers gguf,llamacpp --tokens 700 --repeats 3 \
        --out "$out/prefill-700.json"
fi
echo "wrote $out: six tasks (bench_tasks.sh gguf-short), cost.json, prefill-700.json" >&2
