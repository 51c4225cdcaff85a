#!/usr/bin/env bash
# Time to the first token, peak RSS and bytes written for a GGUF file never seen before: an empty
# SPECWISE_HOME (the compiled kernels linked in, so no build is timed) and the file under a new path,
# in the gguf format (as stored) and in the dense format (a bfloat16 copy written first).
#   bash scripts/lab/first_token.sh [FILE.gguf] [OUTDIR]
set -euo pipefail
cd "$(dirname "$0")/../.."
SRC=${1:-$HOME/.cache/specwise/gguf/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf}
OUT=${2:-results/first-token}
mkdir -p "$OUT"
for fmt in gguf dense; do
  home=$(mktemp -d); ln -s "${SPECWISE_HOME:-$HOME/.cache/specwise}/kernels" "$home/kernels"
  file="$home-file.gguf"; cp "$SRC" "$file"
  start=$(date +%s.%N)
  SPECWISE_HOME=$home /usr/bin/time -v .venv/bin/specwise generate --target "$file" --target-format $fmt \
    --max-new-tokens 1 --raw "def fibonacci(n):" > "$OUT/$fmt.out" 2> "$OUT/$fmt.time"
  end=$(date +%s.%N)
  rss=$(grep 'Maximum resident' "$OUT/$fmt.time" | awk '{print $6}')
  written=$(du -sb --exclude=kernels "$home" | cut -f1)
  echo "$fmt: $(echo "$end - $start" | bc) s to the first token, peak RSS ${rss} KB, ${written} bytes written" \
    | tee -a "$OUT/summary.txt"
  rm -rf "$home" "$file"
done
