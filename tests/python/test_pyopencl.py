"""PyOpenCL interop: a clattn.Context on the caller's queue, pyopencl arrays in and out without
copies (the same cl_mem), their offsets and strides, events in PyOpenCL's convention (inputs'
events waited for, outputs carrying the call's), out-of-order queues, the cached programs of a
caller's context released with its last Context, and the errors."""
import ctypes
import gc
import time

import numpy as np
import pytest

import clattn

cl = pytest.importorskip("pyopencl")
import pyopencl.array as cl_array  # noqa: E402  (after the skip)

RNG = np.random.default_rng(5)


@pytest.fixture(scope="module")
def device():
    """The pyopencl device of the device under test (CLATTN_DEVICE): the same ICD loader lists
    platforms and devices in the same order."""
    with clattn.Context() as probe:
        desc = probe._lib.clattn_env_device_desc(probe._env).contents
        return cl.get_platforms()[desc.platform_index].get_devices()[desc.device_index]


@pytest.fixture(scope="module")
def queue(device):
    return cl.CommandQueue(cl.Context([device]))


@pytest.fixture(scope="module")
def pctx(queue):
    context = clattn.Context.from_pyopencl(queue)
    yield context
    context.close()


def test_arrays_come_out_as_arrays_on_the_callers_buffers(pctx, queue):
    x = RNG.standard_normal((2, 9, 3 * 32)).astype(np.float32)
    a = cl_array.to_device(queue, x)
    q, k, v = pctx.split_qkv(a, 2)
    o = pctx.attention(q, k, v, causal=True)
    m = pctx.merge_heads(o)
    assert all(isinstance(t, cl_array.Array) for t in (q, k, v, o, m))
    assert m.queue is queue and m.shape == (2, 9, 32)
    with clattn.Context() as plain:
        want = plain.merge_heads(plain.attention(*plain.split_qkv(x, 2), causal=True))
    assert np.array_equal(m.get(), want)
    out = cl_array.empty(queue, (2, 9, 32), np.float32)
    assert pctx.merge_heads(o, out=out) is out
    assert np.array_equal(out.get(), want)
    # a Tensor over the array's own cl_mem, and an array over the Tensor's
    t = pctx.tensor(a)
    assert t._desc.buffer == a.base_data.int_ptr and np.array_equal(t.numpy(), x)
    back = t.to_pyopencl()
    assert back.base_data.int_ptr == a.base_data.int_ptr and np.array_equal(back.get(), x)


def test_offsets_and_strides_are_read_in_place(pctx, queue):
    x = RNG.standard_normal((3, 2, 7, 16)).astype(np.float32)
    a = cl_array.to_device(queue, x)
    q = a[1:]  # a byte offset into the same buffer
    kt = cl_array.to_device(queue, np.ascontiguousarray(x[1:].transpose(0, 2, 1, 3)))
    k = kt.transpose((0, 2, 1, 3))  # [B,S,H,D] memory seen as [B,H,S,D]
    assert q.offset > 0 and q.base_data.int_ptr == a.base_data.int_ptr
    assert not k.flags.c_contiguous
    with clattn.Context() as plain:
        want = plain.attention(x[1:], x[1:], x[1:])
    assert np.array_equal(pctx.attention(q, k, q).get(), want)


def pending(event):
    time.sleep(0.05)
    return event.command_execution_status != cl.command_execution_status.COMPLETE


def test_the_call_waits_for_wait_for_and_its_inputs_events(pctx, queue):
    x = RNG.standard_normal((1, 1, 5, 8)).astype(np.float32)
    a, b = cl_array.to_device(queue, x), cl_array.to_device(queue, x)  # blocking: before the gates
    gates = [cl.UserEvent(queue.context) for _ in range(2)]
    try:
        # (checks on plain values: pytest's report of a failed check would print the arrays,
        # and reading them blocks on the gates)
        y = pctx.softmax(a, wait_for=[gates[0]])
        held = [pending(e) for e in y.events]
        assert held == [True]
        # an input's pending event holds the call back the same way
        b.add_event(gates[1])
        z = pctx.softmax(b)
        held = [pending(e) for e in z.events]
        assert held == [True]
    finally:  # a failed check must not leave the queue blocked for the other tests
        for gate in gates:
            gate.set_status(cl.command_execution_status.COMPLETE)
    with clattn.Context() as plain:
        assert np.array_equal(y.get(), plain.softmax(x))
    assert np.array_equal(z.get(), y.get())


@pytest.fixture(scope="module")
def out_of_order(device):
    props = cl.command_queue_properties.OUT_OF_ORDER_EXEC_MODE_ENABLE
    if not device.queue_properties & props:
        pytest.skip("the device has no out-of-order queues")
    queue = cl.CommandQueue(cl.Context([device]), properties=props)
    with clattn.Context.from_pyopencl(queue) as ooo:
        yield ooo


def test_an_out_of_order_queue_orders_every_kind_of_call(out_of_order):
    """Chains by events (pyopencl arrays), by barriers (numpy in/out, Tensors), and across the
    two (ctx.tensor of an array, to_pyopencl of a Tensor), each as long as it takes a race on
    PoCL's out-of-order queue to show (before the barriers: wrong 5 times in 5)."""
    ooo, queue = out_of_order, out_of_order.queue
    x = RNG.standard_normal((2, 512, 3 * 256)).astype(np.float32)
    with clattn.Context() as plain:
        want = plain.merge_heads(plain.attention(*plain.split_qkv(x, 4)))
        q = plain.split_qkv(x, 4)[0]
        want_q = plain.attention(q, q, q)
    for _ in range(3):
        m = ooo.merge_heads(ooo.attention(*ooo.split_qkv(cl_array.to_device(queue, x), 4)))
        assert np.array_equal(m.get(), want)
        assert np.array_equal(ooo.attention(q, q, q), want_q)  # numpy in, numpy out
        t = ooo.merge_heads(ooo.attention(*ooo.split_qkv(ooo.tensor(x), 4)))
        assert np.array_equal(t.numpy(), want)  # Tensors
        a = ooo.split_qkv(cl_array.to_device(queue, x), 4)[0]
        assert np.array_equal(ooo.attention(*(ooo.tensor(a),) * 3).numpy(), want_q)
        back = ooo.attention(*(ooo.tensor(q),) * 3).to_pyopencl()
        assert np.array_equal(back.get(), want_q)


def test_an_out_of_order_queue_keeps_no_memory_between_calls(out_of_order):
    """Its calls may overlap, so each allocates its own scratch, and a freed buffer is released,
    not kept for the next tensor."""
    q = RNG.standard_normal((1, 2, 64, 16)).astype(np.float32)
    out = out_of_order.attention(q, q, q, path="composed")
    t = out_of_order.tensor(q)
    del t
    gc.collect()
    assert out_of_order.cached_bytes == 0 and np.isfinite(out).all()


def test_a_buffer_shared_with_pyopencl_is_never_reused(pctx, queue):
    """to_pyopencl's array holds the buffer past every Tensor over it: the Context must not
    hand it to a later tensor, which would then write into the array."""
    x = np.arange(256, dtype=np.float32)
    t = pctx.tensor(x)
    array = t.to_pyopencl()
    before = pctx.cached_bytes
    del t
    gc.collect()
    assert pctx.cached_bytes == before
    later = pctx.tensor(np.zeros(256, np.float32))
    assert later._desc.buffer != array.base_data.int_ptr
    assert np.array_equal(array.get(), x) and np.array_equal(later.numpy(), np.zeros(256))


def test_close_leaves_the_callers_queue_working(device):
    queue = cl.CommandQueue(cl.Context([device]))
    ctx = clattn.Context.from_pyopencl(queue)
    assert ctx.queue is queue
    y = ctx.softmax(cl_array.to_device(queue, np.ones((2, 4), np.float32)))
    ctx.close()
    assert np.array_equal(y.get(), np.full((2, 4), 0.25, np.float32))
    assert np.array_equal((y * 4).get(), np.ones((2, 4), np.float32))


def test_the_last_context_on_an_opencl_context_releases_its_programs(device):
    queue = cl.CommandQueue(cl.Context([device]))
    first, second = clattn.Context.from_pyopencl(queue), clattn.Context.from_pyopencl(queue)
    lib = first._lib
    lib.clattn_cache_stats.argtypes = [ctypes.POINTER(ctypes.c_size_t)] + [ctypes.c_void_p] * 2
    programs = ctypes.c_size_t()
    first.softmax(cl_array.to_device(queue, np.ones((2, 4), np.float32))).get()
    lib.clattn_cache_stats(ctypes.byref(programs), None, None)
    cached = programs.value
    first.close()
    lib.clattn_cache_stats(ctypes.byref(programs), None, None)
    assert programs.value == cached  # the second Context still uses them
    second.close()
    lib.clattn_cache_stats(ctypes.byref(programs), None, None)
    assert programs.value < cached


def test_wrong_arrays_are_refused(pctx, queue, device):
    a = cl_array.to_device(queue, np.ones((1, 1, 4, 8), np.float32))
    with clattn.Context() as plain, pytest.raises(ValueError, match="from_pyopencl"):
        plain.attention(a, a, a)
    foreign = cl_array.to_device(cl.CommandQueue(cl.Context([device])), np.ones(8, np.float32))
    with pytest.raises(ValueError, match="another OpenCL context"):
        pctx.softmax(foreign)
    with pytest.raises(TypeError, match="q: "):
        pctx.attention(cl_array.to_device(queue, np.ones((1, 1, 4, 8), np.int32)), a, a)
    half = cl_array.to_device(queue, np.ones((1, 1, 4, 8), np.float16))
    assert pctx.attention(half, half, half).dtype == np.float16  # f16 storage passes as it is
    assert pctx.attention(a, a, half).dtype == np.float32  # each operand its own storage
