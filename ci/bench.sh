#!/usr/bin/env bash
# Installs what is missing, builds, and runs the benchmark on every OpenCL device, beside
# PyTorch on the CPU. Extra arguments go to clattn-bench (e.g. --quick, --op split_heads).
# Results: the table on stdout, one column per device (bench/compare.py), bench/results/bench.json
# and the charts bench/results/vs_torch.png and roofline.png (bench/plot.py).
set -euo pipefail
cd "$(dirname "$0")/.."
bash ci/setup.sh
bash ci/build.sh
build=${CLATTN_BUILD_DIR:-build}
export POCL_CACHE_DIR="$PWD/$build/pocl-cache"
# Mesa's rusticl shows its CPU device (llvmpipe) only when asked: a second OpenCL implementation
# beside PoCL in the table. RUSTICL_ENABLE= (empty) leaves it out; its rows are slow.
export RUSTICL_ENABLE=${RUSTICL_ENABLE-llvmpipe}
mkdir -p bench/results "$POCL_CACHE_DIR"
"$build/bench/clattn-bench" --device all --json bench/results/bench.json "$@"
echo
echo "== every device side by side (bench/compare.py)"
/usr/bin/python3 bench/compare.py bench/results/bench.json
echo
/usr/bin/python3 bench/plot.py bench/results/bench.json --out bench/results
echo "JSON: bench/results/bench.json"
