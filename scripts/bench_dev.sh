#!/usr/bin/env bash
# Kept for the commands in docs/BENCHMARKS.md: the "dev" set of scripts/bench_tasks.sh.
exec bash "$(dirname "$0")/bench_tasks.sh" dev "$@"
