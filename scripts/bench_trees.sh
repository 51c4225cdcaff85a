#!/usr/bin/env bash
# Kept for the commands in docs/BENCHMARKS.md: the "trees" set of scripts/bench_tasks.sh.
exec bash "$(dirname "$0")/bench_tasks.sh" trees "$@"
