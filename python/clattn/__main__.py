"""python -m clattn devices | selftest [--device SPEC]

`selftest` runs every op that exists on the device against a numpy float64 reference and prints
the largest error of each: the check to run on a new GPU driver before trusting it."""
import argparse
import sys

import numpy as np

import clattn


def reference_softmax(x, scale, visible):
    s = np.where(visible, x.astype(np.float64) * scale, -np.inf)
    m = s.max(axis=-1, keepdims=True)
    e = np.where(visible, np.exp(s - np.where(np.isfinite(m), m, 0.0)), 0.0)
    total = e.sum(axis=-1, keepdims=True)
    return np.where(total > 0, e / np.where(total > 0, total, 1.0), 0.0)


def reference_attention(q, k, v, visible):
    s = q.astype(np.float64) @ k.astype(np.float64).transpose(0, 1, 3, 2) / np.sqrt(q.shape[-1])
    return reference_softmax(s, 1.0, visible) @ v.astype(np.float64)


def reference_linear(q, k, v, visible, eps=1e-6):
    phi = lambda t: np.where(t > 0, t + 1.0, np.exp(np.minimum(t, 0.0)))  # elu(x) + 1
    w = (phi(q.astype(np.float64)) @ phi(k.astype(np.float64)).transpose(0, 1, 3, 2)) * visible
    return (w @ v.astype(np.float64)) / (w.sum(-1, keepdims=True) + eps)


def reference_attention_grads(q, k, v, dout, visible):
    """dq, dk, dv of reference_attention (one kv head per query head) given dout."""
    q, k, v, dout = (a.astype(np.float64) for a in (q, k, v, dout))
    scale = 1.0 / np.sqrt(q.shape[-1])
    p = reference_softmax(q @ k.transpose(0, 1, 3, 2), scale, visible)
    dp = dout @ v.transpose(0, 1, 3, 2)
    ds = p * (dp - (dout * (p @ v)).sum(-1, keepdims=True))
    return scale * ds @ k, scale * ds.transpose(0, 1, 3, 2) @ q, p.transpose(0, 1, 3, 2) @ dout


def reference_linear_grads(q, k, v, dout, visible, eps=1e-6):
    """dq, dk, dv of reference_linear given dout."""
    q, k, v, dout = (a.astype(np.float64) for a in (q, k, v, dout))
    phi = lambda t: np.where(t > 0, t + 1.0, np.exp(np.minimum(t, 0.0)))
    slope = lambda t: np.where(t > 0, 1.0, np.exp(np.minimum(t, 0.0)))
    fq, fk = phi(q), phi(k)
    w = (fq @ fk.transpose(0, 1, 3, 2)) * visible
    den = w.sum(-1, keepdims=True) + eps
    dnum = dout / den
    dden = -(dout * (w @ v)).sum(-1, keepdims=True) / den ** 2
    dw = (dnum @ v.transpose(0, 1, 3, 2) + dden) * visible
    return (dw @ fk) * slope(q), (dw.transpose(0, 1, 3, 2) @ fq) * slope(k), w.transpose(0, 1, 3, 2) @ dnum


def relative_error(got, want):
    return np.abs(got - want).max() / max(np.abs(want).max(), 1e-30)


def selftest(device):
    rng = np.random.default_rng(0)
    rows = []
    with clattn.Context(device) as ctx:
        print("library:", clattn._lib_handle()._name)
        print("device:", ctx.device)
        b, h, sq, sk = 2, 3, 17, 33
        x = rng.standard_normal((b, h, sq, sk)).astype(np.float32)
        lengths = np.array([sk, 20])
        keys = np.arange(sk)
        visible = (keys[None, :] <= np.arange(sq)[:, None])[None, None] & (
            keys[None, None, None, :] < lengths[:, None, None, None])
        y = ctx.softmax(x, scale=0.5, causal=True, key_lengths=lengths)
        rows.append(("softmax (causal + key lengths)", np.abs(y - reference_softmax(x, 0.5, visible)).max(), 1e-5))
        packed = rng.standard_normal((b, 7, h * 8)).astype(np.float32)
        heads = ctx.split_heads(packed, h)
        expect = packed.reshape(b, 7, h, 8).transpose(0, 2, 1, 3)
        rows.append(("split_heads", np.abs(heads - expect).max(), 0.0))
        rows.append(("merge_heads", np.abs(ctx.merge_heads(heads) - packed).max(), 0.0))
        qkv = rng.standard_normal((b, 7, 3 * h * 8)).astype(np.float32)
        q, k, v = ctx.split_qkv(qkv, h)
        parts = qkv.reshape(b, 7, 3, h, 8).transpose(2, 0, 3, 1, 4)
        rows.append(("split_qkv", max(np.abs(t - p).max() for t, p in zip((q, k, v), parts)), 0.0))
        q, k, v = (rng.standard_normal((b, h, 40, 16)).astype(np.float32) for _ in range(3))
        causal = np.tril(np.ones((40, 40), bool))[None, None]
        out = ctx.attention(q, k, v, causal=True)
        rows.append(("attention (causal), relative", relative_error(out, reference_attention(q, k, v, causal)), 1e-5))
        dout = rng.standard_normal(out.shape).astype(np.float32)
        out, lse = ctx.attention(q, k, v, causal=True, return_lse=True)
        got = ctx.attention_backward(dout, q, k, v, out, lse, causal=True)
        want = reference_attention_grads(q, k, v, dout, causal)
        rows.append(("attention backward (causal), relative", max(relative_error(g, w) for g, w in zip(got, want)), 1e-5))
        out = ctx.linear_attention(q, k, v, causal=True)
        rows.append(("linear attention (causal), relative", relative_error(out, reference_linear(q, k, v, causal)), 1e-5))
        got = ctx.linear_attention_backward(dout, q, k, v, causal=True)
        want = reference_linear_grads(q, k, v, dout, causal)
        rows.append(("linear attention backward, relative", max(relative_error(g, w) for g, w in zip(got, want)), 1e-5))
    ok = True
    print("%-36s %12s %10s" % ("op", "max error", "tolerance"))
    for name, err, tol in rows:
        good = err <= tol
        ok &= good
        print("%-36s %12.3g %10.1g %s" % (name, err, tol, "ok" if good else "FAIL"))
    return 0 if ok else 1


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m clattn")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("devices", help="list the OpenCL devices")
    test = sub.add_parser("selftest", help="check every op against numpy on a device")
    test.add_argument("--device", default=None, help="P:D or a name substring (CLATTN_DEVICE)")
    args = parser.parse_args(argv)
    if args.command == "devices":
        for d in clattn.devices():
            print("%-5s %-4s %s / %s (%s)" % (d["index"], d["type"], d["platform"], d["name"], d["version"]))
            print("           " + d["facts"])
            with clattn.Context(d["index"]) as ctx:
                print("           matrix_units=" + (",".join(ctx.matrix_units()) or "none"))
        return 0
    return selftest(args.device)


if __name__ == "__main__":
    sys.exit(main())
