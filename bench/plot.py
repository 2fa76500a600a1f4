#!/usr/bin/python3
"""Draws clattn-bench JSON files as PNG charts.

    bench/plot.py bench/results/bench.json [other.json ...] [--out bench/results]

vs_torch.png   per case, one bar per device: PyTorch's time (on the CPU, or where
               CLATTN_PEER_DEVICE put it) over clattn's (log
               scale; above the line at 1, clattn is faster)
roofline.png   per case, one bar per device: percent of that device's own ceiling, the copy
               kernel for memory-bound ops (GB/s) and the FMA kernel for compute-bound ones
               (GFLOP/s), both measured by clattn-bench beside the row
"""
import argparse
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import matplotlib.ticker  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from compare import load_all, peer_label  # noqa: E402


def case_label(case):
    op, variant, dtype, shape = case
    return "%s %s %s  %s" % (op, variant, dtype, shape)


def bars(rows, devices, value, title, xlabel, path, log=False, line=None):
    """One group of horizontal bars per case (value(record), or None to leave a gap), one bar
    per device; the cases read top to bottom in the order the benchmark ran them."""
    cases = [c for c, per in rows.items() if any(value(per.get(d)) is not None for d in devices)]
    if not cases:
        return False
    height = 0.8 / max(len(devices), 1)
    fig, ax = plt.subplots(figsize=(11, 1.5 + 0.28 * len(cases) * max(1, len(devices) ** 0.5)))
    for k, device in enumerate(devices):
        ys, xs = [], []
        for i, case in enumerate(cases):
            x = value(rows[case].get(device))
            if x is not None:
                ys.append(i + (k - (len(devices) - 1) / 2) * height)
                xs.append(x)
        ax.barh(ys, xs, height, label=device)
    if line is not None:
        ax.axvline(line, color="black", linewidth=0.8)
    if log:
        ax.set_xscale("log")
        ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: "%gx" % v))
    ax.set_yticks(range(len(cases)))
    ax.set_yticklabels([case_label(c) for c in cases], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel(xlabel)
    ax.set_title(title)
    ax.grid(axis="x", linewidth=0.3)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def vs_torch(record):
    if record is None or record.get("check") in ("wrong", "ablated"):
        return None
    return record.get("peer_ratio", {}).get("torch")


def roofline(record):
    if record is None or record.get("check") in ("wrong", "ablated"):
        return None
    return record["roofline_pct"]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("json", nargs="+")
    parser.add_argument("--out", default=None, help="folder of the PNGs (default: the first JSON's)")
    args = parser.parse_args(argv)
    devices, rows, info = load_all(args.json)
    out = args.out or os.path.dirname(os.path.abspath(args.json[0]))
    os.makedirs(out, exist_ok=True)
    written = []
    path = os.path.join(out, "vs_torch.png")
    peer = peer_label(info)
    if bars(rows, devices, vs_torch, "clattn against %s (same machine, same run)" % peer,
            "PyTorch time / clattn time (log; > 1: clattn faster)", path, log=True, line=1.0):
        written.append(path)
    path = os.path.join(out, "roofline.png")
    if bars(rows, devices, roofline, "Percent of each device's own ceiling (copy GB/s or FMA GFLOP/s)",
            "% of the device's measured ceiling", path):
        written.append(path)
    for p in written:
        print(p)
    return 0 if written else 1


if __name__ == "__main__":
    sys.exit(main())
