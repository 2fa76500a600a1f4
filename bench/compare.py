#!/usr/bin/python3
"""Joins clattn-bench JSON files (one or many machines) into one vendor table.

    bench/compare.py bench/results/bench.json [other.json ...] [--markdown]

First a line per device (driver, ceilings, launch latency, cold start), then one row per case
(op, variant, dtype, shape) and one column per device: its value (GB/s or GFLOP/s), its percent
of that device's own ceiling, and its speed over PyTorch's on the CPU of the machine that ran it
(> 1: clattn is faster); the last column is PyTorch's own time. Devices of the same name from
different files are told apart by the file's name.
"""
import argparse
import json
import os
import sys


def load(paths):
    """(devices, rows): device labels in order of appearance, and {case: {device: record}}."""
    devices, rows, _ = load_all(paths)
    return devices, rows


def load_all(paths):
    """load(), and the device entries of every file keyed by their label."""
    devices, rows, info = [], {}, {}
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
            # a labelled record (tools/gpu_session.sh: one per row) is its own case
            variant = r["variant"] + (" " + r["label"] if r.get("label") else "")
            case = (r["op"], variant, r["dtype"], r["shape"])
            rows.setdefault(case, {})[label] = r
        for d in data.get("devices", []):
            label = short(d["device"])
            if len(seen.get(d["device"], ())) > 1:
                label += " (%s)" % tag
            info[label] = d
    return devices, rows, info


def cell(record):
    if record is None:
        return "-"
    if record.get("check") == "wrong":
        return "WRONG"
    text = "%.1f %s (%.0f%%)" % (record["value"], record["metric"], record["roofline_pct"])
    if record.get("check") == "ablated":  # wrong, timed for an ablation (--time-wrong)
        text += " ablated"
    torch = record.get("peer_ratio", {}).get("torch")
    if torch is not None:
        text += " %.2fx torch" % torch
    return text


def torch_cell(per):
    """PyTorch's median for the case (the first file's that measured it)."""
    for record in per.values():
        ms = record.get("peer_ms", {}).get("torch")
        if ms is not None:
            return "%.3f ms" % ms
    return "-"


def device_line(label, d):
    first = d.get("first_calls_ms") or {}
    cold = lambda v: "-" if v is None else "%.0f ms" % v
    matrix = d.get("matrix_gflops") or 0
    return ("%s: %s %s, driver %s, %s; copy %.1f GB/s, FMA %.1f GFLOP/s%s, launch %.0f us; first "
            "calls %s (driver cache warm), %s (empty)"
            % (label, d.get("platform", "?"), d.get("type", "?"), d.get("driver", "?"),
               d.get("opencl_c", "?"), d.get("copy_gbs", 0), d.get("fma_gflops", 0),
               ", matrix f16 %.1f GFLOP/s" % matrix if matrix else "",
               d.get("launch_us", 0), cold(first.get("warm_cache")), cold(first.get("empty_cache"))))


def peer_label(info):
    """The PyTorch column's title: where the peer ran (CLATTN_PEER_DEVICE, recorded per file;
    files older than that field ran it on the CPU)."""
    where = sorted({d.get("peer_device", "cpu") for d in info.values()}) or ["cpu"]
    return "PyTorch " + "/".join(w.upper() for w in where)


def short(name, width=28):
    return name if len(name) <= width else name[: width - 1] + "~"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("json", nargs="+")
    parser.add_argument("--markdown", action="store_true", help="a Markdown table")
    args = parser.parse_args(argv)
    devices, rows, info = load_all(args.json)
    if not rows:
        print("no records in %s" % ", ".join(args.json), file=sys.stderr)
        return 1
    for label in devices:
        if label in info:
            print(("- " if args.markdown else "") + device_line(label, info[label]))
    print()
    header = ["op", "variant", "dtype", "shape"] + devices + [peer_label(info)]
    lines = [header] + [list(case) + [cell(per.get(d)) for d in devices] + [torch_cell(per)]
                        for case, per in rows.items()]
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
