#!/usr/bin/env bash
# The whole test suite: installs what is missing, builds, and runs every lane of the table below
# (LANES), in two tracks side by side (the loop, at the end, says which and why). Prints each
# lane's output as it ends, a table of the lanes' wall times and counts, then one line
# "N passed, N failed, N skipped" summed over the lanes, and exits non-zero on any failure.
#
# A lane is a row: name, kind, timeout, selector, environment. The kind says how the lane runs
# and which reports fail it besides the test counts (one function each, lane_KIND below):
#   plain      clattn-tests as it is
#   oclgrind   clattn-tests under Oclgrind (--data-races --check-api, and --uninitialized when
#              the row sets CLATTN_TEST_UNINIT_CHECKER=1, which tells the tests so); Oclgrind
#              exits 0 after reporting errors, so its log is read for them
#   valgrind   clattn-tests under memcheck; its error exit code (99) is a failure
#   asan       clattn-tests of a gcc AddressSanitizer+UBSan+LeakSanitizer build (build-asan);
#              a sanitizer report in the log is a failure, whatever the runner counted
#              (LeakSanitizer reports after the closing line)
#   fuzz       the libFuzzer targets the selector names (build-fuzz; clang, ASan+UBSan), one
#              test each
#   python     pytest over tests/python (its closing line gives the counts)
#   tools      the tool checks the selector names (lane_tools), one test each
#   compile    the dumped programs in the selector's folder through other vendors' compilers
#              (lane_compile), a test per target
# The timeout is per process. The selector is clattn-tests' arguments (clattn-tests --help:
# --suite NAME, --tag TAG, FILTER, each negatable with !); "each:ARGS" runs every test that
# `clattn-tests --list ARGS` names in a process of its own. A runner process that prints no
# closing line (a crash, a hang past its timeout) is a failure.
#
# CLATTN_LANES="valgrind python" runs only the lanes it names (all by default).
# shellcheck disable=SC2317  # the lane_KIND functions and report checks are called by name
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
root=$PWD
build=${CLATTN_BUILD_DIR:-build}
logs="$root/$build/test-logs"
# The sanitizer lanes build trees of their own beside $build (build-asan, build-fuzz), set up
# once, and share its PoCL cache, so no kernel compiles again.
lane_root="$root/$(dirname "$build")"
runner="$root/$build/tests/clattn-tests"
passed=0 failed=0 skipped=0
summary=()

finish() {
  if [ "${#summary[@]}" -gt 0 ]; then
    printf '%-22s %8s %7s %7s %7s\n' lane seconds passed failed skipped
    printf '%s\n' "${summary[@]}"
    printf '%-22s %8d %7d %7d %7d\n' total "$SECONDS" "$passed" "$failed" "$skipped"
  fi
  echo "$passed passed, $failed failed, $skipped skipped"
  [ "$failed" -eq 0 ]
  exit $?
}

if ! bash ci/setup.sh || ! bash ci/build.sh; then
  echo "ci/test.sh: setup or build failed"
  failed=1
  finish
fi

# PoCL compiles each program for seconds the first time: keep its cache in the build tree.
export POCL_CACHE_DIR="$root/$build/pocl-cache"
mkdir -p "$POCL_CACHE_DIR" "$logs"

# Each lane loads only the OpenCL implementation it tests (OCL_ICD_VENDORS: a folder holding
# that one's .icd file): the ICD loader would load every one installed, and Intel's (installed
# for ocloc) dlopens with RTLD_DEEPBIND, which AddressSanitizer refuses.
icd_dir() {
  mkdir -p "$root/$build/icd/$1" && cp "/etc/OpenCL/vendors/$1.icd" "$root/$build/icd/$1/"
  echo "$root/$build/icd/$1"
}
pocl_icd=$(icd_dir pocl) rusticl_icd=$(icd_dir rusticl)
# The programs a GPU builds, dumped by the pocl-basic lane for the compile lane.
programs="$root/$build/programs-gpu"
rm -rf "$programs" && mkdir -p "$programs"

# ---- LANES ---------------------------------------------------------------------------------
lane_names=() lane_kinds=() lane_timeouts=() lane_selectors=() lane_envs=()
# lane NAME KIND TIMEOUT SELECTOR [VAR=VALUE...]
lane() {
  lane_names+=("$1") lane_kinds+=("$2") lane_timeouts+=("$3") lane_selectors+=("$4")
  shift 4
  lane_envs+=("$([ $# -eq 0 ] || printf '%q ' "$@")")
}
pthread=(OCL_ICD_VENDORS="$pocl_icd" POCL_DEVICES=pthread CLATTN_DEVICE=pthread)
# What a GPU runs, on a CPU device: the tuning table's type:gpu rows (as CLATTN_TUNE, so every
# test that does not force a variant runs the GPU's), under 48 KiB of local memory (the least
# of the three vendors' current GPUs), each program dumped. The tests of the tuning lookup
# itself, and the one that caps groups below the rows' sizes (overrides do not shrink), would
# see the override and are left to the other lanes; so are the three tests of CLBlast's own
# GEMMs (no GPU row reaches CLBlast: they would rerun the pthread lane's, and the first of them
# builds CLBlast's GEMM program, 35 s of PoCL here), and the test that two
# m-tiles a warp give attention_mma's bits (no row asks for them; its two builds, 11 s, run in
# the pthread lane), and the tests of matmul_mma alone (five builds, about 25 s, and the other
# vendors' tile layouts, four; the pthread lane runs them, and MHA's units test dumps matmul_mma
# programs for the compile lane, which rebuilds them for each vendor's unit), and of
# attention_units on the other vendors' emulated tiles (four builds, about 20 s; the compile
# lane rebuilds the NVIDIA-tile programs that the variant lists dump).
gpu_rows=("CLATTN_TUNE=$(sed -n 's/^TUNING_ROW("\([a-z_]*\)", "\*", "type:gpu", "\([^"]*\)").*/\1:\2/p' \
  src/runtime/tuning_table.def | paste -sd';')" CLATTN_MAX_LOCAL_MEMORY=49152
  CLATTN_DUMP_PROGRAMS="$programs")
gpu_rows_selector='--suite !tuning !the_work_group_cap_applies|gemm_bridge_matches|clblast_codes'
gpu_rows_selector+='|clblast_failure_midway|two_m_tiles_a_warp|gemm_on_matrix_units'
gpu_rows_selector+='|gemm_on_every_units_layout|units_on_every_tile'
basic=(OCL_ICD_VENDORS="$pocl_icd" POCL_DEVICES=basic CLATTN_DEVICE=basic CLATTN_FUZZ_N=8
  CLATTN_TEST_SMALL=1 "${gpu_rows[@]}")
sanitizers=("${pthread[@]}"
  "LSAN_OPTIONS=suppressions=$root/ci/lsan.supp:print_suppressions=0"
  "UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1")
# Oclgrind on small shapes (CLATTN_TEST_SMALL); with --uninitialized also -cl-opt-disable, since
# Oclgrind's uninitialized-value checker cannot read optimized code (freeze).
oclgrind_small=(CLATTN_DEVICE=oclgrind CLATTN_TEST_SMALL=1)
uninit=("${oclgrind_small[@]}" CLATTN_BUILD_OPTIONS=-cl-opt-disable CLATTN_TEST_UNINIT_CHECKER=1)

# The layering of src/ (docs/design.md, Architecture): runtime below ops below api, no include
# cycle (tools/check_layers.py, a tool check of lane_tools).
lane layers tools 60 'layers'
# The suite on the device the caller named (a GPU, say): only when CLATTN_DEVICE is set.
if [ -n "${CLATTN_DEVICE:-}" ]; then
  lane device plain 1200 '' CLATTN_DEVICE="$CLATTN_DEVICE"
fi
# PoCL's multi-threaded CPU device: the main lane, with the large shapes and the long fuzz test,
# but MHA's f16 and bf16 storage on the emulated matrix units, which pocl-basic (with the GPU
# rows) and oclgrind-mha run: its emulated programs took PoCL 89 s to build here; and the f32
# cases on the emulated tf32 unit, which pocl-basic (5 s there: the GPU rows' attention tests
# built their programs) and oclgrind-attention run: 45 s of PoCL builds here; and the test that
# a gemm row's set reaches CLBlast, which rusticl runs in half a second: PoCL builds CLBlast's
# GEMM program for that set alone in 30 s (Oclgrind runs the test's host checks). The first test
# here that calls CLBlast (the GEMM bridge's) builds CLBlast's GEMM program, 34-56 s of PoCL:
# leaving it out only moves that build to the next one (a CLBlast failure midway), so the lane
# keeps them, for the asan lane's sake too (the rusticl lane runs them as smoke tests). Nor the
# two attention tests of the emulated units that pocl-basic runs as a GPU would, under the GPU
# rows' tile sizes, and oclgrind-attention too: attention_mma's fixed cases in 16 bits and the
# choice of it for prefill (their shapes are not the lane's to size; 41 s of PoCL builds here).
pthread_selector='!half_storage_on_matrix_units|matrix_unit_cases_in_f32|gemm_rows_reach_clblast'
pthread_selector+='|matrix_unit_cases_in_16_bits|prefill_takes_the_units_found'
lane pocl-pthread plain 1200 "$pthread_selector" "${pthread[@]}"
# The other PoCL lanes check how work-groups run: one thread (basic), there with the GPU rows above
# (gpu_rows), so the GPU's variants and tile sizes run in CI and its programs are dumped; and groups
# of at most 16 work-items (small-groups: the pthread device with every group of clattn's kernels
# capped, CLATTN_MAX_WORK_GROUP), so the small-group paths and the tuning table's fallbacks run.
# (Debian's PoCL 3.1 has no other work-group method to run them with: it knows "loopvec", its
# default, and "workitemrepl", whose builds took 3x as long here, and takes any other name, "cbs"
# too, for its default.) They take a shorter fuzz test (CLATTN_FUZZ_N), since every random case
# compiles its own program and the main lane has the long one, and both take the small shapes (the
# pthread lane runs the large ones: they test sizes, not groups), to keep CI inside its time. The
# small-groups lane leaves out what the cap does not change or does not reach:
# - the backward's tests but its tiles kernels' in small groups, in longest-first order and their
#   plans, and its random cases (the lanes kernels' groups share nothing, 80 s a lane; the tiles at
#   the row's sizes, 14 s here, would be capped to the same 16 work-items; their split rows, which
#   the random cases split too, are runs of row blocks, whatever the group);
# - the four tests that run CLBlast's own GEMMs (the cap does not reach CLBlast's kernels; 49 s);
# - the tests of what each element becomes, whatever the group that computes it: the attention's
#   and linear attention's storage tests (every dtype and layout), linear attention's feature
#   maps, the half conversions and the copies of every dtype pair.
# (The lane shares the pthread lane's PoCL cache: only its groups' work-group functions build
# here, so it takes about a minute. When it asked for "cbs", PoCL, which keys its cache by the
# method's name, built each program again: 280 s.)
small_groups_left_out='gemm_bridge|gemm_rows_reach|clblast_failure_midway|storage_and_layouts'
small_groups_left_out+='|feature_maps|half_conversions_agree|copy_aligned_rows_every_dtype_pair'
small_groups_left_out+='|attention_backward.gradients|attention_backward.invisible'
small_groups_left_out+='|attention_backward.caller|attention_backward.tiles_kernels_give'
small_groups_left_out+='|attention_backward.tiles_kernels_with_split_rows'
small_groups_left_out+='|attention_backward.composed|attention_backward.linear'
small_groups_left_out+='|attention_backward.lanes_kernels_over'
lane pocl-basic plain 1200 "$gpu_rows_selector" "${basic[@]}"
lane pocl-small-groups plain 1200 "!$small_groups_left_out" \
  "${pthread[@]}" CLATTN_FUZZ_N=8 CLATTN_MAX_WORK_GROUP=16 CLATTN_TEST_SMALL=1
# The GPU programs pocl-basic dumped, built offline for Intel (ocloc: dg2-g10, pvc, tgllp), AMD
# (clang: gfx90a, gfx1100) and NVIDIA (clang: PTX for sm_80) by tools/compile_programs.py, each
# op's programs reduced to a cover of their build options; a target is a test, which passes when
# every program builds, and the resource table goes to test-logs/compile-table.md. Then a planted
# non-portable construct (a double, which Intel's Arc and Xe-LP compilers refuse) must fail it,
# and the matrix-unit probe's inline PTX must reach clang's sm_80 output.
lane compile compile 900 "$programs"
# Mesa's rusticl on llvmpipe: a second OpenCL implementation, with its own compiler (clang to
# SPIR-V to NIR to LLVM), runtime and limits (32 KiB of local memory, no subgroups, no fp16).
# It compiles an attention program in tens of seconds, so it runs the tests tagged smoke
# (tests/harness.h: every op's kernels and mask parts, in minutes), with a short fuzz test.
lane rusticl plain 1200 '--tag smoke' OCL_ICD_VENDORS="$rusticl_icd" RUSTICL_ENABLE=llvmpipe \
  CLATTN_DEVICE=llvmpipe CLATTN_TEST_SMALL=1 CLATTN_FUZZ_N=2 \
  MESA_SHADER_CACHE_DIR="$root/$build/mesa-shader-cache"
# The Python binding against PyTorch, and its ctypes structs against the C layout
# (tests/python/test_abi.py, through the layout helper built beside the runner).
lane python python 1200 tests/python "${pthread[@]}" CLATTN_LIBRARY="$root/$build/libclattn.so" \
  CLATTN_ABI_HELPER="$root/$build/tests/libclattn_abi_layout.so"
# clattn-tune's search over two ops (every candidate checked against the reference): copy's
# whole grid, and softmax's first 15 s of it (--budget; its whole grid, about 45 builds, took
# 46 s here, and the softmax suite runs every variant), so that here the search's stop at its
# budget runs too (not asserted: a faster machine may finish the grid);
# clattn-bench's default-vs-tuned rows, the Python binding's overhead row (its three chains
# must agree), and the Python package installed by pip (ci/package.sh), run as a user runs them
# (lane_tools); and tests/probes/barrier_skip.c on the pthread device, which prints whether
# PoCL still miscompiles a loop's skip past its barriers and fails if the form clattn's kernels
# use instead (a barrier on the skipping path) is wrong.
lane tools tools 600 \
  'tune-copy tune-softmax bench-tuning bench-python package probe-barrier-skip' "${pthread[@]}"
# The whole suite built by gcc with AddressSanitizer, UndefinedBehaviorSanitizer and
# LeakSanitizer (ci/lsan.supp: the driver's own leaks only); whole stacks (libpocl has no frame
# pointers), so that ci/lsan.supp can name driver code. The short fuzz test (the pthread lane
# runs the long one; its every case builds a program, 270 s of this lane at full length).
# Without the tests the pthread lane leaves out (this lane reads its PoCL cache: the programs
# they would build here alone would cost as much; of the emulated units' attention tests it
# keeps those the pthread lane runs, which walk the same planning code: every tile, key splits,
# two m-tiles a warp).
lane asan asan 900 "$pthread_selector" "${sanitizers[@]}" CLATTN_FUZZ_N=12 \
  ASAN_OPTIONS=detect_leaks=1:fast_unwind_on_malloc=0:malloc_context_size=30
# memcheck on the main build's runner (ci/valgrind.supp), over the tests that run no kernel, the
# ones tagged host (status, the validator, device selection and env tensors, every op's
# bad-argument tests, the tuning lookup): PoCL compiles its kernels for another CPU under
# valgrind (no AVX-512 there), minutes each, and runs them slowly.
lane valgrind valgrind 600 '--tag host' "${pthread[@]}"
# The libFuzzer targets in fuzz/ (validator, parsers, cache_blob): each runs its committed seeds
# (fuzz/corpus) and what earlier runs found (build-fuzz/corpus), then mutates for
# CLATTN_FUZZ_SECONDS (15) each. Clean: one test passed; a crash: one failed, printed with the
# input that caused it (rerun: build-fuzz/fuzz/fuzz_TARGET INPUT).
lane fuzz fuzz 300 'validator parsers cache_blob' "${sanitizers[@]}" ASAN_OPTIONS=detect_leaks=1
# Oclgrind runs three ways (out-of-bounds reads and writes, races, uninitialized values, API
# misuse). First the whole suite with --uninitialized, which leaves out two paths whose right
# results it misreads (tests/harness.h, test_under_uninit_checker), linear attention apart, and
# the attention fuzz test, whose random shapes run in the attention lane below (the fixed
# attention tests cover every path this checker can read; the fuzz test cost 49 s here):
lane oclgrind oclgrind 1200 '--suite !linear_attention --suite !attention_fuzz' "${uninit[@]}"
# the linear attention tests with that checker too, each in a process of its own (after other
# tests in the same process, the checker misreads the scratch they write and read: README,
# Known limits);
lane oclgrind-linear oclgrind 1200 'each:--suite linear_attention' "${uninit[@]}"
# then without that checker, with those paths: the attention suites (linear attention's and the
# backward's too, whose device tests skip under that checker; by exact name, since the substring
# "attention" also picked six MHA tests the next lane runs), the attention suite's variants only
# those the first pass left out (CLATTN_TEST_AFTER_UNINIT_CHECKER: the others ran the same cases
# there, under the race and bounds checks too; 18 s of 106 here), and the backward's tiles
# kernels in small groups, in longest-first order, under the garbage test and in its random
# cases (10 s here), not at the GPU row's sizes (their barriers and bounds are the same code;
# 12 s here), nor the two tests that split counts share a program (they count builds, which
# Oclgrind does not check, on kernels the split tests run here; 9 s)...
attention_suites='--suite attention --suite attention_fuzz --suite attention_backward'
lane oclgrind-attention oclgrind 1200 \
  "$attention_suites --suite linear_attention !tiles_kernels_give|split_counts_share" \
  "${oclgrind_small[@]}" CLATTN_TEST_AFTER_UNINIT_CHECKER=1
# ...the MHA suite (its CLBlast GEMMs are such a path)...
lane oclgrind-mha oclgrind 1200 '--suite mha' "${oclgrind_small[@]}"
# ...and the reliability suite (fault injection in the composed path, determinism).
lane oclgrind-reliability oclgrind 1200 '--suite reliability' "${oclgrind_small[@]}"

# ---- counting ------------------------------------------------------------------------------
# lane_p, lane_f, lane_s: the counts of the lane that runs; lane_env: its environment.
lane_p=0 lane_f=0 lane_s=0 lane_env=()

# Adds the runner's closing line in `log` to the lane's counts; none is a failure.
count_closing_line() {
  local name=$1 what=$2 log=$3 rc=$4 line p f s
  line=$(grep -E '^[0-9]+ passed, [0-9]+ failed, [0-9]+ skipped$' "$log" | tail -n 1)
  if [ -z "$line" ]; then
    echo "[$name] $what: no result line (exit $rc: a crash, a hang, a bad selector); see" \
      "$logs/$name.log"
    lane_f=$((lane_f + 1))
    return
  fi
  read -r p _ f _ s _ <<<"$line"
  lane_p=$((lane_p + p)) lane_f=$((lane_f + f)) lane_s=$((lane_s + s))
}

# Runs clattn-tests (RUNNER) behind the wrapper command ("$@": oclgrind, valgrind, or none)
# with the lane's environment and selector: one process, or one per test for "each:". Each
# process's log and exit status go to the kind's report check (CHECK NAME LOG STATUS), which
# counts a report as a failure. The lane's log is every process's output in turn.
run_runner() {
  local name=$1 timeout=$2 selector=$3 check=$4 runner=$5 log="$logs/$1.log" group rc
  shift 5
  local -a groups args
  if [[ $selector == each:* ]]; then
    read -ra args <<<"${selector#each:}"
    mapfile -t groups < <("$runner" --list "${args[@]}")
    if [ "${#groups[@]}" -eq 0 ]; then
      echo "[$name] \`clattn-tests --list ${selector#each:}\` names no test"
      lane_f=$((lane_f + 1))
      return
    fi
  else
    groups=("$selector")
  fi
  : >"$log"
  for group in "${groups[@]}"; do
    read -ra args <<<"$group"
    env "${lane_env[@]}" timeout "$timeout" "$@" "$runner" "${args[@]}" >"$log.one" 2>&1
    rc=$?
    cat "$log.one" >>"$log"
    count_closing_line "$name" "${group:-all}" "$log.one" "$rc"
    "$check" "$name" "$log.one" "$rc"
  done
  rm -f "$log.one"
  grep -m1 '^device' "$log" | sed "s/^/[$name] /"
  grep -E '^(FAIL|skip)' "$log" | sed "s/^/[$name] /"
}

# ---- report checks, one per kind -------------------------------------------------------------
no_reports() { :; }

# A sanitizer report fails the lane whatever the runner counted.
sanitizer_reports() {
  local name=$1 log=$2 pattern='^==[0-9]+==ERROR: |runtime error: '
  if grep -qE "$pattern" "$log"; then
    echo "[$name] sanitizer report in $logs/$name.log:"
    grep -E -A14 "$pattern" "$log" | head -40
    lane_f=$((lane_f + 1))
  fi
}

# Oclgrind reports problems in its log and still exits 0: its log is read for them. An API
# error report counts unless it is the build failure that a test provokes on purpose.
oclgrind_reports() {
  local name=$1 log=$2 pattern reports api
  pattern='Invalid (read|write)|data race|Uninitialized value|Controlflow depends on uninitialized|Work-group divergence|out-of-bounds|exceeds static array size'
  api=$(grep -A1 'runtime error detected' "$log" | grep -c 'Function:')
  api=$((api - $(grep -A2 'runtime error detected' "$log" | grep -c 'CL_BUILD_PROGRAM_FAILURE')))
  reports=$(($(grep -cE "$pattern" "$log") + api))
  pattern="$pattern|runtime error detected"
  if [ "$reports" -gt 0 ]; then
    echo "[$name] $reports error reports in $logs/$name.log:"
    grep -E -A6 "$pattern" "$log" | head -40
    lane_f=$((lane_f + 1))
  fi
}

# memcheck's errors (definite leaks included) make valgrind exit 99.
valgrind_reports() {
  local name=$1 log=$2 rc=$3
  if [ "$rc" -eq 99 ]; then
    echo "[$name] memcheck errors:"
    grep -E -A12 '^==[0-9]+== (Invalid|Conditional|Use of|Syscall|Mismatched|[0-9,]+ bytes in)' \
      "$log" | head -40
    lane_f=$((lane_f + 1))
  fi
}

# ---- lane kinds ------------------------------------------------------------------------------
# lane_KIND NAME TIMEOUT SELECTOR: runs the lane with lane_env, counting into lane_p/f/s.
lane_plain() { run_runner "$1" "$2" "$3" no_reports "$runner"; }

lane_oclgrind() {
  local -a flags=(--data-races --check-api)
  [[ " ${lane_env[*]} " == *" CLATTN_TEST_UNINIT_CHECKER=1 "* ]] && flags+=(--uninitialized)
  run_runner "$1" "$2" "$3" oclgrind_reports "$runner" oclgrind "${flags[@]}"
}

lane_valgrind() {
  run_runner "$1" "$2" "$3" valgrind_reports "$runner" valgrind --error-exitcode=99 \
    --leak-check=full --show-leak-kinds=definite --errors-for-leak-kinds=definite \
    --suppressions="$root/ci/valgrind.supp" --num-callers=30
}

lane_asan() {
  local asan="$lane_root/build-asan" build_log="$logs/$1.log.build"
  if { [ -f "$asan/build.ninja" ] ||
    CC=gcc meson setup "$asan" --buildtype=debugoptimized -Db_sanitize=address,undefined \
      -Db_lundef=false -Dbench=false; } >"$build_log" 2>&1 &&
    ninja -C "$asan" tests/clattn-tests >>"$build_log" 2>&1; then
    run_runner "$1" "$2" "$3" sanitizer_reports "$asan/tests/clattn-tests"
  else
    echo "[$1] build failed; see $build_log"
    lane_f=$((lane_f + 1))
  fi
}

lane_fuzz() {
  local name=$1 timeout=$2 fuzz="$lane_root/build-fuzz" target log runs
  local -a targets
  read -ra targets <<<"$3"
  if ! { [ -f "$fuzz/build.ninja" ] ||
    CC=clang meson setup "$fuzz" -Dfuzz=true -Dtests=false -Dbench=false \
      -Db_sanitize=address,undefined -Db_lundef=false \
      "-Dc_args=-fsanitize=fuzzer-no-link -fno-sanitize-recover=undefined"; } \
    >"$logs/$name-build.log" 2>&1 ||
    ! ninja -C "$fuzz" "${targets[@]/#/fuzz/fuzz_}" >>"$logs/$name-build.log" 2>&1; then
    echo "[$name] build failed; see $logs/$name-build.log"
    lane_f=$((lane_f + 1))
    return
  fi
  for target in "${targets[@]}"; do
    log="$logs/$name-$target.log"
    mkdir -p "$fuzz/corpus/$target" "$fuzz/artifacts"
    if env "${lane_env[@]}" timeout "$timeout" "$fuzz/fuzz/fuzz_$target" \
      -max_total_time="${CLATTN_FUZZ_SECONDS:-15}" -timeout=20 -print_final_stats=1 \
      -artifact_prefix="$fuzz/artifacts/$target-" "$fuzz/corpus/$target" \
      "$root/fuzz/corpus/$target" >"$log" 2>&1; then
      lane_p=$((lane_p + 1))
    else
      echo "[$name] FAIL $target; see $log; input:" \
        "$(sed -n 's/.*Test unit written to //p' "$log")"
      grep -E -A8 '^==[0-9]+== ?ERROR: |runtime error: |fuzz invariant broken' "$log" | head -20
      lane_f=$((lane_f + 1))
    fi
  done
  runs=$(for target in "${targets[@]}"; do cat "$logs/$name-$target.log"; done |
    awk '/^stat::number_of_executed_units/ {s += $2} END {print s + 0}')
  echo "[$name] $runs inputs run"
}

# pytest's closing line, "== 19 passed, 1 skipped in 12.3s ==", gives the counts (failed and
# errors as failures); none, or an exit status other than 0 with no failure counted, is a
# failure.
lane_python() {
  local name=$1 log="$logs/$1.log" rc line n word
  local -a args
  read -ra args <<<"$3"
  env "${lane_env[@]}" timeout "$2" /usr/bin/python3 -m pytest -v "${args[@]}" >"$log" 2>&1
  rc=$?
  grep -E '^(FAILED|ERROR|SKIPPED) ' "$log" | sed "s/^/[$name] /"
  line=$(grep -E '^=+ .* in [0-9.]+s( \([0-9:]+\))? =+$' "$log" | tail -n 1)
  if [ -z "$line" ]; then
    echo "[$name] no pytest result line (exit $rc; crash or hang); see $log"
    lane_f=$((lane_f + 1))
    return
  fi
  while read -r n word; do
    case $word in
      passed | xpassed) lane_p=$((lane_p + n)) ;;
      failed | error | errors) lane_f=$((lane_f + n)) ;;
      skipped | xfailed) lane_s=$((lane_s + n)) ;;
    esac
  done < <(grep -oE '[0-9]+ [a-z]+' <<<"$line")
  if [ "$rc" -ne 0 ] && [ "$lane_f" -eq 0 ]; then
    echo "[$name] pytest exited $rc: $line; see $log"
    lane_f=$((lane_f + 1))
  fi
}

# The tools, run as a user runs them, each check one test: it passes when the tool exits 0 and
# prints what it exists to print (for the tuner: its row, with no candidate rejected for a wrong
# result or a failed call).
lane_tools() {
  local name=$1 check log expect
  local -a checks command
  read -ra checks <<<"$3"
  for check in "${checks[@]}"; do
    case $check in
      layers)
        expect='layers and no cycle$'
        command=(python3 "$root/tools/check_layers.py" "$root/src") ;;
      tune-copy)
        expect='^TUNING_ROW\("copy"'
        command=("$root/$build/tune/clattn-tune" --op copy --repeats 1) ;;
      tune-softmax)
        expect='^TUNING_ROW\("softmax"'
        command=("$root/$build/tune/clattn-tune" --op softmax --repeats 1 --budget 15) ;;
      bench-tuning)
        expect='linear_attention .*tuned/default time'
        command=("$root/$build/bench/clattn-bench" --op tuning --quick --repeats 2 --no-peers) ;;
      bench-python)
        expect='^Python, device tensors +[0-9.]+ +[0-9.]+ +[0-9.]+x$'
        command=(/usr/bin/python3 "$root/bench/bench_python.py" --rounds 2
          --helper "$root/$build/bench/libclattn_bench_chain.so") ;;
      package)
        expect='^library: .*/package/venv/.*/clattn/libclattn\.so$'
        command=(bash "$root/ci/package.sh" "$root/$build/package") ;;
      probe-barrier-skip)
        expect='with a barrier on the skip path: 0 of'
        command=("$root/$build/tests/probe-barrier-skip") ;;
      *)
        echo "[$name] no tool check named $check"
        lane_f=$((lane_f + 1))
        continue ;;
    esac
    log="$logs/$name-$check.log"
    if env "${lane_env[@]}" timeout "$2" "${command[@]}" >"$log" 2>&1 &&
      grep -qE "$expect" "$log" && ! grep -qE '\([1-9][0-9]* rejected' "$log"; then
      lane_p=$((lane_p + 1))
    else
      echo "[$name] FAIL $check; see $log"
      lane_f=$((lane_f + 1))
    fi
  done
}

# ptx_rebuilds LANE KERNEL PTX PROGRAM|SED[|TEXT]...: each dumped PROGRAM (its .options; SED
# edits them) rebuilt for sm_80 with the instruction (MMA_PTX=1, or on the subgroup tile
# MMA_NATIVE=1 of its NVIDIA unit) into PTX must carry mma.sync and ldmatrix, or with f32
# (attention_mma's 3xTF32) the tf32 mma.sync (and TEXT, where given); one pass when every one
# did (and there was one), else one failure.
ptx_rebuilds() {
  local name=$1 kernel=$2 ptx=$3 entry program edit also options count=0 built=0 mma fragments
  shift 3
  for entry in "$@"; do
    IFS='|' read -r program edit also <<<"$entry"
    options=$(sed "s/-DMMA_PTX=0/-DMMA_PTX=1/; s/-DMMA_NATIVE=0/-DMMA_NATIVE=1/; $edit" \
      "$program")
    mma="mma.sync.aligned.m16n8k16" fragments="ldmatrix.sync.aligned.m8n8.x4"
    if [[ "$options" == *-DMMA_T=f32* ]]; then
      mma="mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32" fragments=$mma
    fi
    count=$((count + 1))
    # shellcheck disable=SC2086 # the options are a list of arguments
    clang-15 -x cl -cl-std=CL1.2 -nogpulib -O2 -Xclang -finclude-default-header \
      -target nvptx64-unknown-nvidiacl -march=sm_80 -Xclang -mlink-builtin-bitcode \
      -Xclang /usr/lib/clc/nvptx64--nvidiacl.bc $options -DMMA_ASM=__asm__ -S \
      "${program%.options}.cl" -o "$ptx" 2>>"$logs/$name-$kernel.log" &&
      grep -q "$mma" "$ptx" && grep -q "$fragments" "$ptx" &&
      grep -q -- "${also:-mma.sync}" "$ptx" && built=$((built + 1))
  done
  if [ "$count" -gt 0 ] && [ "$built" -eq "$count" ]; then
    lane_p=$((lane_p + 1))
  else
    echo "[$name] FAIL $kernel with the instruction: $built of $count programs built;" \
      "see $logs/$name-$kernel.log"
    lane_f=$((lane_f + 1))
  fi
}

# target_results LANE LOG WORD TAIL: a test per line "WORD TARGET: BUILT of COUNT TAIL" of LOG
# (tools/compile_programs.py's), passing when BUILT is COUNT; `result_lines` counts the lines.
target_results() {
  local name=$1 target built count
  result_lines=0
  while read -r _ target built _ count _; do
    result_lines=$((result_lines + 1))
    if [ "$built" = "$count" ]; then
      lane_p=$((lane_p + 1))
    else
      echo "[$name] FAIL ${target%:} ($3): $built of $count $4"
      lane_f=$((lane_f + 1))
    fi
  done < <(grep -E "^$3 [a-z0-9_-]+: [0-9]+ of [0-9]+ $4\$" "$2")
}

# The dumped programs (the selector: their folder) through tools/compile_programs.py, a test per
# target; the pocl-basic lane dumps them, and when it did not run this time, this lane runs its
# tests to dump them. Then the planted construct, a test that passes when the tool fails on it.
lane_compile() {
  local name=$1 dump=$3 log="$logs/$1.log" result_lines planted small
  local -a selector
  if ! compgen -G "$dump/*.cl" >/dev/null; then
    read -ra selector <<<"$gpu_rows_selector"
    env "${basic[@]}" timeout "$2" "$runner" "${selector[@]}" >"$logs/$name-dump.log" 2>&1
  fi
  timeout "$2" python3 "$root/tools/compile_programs.py" "$dump" \
    --table "$logs/$name-table.md" >"$log" 2>&1
  grep -E -A4 '^FAIL' "$log" | head -40 | sed "s/^/[$name] /"
  if ! grep -qE '^[0-9]+ programs x [0-9]+ targets: [0-9]+ built, 0 failed$' "$log"; then
    echo "[$name] not every program built; see $log"
  fi
  target_results "$name" "$log" target 'programs built'
  if [ "$result_lines" -eq 0 ]; then
    echo "[$name] no result line; see $log"
    lane_f=$((lane_f + 1))
  fi
  grep -E '^[0-9]+ programs x' "$log" | sed "s/^/[$name] /"
  planted=$(mktemp -d)
  # shellcheck disable=SC2012  # the dump's names are <op>-<hex>.cl
  small=$(ls -S "$dump"/*.cl 2>/dev/null | tail -n 1)
  if [ -n "$small" ] && cp "$small" "${small%.cl}.options" "$planted/" &&
    echo '__kernel void planted(__global float *x) { double d = x[0]; x[0] = (float)(d * 3); }' \
      >>"$planted/${small##*/}" &&
    ! python3 "$root/tools/compile_programs.py" "$planted" --targets dg2-g10 \
      >"$logs/$name-planted.log" 2>&1 &&
    grep -q "requires cl_khr_fp64" "$logs/$name-planted.log"; then
    lane_p=$((lane_p + 1))
  else
    echo "[$name] FAIL the planted double was not refused; see $logs/$name-planted.log"
    lane_f=$((lane_f + 1))
  fi
  # The matrix-unit probes' PTX builds (cl/mma.cl with MMA_PTX), which no CPU lane builds: clang
  # must emit the tensor-core instruction for sm_80 (f16 and bf16 with cp.async, f32's 3xTF32
  # with the lane exchange). Their operands are checked on a GPU, by the probe itself (no ptxas
  # in Debian).
  local type instruction copies
  for type in f16 bf16 f32; do
    instruction="m16n8k16.row.col.f32.$type.$type" copies="cp.async.cg.shared.global"
    [ "$type" = f32 ] && instruction="m16n8k8.row.col.f32.tf32.tf32" copies="shfl.sync.bfly"
    # (to a file: grep -q would stop reading early, and pipefail count clang's SIGPIPE)
    if clang-15 -x cl -cl-std=CL1.2 -nogpulib -O2 -Xclang -finclude-default-header \
      -target nvptx64-unknown-nvidiacl -march=sm_80 -I "$root/cl" -DMMA_PROBE=1 -DMMA_PTX=1 \
      -DMMA_ASM=__asm__ -DMMA_T=$type -S "$root/cl/mma.cl" -o "$planted.ptx" \
      2>"$logs/$name-mma-$type.log" &&
      grep -q "mma.sync.aligned.$instruction.f32" "$planted.ptx" &&
      grep -q "$copies" "$planted.ptx"; then
      lane_p=$((lane_p + 1))
    else
      echo "[$name] FAIL the $type mma probe's PTX lacks its instruction;" \
        "see $logs/$name-mma-$type.log"
      lane_f=$((lane_f + 1))
    fi
  done
  # attention_mma and matmul_mma as a GPU with the unit builds them (the dump holds their
  # emulated builds): every program of each rebuilt with MMA_PTX=1 must carry the instruction
  # and the fragment loads, attention_mma's with its tiles copied into two buffers (then with
  # cp.async too), fetched into registers at the tile and a tile ahead (the test shapes' head
  # dims take one), matmul_mma's with b n-major (MHA's) and k-major, indexed in ulong (the dump's
  # are uint: no test matrix reaches 2^31), f32's (the tf32 unit's) also as MHA's projections take
  # it: b n-major with a bias row
  local program ahead
  local -a attention=() matmul=()
  for program in $(grep -l -- '-DVARIANT=5 ' "$dump"/attention-*.options 2>/dev/null); do
    # (copies need aligned rows: an unaligned program is rebuilt as if its rows were aligned)
    attention+=("$program|s/-DMMA_ASYNC=[01]/-DMMA_ASYNC=1/; s/-DALIGNED=0/-DALIGNED=1/|cp.async")
    for ahead in 0 1; do
      attention+=("$program|s/-DMMA_ASYNC=1/-DMMA_ASYNC=0/; s/-DMMA_AHEAD=[01]/-DMMA_AHEAD=$ahead/")
    done
  done
  for program in $(grep -l -- '-DMATMUL_MMA=1 .*-DMMA_UNIT=1 ' "$dump"/matmul-*.options \
    2>/dev/null); do
    matmul+=("$program|" "$program|s/-DTRANS_B=1/-DTRANS_B=0/" "$program|s/-DIDX=uint/-DIDX=ulong/")
    if grep -q -- '-DMMA_T=f32 ' "$program"; then
      matmul+=("$program|s/-DTRANS_B=0/-DTRANS_B=1/; s/-DHAS_BIAS=0/-DHAS_BIAS=1/")
    fi
  done
  ptx_rebuilds "$name" attention_mma "$planted.ptx" "${attention[@]}"
  ptx_rebuilds "$name" matmul_mma "$planted.ptx" "${matmul[@]}"
  rm -rf "$planted" "$planted.ptx"
  # The other vendors' matrix units, as a GPU that has one builds the subgroup-tile programs
  # (matmul_mma, attention_units, the probes): Intel's dpas (dg2-g10, pvc), AMD's WMMA (gfx1100)
  # and MFMA (gfx90a); a test per target, each build carrying its instruction, and one that
  # attention_units was among them (the dump must hold it: the attention tests force it).
  timeout "$2" python3 "$root/tools/compile_programs.py" "$dump" --native \
    >"$logs/$name-native.log" 2>&1
  if grep -qE '^attention: [1-9][0-9]* of [0-9]+ programs on the subgroup tile' \
    "$logs/$name-native.log"; then
    lane_p=$((lane_p + 1))
  else
    echo "[$name] FAIL no attention_units program among the matrix-unit rebuilds;" \
      "see $logs/$name-native.log"
    lane_f=$((lane_f + 1))
  fi
  grep -E -A4 '^FAIL' "$logs/$name-native.log" | head -20 | sed "s/^/[$name] /"
  target_results "$name" "$logs/$name-native.log" native 'builds carry the instruction'
  grep -E '^native .* spills' "$logs/$name-native.log" | sed "s/^/[$name] /"
  if [ "$result_lines" -ne 4 ]; then
    echo "[$name] FAIL the matrix-unit rebuilds reported $result_lines of 4 targets;" \
      "see $logs/$name-native.log"
    lane_f=$((lane_f + 1))
  fi
}

# ---- the loop --------------------------------------------------------------------------------
for wanted in ${CLATTN_LANES:-}; do
  if [[ " ${lane_names[*]} " != *" $wanted "* ]]; then
    echo "ci/test.sh: CLATTN_LANES names $wanted, which is no lane (${lane_names[*]})"
    failed=$((failed + 1))
  fi
done
# Two tracks of lanes run side by side, each lane after the one before it in its track, in the
# table's order: most lanes spend their time in one compiler's thread (PoCL's, Oclgrind's,
# clang's), so on two cores the two tracks take about the longer one's time, not the sum (1441 s
# against 2023 s serial, one run each; lanes run 1.2-1.8x slower beside another). Track b holds
# lanes that share no state with track a's: pocl-basic and the compile lane that reads its
# dump, rusticl, and two of Oclgrind's; they keep their PoCL cache apart (pocl-cache-b), so no
# two processes write one cache. Track a holds the rest: the pthread device's lanes share its
# cache, built by pocl-pthread first, and the other Oclgrind lanes, which even the tracks (with
# oclgrind-mha and oclgrind-reliability in b, a took 1409 s and b about 1650). Each lane's
# output goes to test-logs/NAME.out, printed whole when the lane ends; the summary follows the
# table's order.
track_b=(pocl-basic compile rusticl oclgrind oclgrind-linear)
for name in "${track_b[@]}"; do
  if [[ " ${lane_names[*]} " != *" $name "* ]]; then
    echo "ci/test.sh: track b names $name, which is no lane"
    failed=$((failed + 1))
  fi
done

selected() { [[ -z ${CLATTN_LANES:-} || " $CLATTN_LANES " == *" $1 "* ]]; }
track_of() { if [[ " ${track_b[*]} " == *" $1 "* ]]; then echo b; else echo a; fi; }

# run_lane I: lane I of the table, its output into test-logs/NAME.out (then printed) and its
# seconds and counts into test-logs/NAME.result.
run_lane() {
  local i=$1 name=${lane_names[$1]} start=$SECONDS seconds
  eval "lane_env=(${lane_envs[i]})"
  lane_p=0 lane_f=0 lane_s=0
  {
    echo "== lane $name"
    "lane_${lane_kinds[i]}" "$name" "${lane_timeouts[i]}" "${lane_selectors[i]}"
    seconds=$((SECONDS - start))
    echo "[$name] $lane_p passed, $lane_f failed, $lane_s skipped (${seconds} s)"
  } >"$logs/$name.out" 2>&1
  echo "$seconds $lane_p $lane_f $lane_s" >"$logs/$name.result"
  cat "$logs/$name.out"
}

# run_track a|b: the selected lanes of that track, in the table's order.
run_track() {
  local i name
  for i in "${!lane_names[@]}"; do
    name=${lane_names[i]}
    selected "$name" && [ "$(track_of "$name")" = "$1" ] || continue
    run_lane "$i"
  done
}

for name in "${lane_names[@]}"; do rm -f "$logs/$name.result"; done
(
  export POCL_CACHE_DIR="$root/$build/pocl-cache-b"
  mkdir -p "$POCL_CACHE_DIR"
  run_track b
) &
run_track a
wait

for i in "${!lane_names[@]}"; do
  name=${lane_names[i]}
  selected "$name" || continue
  if ! read -r seconds lane_p lane_f lane_s <"$logs/$name.result" 2>/dev/null; then
    echo "[$name] left no result (its track broke off)"
    seconds=0 lane_p=0 lane_f=1 lane_s=0
  fi
  summary+=("$(printf '%-22s %8d %7d %7d %7d' "$name" "$seconds" "$lane_p" "$lane_f" "$lane_s")")
  passed=$((passed + lane_p)) failed=$((failed + lane_f)) skipped=$((skipped + lane_s))
done

finish
