#!/usr/bin/env bash
# The code-edit workload (specwise/data/code_edit.jsonl, HumanEval functions with edits whose answers
# copy most of their input): plain decoding, n-gram k=4, the int8 draft model, suffix chain and suffix
# tree, on N prompts, then on the same N prompts again ("code-edit second pass"), in one process: the
# suffix drafter's store then holds the first pass while the second runs (each method its own store).
# No --resume: a resumed run would start the second pass with an empty store. --no-adaptive: each
# method drafts its k every step, as when the results were published.
# Usage: bash scripts/bench_code_edit.sh [OUT] [N] [extra `specwise bench run` options...]
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-results/bench-code-edit}
n=${2:-20}
shift 2 || shift $#
.venv/bin/specwise bench run --questions specwise/data/code_edit.jsonl --questions-per-task "$n" \
  --max-new-tokens 256 --temperature 0 --threads 2 --no-adaptive \
  --methods specwise-ar \
  --methods specwise:drafter=ngram,k=4 \
  --methods specwise:drafter=draft-model,k=4,quantize=gguf \
  --methods specwise:drafter=suffix,k=16 \
  --methods specwise:drafter=suffix,tree_nodes=16,tree_depth=12,tree_branching=2 \
  --out "$out" "$@"
