#!/usr/bin/env python3
"""Builds the programs clattn dumped (CLATTN_DUMP_PROGRAMS) with other vendors' compilers, offline.

    python3 tools/compile_programs.py DUMP_DIR [--all] [--targets T,T] [--jobs N] [--table FILE]
    python3 tools/compile_programs.py DUMP_DIR --native [--all] [--targets T,T] [--jobs N]

DUMP_DIR holds <op>-<hash>.cl and <op>-<hash>.options pairs: each program's source text and
build options exactly as a device's driver got them. Each one is built for every target of
TARGETS: Intel's offline compiler (ocloc, from Debian's intel-opencl-icd) for three Intel GPU
generations, and clang for two AMD GPUs and NVIDIA's PTX, linked with libclc (Debian's libclc-15)
as a driver links its own built-ins. Any error fails the run (exit 1), printed with the
compiler's message; it names the kernel file and line (the dump keeps clattn's #line marks).
The last lines say, per target, how many programs built, then the total.

By default each op's programs are first reduced to a cover: the fewest programs (greedy) among
which every build option value of that op's programs appears (of the sizes, head dims and tile
counts, the smallest and largest), since an Intel build of the attention file takes seconds per
GPU generation. --all builds every program.

The resource table: for each kernel and target, the worst case over the programs built (most
registers, scratch and spills, least occupancy). AMD's numbers come from clang's
kernel-resource-usage remarks, Intel's from ocloc's spill warnings (the registers the build IGC
keeps spilled, 32 bytes each on dg2-g10 and tgllp, 64 on pvc; a kernel that does not spill gets
none, so 0); clang prints none for NVPTX (no ptxas here). --table FILE writes it as
Markdown.

--native builds the programs a GPU with a matrix unit builds instead, which no CPU lane dumps: each
dumped program on cl/mma.cl's subgroup tile in its emulated NVIDIA build (-DMMA_UNIT=1
-DMMA_NATIVE=0: matmul_mma, the probes) rebuilt with the native mechanism of each target that has
one (NATIVE: Intel's dpas in subgroups of 8 and 16, AMD's WMMA and MFMA; NVIDIA's PTX is
ci/test.sh's ptx_rebuilds), with the build macros of the target vendor's tuning row where it has
one (Intel's 16 x 16 matmul tiles and 16-key attention tiles, not the NVIDIA-sized ones the
emulation was dumped with), matmul_mma with b in both layouts; each build must succeed and its
machine code carry the instruction (Intel's from IGC's shader dump, AMD's assembly). ocloc does not
enable cl_intel_subgroup_matrix_multiply_accumulate for an offline device, so the build defines the
macro a driver defines where its device reports the extension.
"""
import argparse
import collections
import concurrent.futures
import os
import re
import shutil
import subprocess
import sys
import tempfile

LIBCLC = "/usr/lib/clc"
CLANG = "clang-15"  # the first Debian clang whose AMDGPU back end prints resource remarks
CLANG_COMMON = ["-x", "cl", "-cl-std=CL1.2", "-nogpulib", "-O2",
                "-Xclang", "-finclude-default-header"]

# name: (kind, compiler arguments)
TARGETS = {
    "dg2-g10": ("ocloc", ["-device", "dg2-g10"]),  # Arc A770 (Xe-HPG)
    "pvc": ("ocloc", ["-device", "pvc"]),          # Data Center GPU Max (Xe-HPC)
    "tgllp": ("ocloc", ["-device", "tgllp"]),      # Tiger Lake integrated (Xe-LP)
    "gfx90a": ("amdgcn", ["-target", "amdgcn-unknown-amdhsa", "-mcpu=gfx90a"]),    # MI200
    "gfx1100": ("amdgcn", ["-target", "amdgcn-unknown-amdhsa", "-mcpu=gfx1100"]),  # RX 7900
    "sm_80": ("nvptx", ["-target", "nvptx64-unknown-nvidiacl", "-march=sm_80"]),   # A100 class
}
LIBCLC_OF = {"amdgcn": "amdgcn--amdhsa.bc", "nvptx": "nvptx64--nvidiacl.bc"}

# target: (cl/mma.cl's MMA_UNIT for its matrix unit, what its machine code must then carry)
NATIVE = {
    "dg2-g10": (4, r"dpas\.8x8 \(8\|M0\)"),
    "pvc": (5, r"dpas\.8x8 \(16\|M0\)"),
    "gfx1100": (2, r"v_wmma_f32_16x16x16_b?f16"),
    "gfx90a": (3, r"v_mfma_f32_16x16x16(f16|bf16_1k)"),
}
INTEL_MATRIX_MACRO = "-Dcl_intel_subgroup_matrix_multiply_accumulate"
# The vendor (CL_DEVICE_VENDOR) whose tuning rows a target's device reads.
VENDOR = {"dg2-g10": "Intel(R) Corporation", "pvc": "Intel(R) Corporation",
          "tgllp": "Intel(R) Corporation", "gfx90a": "Advanced Micro Devices, Inc.",
          "gfx1100": "Advanced Micro Devices, Inc."}
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def vendor_rows():
    """{(op, vendor): {build macro: value}}: the tuning table's vendor:<vendor>/gpu rows
    (src/runtime/tuning_table.def), each parameter as the build macro tuning_params.h names
    for it (HOST parameters left out)."""
    with open(os.path.join(ROOT, "src/runtime/tuning_params.h")) as f:
        params = f.read()
    with open(os.path.join(ROOT, "src/runtime/tuning_table.def")) as f:
        table = f.read()
    macros = {}
    for op, block in re.findall(r"OP\((\w+), (CLATTN__TUNING_\w+), \d\)", params):
        body = re.search(r"#define " + block + r"\(X\)(.*?)\n\n", params, re.S).group(1)
        macros[op] = dict(re.findall(r"X\((\w+), [^,]+, [^,]+, [^,]+, (\w+)\)", body))
    rows = {}
    for op, vendor, values in re.findall(
            r'TUNING_ROW\("(\w+)", "\*", "vendor:([^/"]+)/gpu", "([^"]*)"\)', table):
        pairs = (p.split("=") for p in values.split(","))
        rows[(op, vendor)] = {macros[op][k]: v for k, v in pairs
                              if macros[op].get(k, "HOST") != "HOST"}
    return rows


def as_vendor_builds(options, op, target, rows):
    """The program's options with the build macros the target's vendor row sets (only those the
    program has): the tiles that vendor's GPU builds, not the emulation's NVIDIA-sized ones."""
    row = rows.get((op, VENDOR.get(target)), {})
    return [f"-D{macro_of(o)}={row[macro_of(o)]}" if macro_of(o) in row else o for o in options]


def macro_of(option):
    """The macro a -DNAME=VALUE option defines (None for other options)."""
    return option[2:].split("=")[0] if option.startswith("-D") else None

AMD_REMARK = re.compile(r"remark: +(Function Name|SGPRs|VGPRs|ScratchSize \[bytes/lane\]|"
                        r"Occupancy \[waves/SIMD\]|VGPRs Spill|LDS Size \[bytes/block\]): (\S+)")
INTEL_SPILL = re.compile(r"kernel (\w+) +compiled SIMD(\d+) allocated (\d+) regs and spilled "
                         r"around (\d+)")
KERNEL = re.compile(r"__kernel\s+(?:__attribute__\(\(.*?\)\)\s+)?void\s+(\w+)\s*\(", re.S)
ERROR = re.compile(r"error|Build failed", re.I)  # the lines a failure prints


def programs(folder):
    """{op: {stem: [option, ...]}} for every source/options pair in folder."""
    found = collections.defaultdict(dict)
    for name in sorted(os.listdir(folder)):
        if name.endswith(".options"):
            stem = name[: -len(".options")]
            if os.path.exists(os.path.join(folder, stem + ".cl")):
                with open(os.path.join(folder, name)) as f:
                    found[stem.rsplit("-", 1)[0]][stem] = f.read().split()
    return found


# Options that size arrays and loops rather than choose code: the cover needs only their
# smallest and largest values (the compilers differ between sizes in registers and spills, whose
# worst case the largest shows), not every value the tests happened to use.
SIZES = tuple("-D%s=" % name for name in ("HEAD_DIM", "VALUE_DIM", "BM", "BN", "TK", "ROWS",
                                            "BR", "BC", "BQ", "TS", "STEP_TOKENS", "STEP_HEADS",
                                            "LANE_TILES", "KEY_TILES"))


def cover(options_of):
    """The stems of a greedy cover: every option value of any program is in a chosen one (of
    the SIZES options, the smallest and the largest value)."""
    values = collections.defaultdict(set)
    for options in options_of.values():
        for o in options:
            if o.startswith(SIZES):
                values[o.split("=")[0]].add(int(o.split("=")[1]))
    ends = {name: {min(v), max(v)} for name, v in values.items()}
    needed = lambda o: not o.startswith(SIZES) or int(o.split("=")[1]) in ends[o.split("=")[0]]
    options_of = {stem: [o for o in options if needed(o)] for stem, options in options_of.items()}
    left, chosen = set().union(*map(set, options_of.values())), []
    while left:
        best = max(sorted(options_of), key=lambda s: len(left & set(options_of[s])))
        chosen.append(best)
        left -= set(options_of[best])
    return chosen


def command(target, source, options, out_dir, assembly=False):
    """The build's argv; clang writes out_dir/out (AMD: an object, or with `assembly` the
    assembly text out.s; NVIDIA: PTX)."""
    kind, args = TARGETS[target]
    if kind == "ocloc":
        return ["ocloc", "compile", "-file", source, *args, "-options", " ".join(options),
                "-out_dir", out_dir]
    libclc = ["-Xclang", "-mlink-builtin-bitcode", "-Xclang",
              os.path.join(LIBCLC, LIBCLC_OF[kind])]
    remarks = ["-Rpass-analysis=kernel-resource-usage"] if kind == "amdgcn" else []
    output = ["-S", source, "-o", os.path.join(out_dir, "out.s")] if assembly else \
        ["-c" if kind == "amdgcn" else "-S", source, "-o", os.path.join(out_dir, "out")]
    return [CLANG, *CLANG_COMMON, *args, *libclc, *remarks, "-Wno-linker-warnings", *options,
            *output]


def build(folder, stem, options, target):
    """(stem, target, ok, output, {kernel: {measure: value}})"""
    with tempfile.TemporaryDirectory() as out_dir:
        run = subprocess.run(command(target, os.path.join(folder, stem + ".cl"), options, out_dir),
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    text = run.stdout
    ok = run.returncode == 0 and "Build failed" not in text
    resources = collections.defaultdict(dict)
    kernel = None
    for measure, value in AMD_REMARK.findall(text):
        if measure == "Function Name":
            kernel = value
        elif kernel:
            resources[kernel][measure.split(" ")[0] if "Spill" not in measure else "Spill"] = \
                int(value)
    for name, simd, regs, spill in INTEL_SPILL.findall(text):
        resources[name]["Spill"] = int(spill)
        resources[name]["SIMD"] = int(simd)
    return stem, target, ok, text, resources


INTEL_GRF_BYTES = {"dg2-g10": 32, "pvc": 64, "tgllp": 32}  # a register of a thread (SIMD lanes)
AMD_SCRATCH = re.compile(r"ScratchSize \[bytes/lane\]: (\d+)")


def intel_spills(target, text):
    """Bytes a thread each kernel spills in the build IGC keeps, from ocloc's warning (registers):
    IGC compiles a kernel that spills again with other settings and keeps the better build, and
    its shader dump holds every attempt (OCL_asm<hash>_simd16... and _1_simd16...), so the
    dump's first `.spill size` is not what runs."""
    return [int(spill) * INTEL_GRF_BYTES[target] for *_, spill in INTEL_SPILL.findall(text)]


def native_build(folder, stem, options, target):
    """(stem, target, ok, output, spill): the program rebuilt with the target's native matrix
    unit; spill: the most bytes its kernels spill (Intel, a thread) or scratch (AMD, a lane)."""
    unit, instruction = NATIVE[target]
    options = [o for o in options if not o.startswith(("-DMMA_UNIT=", "-DMMA_NATIVE="))]
    options += [f"-DMMA_UNIT={unit}", "-DMMA_NATIVE=1"]
    kind = TARGETS[target][0]
    source = os.path.join(folder, stem + ".cl")
    with tempfile.TemporaryDirectory() as out_dir:
        env = dict(os.environ)
        if kind == "ocloc":
            options.append(INTEL_MATRIX_MACRO)
            env.update(IGC_ShaderDumpEnable="1", IGC_DumpToCustomDir=out_dir)
        argv = command(target, source, options, out_dir, assembly=True)
        run = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             env=env)
        code = ""
        for name in os.listdir(out_dir):
            if name.endswith((".asm", ".s")):
                with open(os.path.join(out_dir, name), errors="replace") as f:
                    code += f.read()
    ok = run.returncode == 0 and "Build failed" not in run.stdout
    text = run.stdout
    if ok and not re.search(instruction, code):
        ok, text = False, f"{text}\nbuilt, but the machine code lacks {instruction}"
    spills = intel_spills(target, text) if kind == "ocloc" else []
    spills += map(int, AMD_SCRATCH.findall(text))
    return stem, target, ok, text, max(spills, default=0)


def native_main(args, targets, found):
    """--native: every emulated tile program rebuilt per target with its unit; 1 on a failure."""
    targets = [t for t in targets if t in NATIVE]
    jobs, rows = [], vendor_rows()
    for op in sorted(found):
        # (f32's tf32 probe is NVIDIA's warp products, no subgroup tile: no other unit has it)
        eligible = {stem: o for stem, o in found[op].items()
                    if "-DMMA_UNIT=1" in o and "-DMMA_NATIVE=0" in o and "-DMMA_T=f32" not in o}
        if not eligible:
            continue
        stems = sorted(eligible) if args.all else cover(eligible)
        print(f"{op}: {len(stems)} of {len(eligible)} programs on the subgroup tile")
        for stem in stems:
            layouts = [eligible[stem]]
            if "-DTRANS_B=1" in eligible[stem]:  # matmul_mma's b k-major too
                layouts.append([o.replace("-DTRANS_B=1", "-DTRANS_B=0") for o in eligible[stem]])
            jobs += [(stem, as_vendor_builds(options, op, t, rows), t) for options in layouts
                     for t in targets]
    if not jobs:
        print("compile_programs: no program on the subgroup tile")
        return 1
    results, worst = [], {}
    with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
        for stem, target, ok, text, spill in pool.map(lambda j: native_build(args.folder, *j),
                                                      jobs):
            results.append((target, ok))
            if ok and spill >= worst.get(target, (0, ""))[0]:
                worst[target] = (spill, stem)
            if not ok:
                print(f"FAIL {stem} for {target} with its matrix unit:")
                print("\n".join(line for line in text.splitlines()
                                if ERROR.search(line) or "lacks" in line)[:3000])
    for t in targets:
        built = sum(1 for target, ok in results if target == t and ok)
        count = sum(1 for target, _ in results if target == t)
        print(f"native {t}: {built} of {count} builds carry the instruction")
        if t in worst:
            unit = "bytes a thread" if TARGETS[t][0] == "ocloc" else "bytes a lane"
            print(f"native {t} spills: at most {worst[t][0]} {unit} ({worst[t][1]})")
    failures = sum(1 for _, ok in results if not ok)
    return 1 if failures else 0


def kernels_of(folder, results):
    """{stem: the kernels its program holds}: those AMD's compiler reported (the source text also
    has kernels its build options leave out), else every __kernel of the text."""
    emitted = collections.defaultdict(set)
    for stem, target, ok, _, resources in results:
        if ok and TARGETS[target][0] == "amdgcn":
            emitted[stem].update(resources)
    held = {}
    for stem in {r[0] for r in results}:
        if emitted[stem]:
            held[stem] = sorted(emitted[stem])
        else:
            with open(os.path.join(folder, stem + ".cl")) as f:
                held[stem] = KERNEL.findall(f.read())
    return held


WORST = {"SGPRs": max, "VGPRs": max, "ScratchSize": max, "Occupancy": min, "Spill": max,
         "LDS": max, "SIMD": min}


def table(results, folder, targets):
    """Markdown rows: kernel, then per target its worst case over the programs built."""
    worst = collections.defaultdict(dict)  # (kernel, target) -> measure -> value
    seen = collections.Counter()
    held = kernels_of(folder, results)
    for stem, target, ok, _, resources in results:
        if not ok:
            continue
        names = held[stem]
        if target == targets[0]:
            seen.update(names)
        for name in names:
            cell = worst[(name, target)]
            measured = dict(resources.get(name, {}))
            if TARGETS[target][0] == "ocloc":
                measured.setdefault("Spill", 0)
            for measure, value in measured.items():
                cell[measure] = WORST[measure](cell.get(measure, value), value)
    amd = [t for t in targets if TARGETS[t][0] == "amdgcn"]
    intel = [t for t in targets if TARGETS[t][0] == "ocloc"]
    head = ["kernel", "programs"]
    head += [f"{t} VGPRs / scratch B / spills / waves" for t in amd]
    head += [f"{t} spill" for t in intel]
    rows = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for name in sorted(seen):
        cells = [f"`{name}`", str(seen[name])]
        for t in amd:
            c = worst[(name, t)]
            cells.append(f"{c.get('VGPRs', '?')} / {c.get('ScratchSize', '?')} / "
                         f"{c.get('Spill', '?')} / {c.get('Occupancy', '?')}")
        for t in intel:
            c = worst[(name, t)]
            cells.append(str(c.get("Spill", "?")))
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("folder")
    parser.add_argument("--all", action="store_true", help="every program, not each op's cover")
    parser.add_argument("--targets", default=",".join(TARGETS))
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--table", help="write the resource table (Markdown) to this file")
    parser.add_argument("--native", action="store_true",
                        help="rebuild the subgroup-tile programs with each target's matrix unit")
    args = parser.parse_args()
    targets = args.targets.split(",")
    unknown = [t for t in targets if t not in TARGETS]
    missing = sorted({"ocloc" if TARGETS[t][0] == "ocloc" else CLANG
                      for t in targets if t in TARGETS} - {c for c in ("ocloc", CLANG)
                                                          if shutil.which(c)})
    missing += [f"{LIBCLC}/{LIBCLC_OF[TARGETS[t][0]]}" for t in targets
                if t in TARGETS and TARGETS[t][0] in LIBCLC_OF
                and not os.path.exists(os.path.join(LIBCLC, LIBCLC_OF[TARGETS[t][0]]))]
    if unknown or missing:
        print(f"compile_programs: unknown targets {unknown}, missing {sorted(set(missing))}")
        return 1
    found = programs(args.folder)
    if not found:
        print(f"compile_programs: no dumped program in {args.folder}")
        return 1
    if args.native:
        return native_main(args, targets, found)
    chosen = []
    for op in sorted(found):
        stems = sorted(found[op]) if args.all else cover(found[op])
        chosen += [(stem, found[op][stem]) for stem in stems]
        print(f"{op}: {len(stems)} of {len(found[op])} programs")
    # the largest sources first, so that the slowest builds do not end the run alone
    jobs = sorted(((stem, options, t) for stem, options in chosen for t in targets),
                  key=lambda j: -os.path.getsize(os.path.join(args.folder, j[0] + ".cl")))
    results, failures = [], 0
    with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
        for result in pool.map(lambda j: build(args.folder, *j), jobs):
            results.append(result)
            stem, target, ok, text, _ = result
            if not ok:
                failures += 1
                print(f"FAIL {stem} for {target}:")
                print("\n".join(line for line in text.splitlines() if ERROR.search(line))[:3000])
    resources = table(results, args.folder, targets)
    print(resources)
    if args.table:
        with open(args.table, "w") as f:
            f.write(resources + "\n")
    for t in targets:
        built = sum(1 for _, target, ok, _, _ in results if target == t and ok)
        print(f"target {t}: {built} of {len(chosen)} programs built")
    print(f"{len(chosen)} programs x {len(targets)} targets: {len(jobs) - failures} built, "
          f"{failures} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
