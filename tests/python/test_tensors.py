"""Device-resident tensors (clattn.Tensor): uploads, downloads, views without copies, ops that
stay on the device, out=, release, and the errors a wrong tensor gets."""
import gc

import numpy as np
import pytest

import clattn

RNG = np.random.default_rng(77)


def test_round_trips_keep_values_and_dtypes(ctx):
    for array in (RNG.standard_normal((2, 3, 5)).astype(np.float32),
                  RNG.standard_normal((7,)).astype(np.float16),
                  RNG.integers(-9, 9, (4, 6)).astype(np.int32),
                  RNG.random((3, 4)) > 0.5):
        t = ctx.tensor(array)
        assert t.shape == array.shape and t.dtype == array.dtype, (t, array.dtype)
        assert np.array_equal(t.numpy(), array)
    assert ctx.tensor(np.ones((2, 2))).dtype == np.float32  # float64 becomes float32
    with pytest.raises(TypeError):
        ctx.tensor(np.ones(3, np.complex64))


def test_bfloat16_storage_through_astype(ctx):
    x = RNG.standard_normal((2, 8)).astype(np.float32)
    b = ctx.tensor(x).astype("bfloat16")
    assert b.dtype == "bfloat16"
    want = (x.view(np.uint32) + 0x7FFF + ((x.view(np.uint32) >> 16) & 1)) >> 16 << 16
    assert np.array_equal(b.numpy(), want.astype(np.uint32).view(np.float32))


def test_views_copy_nothing_and_read_right(ctx):
    x = RNG.standard_normal((2, 3, 4, 5)).astype(np.float32)
    t = ctx.tensor(x)
    p = t.permute(0, 2, 1, 3)
    assert p.shape == (2, 4, 3, 5) and p.strides == (60, 5, 20, 1) and p.offset == 0
    assert np.array_equal(p.numpy(), x.transpose(0, 2, 1, 3))
    assert np.array_equal(t.transpose(2, 3).numpy(), x.swapaxes(2, 3))
    assert np.array_equal(t[1].numpy(), x[1])
    assert np.array_equal(t[:, 1:3].numpy(), x[:, 1:3])
    assert np.array_equal(t[1, ::2].numpy(), x[1, ::2])
    assert t[1]._desc.buffer == t._desc.buffer  # the same cl_mem
    assert np.array_equal(t[0].reshape(1, 3, 4, 5).numpy(), x[:1])
    with pytest.raises(ValueError):
        t.reshape(6, 4, 5)  # would need a copy


def test_ops_on_tensors_stay_on_the_device(ctx):
    x = RNG.standard_normal((2, 16, 3 * 64)).astype(np.float32)
    xt = ctx.tensor(x)
    q, k, v = ctx.split_qkv(xt, 4)
    o = ctx.attention(q, k, v, causal=True)
    m = ctx.merge_heads(o)
    assert all(isinstance(t, clattn.Tensor) for t in (q, k, v, o, m))
    want = ctx.merge_heads(ctx.attention(*ctx.split_qkv(x, 4), causal=True))
    assert isinstance(want, np.ndarray)
    assert np.array_equal(m.numpy(), want)
    # a [B,S,H,D] view goes in as it is: attention reads the strides
    qs = ctx.tensor(q.numpy().transpose(0, 2, 1, 3)).permute(0, 2, 1, 3)
    assert np.array_equal(ctx.attention(qs, k, v, causal=True).numpy(), o.numpy())
    # mixed numpy and tensors: tensors out
    assert isinstance(ctx.attention(q.numpy(), k, v), clattn.Tensor)


def test_out_writes_into_the_given_tensor(ctx):
    x = RNG.standard_normal((1, 2, 9, 8)).astype(np.float32)
    out = ctx.empty((1, 9, 16))
    got = ctx.merge_heads(ctx.tensor(x), out=out)
    assert got is out
    assert np.array_equal(out.numpy(), x.transpose(0, 2, 1, 3).reshape(1, 9, 16))
    scores = RNG.standard_normal((2, 5, 7)).astype(np.float32)
    y = ctx.empty((2, 5, 7))
    assert ctx.softmax(scores, causal=True, out=y) is y  # numpy in, out= a tensor
    assert np.allclose(y.numpy(), ctx.softmax(scores, causal=True), rtol=0, atol=0)
    with pytest.raises(ValueError):
        ctx.merge_heads(ctx.tensor(x), out=ctx.empty((1, 9, 15)))
    with pytest.raises(TypeError):
        ctx.merge_heads(x, out=np.empty((1, 9, 16), np.float32))


def test_backward_and_linear_steps_on_tensors(ctx):
    q, k, v, dout = (ctx.tensor(RNG.standard_normal((1, 2, 12, 16)).astype(np.float32))
                     for _ in range(4))
    out, lse = ctx.attention(q, k, v, causal=True, return_lse=True)
    grads = ctx.attention_backward(dout, q, k, v, out, lse, causal=True)
    host = ctx.attention_backward(*(t.numpy() for t in (dout, q, k, v, out, lse)), causal=True)
    for g, h in zip(grads, host):
        assert isinstance(g, clattn.Tensor) and np.array_equal(g.numpy(), h)
    # the recurrent state on the device, updated in place, matches the host state's steps
    state = (ctx.tensor(np.zeros((1, 2, 16, 16), np.float32)),
             ctx.tensor(np.zeros((1, 2, 16), np.float32)))
    host_state = None
    for t in range(3):
        step = slice(t, t + 1)
        row, state2 = ctx.linear_attention_step(q[:, :, step], k[:, :, step], v[:, :, step],
                                                state)
        assert state2[0] is state[0]
        want, host_state = ctx.linear_attention_step(q.numpy()[:, :, step], k.numpy()[:, :, step],
                                                     v.numpy()[:, :, step], host_state)
        assert np.array_equal(row.numpy(), want)
    assert np.array_equal(state[0].numpy(), host_state[0])


def test_mask_arguments_as_tensors(ctx):
    """Lengths, keep mask, bias and ALiBi slopes as device tensors give what numpy ones give."""
    q, k, v = (RNG.standard_normal((2, 3, 6, 8)).astype(np.float32) for _ in range(3))
    masks = dict(key_lengths=np.array([5, 2], np.int32), query_lengths=np.array([6, 4], np.int32),
                 mask=RNG.random((1, 3, 6, 6)) > 0.3,
                 bias=RNG.standard_normal((2, 1, 6, 6)).astype(np.float32),
                 alibi_slopes=np.array([0.5, 0.25, 0.125], np.float32))
    want = ctx.attention(q, k, v, causal=True, **masks)
    got = ctx.attention(q, k, v, causal=True, **{n: ctx.tensor(m) for n, m in masks.items()})
    assert isinstance(got, clattn.Tensor) and np.array_equal(got.numpy(), want)
    lengths = dict(key_lengths=masks["key_lengths"], query_lengths=masks["query_lengths"])
    want = ctx.linear_attention(q, k, v, **lengths)
    got = ctx.linear_attention(q, k, v, **{n: ctx.tensor(m) for n, m in lengths.items()})
    assert np.array_equal(got.numpy(), want)


def test_release_on_del_and_close(ctx):
    before = len(ctx._storages)
    t = ctx.empty((256, 256))
    view = t[3:]
    del t
    gc.collect()
    assert len(ctx._storages) == before + 1  # the view keeps the buffer
    del view
    gc.collect()
    assert len(ctx._storages) == before
    with clattn.Context() as other:
        kept = other.tensor(np.ones(4, np.float32))
    with pytest.raises(ValueError):
        kept.numpy()  # released with its context


def test_freed_buffers_are_kept_for_the_next_tensor_of_their_bytes():
    """A freed tensor's buffer (or a numpy call's scratch) goes back to its Context, which hands
    it to the next allocation of the same bytes, whatever the dtype and shape; the oldest go past
    32 kept, and release_cached gives them all back."""
    with clattn.Context() as c:
        t = c.empty((1000,))
        buffer = t._desc.buffer
        del t
        gc.collect()
        assert c.cached_bytes == 4000
        half = c.empty((2, 1000), np.float16)  # the same 4000 bytes
        assert half._desc.buffer == buffer and c.cached_bytes == 0
        assert half.strides == (1000, 1) and half.offset == 0
        x = RNG.standard_normal((2, 1000)).astype(np.float16)
        assert np.array_equal(c.tensor(x).numpy(), x)  # the reused buffer holds what is put in
        view = half[1]
        del half
        gc.collect()
        assert c.cached_bytes == 4000  # the temporary tensor's; the view keeps half's buffer
        del view
        c.release_cached()
        want = c.softmax(x)  # numpy in, numpy out: the call's upload and output are kept
        assert c.cached_bytes == 8000
        for _ in range(3):
            assert np.array_equal(c.softmax(x), want) and c.cached_bytes == 8000
        tensors = [c.empty((64,)) for _ in range(40)]
        del tensors
        gc.collect()
        assert c.cached_bytes == 32 * 256  # the softmax's two 4000-byte buffers went first
        c.release_cached()
        assert c.cached_bytes == 0


def _attention_reference(q, k, v):
    s = np.einsum("bhqd,bhkd->bhqk", q.astype(np.float64), k) / np.sqrt(q.shape[-1])
    p = np.exp(s - s.max(-1, keepdims=True))
    return np.einsum("bhqk,bhkd->bhqd", p / p.sum(-1, keepdims=True), v)


def test_calls_share_one_workspace_grown_to_the_largest_need():
    """The ops that need scratch borrow the Context's one workspace instead of allocating their
    own per call: a smaller need takes it as it is, a larger one replaces it while calls that
    used the old one may still be in flight (Tensors: nothing waits between the calls), and
    release_cached gives it back."""
    shapes = [(1, 2, 64, 16), (2, 2, 160, 16), (1, 2, 64, 16)]
    inputs = [[RNG.standard_normal(s).astype(np.float32) for _ in range(3)] for s in shapes]
    with clattn.Context() as c:
        assert c.workspace_bytes == 0
        uploaded = [[c.tensor(a) for a in arrays] for arrays in inputs]  # uploads wait
        outs, held = [], []
        for q, k, v in uploaded:
            outs.append(c.attention(q, k, v, path="composed"))
            held.append(c.workspace_bytes)
        assert 0 < held[0] < held[1] == held[2], held
        for (q, k, v), out in zip(inputs, outs):
            np.testing.assert_allclose(out.numpy(), _attention_reference(q, k, v), atol=2e-5)
        c.release_cached()
        assert c.workspace_bytes == 0
        q, k, v = inputs[1]
        x, w = q[0], RNG.standard_normal((3 * 16, 16)).astype(np.float32)
        for call in (lambda: c.mha(x, x, x, 2, w, None, w[:16], None),
                     lambda: c.linear_attention(q, k, v, causal=True),
                     lambda: c.linear_attention_backward(q, q, k, v, causal=True),
                     lambda: c.attention_backward(q, q, k, v, q, np.zeros(q.shape[:3], np.float32),
                                                  path="composed")):
            call()
            assert c.workspace_bytes > 0, call
            c.release_cached()


def test_wrong_tensors_are_refused(ctx):
    with clattn.Context() as other:
        foreign = other.tensor(np.ones((1, 1, 4, 8), np.float32))
        with pytest.raises(ValueError):
            ctx.attention(foreign, foreign, foreign)
    q = ctx.tensor(np.ones((1, 1, 4, 8), np.float32))
    with pytest.raises(TypeError):
        ctx.attention(q, q, q, key_lengths=ctx.tensor(np.array([4.0], np.float32)))
    with pytest.raises(ValueError):
        ctx.attention(q, q, q, key_lengths=ctx.tensor(np.array([4, 4], np.int32)))
    with pytest.raises(TypeError):
        ctx.attention(ctx.tensor(np.ones((1, 1, 4, 8), np.int32)), q, q)
    with pytest.raises(TypeError):
        ctx.attention_backward(q.astype(np.float16), q, q, q, q, np.zeros((1, 1, 4), np.float32))


def test_matrix_units_are_reported(ctx):
    units = ctx.matrix_units()
    kinds, dtypes = ("mma", "wmma", "mfma", "dpas"), ("f16", "bf16")
    known = {kind + "-" + dtype for kind in kinds for dtype in dtypes}
    assert set(units) <= known
    assert ctx.matrix_units() == units  # probed once, cached
