#!/usr/bin/env bash
# One call's worth of GPU work for a machine that has an NVIDIA driver and PyTorch but no OpenCL
# packages (a lent, bare machine: GPU time there is minutes, so everything runs in one go).
#
#   bash tools/gpu_session.sh prepare        # here, with network: the OpenCL and CLBlast .debs
#                                            # into .gpu/ (Debian 12's, 2 MB; .gpu is ignored)
#   OUT=dir bash tools/gpu_session.sh run [ROW...]   # there, with .gpu carried along
#
# `run` unpacks the .debs into a private root (never into /), points an ICD file at the
# driver's libnvidia-opencl, builds clattn, runs the matrix-unit probes, one clattn-bench
# invocation per ROW with PyTorch on the same GPU as the peer (CLATTN_PEER_DEVICE=cuda), the
# machine code (machine_code below), then the C suite, and writes into $OUT: session.log
# (everything printed), bench.json (every row's records, each with its ROW's label),
# build-logs.txt and sass.tar.gz. A ROW is "LABEL|OP|CLATTN_TUNE[|NAME=VALUE]": OP may carry
# more of clattn-bench's options ("attention --only f16 --time-wrong"), the tune part may be
# empty, NAME=VALUE is set for that row alone (CLATTN_KERNEL_DIR=dir times another version of
# the kernels beside this one in the same call). Without ROWs it runs DEFAULT_ROWS below: the
# default rows of the issues' targets (f32 and f16 prefill, causal, decoding, linear attention
# and its step, MHA, the GEMMs, softmax, the copies, the backward), then the questions the
# last call (2026-11-30, bench/reference/nvidia-h200.json, c4) left open: linear attention
# with fewer and more chunks than the row's ITEMS=512 (256; 2048, the old row), 3xTF32
# attention with 16-key tiles (4% faster there, within the call's drift), matmul_mma's f32
# products with 64 columns a warp (15-25% faster on the three GEMM shapes) in MHA and in the
# composed backward before a row takes it, and the f16 prefill rows again (0.47x SDPA there,
# 0.54-0.58x in earlier calls: issue 24 asks 0.5x). Since c4 the host path keeps its tuning
# answers (PoCL: 79k to 69k instructions a call): every row's host_ms (recorded since c4)
# beside its time says what the host costs on a GPU driver. The transposes
# now take local-memory tiles (TILES=1); a row times transpose4d's blocks beside them. Causal
# prefill now starts its longest groups first (LPT=1): two rows time it off, and with sections
# sized for a 50 MiB cache (the H100's and H200's L2) in case the driver reports less. The
# backward now takes its tiles kernels on GPUs (BWD_TILES=1; the lanes kernels took 26.4 ms at
# D=64 in c4): the default rows time them against PyTorch's autograd, causal too (its queries
# pass longest first, LPT=1; a row without), the cross row (4096 queries against 77 keys, whose
# keys pass splits its rows: and a row without, SPLIT_MIN past its rows), the default row without
# splits (on an H200's 132 units its 512 key groups split their rows 3 ways, and its queries
# pass its keys 3 ways), and the last four with groups of 256, slices of 16 and 64 dims (64: one
# slice at D=64), blocks of 32 rows. The 16-bit reshape rows now move the
# f32 rows' bytes (twice the batch: c4's f16 split heads read 46% of copy at half the bytes).
# In c4 f32 prefill's call took 0.339 ms where its kernel took 0.260 (D=128: 0.634 and 0.507),
# timed alternately with the FMA ceiling: the `apart` row times the attention rows back to back
# (--apart), in case the ceiling kernels lower the clocks the row then gets, and every row now
# also reports its share of the ceiling by device times (device_roofline_pct).
# GPU_TESTS holds clattn-tests' arguments, several runs separated by ';' (default: none, the
# whole suite; "skip" skips it); GPU_QUICK=1 passes --quick to the benchmark. Each step has a
# time limit (a bench row 120 s: rows took 1-42 s, and a kernel that NVIDIA's compiler chews on
# for minutes must not take the call), and all of them GPU_BUDGET_S, so a hung step cannot eat
# the call. Off the GPU (to try the script), set OCL_ICD_VENDORS, CLATTN_DEVICE and
# CLATTN_PEER_DEVICE, and it uses them.
set -uo pipefail
cd "$(dirname "$0")/.."

DEFAULT_ROWS=( # most wanted first: rows past the budget are skipped
  "default|attention|"
  "default|attention_causal|"
  "default|attention_decode|"
  "default|linear_attention|"
  "default|linear_attention_causal|"
  "default|linear_step|"
  "default|mha|"
  "default|gemm --only f32|"
  "default|gemm --only f16|"
  "default|softmax|"
  "default|split_heads|"
  "default|split_qkv|"
  "default|transpose|"
  "default|attention_backward --only f32|"
  "lin-items256|linear_attention --no-peers|linear_attention:ITEMS=256"
  "lin-items2048|linear_attention --no-peers|linear_attention:ITEMS=2048"
  "tf32-k16|attention --only f32 --no-peers|attention:UNIT_KEYS=16"
  "mm-f32-n64|gemm --only f32 --no-peers|matmul:UNIT_N=64"
  "mha-n64|mha --only f32 --no-peers|matmul:UNIT_N=64"
  "bwd-n64|attention_backward --only f32 --no-peers|matmul:UNIT_N=64"
  "again|attention --only f16|"
  "again|attention_causal --only f16|"
  "apart|attention --no-peers --apart|"
  "blocks|transpose --no-peers|copy:TILES=0"
  "lpt-off|attention_causal --no-peers|attention:LPT=0"
  "lpt-50mb|attention_causal --no-peers|attention:LPT_MB=50"
  "default|attention_backward_causal --only f32|"
  "bwd-lpt-off|attention_backward_causal --only f32 --no-peers|attention:LPT=0"
  "default|attention_backward_cross|"
  "bwd-rows-off|attention_backward_cross --no-peers|attention:BWD_SPLIT_MIN=1048576"
  "default|attention_backward_gqa|"
  "bwd-rows-off|attention_backward_gqa --no-peers|attention:BWD_SPLIT_MIN=1048576"
  "default|attention_backward_bias|"
  "bwd-splits-off|attention_backward --only f32 --no-peers|attention:SPLIT_MIN=1048576"
  "bwd-g256|attention_backward --only f32 --no-peers|attention:BWD_GROUP=256"
  "bwd-s16|attention_backward --only f32 --no-peers|attention:BWD_SLICE=16"
  "bwd-s64|attention_backward --only f32 --no-peers|attention:BWD_SLICE=64"
  "bwd-b32|attention_backward --only f32 --no-peers|attention:BWD_BLOCK=32"
)

DEBS=(ocl-icd-libopencl1 ocl-icd-opencl-dev opencl-c-headers opencl-clhpp-headers libclblast1
  libclblast-dev pkgconf pkgconf-bin libpkgconf3)

prepare() {
  mkdir -p .gpu/debs
  (cd .gpu/debs && apt-get download "${DEBS[@]}") || return 1
  ls -l .gpu/debs
}

# The .debs unpacked under $1, and the environment that finds them there.
unpack() {
  local prefix=$1 lib
  mkdir -p "$prefix"
  for deb in .gpu/debs/*.deb; do # a .deb is an ar archive; Debian 12's hold data.tar.xz
    if command -v dpkg >/dev/null; then
      dpkg -x "$deb" "$prefix"
    else
      ar p "$deb" data.tar.xz | tar -xJ -C "$prefix"
    fi
  done
  lib=$prefix/usr/lib/x86_64-linux-gnu
  export PATH=$prefix/usr/bin:$PATH
  export PKG_CONFIG_PATH=$lib/pkgconfig:$prefix/usr/share/pkgconfig
  export PKG_CONFIG_SYSROOT_DIR=$prefix   # the .pc files say /usr
  export LD_LIBRARY_PATH=$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  export LIBRARY_PATH=$lib
  export CPATH=$prefix/usr/include
}

# An ICD folder naming the driver's OpenCL library, wherever the driver's files were mounted.
nvidia_icd() {
  local dir=$1 found=""
  if [ -n "${OCL_ICD_VENDORS:-}" ]; then
    echo "ICD: $OCL_ICD_VENDORS (given)"
    return
  fi
  mkdir -p "$dir"
  for candidate in /etc/OpenCL/vendors/nvidia.icd; do
    [ -f "$candidate" ] && cp "$candidate" "$dir/" && found=$candidate
  done
  if [ -z "$found" ]; then
    found=$( (ldconfig -p 2>/dev/null | awk '/libnvidia-opencl\.so/ {print $NF}';
      ls /usr/local/nvidia/lib64/libnvidia-opencl.so* /usr/lib/x86_64-linux-gnu/libnvidia-opencl.so* \
        2>/dev/null) | head -n 1)
    [ -n "$found" ] && echo "$found" >"$dir/nvidia.icd"
  fi
  echo "ICD: ${found:-none found}"
  export OCL_ICD_VENDORS=$dir
}

# The whole run stays inside GPU_BUDGET_S (default 540: a call may take 600 s), so the files
# under $OUT come back even when a step hangs.
deadline=$(($(date +%s) + ${GPU_BUDGET_S:-540}))

step() { # step LIMIT_S NAME COMMAND...: runs it under a time limit, says how it ended
  local limit=$1 name=$2 start rc
  shift 2
  start=$(date +%s)
  [ $((deadline - start)) -lt "$limit" ] && limit=$((deadline - start))
  if [ "$limit" -lt 10 ]; then
    echo "=== $name: skipped, the time budget is spent"
    return 124
  fi
  echo "=== $name"
  timeout "$limit" "$@"
  rc=$?
  echo "=== $name: rc $rc in $(($(date +%s) - start)) s"
  return $rc
}

bench_rows() {
  local out=$1 row label op tune setting n=0
  shift
  for row in "$@"; do
    IFS='|' read -r label op tune setting <<<"$row"
    n=$((n + 1))
    ( # shellcheck disable=SC2163 # the row's own NAME=VALUE, if any
      [ -z "$setting" ] || export "$setting"
      # shellcheck disable=SC2086 # OP may carry more options: "attention --only f16"
      CLATTN_TUNE=$tune step 120 "bench $label $op${tune:+ ($tune)}${setting:+ $setting}" \
        build/bench/clattn-bench --device "${CLATTN_DEVICE:-nvidia}" --op $op \
        ${GPU_QUICK:+--quick} --json "$out/bench-$n-$label.json")
  done
}

# Every row file's records, labelled, into one JSON (the devices from the first file).
merge_json() {
  python3 - "$@" <<'EOF'
import json, os, sys
out, files = sys.argv[1], sys.argv[2:]
merged = {"devices": [], "records": []}
for path in files:
    with open(path) as f:
        data = json.load(f)
    label = os.path.basename(path).split("-", 2)[2].rsplit(".", 1)[0]
    merged["devices"] = merged["devices"] or data.get("devices", [])
    for record in data.get("records", []):
        record["label"] = label
        merged["records"].append(record)
with open(out, "w") as f:
    json.dump(merged, f, indent=1)
print(f"{len(merged['records'])} records from {len(files)} runs -> {out}")
EOF
}

# Each dumped program's options and build log (its time, the driver's messages), one file: the
# call returns few files.
build_logs() {
  local log
  for log in "$1"/*.log; do
    [ -f "$log" ] || continue
    echo "== $(basename "$log" .log): $(cat "${log%.log}.options")"
    cat "$log"
    echo
  done
}

# The machine code of the cached programs whose PTX defines GPU_SASS_KERNEL (kernel names,
# comma-separated; default attention_mma, attention_units and matmul_mma): NVIDIA's OpenCL
# binary is PTX text; CUDA's ptxas, where the machine has it, assembles it for the GPU's own
# architecture with -v (registers, spills) and cuobjdump prints the SASS, all in one archive,
# $OUT/sass.tar.gz (the call returns few files).
machine_code() {
  local cache=$1 out=$2 arch ptx
  if ! command -v ptxas >/dev/null || ! command -v cuobjdump >/dev/null; then
    echo "machine code: no ptxas or cuobjdump here"
    return 0
  fi
  arch=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -n 1 | tr -d .)
  mkdir -p "$out"
  python3 tools/cached_ptx.py "$cache" "$out" "${GPU_SASS_KERNEL:-attention_mma,attention_units,matmul_mma}"
  for ptx in "$out"/*.ptx; do
    [ -f "$ptx" ] || continue
    step 120 "ptxas $(basename "$ptx")" ptxas -arch="sm_$arch" -v -o "${ptx%.ptx}.cubin" "$ptx" \
      >"${ptx%.ptx}.ptxas" 2>&1
    cat "${ptx%.ptx}.ptxas"
    [ -f "${ptx%.ptx}.cubin" ] && cuobjdump -sass "${ptx%.ptx}.cubin" >"${ptx%.ptx}.sass"
    rm -f "${ptx%.ptx}.cubin"
  done
  tar -czf "$OUT/sass.tar.gz" -C "$out" .
}

# clattn-tests once per ';'-separated selection of GPU_TESTS (none: the whole suite).
run_tests() {
  local selections=() selection
  IFS=';' read -ra selections <<<"${GPU_TESTS:-}"
  [ ${#selections[@]} -gt 0 ] || selections=("")
  for selection in "${selections[@]}"; do
    # shellcheck disable=SC2086 # a selection is a list of arguments
    step 300 "tests $selection" build/tests/clattn-tests $selection
  done
}

run() {
  : "${OUT:?set OUT to the folder the results go to}"
  local work=/tmp/clattn-gpu rows=("$@")
  [ ${#rows[@]} -gt 0 ] || rows=("${DEFAULT_ROWS[@]}")
  rm -rf "$work/json" "$work/programs" "$work/sass" "$work/cache"
  mkdir -p "$work/json" "$work/programs" "$work/cache" "$OUT"
  {
    unpack "$work/root"
    # meson and ninja may be pip packages beside the python3 that holds PyTorch
    PATH=$PATH:$(dirname "$(command -v python3)")
    nvidia_icd "$work/icd"
    nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv 2>&1
    export CLATTN_PEER_DEVICE=${CLATTN_PEER_DEVICE:-cuda} CLATTN_PYTHON=${CLATTN_PYTHON:-python3}
    export CLATTN_DEVICE=${CLATTN_DEVICE:-nvidia} CLATTN_CACHE_DIR=$work/cache
    # each row's kernels timed apart too (kernels_ms in the JSON): where a call of several goes;
    # and its share of the ceiling by device times alone (device_roofline_pct)
    export CLATTN_BENCH_KERNELS=${CLATTN_BENCH_KERNELS:-1}
    CLATTN_BUILD_DIR=build step 300 build bash ci/build.sh || return 1
    # The probes first (seconds: whether the matrix units run), the rows, then the whole suite
    # in the time left.
    step 60 probes build/tests/clattn-tests --suite matrix_units
    # The programs of the rows and tests dumped with their build logs; on NVIDIA's driver
    # -cl-nv-verbose puts ptxas' registers, spills and local memory of every kernel there.
    export CLATTN_DUMP_PROGRAMS=$work/programs
    if command -v nvidia-smi >/dev/null; then export CLATTN_BUILD_OPTIONS=-cl-nv-verbose; fi
    bench_rows "$work/json" "${rows[@]}"
    merge_json "$OUT/bench.json" "$work"/json/bench-*.json
    build_logs "$work/programs" >"$OUT/build-logs.txt"
    machine_code "$CLATTN_CACHE_DIR" "$work/sass"
    [ "${GPU_TESTS:-}" = skip ] || run_tests
    build_logs "$work/programs" >"$OUT/build-logs.txt"
  } 2>&1 | tee "$OUT/session.log"
}

case "${1:-}" in
prepare) prepare ;;
run)
  shift
  run "$@"
  ;;
*)
  sed -n '2,19p' "$0"
  exit 2
  ;;
esac
