#!/usr/bin/env bash
# The dev-split benchmark of docs/BENCHMARKS.md, one run per task (each run is a side-by-side,
# prompt-by-prompt comparison of every method), then one merged report. A task whose
# directory already has a finished run.json is skipped, so the script can be resumed.
# Usage: bash scripts/bench_dev.sh [OUT_ROOT] [TASK...]
set -euo pipefail
cd "$(dirname "$0")/.."
root=${1:-results/bench-dev}
shift || true
tasks=("$@")
[ ${#tasks[@]} -gt 0 ] || tasks=(qa translation math_reasoning "multi-turn conversation" summarization rag)
methods=(
  --methods hf-generate,hf-assisted,hf-prompt-lookup,specwise-ar
  --method specwise:drafter=none,runner=hf
  --method specwise:drafter=draft-model,k=4
  --method specwise:drafter=draft-model,k=4,quantize=int8
  --method specwise:drafter=draft-model,adaptive=1,quantize=int8
  --method specwise:drafter=ngram,k=4
)
for task in "${tasks[@]}"; do
  out="$root/${task// /-}"
  if [ -f "$out/run.json" ] && grep -q '"finished"' "$out/run.json"; then
    echo "skip $task: finished in $out"; continue
  fi
  .venv/bin/specwise bench run --tasks "$task" --questions-per-task 5 --max-new-tokens 128 \
    --temperature 0 --dtype bfloat16 --threads 2 "${methods[@]}" --out "$out"
done
dirs=()
for task in "${tasks[@]}"; do dirs+=("$root/${task// /-}"); done
.venv/bin/specwise bench report "${dirs[@]}" --out "$root/all"
