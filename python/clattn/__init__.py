"""clattn: transformer-attention primitives on any OpenCL device, from Python.

numpy arrays in (float32 or float16; bool and int32 for masks and lengths), fresh numpy arrays
out. The surface mirrors PyTorch names; see docs/design.md (The Python binding) and the README.

    import clattn
    ctx = clattn.Context()                      # CLATTN_DEVICE, else the first GPU
    p = ctx.softmax(scores, scale=0.125, causal=True, key_lengths=[5, 7])
"""
import ctypes
import math
import sys
import threading
import weakref

import numpy as np

from . import _lib

__all__ = ["Context", "Error", "Tensor", "devices"]

_LIB = None


def _lib_handle():
    global _LIB
    if _LIB is None:
        _LIB = _lib.load()
    return _LIB


class Error(Exception):
    """A failed library call: `status` is the status name, `message` the library's detail."""

    def __init__(self, status, message):
        self.status = status
        self.message = message
        super().__init__("%s: %s" % (status, message))


def _check(code):
    if code != 0:
        lib = _lib_handle()
        raise Error(lib.clattn_status_name(code).decode(), lib.clattn_last_error().decode())


def _device_facts(lib, device):
    text = ctypes.create_string_buffer(8192)
    _check(lib.clattn_device_facts(device, text, len(text)))
    return text.value.decode(errors="replace")


def devices():
    """Every OpenCL device: index ("P:D"), platform, name, vendor, type, version, and facts (what
    clattn relies on about it, clattn_device_facts: "opencl=3.0 opencl_c=1.2 local_memory=...")."""
    lib = _lib_handle()
    count = ctypes.c_size_t(0)
    _check(lib.clattn_list_devices(None, 0, ctypes.byref(count)))
    descs = (_lib.DeviceDesc * max(count.value, 1))()
    _check(lib.clattn_list_devices(descs, count.value, ctypes.byref(count)))
    kinds = {1: "default", 2: "cpu", 4: "gpu", 8: "accelerator", 16: "custom"}
    result = []
    for d in descs[: count.value]:
        kind = ",".join(v for k, v in kinds.items() if d.type & k) or str(d.type)
        result.append(
            {
                "index": "%d:%d" % (d.platform_index, d.device_index),
                "platform": d.platform_name.decode(errors="replace"),
                "name": d.name.decode(errors="replace"),
                "vendor": d.vendor.decode(errors="replace"),
                "type": kind,
                "version": d.version.decode(errors="replace"),
                "facts": _device_facts(lib, d.device),
            }
        )
    return result


_FLOAT_DTYPES = {np.dtype(np.float32): _lib.F32, np.dtype(np.float16): _lib.F16}


def _float_array(name, value, dtype=None):
    """`value` as a contiguous float array clattn can store. float64 (numpy's default, and Python
    floats) becomes float32, as torch's default dtype would; float32 and float16 stay; any other
    dtype (integers, bool, complex) is a TypeError naming the argument. `dtype`, the first
    input's, then converts a float input to match it. A Tensor passes as it is (a float one, of
    `dtype` when given: a device tensor is never converted behind the caller's back)."""
    if isinstance(value, Tensor) or _is_pyopencl(value):
        code = value._desc.dtype if isinstance(value, Tensor) else _STORAGE_CODES.get(value.dtype)
        if code not in _FLOAT_CODES:
            raise TypeError("%s: a %s %s; clattn takes float ones here"
                            % (name, value.dtype, _kind_name(value)))
        if dtype is not None and _code_of(dtype) != code:
            raise TypeError("%s: a %s %s where %s is needed"
                            % (name, value.dtype, _kind_name(value), dtype))
        return value
    array = np.asarray(value)
    if array.dtype == np.float64:
        array = array.astype(np.float32)
    if array.dtype not in _FLOAT_DTYPES:
        raise TypeError("%s: dtype %s is not a float dtype clattn stores (float32, float16; "
                        "float64 becomes float32)" % (name, array.dtype))
    if dtype is not None:
        array = array.astype(dtype, copy=False)
    return np.ascontiguousarray(array)


# OpenCL contexts of from_pyopencl Contexts -> how many are open: the last to close releases the
# programs clattn cached for that context (they hold it alive).
_WRAPPED_CONTEXTS = {}

_STORAGE_CODES = {np.dtype(np.float32): _lib.F32, np.dtype(np.float16): _lib.F16,
                  np.dtype(np.int32): _lib.I32, np.dtype(np.bool_): _lib.U8}
_CODE_DTYPES = {_lib.F32: np.dtype(np.float32), _lib.F16: np.dtype(np.float16),
                _lib.BF16: "bfloat16", _lib.I32: np.dtype(np.int32), _lib.U8: np.dtype(np.bool_)}
_FLOAT_CODES = (_lib.F32, _lib.F16, _lib.BF16)
_KEPT_BUFFERS = 32  # the most freed buffers a Context keeps for reuse (Context._give_back)


class _Storage:
    """A buffer its Context allocated: given back when no tensor views it any more, or when the
    context closes (whichever comes first). `reusable`: the Context may keep it for a later
    tensor of the same bytes (not once a pyopencl array shares it, nor for the workspace)."""

    reusable = True

    def __init__(self, ctx, desc):
        self.ctx, self.desc = ctx, desc
        ctx._storages.add(self)

    def free(self):
        desc, self.desc = self.desc, None  # first: a second free() finds nothing to give back
        if desc is not None:
            self.ctx._give_back(desc, self.reusable)

    def __del__(self):
        try:
            self.free()
        except Exception:
            pass


class _Borrowed(_Storage):
    """The buffer of a pyopencl array a Tensor views: the array owns it; the Tensor keeps the
    array alive, and the context's close ends the Tensor's use of it."""

    def __init__(self, ctx, array):
        self.array = array
        super().__init__(ctx, True)

    def free(self):
        self.desc = self.array = None


class _Workspace(_Storage):
    """The scratch a Context lends its calls (Context._workspace_for): `nbytes` bytes."""

    reusable = False

    def __init__(self, ctx, nbytes):
        desc = ctx._alloc_desc(_lib.F32, (1, 1, 1, (nbytes + 3) // 4))
        self.nbytes = nbytes
        super().__init__(ctx, desc)


class Tensor:
    """A tensor on one Context's device: shape (1 to 4 dims), dtype, strides and offset (in
    elements) as clattn's descriptor has them, over a buffer it owns or shares with the tensor it
    is a view of. Views (permute, transpose, [] on the leading axes, reshape by leading 1s) copy
    nothing. numpy() downloads. Ops given a Tensor return Tensors and leave host memory alone."""

    def __init__(self, ctx, storage, desc, shape):
        self._ctx, self._storage, self._desc, self._shape = ctx, storage, desc, tuple(shape)

    # ---- what it is ----

    @property
    def shape(self):
        return self._shape

    @property
    def ndim(self):
        return len(self._shape)

    @property
    def dtype(self):
        """A numpy dtype (float32, float16, int32, bool), or the string "bfloat16"."""
        return _CODE_DTYPES[self._desc.dtype]

    @property
    def strides(self):
        """In elements, of the dims of `shape`."""
        return tuple(self._desc.strides[4 - self.ndim:])

    @property
    def offset(self):
        return self._desc.offset

    @property
    def context(self):
        return self._ctx

    def __repr__(self):
        return "clattn.Tensor(shape=%s, dtype=%s, strides=%s, offset=%d)" % (
            self.shape, self.dtype if isinstance(self.dtype, str) else self.dtype.name,
            self.strides, self.offset)

    def _descriptor(self, ctx):
        """The descriptor for a call on `ctx`; refuses a released tensor or another context."""
        if ctx is not self._ctx:
            raise ValueError("a tensor of another clattn.Context")
        if self._storage.desc is None:
            raise ValueError("the tensor was released (its context is closed)")
        return self._desc

    # ---- views ----

    def _view(self, shape, strides, offset):
        desc = _lib.Tensor()
        desc.buffer, desc.offset, desc.dtype = self._desc.buffer, offset, self._desc.dtype
        pad = 4 - len(shape)
        for i in range(4):
            desc.shape[i] = 1 if i < pad else shape[i - pad]
            desc.strides[i] = 0 if i < pad else strides[i - pad]
        return Tensor(self._ctx, self._storage, desc, shape)

    def permute(self, *dims):
        dims = tuple(dims[0]) if len(dims) == 1 and not isinstance(dims[0], int) else dims
        if sorted(dims) != list(range(self.ndim)):
            raise ValueError("permute: %s is not a permutation of %d dims" % (dims, self.ndim))
        return self._view([self.shape[d] for d in dims], [self.strides[d] for d in dims],
                          self.offset)

    def transpose(self, a, b):
        dims = list(range(self.ndim))
        dims[a], dims[b] = dims[b], dims[a]
        return self.permute(*dims)

    def __getitem__(self, key):
        """Integers and slices (step >= 1) along the leading axes."""
        key = key if isinstance(key, tuple) else (key,)
        if len(key) > self.ndim:
            raise IndexError("%d indices for %d dims" % (len(key), self.ndim))
        shape, strides, offset = [], [], self.offset
        for axis, k in enumerate(key):
            n, stride = self.shape[axis], self.strides[axis]
            if isinstance(k, slice):
                start, stop, step = k.indices(n)
                if step < 1:
                    raise IndexError("slices with a step below 1 are not views clattn can take")
                shape.append(max(0, (stop - start + step - 1) // step))
                strides.append(stride * step)
                offset += start * stride
            else:
                index = int(k) + n if int(k) < 0 else int(k)
                if not 0 <= index < n:
                    raise IndexError("index %s out of range for a dim of %d" % (k, n))
                offset += index * stride
        shape += list(self.shape[len(key):])
        strides += list(self.strides[len(key):])
        if not shape or 0 in shape:
            raise IndexError("a view must keep at least one dim and one element")
        return self._view(shape, strides, offset)

    def reshape(self, *shape):
        """Only adds or drops leading dims of size 1: any other reshape would need a copy."""
        shape = tuple(shape[0]) if len(shape) == 1 and not isinstance(shape[0], int) else shape
        core = lambda s: tuple(s)[next((i for i, n in enumerate(s) if n != 1), len(s)):]
        if core(shape) != core(self.shape) or not 1 <= len(shape) <= 4:
            raise ValueError("reshape %s -> %s: only leading dims of size 1 come and go "
                             "without a copy" % (self.shape, shape))
        kept = core(self.shape)
        strides = [0] * (len(shape) - len(kept)) + list(self.strides[self.ndim - len(kept):])
        return self._view(list(shape), strides, self.offset)

    def astype(self, dtype):
        """A new contiguous float tensor of `dtype` (float32, float16, "bfloat16"), by clattn_copy
        on the device (rounding to nearest even)."""
        if self._desc.dtype not in _FLOAT_CODES or _code_of(dtype) not in _FLOAT_CODES:
            raise TypeError("astype: float tensors to float dtypes only")
        ctx = self._ctx
        out = ctx.empty(self.shape, dtype)
        _check(ctx._lib.clattn_copy(ctypes.byref(self._descriptor(ctx)), None,
                                    ctypes.byref(out._desc), ctx._queue(), 0, None, None))
        return out

    def to_pyopencl(self):
        """A pyopencl.array.Array over the same buffer, offset and strides (no copy), on the
        queue of a Context made by from_pyopencl. It holds its own reference to the buffer."""
        ctx = self._ctx
        desc = self._descriptor(ctx)
        if ctx._cl_queue is None:
            raise ValueError("to_pyopencl: the tensor's Context was not made by from_pyopencl")
        if isinstance(self.dtype, str):
            raise TypeError("to_pyopencl: pyopencl arrays have no bfloat16 dtype")
        import pyopencl
        import pyopencl.array
        item = self.dtype.itemsize
        self._storage.reusable = False  # the array may outlive every Tensor over the buffer
        buffer = pyopencl.Buffer.from_int_ptr(desc.buffer, retain=True)
        array = pyopencl.array.Array(ctx._cl_queue, self.shape, self.dtype, data=buffer,
                                     offset=desc.offset * item,
                                     strides=tuple(st * item for st in self.strides))
        if ctx._out_of_order:  # the writers of the tensor are the calls before: mark them
            marker = ctypes.c_void_p()
            err = _lib.opencl().clEnqueueMarkerWithWaitList(ctx._queue(), 0, None,
                                                            ctypes.byref(marker))
            if err != 0:
                raise Error("CL_ERROR", "clEnqueueMarkerWithWaitList returned %d" % err)
            array.add_event(pyopencl.Event.from_int_ptr(marker.value, retain=False))
        return array

    # ---- to the host ----

    def _contiguous(self):
        n = list(self._desc.shape)
        return all(self._desc.strides[i] == int(np.prod(n[i + 1:])) for i in range(4) if n[i] > 1)

    def numpy(self):
        """A numpy copy (blocking): bfloat16 widened to float32, bool from its bytes."""
        ctx = self._ctx
        desc = self._descriptor(ctx)
        code = desc.dtype
        host_dtype = {_lib.BF16: np.uint16, _lib.U8: np.uint8}.get(code, _CODE_DTYPES.get(code))
        out = np.empty(self.shape, dtype=host_dtype)
        with _Scope(ctx) as scope:
            if not self._contiguous() or desc.offset:
                dense = ctx._alloc(scope, tuple(desc.shape), code)
                _check(ctx._lib.clattn_copy(ctypes.byref(desc), None, ctypes.byref(dense),
                                            ctx._queue(), 0, None, None))
                desc = dense
            _check(ctx._lib.clattn_env_download(ctx._env, ctypes.byref(desc), out.ctypes.data))
        if code == _lib.BF16:
            return (out.astype(np.uint32) << 16).view(np.float32)
        return out.astype(np.bool_) if code == _lib.U8 else out


def _is_pyopencl(value):
    """Whether `value` is a pyopencl.array.Array (pyopencl is imported only by its users)."""
    module = sys.modules.get("pyopencl.array")
    return module is not None and isinstance(value, module.Array)


def _kind_name(value):
    return "tensor" if isinstance(value, Tensor) else "pyopencl array"


def _dtype_name(code):
    dtype = _CODE_DTYPES[code]
    return dtype if isinstance(dtype, str) else dtype.name


def _code_of(dtype):
    """The storage code of a numpy dtype, a Tensor's dtype, or "bfloat16"."""
    if isinstance(dtype, str) and dtype == "bfloat16":
        return _lib.BF16
    return _STORAGE_CODES[np.dtype(dtype)]


def _as_4d(name, shape):
    if not 1 <= len(shape) <= 4:
        raise ValueError("%s: rank %d is not supported (1 to 4 dims)" % (name, len(shape)))
    return (1,) * (4 - len(shape)) + tuple(int(s) for s in shape)


def _causal_mode(causal):
    """(causal flag, alignment) from False | True | "top_left" | "bottom_right"."""
    if causal is False or causal is None:
        return 0, _lib.ALIGN_TOP_LEFT
    if causal is True or causal == "top_left":
        return 1, _lib.ALIGN_TOP_LEFT
    if causal == "bottom_right":
        return 1, _lib.ALIGN_BOTTOM_RIGHT
    raise ValueError('causal: expected False, True, "top_left" or "bottom_right", got %r' % (causal,))


class Context:
    """One device with its context and queue (clattn_env). Close it, or use it in a `with`."""

    def __init__(self, device=None):
        self._init_fields()
        spec = None if device is None else str(device).encode()
        _check(self._lib.clattn_env_create(spec, ctypes.byref(self._env)))

    @classmethod
    def from_pyopencl(cls, queue):
        """A Context on a PyOpenCL queue: ops run on that queue, allocations land in its context,
        and pyopencl.array.Array objects pass in and come out without copies (new outputs by
        pyopencl.array.empty on the queue). On an out-of-order queue, calls on pyopencl arrays
        are ordered by their events; any other call is followed by a barrier, so Tensors and
        numpy results see the calls before them. The queue and its context stay the caller's:
        close() waits for the queue and drops clattn's references (the last Context on that
        OpenCL context also releases the programs clattn cached for it)."""
        import pyopencl
        self = cls.__new__(cls)
        self._init_fields()
        _check(self._lib.clattn_env_wrap(ctypes.c_void_p(queue.int_ptr), ctypes.byref(self._env)))
        self._cl_queue = queue
        self._out_of_order = bool(
            queue.properties & pyopencl.command_queue_properties.OUT_OF_ORDER_EXEC_MODE_ENABLE)
        key = queue.context.int_ptr
        _WRAPPED_CONTEXTS[key] = _WRAPPED_CONTEXTS.get(key, 0) + 1
        return self

    def _init_fields(self):
        """What both constructors start from: no env yet, an in-order queue, nothing kept."""
        self._lib = _lib_handle()
        self._env = ctypes.c_void_p()
        self._storages = weakref.WeakSet()
        self._cl_queue = None
        self._out_of_order = False
        self._workspace = None
        self._kept, self._kept_lock, self._closing = [], threading.RLock(), False

    @property
    def queue(self):
        """The pyopencl.CommandQueue of a Context made by from_pyopencl, else None."""
        return self._cl_queue

    @property
    def device(self):
        d = self._lib.clattn_env_device_desc(self._env).contents
        return "%s / %s" % (d.platform_name.decode(), d.name.decode())

    # ---- memory kept between calls ----

    @property
    def workspace_bytes(self):
        """The bytes of scratch the Context keeps for its calls (0: none). On an in-order queue
        the calls that need scratch (attention, its backward, linear attention and its backward,
        mha) share one buffer, grown to the largest need so far, instead of allocating their own
        each time: fresh device memory is not free (on a CPU device, the page faults of its first
        touch cost more than the composed attention's kernels)."""
        ws = self._workspace
        return ws.nbytes if ws is not None and ws.desc is not None else 0

    @property
    def cached_bytes(self):
        """The bytes the Context holds beyond its live tensors: the workspace, and the buffers
        of freed tensors and of calls' numpy scratch, kept (on an in-order queue, at most 32) for
        the next allocation of the same size. release_cached() gives them back."""
        with self._kept_lock:
            kept = sum(nbytes for nbytes, _ in self._kept)
        return self.workspace_bytes + kept

    def release_cached(self):
        """Releases the workspace and the kept buffers (cached_bytes); later calls allocate
        again. Calls already enqueued keep what they use until they are done."""
        if self._workspace is not None:
            self._workspace.free()
            self._workspace = None
        with self._kept_lock:
            kept, self._kept = self._kept, []
        for _, desc in kept:
            self._lib.clattn_tensor_free(ctypes.byref(desc))

    def _alloc_desc(self, code, shape4):
        """clattn_env_alloc; when the device has no room, once more after release_cached()."""
        desc = _lib.Tensor()
        dims = (ctypes.c_int64 * 4)(*shape4)
        status = self._lib.clattn_env_alloc(self._env, code, dims, ctypes.byref(desc))
        if status != 0 and self.cached_bytes:
            self.release_cached()
            status = self._lib.clattn_env_alloc(self._env, code, dims, ctypes.byref(desc))
        _check(status)
        return desc

    def _new_desc(self, code, shape4):
        """A dense descriptor of dtype `code` and 4-d shape over a buffer of its bytes: one kept
        from a freed tensor of the same bytes, else a new allocation (which also refuses a
        shape clattn_env_alloc refuses)."""
        desc, size = None, self._lib.clattn_dtype_size(code)
        if size and all(n > 0 for n in shape4) and math.prod(shape4) <= 1 << 40:
            nbytes = size * math.prod(shape4)
            with self._kept_lock:
                at = [i for i, (n, _) in enumerate(self._kept) if n == nbytes]
                desc = self._kept.pop(at[-1])[1] if at else None
        if desc is None:
            return self._alloc_desc(code, shape4)
        desc.offset, desc.dtype = 0, code
        stride = 1
        for i in range(3, -1, -1):
            desc.shape[i], desc.strides[i] = shape4[i], stride
            stride *= shape4[i]
        return desc

    def _give_back(self, desc, reusable=True):
        """Ends a buffer's use by a tensor or a call. On an in-order queue the Context keeps it
        for the next allocation of its size: the calls that used it were enqueued before any
        that will, so they run first (uploads and downloads use the same queue). Otherwise, or
        past _KEPT_BUFFERS (the oldest goes), it is released."""
        if not reusable or self._out_of_order or self._closing or not self._env:
            self._lib.clattn_tensor_free(ctypes.byref(desc))
            return
        kept = _lib.Tensor.from_buffer_copy(desc)
        nbytes = self._lib.clattn_dtype_size(kept.dtype) * math.prod(kept.shape)
        with self._kept_lock:
            self._kept.append((nbytes, kept))
            evicted = self._kept.pop(0)[1] if len(self._kept) > _KEPT_BUFFERS else None
        if evicted is not None:
            self._lib.clattn_tensor_free(ctypes.byref(evicted))

    def _workspace_for(self, scope, size_query, *args):
        """The call's workspace (a cl_mem, or None: the library allocates the call's own).
        size_query is the op's clattn_*_workspace_size, args its arguments before the queue.
        Calls on an out-of-order queue may overlap, so they take none. A workspace that a
        larger need replaces stays alive with the scope until the call has been enqueued."""
        if self._out_of_order:
            return None
        need = ctypes.c_size_t(0)
        _check(size_query(*args, self._queue(), ctypes.byref(need)))
        if need.value == 0:
            return None
        if self.workspace_bytes < need.value:
            self._workspace = _Workspace(self, need.value)
        scope.kept.append(self._workspace)
        return self._workspace.desc.buffer

    def matrix_units(self):
        """The matrix units clattn can drive on this device (clattn_matrix_units): a list of
        "mma-f16", "mma-bf16", "mma-tf32" (NVIDIA; tf32: f32 attention as 3xTF32), "wmma-*",
        "mfma-*" (AMD), "dpas-*" (Intel), each probed once on an exact product; [] on CPUs."""
        units = ctypes.c_uint(0)
        _check(self._lib.clattn_matrix_units(self._lib.clattn_env_queue(self._env),
                                             ctypes.byref(units)))
        bits = (1 << i for i in range(32) if units.value >> i & 1)
        return [self._lib.clattn_matrix_unit_name(bit).decode() for bit in bits]

    @property
    def closed(self):
        """Whether close() has run (or begun)."""
        return self._closing

    def close(self):
        """Releases every tensor of the context (using one afterwards is a ValueError), then the
        context and queue."""
        self._closing = True  # what the storages give back is released, not kept
        for storage in list(self._storages):
            storage.free()
        self.release_cached()
        if self._env:
            self._lib.clattn_env_release(self._env)
            self._env = ctypes.c_void_p()
            if self._cl_queue is not None:
                key = self._cl_queue.context.int_ptr
                _WRAPPED_CONTEXTS[key] -= 1
                if _WRAPPED_CONTEXTS[key] == 0:
                    del _WRAPPED_CONTEXTS[key]
                    self._lib.clattn_cache_clear(ctypes.c_void_p(key))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    # ---- device tensors ----

    def tensor(self, array, dtype=None):
        """A device copy of `array` (numpy or anything np.asarray takes): float64 becomes float32
        (the ops' casting rules); float32, float16, int32 and bool stay; `dtype` converts first.
        A pyopencl array (on a from_pyopencl Context) becomes a Tensor over its own buffer,
        offset and strides, without a copy; it stays alive as long as the Tensor."""
        if _is_pyopencl(array):
            if dtype is not None:
                raise TypeError("dtype: a pyopencl array is taken as it is (no conversion)")
            desc = self._check_pyopencl(array, "array")
            if array.events:  # the queue's later work waits for the array's writers
                self._barrier(array.events)
            return Tensor(self, _Borrowed(self, array), desc, array.shape)
        array = np.asarray(array if dtype is None else np.asarray(array).astype(dtype))
        if array.dtype == np.float64:
            array = array.astype(np.float32)
        if array.dtype not in _STORAGE_CODES:
            raise TypeError("array: dtype %s is not one clattn stores (float32, float16, int32, "
                            "bool; float64 becomes float32)" % array.dtype)
        t = self.empty(array.shape, array.dtype)
        host = np.ascontiguousarray(array.astype(np.uint8) if array.dtype == np.bool_ else array)
        _check(self._lib.clattn_env_upload(self._env, ctypes.byref(t._desc), host.ctypes.data))
        return t

    def empty(self, shape, dtype=np.float32):
        """An uninitialized contiguous device tensor of 1 to 4 dims: float32, float16,
        "bfloat16", int32 or bool."""
        shape = (int(shape),) if np.isscalar(shape) else tuple(int(n) for n in shape)
        desc = self._new_desc(_code_of(dtype), _as_4d("shape", shape))
        storage = _Storage(self, desc)
        view = _lib.Tensor.from_buffer_copy(desc)
        return Tensor(self, storage, view, shape)

    def _check_pyopencl(self, array, name="input"):
        """The descriptor of a pyopencl array of this Context's OpenCL context (its buffer, not a
        copy), or the error that says why there is none."""
        if self._cl_queue is None:
            raise ValueError("%s: a pyopencl array; make the clattn.Context with "
                             "clattn.Context.from_pyopencl(queue)" % name)
        if array.context.int_ptr != self._cl_queue.context.int_ptr:
            raise ValueError("%s: a pyopencl array of another OpenCL context" % name)
        code = _STORAGE_CODES.get(np.dtype(array.dtype))
        if code is None:
            raise TypeError("%s: a %s pyopencl array; clattn stores float32, float16, int32 and "
                            "bool" % (name, array.dtype))
        item = array.dtype.itemsize
        if not 1 <= array.ndim <= 4 or array.size == 0:
            raise ValueError("%s: a pyopencl array of shape %s (1 to 4 dims, not empty)"
                             % (name, array.shape))
        if array.offset % item or any(st % item or st < 0 for st in array.strides):
            raise ValueError("%s: offset %d and strides %s (bytes) are not whole, non-negative "
                             "elements" % (name, array.offset, array.strides))
        desc = _lib.Tensor()
        desc.buffer, desc.offset, desc.dtype = array.base_data.int_ptr, array.offset // item, code
        shape4 = _as_4d(name, array.shape)
        strides = (0,) * (4 - array.ndim) + tuple(st // item for st in array.strides)
        for i in range(4):
            desc.shape[i], desc.strides[i] = shape4[i], strides[i]
        return desc

    def _barrier(self, events=()):
        """Everything enqueued after this waits for `events` (pyopencl Events), or, with none, for
        everything enqueued before it."""
        waits = (ctypes.c_void_p * max(len(events), 1))(*[e.int_ptr for e in events])
        err = _lib.opencl().clEnqueueBarrierWithWaitList(self._queue(), len(events),
                                                         waits if events else None, None)
        if err != 0:
            raise Error("CL_ERROR", "clEnqueueBarrierWithWaitList returned %d" % err)

    def finish(self):
        """Waits until every op enqueued on the context's queue is done."""
        err = _lib.opencl().clFinish(self._queue())
        if err != 0:
            raise Error("CL_ERROR", "clFinish returned %d" % err)

    def _alloc(self, scope, shape4, dtype, out=None):
        """An output of the call, by the scope's mode: the call's own scratch (numpy: freed with
        the scope, downloaded by _download), a new Tensor, or a new pyopencl array. `out` (a
        Tensor or a pyopencl array of that shape and dtype) takes the output in its place."""
        if out is not None:
            desc = self._device_operand(scope, "out", out, dtype)
            if tuple(desc.shape) != _as_4d("out", shape4):
                raise ValueError("out: expected shape %s, got %s" % (tuple(shape4), out.shape))
            scope.outputs[ctypes.addressof(desc)] = out
            return desc
        if scope.mode == "pyopencl":
            import pyopencl.array
            if dtype not in _CODE_DTYPES or isinstance(_CODE_DTYPES[dtype], str):
                raise TypeError("bfloat16 output: pyopencl arrays have no bfloat16 dtype")
            array = pyopencl.array.empty(self._cl_queue, tuple(shape4), _CODE_DTYPES[dtype])
            desc = self._device_operand(scope, "output", array, dtype)
            scope.outputs[ctypes.addressof(desc)] = array
            return desc
        if scope.mode == "tensor":
            t = self.empty(shape4, _CODE_DTYPES[dtype])
            scope.outputs[ctypes.addressof(t._desc)] = t
            return t._desc
        t = self._new_desc(dtype, tuple(shape4))
        scope.append(t)
        return t

    def _device_operand(self, scope, name, value, code):
        """The descriptor of a Tensor or pyopencl array of storage `code`, as it is (no copy).
        A pyopencl array's descriptor is the scope's (borrowed: the array keeps its buffer)."""
        if isinstance(value, Tensor):
            if value._desc.dtype != code:
                raise TypeError("%s: a %s tensor where %s is needed"
                                % (name, value.dtype, _dtype_name(code)))
            return value._descriptor(self)
        if _is_pyopencl(value):
            desc = self._check_pyopencl(value, name)
            if desc.dtype != code:
                raise TypeError("%s: a %s pyopencl array where %s is needed"
                                % (name, value.dtype, _dtype_name(code)))
            scope.borrowed.append(desc)
            return desc
        raise TypeError("%s: expected a clattn.Tensor or a pyopencl array, got %s"
                        % (name, type(value).__name__))

    def _upload(self, scope, array, code, name="input"):
        """The descriptor of an input: a Tensor or pyopencl array as it is, numpy uploaded into
        the call's scratch."""
        if _on_device(array):
            return self._device_operand(scope, name, array, code)
        array = np.ascontiguousarray(array)
        t = self._new_desc(code, _as_4d("tensor", array.shape))
        scope.append(t)
        _check(self._lib.clattn_env_upload(self._env, ctypes.byref(t), array.ctypes.data))
        return t

    def _download(self, scope, t, shape, dtype):
        """An output of the call: the device tensor or pyopencl array itself (reshaped to
        `shape`, a pyopencl array with the call's event) when the call works on the device,
        else its numpy copy."""
        if scope.device:
            shape = tuple(shape) or (1,)  # a device result has at least one dim
            result = scope.outputs[ctypes.addressof(t)]
            if scope.mode == "pyopencl" and _is_pyopencl(result):
                result.add_event(scope.event())
            else:
                scope.unordered = True
            return result if tuple(result.shape) == tuple(shape) else result.reshape(shape)
        return self._to_host(t, shape, dtype)

    def _to_host(self, t, shape, dtype):
        out = np.empty(shape, dtype=dtype)
        _check(self._lib.clattn_env_download(self._env, ctypes.byref(t), out.ctypes.data))
        return out

    def _queue(self):
        return self._lib.clattn_env_queue(self._env)

    # ---- ops ----

    def softmax(self, x, scale=1.0, *, causal=False, window=None, global_stride=0,
                key_lengths=None, query_lengths=None, mask=None, bias=None, alibi_slopes=None,
                softcap=0.0, empty_rows="zero", return_lse=False, out=None, wait_for=None):
        """softmax over the last axis of mask(scale * x); x has 1 to 4 dims ([B,H,Sq,Sk])."""
        x = _float_array("x", x)
        shape4 = _as_4d("x", x.shape)
        with _Scope(self, x, out, key_lengths, query_lengths, mask, bias, alibi_slopes,
                    wait_for=wait_for) as scope:
            xt = self._upload(scope, x, _code_of(x.dtype))
            yt = self._alloc(scope, shape4, _code_of(x.dtype), out)
            m = self._mask(scope, shape4, causal, window, global_stride, key_lengths,
                           query_lengths, mask, bias, alibi_slopes, softcap, empty_rows)
            lse = self._alloc(scope, (1,) + shape4[:3], _lib.F32) if return_lse else None
            _check(self._lib.clattn_softmax(
                ctypes.byref(xt), float(scale), ctypes.byref(m), ctypes.byref(yt),
                ctypes.byref(lse) if lse is not None else None, *scope.tail()))
            y = self._download(scope, yt, x.shape, x.dtype)
            if not return_lse:
                return y
            return y, self._download(scope, lse, x.shape[:-1], np.float32)

    def softmax_backward(self, y, dy, scale=1.0, *, out=None, wait_for=None):
        """dz = scale * y * (dy - sum(dy * y, -1)): the gradient of y = softmax(z) over the last
        axis (z = scale * x: the gradient with respect to x, without softcap). y and dy share
        one shape of 1 to 4 dims and one dtype; entries where y is 0 give exactly 0."""
        y = _float_array("y", y)
        dy = _float_array("dy", dy, y.dtype)
        if dy.shape != y.shape:
            raise ValueError("dy: shape %s differs from y's %s" % (dy.shape, y.shape))
        shape4 = _as_4d("y", y.shape)
        with _Scope(self, y, dy, out, wait_for=wait_for) as scope:
            yt = self._upload(scope, y, _code_of(y.dtype))
            dyt = self._upload(scope, dy, _code_of(y.dtype))
            dzt = self._alloc(scope, shape4, _code_of(y.dtype), out)
            _check(self._lib.clattn_softmax_backward(
                ctypes.byref(yt), ctypes.byref(dyt), float(scale), ctypes.byref(dzt),
                *scope.tail()))
            return self._download(scope, dzt, y.shape, y.dtype)

    def split_heads(self, x, num_heads, *, out=None, wait_for=None):
        """[B,S,H*D] -> [B,H,S,D]."""
        x = _float_array("x", x)
        if x.ndim != 3:
            raise ValueError("x: expected [B,S,E], got shape %s" % (x.shape,))
        b, s, e = x.shape
        if num_heads <= 0 or e % num_heads:
            raise ValueError("num_heads: %r does not divide the last dim %d" % (num_heads, e))
        with _Scope(self, x, out, wait_for=wait_for) as scope:
            xt = self._upload(scope, x, _code_of(x.dtype))
            out = self._alloc(scope, (b, num_heads, s, e // num_heads), _code_of(x.dtype), out)
            _check(self._lib.clattn_split_heads(ctypes.byref(xt), int(num_heads),
                                                ctypes.byref(out), *scope.tail()))
            return self._download(scope, out, (b, num_heads, s, e // num_heads), x.dtype)

    def merge_heads(self, x, *, out=None, wait_for=None):
        """[B,H,S,D] -> [B,S,H*D]."""
        x = _float_array("x", x)
        if x.ndim != 4:
            raise ValueError("x: expected [B,H,S,D], got shape %s" % (x.shape,))
        b, h, s, d = x.shape
        with _Scope(self, x, out, wait_for=wait_for) as scope:
            xt = self._upload(scope, x, _code_of(x.dtype))
            out = self._alloc(scope, (1, b, s, h * d), _code_of(x.dtype), out)
            _check(self._lib.clattn_merge_heads(ctypes.byref(xt), ctypes.byref(out),
                                                *scope.tail()))
            return self._download(scope, out, (b, s, h * d), x.dtype)

    def split_qkv(self, x, num_heads, bias=None, *, wait_for=None):
        """Packed [B,S,3*H*D] (q, then k, then v) -> (q, k, v), each [B,H,S,D]; optional bias
        [3*H*D] is added (in f32) on the way."""
        x = _float_array("x", x)
        if x.ndim != 3:
            raise ValueError("x: expected [B,S,3*H*D], got shape %s" % (x.shape,))
        b, s, e3 = x.shape
        if num_heads <= 0 or e3 % (3 * num_heads):
            raise ValueError("num_heads: 3 x %r does not divide the last dim %d" % (num_heads, e3))
        d = e3 // 3 // num_heads
        with _Scope(self, x, bias, wait_for=wait_for) as scope:
            xt = self._upload(scope, x, _code_of(x.dtype))
            bt = None
            if bias is not None:
                bias = _float_array("bias", bias)
                if bias.shape != (e3,):
                    raise ValueError("bias: expected shape (%d,), got %s" % (e3, bias.shape))
                bt = self._upload(scope, bias, _code_of(bias.dtype))
            outs = [self._alloc(scope, (b, num_heads, s, d), _code_of(x.dtype)) for _ in range(3)]
            _check(self._lib.clattn_split_qkv(
                ctypes.byref(xt), ctypes.byref(bt) if bt is not None else None, int(num_heads),
                *[ctypes.byref(o) for o in outs], *scope.tail()))
            return tuple(self._download(scope, o, (b, num_heads, s, d), x.dtype) for o in outs)

    def attention(self, q, k, v, scale=None, *, causal=False, window=None, global_stride=0,
                  key_lengths=None, query_lengths=None, mask=None, bias=None, alibi_slopes=None,
                  softcap=0.0, empty_rows="zero", return_lse=False, return_weights=False,
                  path="auto", out=None, wait_for=None):
        """softmax(mask(scale * q k^T)) v for q [B,Hq,Sq,D], k [B,Hkv,Sk,D], v [B,Hkv,Sk,Dv]
        (Hq a multiple of Hkv); scale None means 1/sqrt(D). Returns out [B,Hq,Sq,Dv], or the
        tuple (out, weights, lse) holding those asked for: weights [B,Hq,Sq,Sk] are the
        attention probabilities (the composed CLBlast path computes them). path: "auto",
        "fused" or "composed" (clattn_attention_ex)."""
        paths = {"auto": _lib.PATH_AUTO, "fused": _lib.PATH_FUSED,
                 "composed": _lib.PATH_COMPOSED}
        if path not in paths:
            raise ValueError('path: expected "auto", "fused" or "composed", got %r' % (path,))
        arrays = _qkv_arrays(q, k, v)
        q, k, v = arrays
        b, hq, sq, _ = q.shape
        out_shape = (b, hq, sq, v.shape[3])
        with _Scope(self, q, k, v, out, key_lengths, query_lengths, mask, bias, alibi_slopes,
                    wait_for=wait_for) as scope:
            qt, kt, vt = (self._upload(scope, a, _code_of(a.dtype)) for a in arrays)
            ot = self._alloc(scope, out_shape, _code_of(q.dtype), out)
            scores = (b, hq, sq, k.shape[2])
            m = self._mask(scope, scores, causal, window, global_stride, key_lengths,
                           query_lengths, mask, bias, alibi_slopes, softcap, empty_rows)
            lse = self._alloc(scope, (1, b, hq, sq), _lib.F32) if return_lse else None
            wt = self._alloc(scope, scores, _lib.F32) if return_weights else None
            options = _lib.AttentionOptions(paths[path],
                                            ctypes.pointer(wt) if wt is not None else None, None)
            lse_p = ctypes.byref(lse) if lse is not None else None
            options.workspace = self._workspace_for(
                scope, self._lib.clattn_attention_workspace_size, ctypes.byref(qt),
                ctypes.byref(kt), ctypes.byref(vt), ctypes.byref(m), ctypes.byref(ot), lse_p,
                ctypes.byref(options))
            _check(self._lib.clattn_attention_ex(
                ctypes.byref(qt), ctypes.byref(kt), ctypes.byref(vt),
                0.0 if scale is None else float(scale), ctypes.byref(m), ctypes.byref(ot),
                lse_p, ctypes.byref(options), *scope.tail()))
            results = [self._download(scope, ot, out_shape, q.dtype)]
            if return_weights:
                results.append(self._download(scope, wt, scores, np.float32))
            if return_lse:
                results.append(self._download(scope, lse, (b, hq, sq), np.float32))
            return results[0] if len(results) == 1 else tuple(results)

    def attention_backward(self, dout, q, k, v, out, lse, scale=None, *, causal=False,
                           window=None, global_stride=0, key_lengths=None, query_lengths=None,
                           mask=None, bias=None, alibi_slopes=None, softcap=0.0,
                           empty_rows="zero", return_dbias=False, path="auto",
                           wait_for=None):
        """The gradients of out = attention(q, k, v, scale, <mask>) given dout, in FlashAttention's
        argument order: (dq, dk, dv), or (dq, dk, dv, dbias) with return_dbias (dbias in the
        shape of the bias given, its broadcast dims summed as autograd sums them). out and lse
        are what attention(..., return_lse=True) returned for the same arguments; the mask
        keywords are attention's. The keep mask, lengths, window and ALiBi slopes have no
        gradient. Rows that saw no key give zeros. path: "auto" and "fused" (the fused kernels)
        or "composed" (GEMMs and the softmax's backward; no softcap, no dbias)."""
        paths = {"auto": _lib.PATH_AUTO, "fused": _lib.PATH_FUSED,
                 "composed": _lib.PATH_COMPOSED}
        if path not in paths:
            raise ValueError('path: expected "auto", "fused" or "composed", got %r' % (path,))
        q, k, v = _qkv_arrays(q, k, v)
        dt = q.dtype
        out = _float_array("out", out, dt)
        dout = _float_array("dout", dout, dt)
        lse = _float_array("lse", lse, np.float32)
        b, hq, sq, _ = q.shape
        out_shape = (b, hq, sq, v.shape[3])
        for name, a in (("out", out), ("dout", dout)):
            if a.shape != out_shape:
                raise ValueError("%s: expected shape %s, got %s" % (name, out_shape, a.shape))
        if lse.shape != (b, hq, sq):
            raise ValueError("lse: expected shape %s, got %s" % ((b, hq, sq), lse.shape))
        if return_dbias and bias is None:
            raise ValueError("return_dbias: there is no bias to differentiate")
        with _Scope(self, dout, q, k, v, out, lse, key_lengths, query_lengths, mask, bias,
                    alibi_slopes, wait_for=wait_for) as scope:
            qt, kt, vt, ot, dot = (self._upload(scope, a, _code_of(dt))
                                   for a in (q, k, v, out, dout))
            lt = self._upload(scope, lse.reshape(1, b, hq, sq), _lib.F32)
            grads = [self._alloc(scope, a.shape, _code_of(dt)) for a in (q, k, v)]
            scores = (b, hq, sq, k.shape[2])
            m = self._mask(scope, scores, causal, window, global_stride, key_lengths,
                           query_lengths, mask, bias, alibi_slopes, softcap, empty_rows)
            bias_shape = np.shape(bias)
            dbt = self._alloc(scope, _as_4d("bias", bias_shape), _lib.F32) if return_dbias else None
            options = _lib.AttentionBackwardOptions(
                paths[path], ctypes.pointer(dbt) if dbt is not None else None, None)
            options.workspace = self._workspace_for(
                scope, self._lib.clattn_attention_backward_workspace_size,
                *(ctypes.byref(t) for t in (qt, kt, vt, ot, dot, lt)), ctypes.byref(m),
                *(ctypes.byref(g) for g in grads), ctypes.byref(options))
            _check(self._lib.clattn_attention_backward(
                *(ctypes.byref(t) for t in (qt, kt, vt, ot, dot, lt)),
                0.0 if scale is None else float(scale), ctypes.byref(m),
                *(ctypes.byref(g) for g in grads), ctypes.byref(options), *scope.tail()))
            results = [self._download(scope, g, a.shape, dt) for g, a in zip(grads, (q, k, v))]
            if return_dbias:
                results.append(self._download(scope, dbt, bias_shape, np.float32))
            return tuple(results)

    def linear_attention(self, q, k, v, causal=False, feature_map="elu1", eps=1e-6, *,
                         key_lengths=None, query_lengths=None, out=None, wait_for=None):
        """Linear attention phi(q_i)^T S / (phi(q_i)^T z + eps), S = sum_j phi(k_j) v_j^T,
        z = sum_j phi(k_j), over the visible keys (j <= i when causal; causal="bottom_right"
        aligns the last query with the last key). q [B,Hq,Sq,D], k [B,Hkv,Sk,D],
        v [B,Hkv,Sk,Dv] -> out [B,Hq,Sq,Dv]. feature_map: "elu1", "relu" or "identity"."""
        arrays = _qkv_arrays(q, k, v)
        q, k, v = arrays
        out_shape = q.shape[:3] + (v.shape[3],)
        with _Scope(self, q, k, v, out, key_lengths, query_lengths,
                    wait_for=wait_for) as scope:
            qt, kt, vt = (self._upload(scope, a, _code_of(a.dtype)) for a in arrays)
            ot = self._alloc(scope, out_shape, _code_of(q.dtype), out)
            m = self._linear_mask(scope, q.shape[0], causal, key_lengths, query_lengths)
            options = _linear_options(feature_map, eps)
            options.workspace = self._workspace_for(
                scope, self._lib.clattn_linear_attention_workspace_size, ctypes.byref(qt),
                ctypes.byref(kt), ctypes.byref(vt), ctypes.byref(m), ctypes.byref(ot),
                ctypes.byref(options))
            _check(self._lib.clattn_linear_attention(
                ctypes.byref(qt), ctypes.byref(kt), ctypes.byref(vt), ctypes.byref(m),
                ctypes.byref(ot), ctypes.byref(options), *scope.tail()))
            return self._download(scope, ot, out_shape, q.dtype)

    def linear_attention_backward(self, dout, q, k, v, causal=False, feature_map="elu1", eps=1e-6,
                                  *, key_lengths=None, query_lengths=None, wait_for=None):
        """The gradients of out = linear_attention(q, k, v, causal, feature_map, eps, <lengths>)
        given dout [B,Hq,Sq,Dv]: (dq, dk, dv) in the shapes of q, k, v. The forward's output is
        recomputed; the causal form runs in O(S) (running sums from both ends)."""
        q, k, v = _qkv_arrays(q, k, v)
        dout = _float_array("dout", dout, q.dtype)
        out_shape = q.shape[:3] + (v.shape[3],)
        if dout.shape != out_shape:
            raise ValueError("dout: expected shape %s, got %s" % (out_shape, dout.shape))
        with _Scope(self, dout, q, k, v, key_lengths, query_lengths,
                    wait_for=wait_for) as scope:
            qt, kt, vt, dt = (self._upload(scope, a, _code_of(q.dtype))
                              for a in (q, k, v, dout))
            grads = [self._alloc(scope, a.shape, _code_of(q.dtype)) for a in (q, k, v)]
            m = self._linear_mask(scope, q.shape[0], causal, key_lengths, query_lengths)
            options = _linear_options(feature_map, eps)
            options.workspace = self._workspace_for(
                scope, self._lib.clattn_linear_attention_backward_workspace_size,
                *(ctypes.byref(t) for t in (qt, kt, vt, dt)), ctypes.byref(m),
                *(ctypes.byref(g) for g in grads), ctypes.byref(options))
            _check(self._lib.clattn_linear_attention_backward(
                *(ctypes.byref(t) for t in (qt, kt, vt, dt)), ctypes.byref(m),
                *(ctypes.byref(g) for g in grads), ctypes.byref(options), *scope.tail()))
            return tuple(self._download(scope, g, a.shape, q.dtype) for g, a in zip(grads, (q, k, v)))

    def _linear_mask(self, scope, batch, causal, key_lengths, query_lengths):
        m = _lib.Mask()
        m.causal, m.align = _causal_mode(causal)
        if key_lengths is not None:
            m.key_lengths = ctypes.pointer(self._vector(scope, "key_lengths", key_lengths, batch))
        if query_lengths is not None:
            m.query_lengths = ctypes.pointer(
                self._vector(scope, "query_lengths", query_lengths, batch))
        return m

    def linear_attention_step(self, q, k, v, state=None, feature_map="elu1", eps=1e-6, *,
                              lengths=None, wait_for=None):
        """The recurrent form for decoding: n new tokens q [B,Hq,n,D], k [B,Hkv,n,D],
        v [B,Hkv,n,Dv] against the running state (S [B,Hkv,D,Dv], z [B,Hkv,D], float32; None:
        zero). Returns (out [B,Hq,n,Dv], new state); steps over a sequence equal the causal
        linear_attention over it. lengths: valid new tokens per batch (the rest are left out)."""
        arrays = _qkv_arrays(q, k, v)
        q, k, v = arrays
        b, hkv, d, dv = k.shape[0], k.shape[1], k.shape[3], v.shape[3]
        if state is None:
            state = (np.zeros((b, hkv, d, dv), np.float32), np.zeros((b, hkv, d), np.float32))
        if any(_on_device(x) for x in state):
            return self._linear_step_on_device(q, k, v, state, feature_map, eps, lengths, wait_for)
        s_host, z_host = (np.ascontiguousarray(x, dtype=np.float32) for x in state)
        if s_host.shape != (b, hkv, d, dv) or z_host.shape != (b, hkv, d):
            raise ValueError("state: expected S %s and z %s, got %s and %s"
                             % ((b, hkv, d, dv), (b, hkv, d), s_host.shape, z_host.shape))
        out_shape = q.shape[:3] + (dv,)
        with _Scope(self, q, k, v, state, lengths, wait_for=wait_for) as scope:
            qt, kt, vt = (self._upload(scope, a, _code_of(a.dtype)) for a in arrays)
            ot = self._alloc(scope, out_shape, _code_of(q.dtype))
            st = self._upload(scope, s_host, _lib.F32)
            zt = self._upload(scope, z_host.reshape(1, b, hkv, d), _lib.F32)
            lt = self._vector(scope, "lengths", lengths, b) if lengths is not None else None
            options = _linear_options(feature_map, eps)
            _check(self._lib.clattn_linear_attention_step(
                ctypes.byref(qt), ctypes.byref(kt), ctypes.byref(vt),
                ctypes.byref(lt) if lt is not None else None, ctypes.byref(st), ctypes.byref(zt),
                ctypes.byref(ot), ctypes.byref(options), *scope.tail()))
            out = self._download(scope, ot, out_shape, q.dtype)
            return out, (self._to_host(st, s_host.shape, np.float32),
                         self._to_host(zt, z_host.shape, np.float32))

    def _linear_step_on_device(self, q, k, v, state, feature_map, eps, lengths, wait_for):
        """linear_attention_step with the state as device tensors or pyopencl arrays, updated in
        place (pyopencl ones also carry the call's event)."""
        s, z = state
        b, hkv, d, dv = k.shape[0], k.shape[1], k.shape[3], v.shape[3]
        for name, t, shape in (("state S", s, (b, hkv, d, dv)), ("state z", z, (b, hkv, d))):
            if not _on_device(t) or tuple(t.shape) != shape or t.dtype != np.float32:
                raise ValueError("%s: expected a float32 device tensor of shape %s" % (name, shape))
        out_shape = q.shape[:3] + (dv,)
        with _Scope(self, q, k, v, s, z, lengths, wait_for=wait_for) as scope:
            qt, kt, vt = (self._upload(scope, a, _code_of(a.dtype)) for a in (q, k, v))
            ot = self._alloc(scope, out_shape, _code_of(q.dtype))
            st = self._device_operand(scope, "state S", s, _lib.F32)
            zt = self._device_operand(scope, "state z", z, _lib.F32)
            lt = self._vector(scope, "lengths", lengths, b) if lengths is not None else None
            options = _linear_options(feature_map, eps)
            _check(self._lib.clattn_linear_attention_step(
                ctypes.byref(qt), ctypes.byref(kt), ctypes.byref(vt),
                ctypes.byref(lt) if lt is not None else None, ctypes.byref(st),
                ctypes.byref(zt), ctypes.byref(ot), ctypes.byref(options), *scope.tail()))
            for t in (s, z):
                if _is_pyopencl(t):
                    t.add_event(scope.event())
            return self._download(scope, ot, out_shape, q.dtype), (s, z)

    def mha(self, query, key, value, num_heads, in_proj_weight, in_proj_bias, out_proj_weight,
            out_proj_bias, key_padding_mask=None, attn_mask=None, is_causal=False,
            need_weights=True, average_attn_weights=True, *, q_proj_weight=None,
            k_proj_weight=None, v_proj_weight=None, wait_for=None):
        """torch.nn.MultiheadAttention(batch_first=True).forward in eval mode, with the
        module's parameters as arrays: query [B,Sq,E], key [B,Sk,kdim], value [B,Sk,vdim];
        in_proj_weight [3E,E] (None when q/k/v_proj_weight are given), in_proj_bias [3E],
        out_proj_weight [E,E], out_proj_bias [E] (biases may be None). Masks take torch's
        polarity: a bool key_padding_mask [B,Sk] or attn_mask [Sq,Sk] / [B*H,Sq,Sk] is True
        where a key is hidden; float masks are added to the scores. Passing the same array as
        query, key and value runs self-attention's single input GEMM. Returns (out [B,Sq,E],
        weights): weights [B,Sq,Sk] averaged over heads, [B,H,Sq,Sk] per head, or None when
        need_weights is False. A query row that sees no key gets out_proj_bias (torch 1.13:
        NaN)."""
        _refuse_tensors(key_padding_mask=key_padding_mask, attn_mask=attn_mask)
        self_attention = key is query and value is query
        query = _float_array("query", query)
        arrays = [query] if self_attention else [query, _float_array("key", key),
                                                 _float_array("value", value)]
        for name, a in zip(("query", "key", "value"), arrays):
            if a.ndim != 3:
                raise ValueError("%s: expected 3 dims [B,S,E], got shape %s" % (name, a.shape))
        b, sq, e = query.shape
        sk = arrays[-1].shape[1]
        heads = int(num_heads)
        weights = (in_proj_weight, q_proj_weight, k_proj_weight, v_proj_weight, in_proj_bias,
                   out_proj_weight, out_proj_bias)
        with _Scope(self, query, key, value, key_padding_mask, attn_mask, weights,
                    wait_for=wait_for) as scope:
            inputs = [self._upload(scope, a.reshape((1,) + a.shape), _code_of(a.dtype))
                      for a in arrays]
            qt, kt, vt = inputs * 3 if self_attention else inputs
            params = _lib.MhaParams(heads)
            for name, array in (("in_proj_weight", in_proj_weight), ("q_proj_weight", q_proj_weight),
                                ("k_proj_weight", k_proj_weight), ("v_proj_weight", v_proj_weight),
                                ("in_proj_bias", in_proj_bias), ("out_proj_weight", out_proj_weight),
                                ("out_proj_bias", out_proj_bias)):
                if array is not None:
                    w = _float_array(name, array)
                    setattr(params, name, ctypes.pointer(
                        self._upload(scope, w.reshape(_as_4d(name, w.shape)), _code_of(w.dtype))))
            ot = self._alloc(scope, (1, b, sq, e), _code_of(query.dtype))
            options = _lib.MhaOptions()
            options.is_causal = int(bool(is_causal))
            if key_padding_mask is not None:
                options.key_padding_mask = ctypes.pointer(
                    self._torch_mask(scope, "key_padding_mask", key_padding_mask, (1, 1, b, sk)))
            if attn_mask is not None:
                m = np.asarray(attn_mask)
                shape = (1, 1) + m.shape if m.ndim == 2 else (b, heads) + m.shape[1:]
                if m.ndim not in (2, 3) or (m.ndim == 3 and m.shape[0] != b * heads):
                    raise ValueError("attn_mask: expected [Sq,Sk] or [B*H,Sq,Sk], got shape %s"
                                     % (m.shape,))
                options.attn_mask = ctypes.pointer(self._torch_mask(scope, "attn_mask", m, shape))
            weights_shape = None
            if need_weights:
                weights_shape = (b, sq, sk) if average_attn_weights else (b, heads, sq, sk)
                wt = self._alloc(scope, _as_4d("weights", weights_shape), _code_of(query.dtype))
                options.weights = ctypes.pointer(wt)
                options.average_attn_weights = int(bool(average_attn_weights))
            options.workspace = self._workspace_for(
                scope, self._lib.clattn_mha_workspace_size, ctypes.byref(qt), ctypes.byref(kt),
                ctypes.byref(vt), ctypes.byref(params), ctypes.byref(ot), ctypes.byref(options))
            _check(self._lib.clattn_mha_forward(
                ctypes.byref(qt), ctypes.byref(kt), ctypes.byref(vt), ctypes.byref(params),
                ctypes.byref(ot), ctypes.byref(options), *scope.tail()))
            out = self._download(scope, ot, (b, sq, e), query.dtype)
            weights = self._download(scope, wt, weights_shape, query.dtype) if need_weights else None
            return out, weights

    def _torch_mask(self, scope, name, mask, shape4):
        """A torch-polarity mask as clattn takes it: bool inverted to u8 keep, float as is."""
        _refuse_tensors(**{name: mask})
        m = np.asarray(mask)
        if m.dtype == np.bool_:
            return self._upload(scope, (~m).astype(np.uint8).reshape(shape4), _lib.U8)
        m = _float_array(name, m)
        return self._upload(scope, m.reshape(shape4), _code_of(m.dtype))

    # ---- the mask keywords ----

    def _mask(self, scope, shape4, causal, window, global_stride, key_lengths, query_lengths,
              mask, bias, alibi_slopes, softcap, empty_rows):
        m = _lib.Mask()
        m.causal, m.align = _causal_mode(causal)
        if window is not None:
            left, right = window
            m.window, m.window_left, m.window_right = 1, int(left), int(right)
        m.global_stride = int(global_stride)
        m.softcap = float(softcap)
        if empty_rows not in ("zero", "nan"):
            raise ValueError('empty_rows: expected "zero" or "nan", got %r' % (empty_rows,))
        m.empty_rows_nan = empty_rows == "nan"
        batch, heads = shape4[0], shape4[1]
        if key_lengths is not None:
            m.key_lengths = ctypes.pointer(self._vector(scope, "key_lengths", key_lengths, batch))
        if query_lengths is not None:
            m.query_lengths = ctypes.pointer(self._vector(scope, "query_lengths", query_lengths, batch))
        if mask is not None:
            m.keep = ctypes.pointer(self._keep_mask(scope, mask))
        if bias is not None:
            b = _float_array("bias", bias)
            if not _on_device(b):
                b = b.reshape(_as_4d("bias", b.shape))
            m.bias = ctypes.pointer(self._upload(scope, b, _code_of(b.dtype), "bias"))
        if alibi_slopes is not None:
            slopes = _float_array("alibi_slopes", alibi_slopes, np.float32)
            slopes = slopes if _on_device(slopes) else slopes.reshape(-1)
            if tuple(slopes.shape) != (heads,):
                raise ValueError("alibi_slopes: expected %d values (one per head), got shape %s"
                                 % (heads, slopes.shape))
            m.alibi_slopes = ctypes.pointer(
                self._upload(scope, slopes, _lib.F32, "alibi_slopes"))
        return m

    def _keep_mask(self, scope, mask):
        """The keep mask (True = attend): a bool array, Tensor or pyopencl array."""
        if _on_device(mask):
            return self._device_operand(scope, "mask", mask, _lib.U8)
        keep = np.asarray(mask)
        if keep.dtype != np.bool_:
            raise ValueError("mask: expected a bool array (True = attend), got %s" % keep.dtype)
        return self._upload(scope, keep.astype(np.uint8).reshape(_as_4d("mask", keep.shape)),
                            _lib.U8)

    def _vector(self, scope, name, values, n):
        """Lengths, one per batch: integers (a numpy array or list), or an int32 Tensor or
        pyopencl array of shape (n,)."""
        if _on_device(values):
            if tuple(values.shape) != (n,):
                raise ValueError("%s: expected shape (%d,) (one per batch), got %s"
                                 % (name, n, values.shape))
            return self._device_operand(scope, name, values, _lib.I32)
        array = np.asarray(values)
        if array.dtype.kind not in "iu":
            raise ValueError("%s: expected integers, got %s" % (name, array.dtype))
        array = array.astype(np.int32).reshape(-1)
        if array.shape != (n,):
            raise ValueError("%s: expected %d values (one per batch), got %d" % (name, n, array.size))
        return self._upload(scope, array, _lib.I32)


def _on_device(value):
    return isinstance(value, Tensor) or _is_pyopencl(value)


def _refuse_tensors(**arguments):
    """mha's masks take numpy arrays: torch's bool polarity is inverted on the way up."""
    for name, value in arguments.items():
        if _on_device(value):
            raise TypeError("%s: takes a numpy array, not a %s" % (name, _kind_name(value)))


def _qkv_arrays(q, k, v):
    arrays = [_float_array(name, a) for name, a in (("q", q), ("k", k), ("v", v))]
    for name, a in zip("qkv", arrays):
        if a.ndim != 4:
            raise ValueError("%s: expected 4 dims [B,H,S,D], got shape %s" % (name, a.shape))
    return arrays


def _linear_options(feature_map, eps):
    if feature_map not in _lib.FEATURE_MAPS:
        raise ValueError('feature_map: expected "elu1", "relu" or "identity", got %r' % (feature_map,))
    return _lib.LinearOptions(_lib.FEATURE_MAPS[feature_map], float(eps), None)


class _Scope(list):
    """One call: its device scratch, released when it ends (downloads are blocking, so the queue
    is done with them; OpenCL keeps a released buffer until the commands that use it are done),
    and its mode, fixed by what it was given (`inputs`, `out` among them):

    - "numpy": numpy in, numpy out;
    - "tensor": some argument is a clattn.Tensor: outputs are new Tensors (or `out`), nothing
      is downloaded;
    - "pyopencl": some argument is a pyopencl.array.Array: outputs are new pyopencl arrays
      (pyopencl.array.empty on the Context's queue) or `out`, and each carries the call's event
      in its `events`, as PyOpenCL's own array operations do.

    The call waits for `wait_for` (PyOpenCL events) and for the events of its pyopencl inputs.
    On an out-of-order queue, a call with any result that carries no event of the call (numpy,
    Tensors) ends with a barrier, so what comes after it sees its results."""

    def __init__(self, ctx, *inputs, wait_for=None):
        super().__init__()
        self._ctx = ctx
        flat = [x for i in inputs for x in (i if isinstance(i, (tuple, list)) else (i,))]
        arrays = [x for x in flat if _is_pyopencl(x)]
        self.mode = "pyopencl" if arrays else (
            "tensor" if any(isinstance(x, Tensor) for x in flat) else "numpy")
        for x in flat:
            if isinstance(x, Tensor):
                x._descriptor(ctx)
            elif _is_pyopencl(x):
                ctx._check_pyopencl(x)
        self.waits = list(wait_for or []) + [e for a in arrays for e in a.events]
        self.outputs = {}
        self.borrowed = []
        self.kept = []  # objects that must outlive the call's enqueue (a replaced workspace)
        self.unordered = self.mode != "pyopencl"  # some result carries no event of the call
        self._event = ctypes.c_void_p()
        self._cl_event = None

    @property
    def device(self):
        return self.mode != "numpy"

    def tail(self):
        """OpenCL's four last arguments of the call: queue, wait list, event (pyopencl mode)."""
        waits = (ctypes.c_void_p * len(self.waits))(*[e.int_ptr for e in self.waits])
        return (self._ctx._queue(), len(self.waits), waits if self.waits else None,
                ctypes.byref(self._event) if self.mode == "pyopencl" else None)

    def event(self):
        """The call's event as a pyopencl.Event (it takes over the reference the call gave)."""
        if self._cl_event is None and self._event.value:
            import pyopencl
            self._cl_event = pyopencl.Event.from_int_ptr(self._event.value, retain=False)
        return self._cl_event

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        for t in self:
            self._ctx._give_back(t)
        self.clear()
        if self._event.value and self._cl_event is None:
            self.event()  # not handed to any output: released with its wrapper
        if self._ctx._out_of_order and self.unordered and exc[0] is None:
            self._ctx._barrier()
