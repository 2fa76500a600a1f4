#!/usr/bin/python3
"""The PyTorch peer of clattn-bench: each op the way PyTorch users write it, on the CPU, or on
the device that CLATTN_PEER_DEVICE names ("cuda": the same GPU clattn runs on, for a vendor's
own stack as the peer).

    torch_ops.py [--repeats N] [--warmup N] --case "OP DTYPE DIMS" [--case ...]

prints one line per case: "OP DTYPE DIMS <median_ms> <min_ms>", or "OP DTYPE DIMS error: ..."
when a case cannot run. DIMS is a comma-separated list whose meaning depends on OP:
  split_heads  B,S,E,H   x.view(B,S,H,D).transpose(1,2).contiguous()
  merge_heads  B,S,E,H   y.transpose(1,2).contiguous().view(B,S,E)   (the inverse)
  split_qkv    B,S,E,H   x.view(B,S,3,H,D).permute(2,0,3,1,4).contiguous(), then unbind(0)
  transpose    B,S,E,H   x [B,H,S,E]: x.transpose(-1, -2).contiguous()
  softmax      B,H,Sq,Sk torch.softmax(x * scale, -1)
  softmax_masked B,H,Sq,Sk  causal + key lengths Sk - b*Sk/8 as a bool mask built once:
                         torch.softmax(x.masked_fill(~mask, -inf) * scale, -1)
  attention[_causal] B,H,S,D  scaled_dot_product_attention(q, k, v[, is_causal]) where torch
                         has it (2.0 and later), else softmax((q @ k^T) * scale [masked_fill]) @ v
  attention_decode B,H,Sq,Sk,D  the same, Sq queries against Sk cached keys, no mask
  attention_backward[_causal] B,H,S,D  torch.autograd.grad of that forward (taken once) in q, k,
                         v given dout; scaled_dot_product_attention's where torch has it
  attention_backward_cross B,H,Sq,Sk,D  the same, Sq queries against Sk keys, no mask
  attention_backward_bias B,H,S,D  the same with a learned bias [1,H,S,S] added to the scores
                         (SDPA's attn_mask where torch has it), the gradient in the bias too
  (attention_memory is not here: its scores would need 8 GiB; the row reports n/a)
  linear_attention B,H,S,D   phi = elu + 1; (phi(q) @ (phi(k)^T @ v)) / (phi(q) @ phi(k).sum + eps)
  linear_attention_causal B,H,S,D  the cumsum form: cumsum of the [B,H,S,D,D] outer products
                         phi(k_j) v_j^T and of phi(k), then the per-query contractions; refused
                         past CUMSUM_LIMIT bytes of outer products (8 GiB at S=8192)
  gemm M,N,K            a @ w.T, a [M,K], w [N,K] (OpenBLAS on the CPU)
  mha B,S,E,H           nn.MultiheadAttention(E, H, batch_first=True).eval(), no grad,
                        module(x, x, x, need_weights=False)
  linear_attention_backward[_causal] B,H,S,D  torch.autograd.grad of the form above (taken
                         once) in q, k, v given dout
  linear_step B,H,1,D   one token: S += phi(k)^T v, z += phi(k), phi(q) S / (phi(q) z + eps)
A case whose first run takes over a second is repeated 3 times after one warm-up.
"""
import argparse
import os
import statistics
import sys
import time

import torch

DTYPES = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}
DEVICE = torch.device(os.environ.get("CLATTN_PEER_DEVICE", "cpu"))
if DEVICE.type != "cpu":
    torch.set_default_device(DEVICE)  # torch 2.0 and later


def sync():
    if DEVICE.type == "cuda":
        torch.cuda.synchronize()


def split_heads(dtype, b, s, e, h):
    x = torch.randn(b, s, e).to(dtype)
    return lambda: x.view(b, s, h, e // h).transpose(1, 2).contiguous()


def merge_heads(dtype, b, s, e, h):
    y = torch.randn(b, h, s, e // h).to(dtype)
    return lambda: y.transpose(1, 2).contiguous().view(b, s, e)


def split_qkv(dtype, b, s, e, h):
    x = torch.randn(b, s, 3 * e).to(dtype)
    return lambda: x.view(b, s, 3, h, e // h).permute(2, 0, 3, 1, 4).contiguous().unbind(0)


def transpose(dtype, b, s, e, h):
    x = torch.randn(b, h, s, e).to(dtype)
    return lambda: x.transpose(-1, -2).contiguous()


def softmax(dtype, b, h, sq, sk):
    x = torch.randn(b, h, sq, sk).to(dtype)
    return lambda: torch.softmax(x * 0.125, -1)


def softmax_masked(dtype, b, h, sq, sk):
    x = torch.randn(b, h, sq, sk).to(dtype)
    lengths = torch.tensor([sk - i * sk // 8 for i in range(b)])
    keys = torch.arange(sk)
    causal = keys[None, :] <= torch.arange(sq)[:, None]
    mask = causal[None, None] & (keys[None, None, None, :] < lengths[:, None, None, None])
    return lambda: torch.softmax(x.masked_fill(~mask, float("-inf")) * 0.125, -1)


SDPA = getattr(torch.nn.functional, "scaled_dot_product_attention", None)  # torch 2.0 and later


def _attention(dtype, b, h, s, d, causal, qkv=None):
    q, k, v = qkv or (torch.randn(b, h, s, d).to(dtype) for _ in range(3))
    if SDPA is not None:  # the fused kernels (FlashAttention on CUDA)
        return lambda: SDPA(q, k, v, is_causal=causal)
    scale = d ** -0.5
    mask = torch.ones(s, s, dtype=torch.bool).tril() if causal else None

    def run():
        scores = (q @ k.transpose(-1, -2)) * scale
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        return torch.softmax(scores, -1) @ v

    return run


def attention_decode(dtype, b, h, sq, sk, d):
    q = torch.randn(b, h, sq, d).to(dtype)
    k, v = (torch.randn(b, h, sk, d).to(dtype) for _ in range(2))
    if SDPA is not None:
        return lambda: SDPA(q, k, v)
    scale = d ** -0.5
    return lambda: torch.softmax((q @ k.transpose(-1, -2)) * scale, -1) @ v


def attention(dtype, b, h, s, d):
    return _attention(dtype, b, h, s, d, False)


def _attention_backward(dtype, b, h, s, d, causal, sk=None, with_bias=False, hkv=None):
    """hkv: kv heads, each shared by h / hkv query heads (autograd sums their gradients)."""
    q = torch.randn(b, h, s, d).to(dtype).requires_grad_()
    k, v = (torch.randn(b, hkv or h, sk or s, d).to(dtype).requires_grad_() for _ in range(2))
    dout = torch.randn(b, h, s, d).to(dtype)
    wrt = (q, k, v)
    if hkv:
        k, v = (t.repeat_interleave(h // hkv, dim=1) for t in (k, v))
    if with_bias:
        bias = torch.randn(1, h, s, sk or s).to(dtype).requires_grad_()
        wrt = wrt + (bias,)
        if SDPA is not None:
            out = SDPA(q, k, v, attn_mask=bias)
        else:
            scores = (q @ k.transpose(-1, -2)) * d ** -0.5 + bias
            out = torch.softmax(scores, -1) @ v
    elif SDPA is not None:
        out = SDPA(q, k, v, is_causal=causal)
    else:
        out = _attention(dtype, b, h, s, d, causal, (q, k, v))()
    return lambda: torch.autograd.grad(out, wrt, dout, retain_graph=True)


def attention_backward(dtype, b, h, s, d):
    return _attention_backward(dtype, b, h, s, d, False)


def attention_backward_causal(dtype, b, h, s, d):
    return _attention_backward(dtype, b, h, s, d, True)


def attention_backward_cross(dtype, b, h, sq, sk, d):
    return _attention_backward(dtype, b, h, sq, d, False, sk)


def attention_backward_gqa(dtype, b, h, hkv, sq, sk, d):
    return _attention_backward(dtype, b, h, sq, d, False, sk, hkv=hkv)


def attention_backward_bias(dtype, b, h, s, d):
    return _attention_backward(dtype, b, h, s, d, False, with_bias=True)


def attention_causal(dtype, b, h, s, d):
    return _attention(dtype, b, h, s, d, True)


CUMSUM_LIMIT = 5 << 30


def _elu1(x):
    return torch.nn.functional.elu(x) + 1


def linear_attention(dtype, b, h, s, d):
    q, k, v = (torch.randn(b, h, s, d).to(dtype) for _ in range(3))

    def run():
        fq, fk = _elu1(q), _elu1(k)
        kv = fk.transpose(-1, -2) @ v
        z = fk.sum(-2, keepdim=True)
        return (fq @ kv) / (fq @ z.transpose(-1, -2) + 1e-6)

    return run


def linear_attention_causal(dtype, b, h, s, d):
    outer = b * h * s * d * d * torch.finfo(dtype).bits // 8
    if outer > CUMSUM_LIMIT:
        raise MemoryError("the cumsum form needs two %.1f GiB tensors" % (outer / 2**30))
    q, k, v = (torch.randn(b, h, s, d).to(dtype) for _ in range(3))

    def run():
        fq, fk = _elu1(q), _elu1(k)
        kv = torch.einsum("bhsd,bhse->bhsde", fk, v).cumsum(2)
        z = fk.cumsum(2)
        num = torch.einsum("bhsd,bhsde->bhse", fq, kv)
        return num / ((fq * z).sum(-1, keepdim=True) + 1e-6)

    return run


def _linear_backward(dtype, b, h, s, d, causal):
    if causal and b * h * s * d * d * torch.finfo(dtype).bits // 8 > CUMSUM_LIMIT:
        raise MemoryError("the cumsum form's outer products would not fit")
    q, k, v = (torch.randn(b, h, s, d).to(dtype).requires_grad_() for _ in range(3))
    fq, fk = _elu1(q), _elu1(k)
    if causal:
        kv = torch.einsum("bhsd,bhse->bhsde", fk, v).cumsum(2)
        num = torch.einsum("bhsd,bhsde->bhse", fq, kv)
        out = num / ((fq * fk.cumsum(2)).sum(-1, keepdim=True) + 1e-6)
    else:
        z = fk.sum(-2, keepdim=True)
        out = (fq @ (fk.transpose(-1, -2) @ v)) / (fq @ z.transpose(-1, -2) + 1e-6)
    dout = torch.randn(b, h, s, d).to(dtype)
    return lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)


def linear_attention_backward(dtype, b, h, s, d):
    return _linear_backward(dtype, b, h, s, d, False)


def linear_attention_backward_causal(dtype, b, h, s, d):
    return _linear_backward(dtype, b, h, s, d, True)


def linear_step(dtype, b, h, n, d):
    q, k, v = (torch.randn(b, h, n, d).to(dtype) for _ in range(3))
    state, z = torch.zeros(b, h, d, d, dtype=dtype), torch.zeros(b, h, 1, d, dtype=dtype)

    def run():
        fq, fk = _elu1(q), _elu1(k)
        state.add_(fk.transpose(-1, -2) @ v)
        z.add_(fk)
        return (fq @ state) / ((fq * z).sum(-1, keepdim=True) + 1e-6)

    return run


def gemm(dtype, m, n, k):
    a, w = torch.randn(m, k).to(dtype), torch.randn(n, k).to(dtype)
    return lambda: a @ w.T


def mha(dtype, b, s, e, h):
    module = torch.nn.MultiheadAttention(e, h, batch_first=True).to(dtype).eval()
    x = torch.randn(b, s, e).to(dtype)

    def run():
        with torch.no_grad():
            return module(x, x, x, need_weights=False)[0]

    return run


OPS = {
    "gemm": gemm,
    "mha": mha,
    "attention": attention,
    "attention_causal": attention_causal,
    "attention_decode": attention_decode,
    "attention_backward": attention_backward,
    "attention_backward_causal": attention_backward_causal,
    "attention_backward_cross": attention_backward_cross,
    "attention_backward_gqa": attention_backward_gqa,
    "attention_backward_bias": attention_backward_bias,
    "linear_attention": linear_attention,
    "linear_attention_causal": linear_attention_causal,
    "linear_attention_backward": linear_attention_backward,
    "linear_attention_backward_causal": linear_attention_backward_causal,
    "linear_step": linear_step,
    "split_heads": split_heads,
    "merge_heads": merge_heads,
    "split_qkv": split_qkv,
    "transpose": transpose,
    "softmax": softmax,
    "softmax_masked": softmax_masked,
}


def time_case(fn, warmup, repeats):
    start = time.perf_counter()
    fn()
    sync()
    if time.perf_counter() - start > 1.0:  # seconds a call: a few repeats tell enough
        warmup, repeats = 0, min(repeats, 3)
    for _ in range(warmup - 1):
        fn()
    sync()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        sync()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times), min(times)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--case", action="append", default=[])
    args = parser.parse_args()
    for case in args.case:
        try:
            op, dtype, dims = case.split()
            fn = OPS[op](DTYPES[dtype], *[int(d) for d in dims.split(",")])
            median, best = time_case(fn, args.warmup, args.repeats)
            print(f"{case} {median:.6f} {best:.6f}", flush=True)
        except Exception as exc:  # report and go on: one bad case must not hide the others
            print(f"{case} error: {exc}", file=sys.stdout, flush=True)


if __name__ == "__main__":
    main()
