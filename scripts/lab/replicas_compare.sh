#!/usr/bin/env bash
# One process with every core against replicas on Ray Serve, on this machine, under the same load:
# `specwise serve` (threads = cores) and `specwise serve --replicas N --threads-per-replica cores/N`,
# each started afresh on a loopback port, sent the same streaming requests by scripts/load_test.py
# (bounded in count and time), then stopped. Writes one JSON report per server into OUT.
# Usage: bash scripts/lab/replicas_compare.sh OUT [REPLICAS] [REQUESTS] [CONCURRENCY]
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${1:?usage: bash scripts/lab/replicas_compare.sh OUT [REPLICAS] [REQUESTS] [CONCURRENCY]}
replicas=${2:-2}
requests=${3:-24}
concurrency=${4:-8}
cores=$(nproc)
mkdir -p "$out"
{ lscpu | grep "Model name"; echo "cores: $cores"; grep -o -w -E 'avx2|avx512_vnni|amx_int8' /proc/cpuinfo | sort -u; } > "$out/machine.txt"

run() {  # name, port, serve options...
    local name=$1 port=$2
    shift 2
    .venv/bin/specwise serve --port "$port" "$@" > "$out/$name.log" 2>&1 &
    local pid=$!
    for _ in $(seq 600); do  # the model loads in each replica: up to 10 minutes
        if curl -sf "http://127.0.0.1:$port/health" > /dev/null; then break; fi
        kill -0 "$pid" 2> /dev/null || { echo "$name did not start: $out/$name.log" >&2; return 1; }
        sleep 1
    done
    .venv/bin/python scripts/load_test.py --url "http://127.0.0.1:$port" --requests "$requests" \
        --concurrency "$concurrency" --max-tokens 64 --time-limit 600 --json > "$out/$name.json"
    kill -TERM "$pid"
    wait "$pid" || true
}

run one-process 8310 --threads "$cores"
run "replicas-$replicas" 8311 --replicas "$replicas" --threads-per-replica $((cores / replicas))
echo "wrote $out"
