#!/usr/bin/env bash
# The dev-split benchmarks of docs/BENCHMARKS.md: one side-by-side run per task (every method on the
# same prompts, interleaved prompt by prompt), then one merged report in OUT_ROOT/all.
# A finished task is skipped and a stopped one resumed (`bench run --resume`), so the script can be
# run again after an interruption and loses at most the question in progress. Questions with a
# contended timing are measured again once at the end of their task (`--redo-contended`).
# Usage: bash scripts/bench_tasks.sh SET [OUT_ROOT] [TASK...]
#   SET: dev      Hugging Face peers, both runners, bf16/int8 chains, adaptive k, n-gram
#        trees    chain versus tree drafting at a comparable verification budget
#        combined both sets in one run (shared baseline; the larger tree dropped)
#        eagle    the trained EAGLE head (from $SPECWISE_HOME/heads/) against the draft model
#                 (with and without a restricted vocabulary) and the n-gram drafter
#        full     combined plus the restricted vocabulary and the EAGLE head: every method in one run
#        long     full without the methods that only answer a question already settled on four tasks
#                 (bf16 vs int8 draft, lean vs HF runner, k=8 chain, restricted vocabulary): for the
#                 long-prompt tasks (summarization, rag), where one generation takes 1-3 minutes here
#        cold     the draft-model configurations a shared drafter cache flattered before cold drafters
#                 (int8 k=4, int8 adaptive, 8-node tree), with hf-generate, plain lean decoding and
#                 n-gram drafting beside them: to measure them again with cold drafters
#        suffix   the suffix drafter (chain and tree) against n-gram drafting and plain decoding; each
#                 task's questions run in one process, so later questions draft from earlier ones
#        gguf     the GGUF file's blocks as stored against llama.cpp on the same file: llamacpp-generate
#                 (the baseline), plain decoding in bfloat16 and in the gguf format, and speculative
#                 configurations on the gguf target (n-gram k=4, adaptive n-gram, the draft model from
#                 its own GGUF blocks, the suffix drafter)
#        gguf-short  gguf without the bfloat16 target and the draft model: the methods that can beat
#                 llama.cpp where the bfloat16 runner cannot (CPUs without native bfloat16)
#        gguf-adaptive  the free drafters with adaptive k on the gguf target (n-gram; suffix up to k = 16)
#                 beside a fixed suffix k = 16, plain decoding and llama.cpp
#        gguf-match  adaptive k per match length of the retrieval drafter (n-gram; suffix up to k = 16)
#                 beside the same rule with one acceptance for all steps, a fixed suffix k = 16, plain
#                 decoding and llama.cpp
#        drafters the drafters for any target on the gguf target beside llama.cpp, plain decoding and
#                 adaptive n-gram drafting: recycle alone and after n-gram or suffix retrieval, layerskip
#                 (exit after layer 21 of 28, the best measured), SmolLM2-135M as a draft model of
#                 another tokenizer, and the suffix drafter
#        gguf-sampled  sampled decoding (temperature 0.7, top-p 0.9, seed 1) on the gguf target beside
#                 llama.cpp sampling with the same settings: plain decoding, n-gram and suffix drafting
#                 verified coupled (the default under sampling: each commits plain sampling's tokens)
#                 and n-gram verified token by token (Leviathan et al.)
# QUESTIONS=N sets the questions per task (default 5). The runs give --no-adaptive, so that a method
# written with k=N drafts N tokens every step, as when they were published; adaptive=1 methods adapt.
# Every set but gguf, gguf-short and drafters measures the dense (bfloat16) target, as when they were published.
set -euo pipefail
cd "$(dirname "$0")/.."
set_name=${1:?usage: bash scripts/bench_tasks.sh dev|trees|combined|eagle|full|long|cold|suffix|gguf|gguf-short|gguf-adaptive|gguf-match|gguf-sampled|drafters [OUT_ROOT] [TASK...]}
shift
root=${1:-results/bench-$set_name}
shift || true
tasks=("$@")
[ ${#tasks[@]} -gt 0 ] || tasks=(qa translation math_reasoning "multi-turn conversation" summarization rag)
dev=(
  --methods specwise:drafter=none,runner=hf
  --methods specwise:drafter=draft-model,k=4
  --methods specwise:drafter=draft-model,k=4,quantize=int8
  --methods specwise:drafter=draft-model,adaptive=1,k=5,quantize=int8
  --methods specwise:drafter=ngram,k=4
)
trees=(
  --methods specwise:drafter=draft-model,quantize=int8,k=4
  --methods specwise:drafter=draft-model,quantize=int8,k=8
  --methods specwise:drafter=draft-model,quantize=int8,tree_nodes=8,tree_depth=4,tree_branching=2
)
case $set_name in
  dev) methods=(--methods hf-generate,hf-assisted,hf-prompt-lookup,specwise-ar "${dev[@]}") ;;
  trees) methods=(--methods hf-generate,specwise-ar "${trees[@]}"
    --methods specwise:drafter=draft-model,quantize=int8,tree_nodes=16,tree_depth=4,tree_branching=3) ;;
  combined) methods=(--methods hf-generate,hf-assisted,hf-prompt-lookup,specwise-ar "${dev[@]}" "${trees[@]:2}") ;;
  full) methods=(--methods hf-generate,hf-assisted,hf-prompt-lookup,specwise-ar "${dev[@]}" "${trees[@]:2}"
    --methods specwise:drafter=draft-model,k=4,quantize=int8,vocab=32768
    --methods specwise:drafter=eagle,k=3) ;;
  long) methods=(--methods hf-generate,hf-assisted,hf-prompt-lookup,specwise-ar
    --methods specwise:drafter=draft-model,k=4,quantize=int8
    --methods specwise:drafter=draft-model,adaptive=1,k=5,quantize=int8
    --methods specwise:drafter=ngram,k=4
    --methods specwise:drafter=draft-model,quantize=int8,tree_nodes=8,tree_depth=4,tree_branching=2
    --methods specwise:drafter=eagle,k=3) ;;
  cold) methods=(--methods hf-generate,specwise-ar
    --methods specwise:drafter=draft-model,k=4,quantize=int8
    --methods specwise:drafter=draft-model,adaptive=1,k=5,quantize=int8
    --methods specwise:drafter=ngram,k=4
    --methods specwise:drafter=draft-model,quantize=int8,tree_nodes=8,tree_depth=4,tree_branching=2) ;;
  eagle) methods=(--methods hf-generate,specwise-ar
    --methods specwise:drafter=draft-model,k=4,quantize=int8
    --methods specwise:drafter=draft-model,k=4,quantize=int8,vocab=32768
    --methods specwise:drafter=draft-model,adaptive=1,k=5,quantize=int8
    --methods specwise:drafter=ngram,k=4
    --methods specwise:drafter=eagle,k=3
    --methods specwise:drafter=eagle,adaptive=1,k=5) ;;
  suffix) methods=(--methods specwise-ar
    --methods specwise:drafter=ngram,k=4
    --methods specwise:drafter=suffix,k=16
    --methods specwise:drafter=suffix,tree_nodes=16,tree_depth=12,tree_branching=2) ;;
  gguf) methods=(--methods llamacpp-generate,specwise-ar --target-format gguf
    --methods specwise:drafter=none,target_format=dense
    --methods specwise:drafter=ngram,k=4
    --methods specwise:drafter=ngram,adaptive=1,k=4
    --methods specwise:drafter=suffix,k=16
    --methods specwise:drafter=draft-model,adaptive=1,k=4,quantize=gguf) ;;
  gguf-short) methods=(--methods llamacpp-generate,specwise-ar --target-format gguf
    --methods specwise:drafter=ngram,k=4
    --methods specwise:drafter=ngram,adaptive=1,k=4
    --methods specwise:drafter=suffix,k=16) ;;
  gguf-adaptive) methods=(--methods llamacpp-generate,specwise-ar --target-format gguf
    --methods specwise:drafter=ngram,adaptive=1,k=4
    --methods specwise:drafter=suffix,adaptive=1,k=4,k_max=16
    --methods specwise:drafter=suffix,k=16) ;;
  gguf-match) methods=(--methods llamacpp-generate,specwise-ar --target-format gguf
    --methods specwise:drafter=ngram,adaptive=1,k=4
    --methods specwise:drafter=ngram,adaptive=1,k=4,k_by_match=0
    --methods specwise:drafter=suffix,adaptive=1,k=4,k_max=16
    --methods specwise:drafter=suffix,adaptive=1,k=4,k_max=16,k_by_match=0
    --methods specwise:drafter=suffix,k=16) ;;
  drafters) methods=(--methods llamacpp-generate,specwise-ar --target-format gguf
    --methods specwise:drafter=ngram,adaptive=1,k=4
    --methods specwise:drafter=suffix,k=16
    --methods specwise:drafter=recycle,with=none,adaptive=1
    --methods specwise:drafter=recycle,with=ngram,adaptive=1
    --methods specwise:drafter=recycle,with=suffix,adaptive=1
    --methods specwise:drafter=layerskip,exit=21,adaptive=1
    --methods specwise:drafter=draft-model,model=smollm2-135m,adaptive=1) ;;
  gguf-sampled) methods=(--methods llamacpp-generate,specwise-ar --target-format gguf
    --methods specwise:drafter=ngram,adaptive=1,k=4
    --methods specwise:drafter=suffix,adaptive=1,k=4,k_max=16
    --methods specwise:drafter=ngram,adaptive=1,k=4,verifier=token
    --temperature 0.7 --top-p 0.9 --seed 1) ;;  # after the run's --temperature 0: the last one counts
  *) echo "unknown set '$set_name': use dev, trees, combined, eagle, full, long, cold, suffix, gguf, gguf-short, gguf-adaptive, gguf-match, gguf-sampled or drafters" >&2; exit 2 ;;
esac
case $set_name in gguf*|drafters) ;; *) methods+=(--target-format dense) ;; esac
for task in "${tasks[@]}"; do
  out="$root/${task// /-}"
  resume=()
  if [ -f "$out/run.json" ]; then
    if grep -q '"finished"' "$out/run.json"; then echo "skip $task: finished in $out"; continue; fi
    resume=(--resume)
  fi
  run=(.venv/bin/specwise bench run --tasks "$task" --questions-per-task "${QUESTIONS:-5}" --max-new-tokens 128
    --temperature 0 --dtype bfloat16 --threads 2 --no-adaptive "${methods[@]}" --out "$out")
  "${run[@]}" "${resume[@]}"
  # A question timed while something else used the CPU (even after its retake) is measured
  # again once, whole, so that its methods stay side by side.
  if .venv/bin/python -c 'import sys; from specwise.bench.machine import contended
from specwise.bench.report import read_records
sys.exit(not any(map(contended, read_records(sys.argv[1]))))' "$out/records.jsonl"; then
    "${run[@]}" --resume --redo-contended
  fi
done
dirs=()
for task in "${tasks[@]}"; do dirs+=("$root/${task// /-}"); done
.venv/bin/specwise bench report "${dirs[@]}" --out "$root/all"
