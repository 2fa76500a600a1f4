"""The Python binding against PyTorch (computed in float64) on random and edge inputs.

Torch 1.13 gives NaN on fully masked rows; clattn gives 0 there (the design's default), so
those rows are compared to 0 explicitly. The tests share one device context, the `ctx` fixture
(conftest.py)."""
import numpy as np
import pytest
import torch

import clattn

RNG = np.random.default_rng(1234)


def torch_masked_softmax(x, scale, visible, bias=None):
    """softmax(x*scale + bias) over visible keys, in float64, with empty rows as 0."""
    s = torch.from_numpy(x.astype(np.float64)) * scale
    if bias is not None:
        s = s + torch.from_numpy(np.asarray(bias, dtype=np.float64))
    keep = torch.from_numpy(np.broadcast_to(visible, x.shape).copy())
    p = torch.softmax(s.masked_fill(~keep, float("-inf")), -1)
    empty = ~keep.any(-1, keepdim=True)
    return torch.where(empty, torch.zeros_like(p), p).numpy(), empty.numpy()


def assert_close(got, want, rtol, atol, what):
    if not np.allclose(got, want, rtol=rtol, atol=atol, equal_nan=True):
        worst = np.unravel_index(np.argmax(np.abs(got - want)), got.shape)
        raise AssertionError("%s: at %s got %r, want %r" % (what, worst, got[worst], want[worst]))


def causal_mask(sq, sk, bottom_right=False):
    off = sk - sq if bottom_right else 0
    return np.arange(sk)[None, :] <= np.arange(sq)[:, None] + off


def test_devices_are_listed():
    found = clattn.devices()
    assert found and all({"index", "platform", "name", "type"} <= set(d) for d in found), found
    # every device's facts line starts with its OpenCL version and names the fields in order
    for d in found:
        names = [field.split("=")[0] for field in d["facts"].split(" ")]
        assert names[:3] == ["opencl", "opencl_c", "local_memory"], d["facts"]
        assert names[-1] == "extensions", d["facts"]


def test_softmax_backward_matches_autograd(ctx):
    # the gradient of a masked, scaled softmax against torch.autograd in float64
    rng = np.random.default_rng(5)
    x = rng.standard_normal((2, 3, 7, 11)).astype(np.float32) * 2
    dy = rng.standard_normal(x.shape).astype(np.float32)
    keep = causal_mask(7, 11, bottom_right=True)
    y = ctx.softmax(x, scale=0.5, causal="bottom_right")
    xt = torch.tensor(x, dtype=torch.float64, requires_grad=True)
    yt = torch.softmax((0.5 * xt).masked_fill(~torch.tensor(keep), float("-inf")), dim=-1)
    yt.backward(torch.tensor(dy, dtype=torch.float64))
    got = ctx.softmax_backward(y, dy, scale=0.5)
    assert_close(got, xt.grad.numpy(), 1e-5, 1e-6, "softmax_backward")
    assert np.all(got[..., ~keep] == 0), "masked entries are not exactly 0"
    with pytest.raises(ValueError):
        ctx.softmax_backward(y, dy[..., :5])


def test_float64_and_python_floats_become_float32(ctx):
    x = RNG.standard_normal((1, 2, 3, 5))
    got = ctx.softmax(x, scale=0.5)
    assert got.dtype == np.float32
    assert np.array_equal(got, ctx.softmax(x.astype(np.float32), scale=0.5))
    assert np.array_equal(ctx.softmax(x.tolist(), scale=0.5), got)


def test_softmax_random_shapes_and_seeds(ctx):
    for seed in range(4):
        rng = np.random.default_rng(seed)
        b, h, sq, sk = rng.integers(1, 4), rng.integers(1, 4), rng.integers(1, 40), rng.integers(1, 70)
        x = rng.standard_normal((b, h, sq, sk)).astype(np.float32) * 3
        want, _ = torch_masked_softmax(x, 0.5, np.ones((sq, sk), bool))
        assert_close(ctx.softmax(x, scale=0.5), want, 1e-5, 1e-7, "seed %d" % seed)


def test_softmax_causal_both_alignments(ctx):
    x = RNG.standard_normal((2, 2, 9, 5)).astype(np.float32)
    for mode, bottom in (("top_left", False), (True, False), ("bottom_right", True)):
        want, _ = torch_masked_softmax(x, 1.0, causal_mask(9, 5, bottom))
        assert_close(ctx.softmax(x, causal=mode), want, 1e-5, 1e-7, str(mode))


def test_softmax_key_lengths_bool_mask_and_bias(ctx):
    x = RNG.standard_normal((3, 2, 6, 11)).astype(np.float32)
    lengths = np.array([11, 4, 0])
    visible = np.arange(11)[None, None, None, :] < lengths[:, None, None, None]
    keep = RNG.random((6, 11)) > 0.3
    bias = RNG.standard_normal((2, 1, 11)).astype(np.float32)
    want, empty = torch_masked_softmax(x, 0.7, visible & keep, bias)
    got = ctx.softmax(x, scale=0.7, key_lengths=lengths, mask=keep, bias=bias)
    assert_close(got, want, 1e-5, 1e-7, "lengths + mask + bias")
    assert empty[2].all() and (got[2] == 0).all(), "fully masked rows must be exactly 0"


def test_softmax_window_and_lse(ctx):
    x = RNG.standard_normal((1, 2, 12, 12)).astype(np.float32)
    i, j = np.arange(12)[:, None], np.arange(12)[None, :]
    visible = (j >= i - 2) & (j <= i + 1)
    want, _ = torch_masked_softmax(x, 1.0, visible)
    y, lse = ctx.softmax(x, window=(2, 1), return_lse=True)
    assert_close(y, want, 1e-5, 1e-7, "window")
    want_lse = torch.logsumexp(torch.from_numpy(x.astype(np.float64)).masked_fill(
        ~torch.from_numpy(visible), float("-inf")), -1).numpy()
    assert_close(lse, want_lse, 1e-5, 1e-6, "lse")


def test_softmax_float16_and_low_rank_inputs(ctx):
    x = RNG.standard_normal((5, 37)).astype(np.float16)
    got = ctx.softmax(x, scale=2.0)
    assert got.dtype == np.float16 and got.shape == x.shape
    want, _ = torch_masked_softmax(x.astype(np.float32), 2.0, np.ones((5, 37), bool))
    assert_close(got.astype(np.float64), want, 2e-3, 1e-6, "f16")
    v = RNG.standard_normal(9).astype(np.float32)
    assert_close(ctx.softmax(v), torch.softmax(torch.from_numpy(v).double(), -1).numpy(), 1e-5, 1e-7, "1-D")


def test_softmax_empty_rows_nan_matches_old_torch(ctx):
    x = RNG.standard_normal((1, 1, 3, 4)).astype(np.float32)
    got = ctx.softmax(x, key_lengths=[0], empty_rows="nan")
    assert np.isnan(got).all()


def test_split_merge_and_qkv_match_torch_views(ctx):
    x = RNG.standard_normal((2, 7, 3 * 4 * 5)).astype(np.float32)
    t = torch.from_numpy(x)
    q, k, v = ctx.split_qkv(x, 4)
    parts = t.view(2, 7, 3, 4, 5).permute(2, 0, 3, 1, 4)
    for got, want in zip((q, k, v), parts):
        assert np.array_equal(got, want.numpy())
    heads = ctx.split_heads(x[:, :, :20], 4)
    assert np.array_equal(heads, t[:, :, :20].reshape(2, 7, 4, 5).transpose(1, 2).numpy())
    assert np.array_equal(ctx.merge_heads(heads), x[:, :, :20])
    bias = RNG.standard_normal(60).astype(np.float32)
    qb, _, _ = ctx.split_qkv(x, 4, bias=bias)
    assert_close(qb, (t + torch.from_numpy(bias)).view(2, 7, 3, 4, 5)[:, :, 0].transpose(1, 2).numpy(), 0, 0, "bias")


def test_errors_name_the_argument(ctx):
    x = np.zeros((2, 3, 4, 5), np.float32)
    for call, kind, word in (
        (lambda: ctx.softmax(x.astype(np.int64)), TypeError, "x"),
        (lambda: ctx.softmax(x.astype(bool)), TypeError, "x"),
        (lambda: ctx.softmax(x, bias=x.astype(np.complex64)), TypeError, "bias"),
        (lambda: ctx.softmax(np.zeros((1, 2, 3, 4, 5), np.float32)), ValueError, "rank"),
        (lambda: ctx.softmax(x, key_lengths=[1, 2, 3]), ValueError, "key_lengths"),
        (lambda: ctx.softmax(x, mask=np.ones((3, 5), bool)), clattn.Error, "mask.keep"),
        (lambda: ctx.softmax(x, causal="sideways"), ValueError, "causal"),
        (lambda: ctx.split_heads(np.zeros((2, 3, 10), np.float32), 3), ValueError, "num_heads"),
    ):
        try:
            call()
        except kind as error:
            assert word in str(error), "%r does not name %s" % (str(error), word)
        else:
            raise AssertionError("no %s for %s" % (kind.__name__, word))
    try:
        ctx.softmax(x, mask=np.ones((3, 5), bool))
    except clattn.Error as error:
        assert error.status == "CLATTN_ERR_SHAPE_MISMATCH", error.status


def test_softmax_alibi_softcap_and_global_positions(ctx):
    x = RNG.standard_normal((1, 3, 10, 10)).astype(np.float32) * 4
    slopes = np.array([0.5, 0.25, 0.125], np.float32)
    i, j = np.arange(10)[:, None], np.arange(10)[None, :]
    alibi = -slopes[:, None, None] * np.abs(i - j)[None]
    want, _ = torch_masked_softmax(x, 1.0, np.ones((10, 10), bool), alibi[None])
    assert_close(ctx.softmax(x, alibi_slopes=slopes), want, 1e-5, 1e-7, "alibi")
    capped = 3.0 * np.tanh(x.astype(np.float64) * 2.0 / 3.0)
    want, _ = torch_masked_softmax(capped, 1.0, np.ones((10, 10), bool))
    assert_close(ctx.softmax(x, scale=2.0, softcap=3.0), want, 1e-5, 1e-7, "softcap")
    visible = ((j >= i - 1) & (j <= i + 1)) | (j % 4 == 0) | (i % 4 == 0)
    want, _ = torch_masked_softmax(x, 1.0, visible)
    assert_close(ctx.softmax(x, window=(1, 1), global_stride=4), want, 1e-5, 1e-7, "sparse")


def test_softmax_ignores_garbage_at_masked_keys(ctx):
    x = RNG.standard_normal((2, 1, 5, 8)).astype(np.float32)
    clean = ctx.softmax(x, causal=True, key_lengths=[8, 3])
    visible = causal_mask(5, 8)[None, None] & (np.arange(8) < np.array([8, 3])[:, None, None, None])
    for garbage in (np.nan, np.inf, 1e30):
        dirty = np.where(visible, x, np.float32(garbage)).astype(np.float32)
        got = ctx.softmax(dirty, causal=True, key_lengths=[8, 3])
        assert np.array_equal(got, clean), garbage


def torch_attention(q, k, v, scale, visible):
    """matmul -> masked_fill -> softmax -> matmul in float64, GQA by repeating k/v heads."""
    group = q.shape[1] // k.shape[1]
    qt, kt, vt = (torch.from_numpy(a.astype(np.float64)) for a in (q, k, v))
    kt, vt = kt.repeat_interleave(group, 1), vt.repeat_interleave(group, 1)
    s = (qt @ kt.transpose(-1, -2)) * scale
    keep = torch.from_numpy(np.broadcast_to(visible, s.shape).copy())
    p = torch.softmax(s.masked_fill(~keep, float("-inf")), -1)
    p = torch.where(keep.any(-1, keepdim=True), p, torch.zeros_like(p))
    return (p @ vt).numpy()


def torch_weights(q, k, scale, visible):
    group = q.shape[1] // k.shape[1]
    qt, kt = (torch.from_numpy(a.astype(np.float64)) for a in (q, k))
    s = (qt @ kt.repeat_interleave(group, 1).transpose(-1, -2)) * scale
    keep = torch.from_numpy(np.broadcast_to(visible, s.shape).copy())
    p = torch.softmax(s.masked_fill(~keep, float("-inf")), -1)
    return torch.where(keep.any(-1, keepdim=True), p, torch.zeros_like(p)).numpy()


def test_attention_weights_and_paths(ctx):
    q = RNG.standard_normal((2, 4, 7, 16)).astype(np.float32)
    k = RNG.standard_normal((2, 2, 11, 16)).astype(np.float32)
    v = RNG.standard_normal((2, 2, 11, 16)).astype(np.float32)
    i, j = np.arange(7)[:, None], np.arange(11)[None, :]
    visible = np.stack([(j <= i + n - 7) & (j < n) for n in (11, 5)])[:, None]
    kwargs = dict(scale=0.25, causal="bottom_right", key_lengths=[11, 5])
    out, weights, lse = ctx.attention(q, k, v, return_weights=True, return_lse=True, **kwargs)
    assert weights.shape == (2, 4, 7, 11) and lse.shape == (2, 4, 7)
    assert_close(weights, torch_weights(q, k, 0.25, visible), 1e-5, 1e-7, "weights")
    assert_close(out, torch_attention(q, k, v, 0.25, visible), 1e-4, 1e-6, "out with weights")
    fused = ctx.attention(q, k, v, path="fused", **kwargs)
    composed = ctx.attention(q, k, v, path="composed", **kwargs)
    assert_close(fused, composed, 1e-5, 1e-6, "fused vs composed")
    try:
        ctx.attention(q, k, v, path="fused", return_weights=True)
    except clattn.Error as error:
        assert error.status == "CLATTN_ERR_INVALID_ARGUMENT", error.status
    else:
        raise AssertionError("weights on the fused path returned")


def test_attention_matches_torch_with_gqa_and_masks(ctx):
    q = RNG.standard_normal((2, 4, 9, 40)).astype(np.float32)
    k = RNG.standard_normal((2, 2, 13, 40)).astype(np.float32)
    v = RNG.standard_normal((2, 2, 13, 24)).astype(np.float32)
    want = torch_attention(q, k, v, 1 / np.sqrt(40), np.ones((9, 13), bool))
    assert_close(ctx.attention(q, k, v), want, 1e-4, 1e-6, "plain")
    # bottom-right aligns each batch's last query with its last *valid* key: off = len - Sq
    lengths = np.array([13, 6])
    i, j = np.arange(9)[:, None], np.arange(13)[None, :]
    visible = np.stack([(j <= i + n - 9) & (j < n) for n in lengths])[:, None]
    want = torch_attention(q, k, v, 0.3, visible)
    got, lse = ctx.attention(q, k, v, scale=0.3, causal="bottom_right", key_lengths=[13, 6],
                             return_lse=True)
    assert_close(got, want, 1e-4, 1e-6, "bottom-right causal + key lengths")
    assert lse.shape == (2, 4, 9)


def torch_attention_grads(q, k, v, dout, scale, visible, bias=None, alibi=None, softcap=0.0):
    """torch.autograd of matmul -> softcap -> + bias -> masked_fill -> softmax -> matmul in
    float64 (empty rows 0; GQA by repeating k/v heads, which autograd sums back): (dq, dk, dv)
    and the bias's gradient in its own (broadcast) shape."""
    group = q.shape[1] // k.shape[1]
    qt, kt, vt = (torch.tensor(a, dtype=torch.float64, requires_grad=True) for a in (q, k, v))
    bt = None if bias is None else torch.tensor(bias, dtype=torch.float64, requires_grad=True)
    s = (qt @ kt.repeat_interleave(group, 1).transpose(-1, -2)) * scale
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    if bt is not None:
        s = s + bt
    if alibi is not None:
        s = s + torch.from_numpy(alibi)
    keep = torch.from_numpy(np.broadcast_to(visible, s.shape).copy())
    p = torch.softmax(s.masked_fill(~keep, float("-inf")), -1)
    p = torch.where(keep.any(-1, keepdim=True), p, torch.zeros_like(p))
    (p @ vt.repeat_interleave(group, 1)).backward(torch.tensor(dout, dtype=torch.float64))
    grads = [t.grad.numpy() for t in (qt, kt, vt)]
    return grads + ([bt.grad.numpy()] if bt is not None else [])


def check_attention_backward(ctx, q, k, v, visible, what, torch_kwargs=None, **kwargs):
    """clattn's forward then backward against torch's autograd, every gradient."""
    dout = RNG.standard_normal(q.shape[:3] + v.shape[3:]).astype(np.float32)
    out, lse = ctx.attention(q, k, v, return_lse=True, **kwargs)
    got = ctx.attention_backward(dout, q, k, v, out, lse, return_dbias="bias" in kwargs,
                                 **kwargs)
    scale = kwargs.get("scale") or 1 / np.sqrt(q.shape[3])
    want = torch_attention_grads(q, k, v, dout, scale, visible, kwargs.get("bias"),
                                 softcap=kwargs.get("softcap", 0.0), **(torch_kwargs or {}))
    assert len(got) == len(want), what
    for name, g, w in zip(("dq", "dk", "dv", "dbias"), got, want):
        assert g.shape == w.shape, (what, name, g.shape, w.shape)
        assert_close(g, w, 1e-4, 2e-5, "%s: %s" % (what, name))
    return got


def test_attention_backward_matches_autograd(ctx):
    q = RNG.standard_normal((2, 4, 9, 40)).astype(np.float32)
    k = RNG.standard_normal((2, 2, 13, 40)).astype(np.float32)
    v = RNG.standard_normal((2, 2, 13, 24)).astype(np.float32)
    check_attention_backward(ctx, q, k, v, np.ones((9, 13), bool), "GQA, Dv != D")
    i, j = np.arange(9)[:, None], np.arange(13)[None, :]
    visible = np.stack([(j <= i + n - 9) & (j < n) for n in (13, 6)])[:, None]
    check_attention_backward(ctx, q, k, v, visible, "bottom-right causal + key lengths",
                             scale=0.3, causal="bottom_right", key_lengths=[13, 6])
    check_attention_backward(ctx, q, k, v, visible, "composed path", scale=0.3,
                             causal="bottom_right", key_lengths=[13, 6], path="composed")
    # rows past a query length see nothing: their gradients are 0
    visible = np.stack([np.broadcast_to(i < n, (9, 13)) for n in (9, 4)])[:, None]
    dq, _, _ = check_attention_backward(ctx, q, k, v, visible, "query lengths",
                                        query_lengths=[9, 4])
    assert np.all(dq[1, :, 4:] == 0)


def test_attention_backward_masks_and_bias_gradients(ctx):
    q = RNG.standard_normal((2, 3, 10, 16)).astype(np.float32)
    k = RNG.standard_normal((2, 3, 10, 16)).astype(np.float32)
    v = RNG.standard_normal((2, 3, 10, 16)).astype(np.float32)
    slopes = np.array([0.5, 0.25, 0.125], np.float32)
    i, j = np.arange(10)[:, None], np.arange(10)[None, :]
    alibi = (-slopes[:, None, None] * np.abs(i - j)[None])[None]
    visible = ((j >= i - 1) & (j <= i + 1)) | (j % 4 == 0) | (i % 4 == 0)
    bias = RNG.standard_normal((1, 3, 10, 10)).astype(np.float32)  # a learned per-head bias
    check_attention_backward(ctx, q, k, v, visible, "window + global + ALiBi + softcap + bias",
                             torch_kwargs=dict(alibi=alibi), window=(1, 1), global_stride=4,
                             alibi_slopes=slopes, softcap=3.0, scale=0.5, bias=bias)
    keep = RNG.random((2, 1, 10, 10)) > 0.3
    padding = RNG.standard_normal((2, 1, 1, 10)).astype(np.float32)  # a key-padding bias
    check_attention_backward(ctx, q, k, v, keep, "keep mask + key-padding bias", mask=keep,
                             bias=padding)
    with pytest.raises(ValueError):
        ctx.attention_backward(q, q, k, v, q, np.zeros((2, 3, 10), np.float32), return_dbias=True)


def test_autograd_attention_trains_like_torch(ctx):
    """clattn.autograd.attention inside a PyTorch graph: its out is Context.attention's, and
    backward() fills q, k, v and the bias with torch.autograd's gradients of the float64 form
    (bottom-right causal with key lengths, GQA, a learned per-head bias); a bias array or an
    input not asking takes no gradient; there is no double backward, nor a backward after the
    Context closed; a dtype it cannot take is refused by name."""
    import clattn.autograd

    shapes = ((2, 4, 9, 16), (2, 2, 13, 16), (2, 2, 13, 8))
    q, k, v = (torch.tensor(RNG.standard_normal(s), dtype=torch.float32, requires_grad=True)
               for s in shapes)
    bias = torch.tensor(RNG.standard_normal((1, 4, 9, 13)), dtype=torch.float32,
                        requires_grad=True)
    weight = RNG.standard_normal((2, 4, 9, 8)).astype(np.float32)  # the loss is sum(out * w)
    mask = dict(causal="bottom_right", key_lengths=[13, 6])
    plain = ctx.attention(q.detach().numpy(), k.detach().numpy(), v.detach().numpy(), 0.3,
                          bias=bias.detach().numpy(), **mask)
    out = clattn.autograd.attention(ctx, q, k, v, 0.3, bias=bias.detach().numpy(), **mask)
    assert np.array_equal(out.detach().numpy(), plain)  # a bias array: no gradient asked
    out = clattn.autograd.attention(ctx, q, k, v, 0.3, bias=bias, **mask)
    assert np.array_equal(out.detach().numpy(), plain)
    (out * torch.from_numpy(weight)).sum().backward()
    i, j = np.arange(9)[:, None], np.arange(13)[None, :]
    visible = np.stack([(j <= i + n - 9) & (j < n) for n in (13, 6)])[:, None]
    want = torch_attention_grads(*(t.detach().numpy() for t in (q, k, v)), weight, 0.3,
                                 visible, bias.detach().numpy())
    for name, t, w in zip(("dq", "dk", "dv", "dbias"), (q, k, v, bias), want):
        assert t.grad.dtype == torch.float32 and t.grad.shape == t.shape, name
        assert_close(t.grad.numpy(), w, 1e-4, 2e-5, "autograd " + name)
    # float16 storage: gradients in float16, within its rounding of the float64 ones
    q16, k16, v16 = (t.detach().half().requires_grad_() for t in (q, k, v))
    clattn.autograd.attention(ctx, q16, k16, v16, causal=True).sum().backward()
    want = torch_attention_grads(*(t.detach().float().numpy() for t in (q16, k16, v16)),
                                 np.ones((2, 4, 9, 8), np.float32), 0.25,
                                 np.arange(13)[None, :] <= np.arange(9)[:, None])
    for name, t, w in zip(("dq", "dk", "dv"), (q16, k16, v16), want):
        assert t.grad.dtype == torch.float16, name
        assert_close(t.grad.float().numpy(), w, 1e-2, 4e-3, "autograd f16 " + name)
    # a bias array, and v not asking: the others' gradients as before, none for them
    q2, k2, v2 = (t.detach().clone().requires_grad_(t is not v) for t in (q, k, v))
    out = clattn.autograd.attention(ctx, q2, k2, v2, 0.3, bias=bias.detach().numpy(), **mask)
    (out * torch.from_numpy(weight)).sum().backward()
    assert v2.grad is None
    assert np.array_equal(q2.grad.numpy(), q.grad.numpy())
    assert np.array_equal(k2.grad.numpy(), k.grad.numpy())
    # no double backward: the backward is clattn's kernels
    (g,) = torch.autograd.grad(clattn.autograd.attention(ctx, q, k, v).sum(), q,
                               create_graph=True)
    with pytest.raises(RuntimeError):  # (torch names what it could not differentiate)
        g.sum().backward()
    with pytest.raises(TypeError, match="q: torch.float64"):
        clattn.autograd.attention(ctx, q.double(), k.double(), v.double())
    with pytest.raises(TypeError, match="bias: torch.float64"):
        clattn.autograd.attention(ctx, q, k, v, bias=bias.double())
    with pytest.raises(TypeError, match="unexpected keyword"):
        clattn.autograd.attention(ctx, q, k, v, return_lse=True)
    # the backward needs the forward's Context open
    with clattn.Context() as other:
        out = clattn.autograd.attention(other, q, k, v)
    with pytest.raises(RuntimeError, match="is closed"):
        out.sum().backward()


def test_autograd_linear_attention_trains_like_torch(ctx):
    """clattn.autograd.linear_attention: its out is Context.linear_attention's, its gradients
    torch.autograd's of the causal cumsum form, GQA."""
    import clattn.autograd

    shapes = ((1, 4, 12, 8), (1, 2, 12, 8), (1, 2, 12, 8))
    arrays = [RNG.standard_normal(s).astype(np.float32) for s in shapes]
    q, k, v = (torch.tensor(a, requires_grad=True) for a in arrays)
    weight = RNG.standard_normal((1, 4, 12, 8)).astype(np.float32)
    out = clattn.autograd.linear_attention(ctx, q, k, v, causal=True)
    assert np.array_equal(out.detach().numpy(), ctx.linear_attention(*arrays, causal=True))
    (out * torch.from_numpy(weight)).sum().backward()
    want = torch_linear(*arrays, True, dout=weight)
    for name, t, w in zip(("dq", "dk", "dv"), (q, k, v), want):
        assert t.grad.dtype == torch.float32 and t.grad.shape == t.shape, name
        assert_close(t.grad.numpy(), w, 1e-4, 2e-5, "autograd linear " + name)


def torch_linear(q, k, v, causal, feature_map="elu1", eps=1e-6, dout=None):
    """The forms a PyTorch user writes, in float64: non-causal through phi(k)^T v, causal through
    cumsum over the outer products; GQA by repeating the kv heads. With dout: the gradients
    (dq, dk, dv) of that form by torch.autograd instead."""
    phi = {"elu1": lambda t: torch.nn.functional.elu(t) + 1, "relu": torch.relu,
           "identity": lambda t: t}[feature_map]
    leaves = [torch.tensor(a, dtype=torch.float64, requires_grad=dout is not None)
              for a in (q, k, v)]
    q, k, v = leaves
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    fq, fk = phi(q), phi(k)
    if causal:
        kv = torch.einsum("bhsd,bhse->bhsde", fk, v).cumsum(2)
        num = torch.einsum("bhsd,bhsde->bhse", fq, kv)
        den = (fq * fk.cumsum(2)).sum(-1, keepdim=True)
    else:
        num = fq @ (fk.transpose(-1, -2) @ v)
        den = fq @ fk.sum(-2).unsqueeze(-1)
    out = num / (den + eps)
    if dout is None:
        return out.detach().numpy()
    out.backward(torch.tensor(dout, dtype=torch.float64))
    return tuple(t.grad.numpy() for t in leaves)


def test_linear_attention_backward_matches_autograd(ctx):
    for causal in (False, True):
        for feature_map in ("elu1", "relu", "identity"):
            positive = feature_map != "elu1"  # relu's slope is defined, identity's den is far from 0
            q = RNG.standard_normal((2, 4, 19, 16)).astype(np.float32)
            k = RNG.standard_normal((2, 2, 19, 16)).astype(np.float32)
            if positive:
                q, k = np.abs(q) + 0.1, np.abs(k) + 0.1
            v = RNG.standard_normal((2, 2, 19, 8)).astype(np.float32)
            dout = RNG.standard_normal((2, 4, 19, 8)).astype(np.float32)
            got = ctx.linear_attention_backward(dout, q, k, v, causal=causal,
                                                feature_map=feature_map)
            want = torch_linear(q, k, v, causal, feature_map, dout=dout)
            for name, g, w in zip(("dq", "dk", "dv"), got, want):
                assert_close(g, w, 1e-4, 1e-5, "%s causal=%s: %s" % (feature_map, causal, name))
    with pytest.raises(ValueError):
        ctx.linear_attention_backward(q, q, k, v)


def test_linear_attention_matches_torch_forms(ctx):
    for causal in (False, True):
        for feature_map in ("elu1", "relu", "identity"):
            q = RNG.standard_normal((2, 4, 70, 16)).astype(np.float32)
            k = RNG.standard_normal((2, 2, 70, 16)).astype(np.float32)
            v = RNG.standard_normal((2, 2, 70, 24)).astype(np.float32)
            if feature_map == "identity":  # positive denominators
                q, k = np.abs(q), np.abs(k)
            got = ctx.linear_attention(q, k, v, causal=causal, feature_map=feature_map)
            want = torch_linear(q, k, v, causal, feature_map)
            assert got.shape == want.shape and got.dtype == np.float32
            assert_close(got, want, 2e-4, 2e-5, "linear %s causal=%s" % (feature_map, causal))
    half = ctx.linear_attention(q.astype(np.float16), k.astype(np.float16), v.astype(np.float16))
    assert half.dtype == np.float16


def test_linear_attention_key_lengths_match_truncated_keys(ctx):
    q, k, v = (RNG.standard_normal((2, 2, 40, 16)).astype(np.float32) for _ in range(3))
    k[1, :, 25:] = np.nan  # padding past batch 1's length never reaches the output
    got = ctx.linear_attention(q, k, v, key_lengths=[40, 25])
    assert_close(got[0], torch_linear(q[:1], k[:1], v[:1], False)[0], 2e-4, 2e-5, "batch 0")
    want = torch_linear(q[1:], k[1:, :, :25], v[1:, :, :25], False)[0]
    assert_close(got[1], want, 2e-4, 2e-5, "batch 1 (25 keys)")


def test_linear_attention_step_decodes_like_causal(ctx):
    q, k, v = (RNG.standard_normal((1, 2, 20, 16)).astype(np.float32) for _ in range(3))
    whole = ctx.linear_attention(q, k, v, causal=True)
    state, rows = None, []
    for t in range(0, 20, 4):  # four tokens a step
        out, state = ctx.linear_attention_step(q[:, :, t:t + 4], k[:, :, t:t + 4],
                                               v[:, :, t:t + 4], state)
        rows.append(out)
    assert_close(np.concatenate(rows, axis=2), whole, 2e-4, 2e-5, "steps vs causal")
    phi_k = torch.nn.functional.elu(torch.from_numpy(k.astype(np.float64))) + 1
    assert_close(state[1], phi_k.sum(2).numpy(), 1e-5, 1e-5, "z after 20 tokens")
    try:
        ctx.linear_attention(q, k, v, feature_map="softmax")
    except ValueError as error:
        assert "feature_map" in str(error)
    else:
        raise AssertionError("an unknown feature map was accepted")



def torch_mha(query, key, value, heads, weights, kdim=None, vdim=None, **kwargs):
    """torch.nn.MultiheadAttention(batch_first=True) in float64, eval, with the given parameters."""
    e = query.shape[-1]
    module = torch.nn.MultiheadAttention(e, heads, batch_first=True, kdim=kdim, vdim=vdim,
                                         dtype=torch.float64).eval()
    with torch.no_grad():
        for name, array in weights.items():
            target = module.out_proj if name.startswith("out_proj") else module
            getattr(target, name.replace("out_proj_", "")).copy_(torch.from_numpy(array))
        t = lambda a: None if a is None else torch.from_numpy(a if a.dtype == np.bool_ else a.astype(np.float64))
        out, w = module(t(query), t(key), t(value), **{k: t(v) if isinstance(v, np.ndarray) else v
                                                      for k, v in kwargs.items()})
    return out.numpy(), None if w is None else w.numpy()


def mha_weights(rng, e, kdim=None, vdim=None):
    w = lambda *shape: (rng.standard_normal(shape) / np.sqrt(shape[-1])).astype(np.float32)
    if kdim is None:
        params = {"in_proj_weight": w(3 * e, e)}
    else:
        params = {"q_proj_weight": w(e, e), "k_proj_weight": w(e, kdim), "v_proj_weight": w(e, vdim)}
    params.update(in_proj_bias=w(3 * e), out_proj_weight=w(e, e), out_proj_bias=w(e))
    return params


def call_mha(ctx, x, key, value, heads, params, **kwargs):
    return ctx.mha(x, key, value, heads, params.get("in_proj_weight"), params["in_proj_bias"],
                   params["out_proj_weight"], params["out_proj_bias"],
                   q_proj_weight=params.get("q_proj_weight"),
                   k_proj_weight=params.get("k_proj_weight"),
                   v_proj_weight=params.get("v_proj_weight"), **kwargs)


def test_mha_self_attention_matches_torch_module(ctx):
    rng = np.random.default_rng(7)
    x = rng.standard_normal((2, 9, 40)).astype(np.float32)
    params = mha_weights(rng, 40)
    padding = np.zeros((2, 9), bool)
    padding[1, 6:] = True  # torch polarity: True hides the key
    attn = rng.random((9, 9)) < 0.2
    np.fill_diagonal(attn, False)
    want, want_w = torch_mha(x, x, x, 2, params, key_padding_mask=padding, attn_mask=attn)
    got, got_w = call_mha(ctx, x, x, x, 2, params, key_padding_mask=padding, attn_mask=attn)
    assert_close(got, want, 1e-4, 1e-5, "out")
    assert_close(got_w, want_w, 1e-4, 1e-6, "averaged weights")


def test_mha_cross_attention_kdim_vdim_float_mask_per_head(ctx):
    rng = np.random.default_rng(8)
    q = rng.standard_normal((2, 5, 24)).astype(np.float32)
    k = rng.standard_normal((2, 7, 16)).astype(np.float32)
    v = rng.standard_normal((2, 7, 20)).astype(np.float32)
    params = mha_weights(rng, 24, 16, 20)
    attn = rng.standard_normal((2 * 3, 5, 7)).astype(np.float32)
    want, want_w = torch_mha(q, k, v, 3, params, kdim=16, vdim=20, attn_mask=attn,
                             average_attn_weights=False)
    got, got_w = call_mha(ctx, q, k, v, 3, params, attn_mask=attn, average_attn_weights=False)
    assert_close(got, want, 1e-4, 1e-5, "out")
    assert_close(got_w, want_w, 1e-4, 1e-6, "per-head weights")


def test_mha_causal_and_fully_padded_batch(ctx):
    """is_causal equals torch's causal bool mask; a batch with every key padded gives
    out_proj_bias (zero attention rows, the design's rule), where torch 1.13 gives NaN and later
    versions may give the bias too (the test passes on either torch, but on nothing else)."""
    rng = np.random.default_rng(9)
    x = rng.standard_normal((2, 6, 24)).astype(np.float32)
    params = mha_weights(rng, 24)
    padding = np.zeros((2, 6), bool)
    padding[1] = True
    causal = ~causal_mask(6, 6)
    want, _ = torch_mha(x, x, x, 4, params, key_padding_mask=padding, attn_mask=causal,
                        need_weights=False)
    got, got_w = call_mha(ctx, x, x, x, 4, params, key_padding_mask=padding, is_causal=True,
                          need_weights=False)
    assert got_w is None
    assert_close(got[0], want[0], 1e-4, 1e-5, "causal batch")
    bias = np.broadcast_to(params["out_proj_bias"], got[1].shape)
    assert np.isnan(want[1]).all() or np.allclose(want[1], bias, 1e-5, 1e-6), \
        f"torch gave neither NaN nor the bias on a fully padded batch: {want[1][0]}"
    assert_close(got[1], bias, 1e-6, 1e-7, "fully padded batch")


def test_selftest_passes(capsys):
    # `python -m clattn selftest`, the check a user runs on a new driver, itself passes here
    from clattn.__main__ import selftest
    assert selftest(None) == 0, capsys.readouterr().out
