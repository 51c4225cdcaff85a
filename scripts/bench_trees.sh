#!/usr/bin/env bash
# Chain versus tree drafting at a comparable verification budget (docs/BENCHMARKS.md), one run per
# task (resumable: finished tasks are skipped), then one merged report.
# Usage: bash scripts/bench_trees.sh [OUT_ROOT] [TASK...]
set -euo pipefail
cd "$(dirname "$0")/.."
root=${1:-results/bench-trees}
shift || true
tasks=("$@")
[ ${#tasks[@]} -gt 0 ] || tasks=(qa translation math_reasoning "multi-turn conversation" summarization rag)
methods=(
  --methods hf-generate,specwise-ar
  --method specwise:drafter=draft-model,quantize=int8,k=4
  --method specwise:drafter=draft-model,quantize=int8,k=8
  --method specwise:drafter=draft-model,quantize=int8,tree_nodes=8,tree_depth=4,tree_branching=2
  --method specwise:drafter=draft-model,quantize=int8,tree_nodes=16,tree_depth=4,tree_branching=3
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
