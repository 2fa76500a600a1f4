#!/usr/bin/env bash
# Installs what is missing, builds, and runs the benchmark on every OpenCL device, beside
# PyTorch on the CPU. Extra arguments go to clattn-bench (e.g. --quick, --op split_heads).
# Results: the table on stdout and bench/results/bench.json.
set -euo pipefail
cd "$(dirname "$0")/.."
bash ci/setup.sh
bash ci/build.sh
build=${CLATTN_BUILD_DIR:-build}
export POCL_CACHE_DIR="$PWD/$build/pocl-cache"
mkdir -p bench/results "$POCL_CACHE_DIR"
"$build/bench/clattn-bench" --device all --json bench/results/bench.json "$@"
echo "JSON: bench/results/bench.json"
