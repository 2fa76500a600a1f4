#!/usr/bin/python3
"""The Python binding's overhead: the chain split_qkv -> attention -> merge_heads at a small shape
(default B=1 S=128 E=256 H=4, float32), the same three ops enqueued

  - from C (bench/chain.c, loaded with ctypes, on the binding's own library and buffers),
  - from Python on device tensors (clattn.Tensor: new outputs each op, nothing downloaded),
  - from Python with numpy arrays in and out (an upload and a download around every op),

each chain waited for (clFinish, ctx.finish(), or the blocking download). The three alternate in
rounds of a few chains each, so all see the same machine; the results of the three chains are
compared bit for bit before anything is timed.

    PYTHONPATH=python /usr/bin/python3 bench/bench_python.py [--device SPEC] [--rounds N]
        [--shape B,S,E,H] [--json FILE]

CLATTN_LIBRARY picks the library (default: the build tree's), --helper the C chain's module
(default: build/bench/libclattn_bench_chain.so)."""
import argparse
import ctypes
import json
import os
import statistics
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "python"))
import clattn  # noqa: E402  (the path above)
from clattn import _lib  # noqa: E402


def load_helper(path):
    helper = ctypes.CDLL(path)
    helper.clattn_bench_chain.restype = ctypes.c_int
    helper.clattn_bench_chain.argtypes = [
        ctypes.c_void_p, ctypes.POINTER(_lib.Tensor), ctypes.c_int, ctypes.POINTER(_lib.Tensor),
        ctypes.POINTER(_lib.Tensor), ctypes.c_int, ctypes.POINTER(ctypes.c_double)]
    return helper


class Chains:
    """The three chains on one Context and one input."""

    def __init__(self, ctx, helper, b, s, e, h):
        self.ctx, self.helper, self.heads = ctx, helper, h
        self.host = np.random.default_rng(1).standard_normal((b, s, 3 * e)).astype(np.float32)
        self.x = ctx.tensor(self.host)
        d = e // h
        self.qkvo = [ctx.empty((b, h, s, d)) for _ in range(4)]
        self.merged = ctx.empty((b, s, e))
        self.descs = (_lib.Tensor * 4)(*(t._desc for t in self.qkvo))
        self.x4 = self.x.reshape(1, b, s, 3 * e)
        self.m4 = self.merged.reshape(1, b, s, e)

    def c(self, count):
        times = (ctypes.c_double * count)()
        status = self.helper.clattn_bench_chain(
            self.ctx._queue(), ctypes.byref(self.x4._desc), self.heads, self.descs,
            ctypes.byref(self.m4._desc), count, times)
        if status != 0:
            raise clattn.Error(str(status), "the C chain failed")
        return list(times)

    def tensors(self, count):
        return self._python_chain(count, self.x, self.ctx.finish)

    def numpy(self, count):  # the last download blocks: nothing more to wait for
        return self._python_chain(count, self.host, lambda: None)

    def _python_chain(self, count, x, wait):
        times = []
        ctx = self.ctx
        for _ in range(count):
            start = time.perf_counter()
            merged = ctx.merge_heads(ctx.attention(*ctx.split_qkv(x, self.heads)))
            wait()
            times.append((time.perf_counter() - start) * 1e3)
        self.last = merged
        return times


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default=None)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--per-round", type=int, default=10)
    parser.add_argument("--shape", default="1,128,256,4", help="B,S,E,H")
    parser.add_argument("--helper", default=os.path.join(
        ROOT, os.environ.get("CLATTN_BUILD_DIR", "build"), "bench",
        "libclattn_bench_chain.so"))
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    b, s, e, h = (int(n) for n in args.shape.split(","))
    helper = load_helper(args.helper)
    with clattn.Context(args.device) as ctx:
        chains = Chains(ctx, helper, b, s, e, h)
        names = {"c": "C", "tensors": "Python, device tensors", "numpy": "Python, numpy in/out"}
        results = {}
        for name in names:  # first calls (program builds), then the same result from each
            getattr(chains, name)(2)
            results[name] = (chains.merged if name == "c" else chains.last)
        check = np.array_equal(results["c"].numpy(), results["tensors"].numpy()) and \
            np.array_equal(results["c"].numpy(), results["numpy"])
        times = {name: [] for name in names}
        for _ in range(args.rounds):
            for name in names:
                times[name] += getattr(chains, name)(args.per_round)
        median = {n: statistics.median(t) for n, t in times.items()}
        shape = "B=%d S=%d E=%d H=%d f32" % (b, s, e, h)
        print("device: %s" % ctx.device)
        print("chain split_qkv -> attention -> merge_heads, %s, %d chains each, results %s"
              % (shape, len(times["c"]), "equal" if check else "DIFFER"))
        print("%-26s %10s %10s %10s" % ("from", "median_ms", "min_ms", "vs C"))
        for name, label in names.items():
            print("%-26s %10.3f %10.3f %9.2fx" % (label, median[name], min(times[name]),
                                                 median[name] / median["c"]))
        print("numpy in/out takes %.2fx the device tensors' time"
              % (median["numpy"] / median["tensors"]))
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"device": ctx.device, "shape": shape, "check": "ok" if check else "wrong",
                           "chains": len(times["c"]),
                           "median_ms": median, "min_ms": {n: min(t) for n, t in times.items()}},
                          f, indent=1)
    return 0 if check else 1


if __name__ == "__main__":
    sys.exit(main())
