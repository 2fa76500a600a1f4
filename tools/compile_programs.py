#!/usr/bin/env python3
"""Builds the programs clattn dumped (CLATTN_DUMP_PROGRAMS) with other vendors' compilers, offline.

    python3 tools/compile_programs.py DUMP_DIR [--all] [--targets T,T] [--jobs N] [--table FILE]

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
kernel-resource-usage remarks, Intel's from ocloc's spill warnings (a kernel that does not
spill gets none, so 0); clang prints none for NVPTX (no ptxas here). --table FILE writes it as
Markdown.
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
SIZES = tuple("-D%s=" % name for name in ("HEAD_DIM", "VALUE_DIM", "BM", "BN", "TK", "SPLITS",
                                            "ROWS"))


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


def command(target, source, options, out_dir):
    kind, args = TARGETS[target]
    if kind == "ocloc":
        return ["ocloc", "compile", "-file", source, *args, "-options", " ".join(options),
                "-out_dir", out_dir]
    libclc = ["-Xclang", "-mlink-builtin-bitcode", "-Xclang",
              os.path.join(LIBCLC, LIBCLC_OF[kind])]
    remarks = ["-Rpass-analysis=kernel-resource-usage"] if kind == "amdgcn" else []
    return [CLANG, *CLANG_COMMON, *args, *libclc, *remarks, "-Wno-linker-warnings", *options,
            "-c" if kind == "amdgcn" else "-S", source, "-o", os.path.join(out_dir, "out")]


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
