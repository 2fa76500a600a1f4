#!/usr/bin/python3
"""Joins clattn-bench JSON files (one or many machines) into one vendor table.

    bench/compare.py bench/results/bench.json [other.json ...] [--markdown]

One row per case (op, variant, dtype, shape), one column per device: its value (GB/s or
GFLOP/s), its percent of that device's own ceiling, and its speed over PyTorch's on the CPU of
the machine that ran it (> 1: clattn is faster). Devices of the same name from different files
are told apart by the file's name.
"""
import argparse
import json
import os
import sys


def load(paths):
    """(devices, rows): device labels in order of appearance, and {case: {device: record}}."""
    devices, rows = [], {}
    names = [json.load(open(p)) for p in paths]
    seen = {}
    for path, data in zip(paths, names):
        for d in data.get("devices", []):
            seen.setdefault(d["device"], set()).add(path)
    for path, data in zip(paths, names):
        tag = os.path.splitext(os.path.basename(path))[0]
        for r in data.get("records", []):
            label = short(r["device"])
            if len(seen.get(r["device"], ())) > 1:
                label += " (%s)" % tag
            if label not in devices:
                devices.append(label)
            case = (r["op"], r["variant"], r["dtype"], r["shape"])
            rows.setdefault(case, {})[label] = r
    return devices, rows


def cell(record):
    if record is None:
        return "-"
    if record.get("check") == "wrong":
        return "WRONG"
    text = "%.1f %s (%.0f%%)" % (record["value"], record["metric"], record["roofline_pct"])
    torch = record.get("peer_ratio", {}).get("torch")
    if torch is not None:
        text += " %.2fx torch" % torch
    return text


def short(name, width=28):
    return name if len(name) <= width else name[: width - 1] + "~"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("json", nargs="+")
    parser.add_argument("--markdown", action="store_true", help="a Markdown table")
    args = parser.parse_args(argv)
    devices, rows = load(args.json)
    if not rows:
        print("no records in %s" % ", ".join(args.json), file=sys.stderr)
        return 1
    header = ["op", "variant", "dtype", "shape"] + devices
    lines = [header] + [list(case) + [cell(per.get(d)) for d in devices] for case, per in rows.items()]
    if args.markdown:
        print("| " + " | ".join(header) + " |")
        print("|" + " --- |" * len(header))
        for line in lines[1:]:
            print("| " + " | ".join(line) + " |")
        return 0
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    for line in lines:
        print("  ".join(text.ljust(w) for text, w in zip(line, widths)).rstrip())
    return 0


if __name__ == "__main__":
    sys.exit(main())
