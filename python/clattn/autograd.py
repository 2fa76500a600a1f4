"""PyTorch autograd for clattn's attention: the forward runs on the Context's OpenCL device, and
so does the backward when PyTorch asks for gradients.

    import torch, clattn, clattn.autograd
    with clattn.Context("pocl") as ctx:
        q, k, v = (torch.randn(2, 8, 128, 64, requires_grad=True) for _ in range(3))
        out = clattn.autograd.attention(ctx, q, k, v, causal=True)
        out.square().sum().backward()    # q.grad, k.grad, v.grad: clattn_attention_backward

The tensors are PyTorch CPU tensors of float32 or float16 (the gradients come back in the
inputs' dtype): each call copies them to the device and back, so this is for models whose other
layers run on the CPU; the Context's device tensors (clattn.Tensor) keep data on the device.
attention() keeps the forward's out and lse (FlashAttention's contract, O(S) memory beside out)
for its backward. A bias that requires grad gets dbias, summed over the dims it broadcasts, as
autograd sums a broadcast; the other mask keywords (causal, window, key_lengths, mask, ...) are
Context.attention's and have no gradient. The backward runs on the forward's Context, which must
still be open then. There is no double backward (create_graph=True through these ops is an
error): the backward is clattn's kernels, not a graph of PyTorch operations. Importing this
module imports torch; the rest of the package does not need it.
"""
import torch

_DTYPES = (torch.float32, torch.float16)
# Context.attention's keywords that describe the mask (the ones this module passes through)
_MASK_KEYWORDS = ("causal", "window", "global_stride", "key_lengths", "query_lengths", "mask",
                  "alibi_slopes", "softcap", "empty_rows")
_LINEAR_KEYWORDS = ("key_lengths", "query_lengths")


def _numpy(t):
    """A tensor's values as a contiguous numpy array, outside autograd."""
    return t.detach().contiguous().numpy()


def _check_tensor(name, t, dtype=None):
    """A CPU tensor of float32 or float16 (of `dtype` where given); else a named refusal."""
    if not isinstance(t, torch.Tensor):
        raise TypeError("%s: expected a torch.Tensor, got %s" % (name, type(t).__name__))
    if t.device.type != "cpu":
        raise ValueError("%s: on %s; clattn.autograd takes CPU tensors (clattn copies them to "
                         "its own device)" % (name, t.device))
    if t.dtype not in _DTYPES or (dtype is not None and t.dtype != dtype):
        raise TypeError("%s: %s; expected float32 or float16%s" % (
            name, t.dtype, "" if dtype is None else ", the same for q, k and v"))


def _check_inputs(q, k, v):
    for name, t in (("q", q), ("k", k), ("v", v)):
        _check_tensor(name, t, q.dtype if isinstance(q, torch.Tensor) else None)


def _check_open(ctx):
    if ctx.closed:
        raise RuntimeError("clattn.autograd: the Context the forward ran on is closed; run the "
                           "backward before closing it")


def _plain(keywords, allowed, what):
    """The keywords as numpy/Python values for the Context (tensors detached)."""
    unknown = sorted(set(keywords) - set(allowed))
    if unknown:
        raise TypeError("%s: unexpected keyword(s) %s" % (what, ", ".join(unknown)))
    return {key: _numpy(value) if isinstance(value, torch.Tensor) else value
            for key, value in keywords.items()}


class _Attention(torch.autograd.Function):
    @staticmethod
    def forward(fctx, ctx, scale, mask, q, k, v, bias):
        fctx.ctx, fctx.scale, fctx.mask = ctx, scale, mask
        out, lse = ctx.attention(_numpy(q), _numpy(k), _numpy(v), scale,
                                 bias=None if bias is None else _numpy(bias), return_lse=True,
                                 **mask)
        out = torch.from_numpy(out)
        fctx.lse = lse  # float32, (B, Hq, Sq): not a tensor autograd needs to know
        # (the bias too, so that an in-place change before the backward is autograd's error)
        fctx.save_for_backward(q, k, v, out, bias)
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(fctx, dout):
        q, k, v, out, bias = fctx.saved_tensors
        _check_open(fctx.ctx)
        want_dbias = fctx.needs_input_grad[6]
        grads = fctx.ctx.attention_backward(
            _numpy(dout.to(q.dtype)), _numpy(q), _numpy(k), _numpy(v), _numpy(out), fctx.lse,
            fctx.scale, bias=None if bias is None else _numpy(bias), return_dbias=want_dbias,
            **fctx.mask)
        dq, dk, dv = (torch.from_numpy(g) for g in grads[:3])
        dbias = torch.from_numpy(grads[3]).to(bias.dtype) if want_dbias else None
        return None, None, None, dq, dk, dv, dbias


def attention(ctx, q, k, v, scale=None, *, bias=None, **mask):
    """Context.attention(q, k, v, scale, bias=bias, **mask) as a PyTorch operation with
    gradients in q, k, v and bias: q [B,Hq,Sq,D], k [B,Hkv,Sk,D], v [B,Hkv,Sk,Dv] ->
    out [B,Hq,Sq,Dv]. The mask keywords are Context.attention's (causal, window,
    global_stride, key_lengths, query_lengths, mask, alibi_slopes, softcap, empty_rows)."""
    _check_inputs(q, k, v)
    if bias is not None and not isinstance(bias, torch.Tensor):
        bias = torch.as_tensor(bias, dtype=torch.float32)
    if bias is not None:
        _check_tensor("bias", bias)
    return _Attention.apply(ctx, scale, _plain(mask, _MASK_KEYWORDS, "attention"), q, k, v,
                            bias)


class _LinearAttention(torch.autograd.Function):
    @staticmethod
    def forward(fctx, ctx, causal, feature_map, eps, lengths, q, k, v):
        fctx.ctx, fctx.args, fctx.lengths = ctx, (causal, feature_map, eps), lengths
        fctx.save_for_backward(q, k, v)
        out = ctx.linear_attention(_numpy(q), _numpy(k), _numpy(v), causal, feature_map, eps,
                                   **lengths)
        return torch.from_numpy(out)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(fctx, dout):
        q, k, v = fctx.saved_tensors
        _check_open(fctx.ctx)
        grads = fctx.ctx.linear_attention_backward(_numpy(dout.to(q.dtype)), _numpy(q),
                                                   _numpy(k), _numpy(v), *fctx.args,
                                                   **fctx.lengths)
        return (None,) * 5 + tuple(torch.from_numpy(g) for g in grads)


def linear_attention(ctx, q, k, v, causal=False, feature_map="elu1", eps=1e-6, **lengths):
    """Context.linear_attention(q, k, v, causal, feature_map, eps, key_lengths=...,
    query_lengths=...) as a PyTorch operation with gradients in q, k and v."""
    _check_inputs(q, k, v)
    return _LinearAttention.apply(ctx, causal, feature_map, eps,
                                  _plain(lengths, _LINEAR_KEYWORDS, "linear_attention"), q, k, v)
