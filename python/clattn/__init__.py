"""clattn: transformer-attention primitives on any OpenCL device, from Python.

numpy arrays in (float32 or float16; bool and int32 for masks and lengths), fresh numpy arrays
out. The surface mirrors PyTorch names; see docs/design.md (The Python binding) and the README.

    import clattn
    ctx = clattn.Context()                      # CLATTN_DEVICE, else the first GPU
    p = ctx.softmax(scores, scale=0.125, causal=True, key_lengths=[5, 7])
"""
import ctypes

import numpy as np

from . import _lib

__all__ = ["Context", "Error", "devices"]

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
    input's, then converts a float input to match it."""
    array = np.asarray(value)
    if array.dtype == np.float64:
        array = array.astype(np.float32)
    if array.dtype not in _FLOAT_DTYPES:
        raise TypeError("%s: dtype %s is not a float dtype clattn stores (float32, float16; "
                        "float64 becomes float32)" % (name, array.dtype))
    if dtype is not None:
        array = array.astype(dtype, copy=False)
    return np.ascontiguousarray(array)


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
        self._lib = _lib_handle()
        self._env = ctypes.c_void_p()
        spec = None if device is None else str(device).encode()
        _check(self._lib.clattn_env_create(spec, ctypes.byref(self._env)))

    @property
    def device(self):
        d = self._lib.clattn_env_device_desc(self._env).contents
        return "%s / %s" % (d.platform_name.decode(), d.name.decode())

    def close(self):
        if self._env:
            self._lib.clattn_env_release(self._env)
            self._env = ctypes.c_void_p()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    # ---- device tensors (freed by _Scope) ----

    def _alloc(self, scope, shape4, dtype):
        t = _lib.Tensor()
        dims = (ctypes.c_int64 * 4)(*shape4)
        _check(self._lib.clattn_env_alloc(self._env, dtype, dims, ctypes.byref(t)))
        scope.append(t)
        return t

    def _upload(self, scope, array, code):
        array = np.ascontiguousarray(array)
        t = self._alloc(scope, _as_4d("tensor", array.shape), code)
        _check(self._lib.clattn_env_upload(self._env, ctypes.byref(t), array.ctypes.data))
        return t

    def _download(self, t, shape, dtype):
        out = np.empty(shape, dtype=dtype)
        _check(self._lib.clattn_env_download(self._env, ctypes.byref(t), out.ctypes.data))
        return out

    def _queue(self):
        return self._lib.clattn_env_queue(self._env)

    # ---- ops ----

    def softmax(self, x, scale=1.0, *, causal=False, window=None, global_stride=0,
                key_lengths=None, query_lengths=None, mask=None, bias=None, alibi_slopes=None,
                softcap=0.0, empty_rows="zero", return_lse=False):
        """softmax over the last axis of mask(scale * x); x has 1 to 4 dims ([B,H,Sq,Sk])."""
        x = _float_array("x", x)
        shape4 = _as_4d("x", x.shape)
        with _Scope(self) as scope:
            xt = self._upload(scope, x, _FLOAT_DTYPES[x.dtype])
            yt = self._alloc(scope, shape4, _FLOAT_DTYPES[x.dtype])
            m = self._mask(scope, shape4, causal, window, global_stride, key_lengths,
                           query_lengths, mask, bias, alibi_slopes, softcap, empty_rows)
            lse = self._alloc(scope, (1,) + shape4[:3], _lib.F32) if return_lse else None
            _check(self._lib.clattn_softmax(
                ctypes.byref(xt), float(scale), ctypes.byref(m), ctypes.byref(yt),
                ctypes.byref(lse) if lse is not None else None, self._queue(), 0, None, None))
            y = self._download(yt, x.shape, x.dtype)
            if not return_lse:
                return y
            return y, self._download(lse, x.shape[:-1], np.float32)

    def softmax_backward(self, y, dy, scale=1.0):
        """dz = scale * y * (dy - sum(dy * y, -1)): the gradient of y = softmax(z) over the last
        axis (z = scale * x: the gradient with respect to x, without softcap). y and dy share
        one shape of 1 to 4 dims and one dtype; entries where y is 0 give exactly 0."""
        y = _float_array("y", y)
        dy = _float_array("dy", dy, y.dtype)
        if dy.shape != y.shape:
            raise ValueError("dy: shape %s differs from y's %s" % (dy.shape, y.shape))
        shape4 = _as_4d("y", y.shape)
        with _Scope(self) as scope:
            yt = self._upload(scope, y, _FLOAT_DTYPES[y.dtype])
            dyt = self._upload(scope, dy, _FLOAT_DTYPES[y.dtype])
            dzt = self._alloc(scope, shape4, _FLOAT_DTYPES[y.dtype])
            _check(self._lib.clattn_softmax_backward(
                ctypes.byref(yt), ctypes.byref(dyt), float(scale), ctypes.byref(dzt),
                self._queue(), 0, None, None))
            return self._download(dzt, y.shape, y.dtype)

    def split_heads(self, x, num_heads):
        """[B,S,H*D] -> [B,H,S,D]."""
        x = _float_array("x", x)
        if x.ndim != 3:
            raise ValueError("x: expected [B,S,E], got shape %s" % (x.shape,))
        b, s, e = x.shape
        if num_heads <= 0 or e % num_heads:
            raise ValueError("num_heads: %r does not divide the last dim %d" % (num_heads, e))
        with _Scope(self) as scope:
            xt = self._upload(scope, x, _FLOAT_DTYPES[x.dtype])
            out = self._alloc(scope, (b, num_heads, s, e // num_heads), _FLOAT_DTYPES[x.dtype])
            _check(self._lib.clattn_split_heads(ctypes.byref(xt), int(num_heads),
                                                ctypes.byref(out), self._queue(), 0, None, None))
            return self._download(out, (b, num_heads, s, e // num_heads), x.dtype)

    def merge_heads(self, x):
        """[B,H,S,D] -> [B,S,H*D]."""
        x = _float_array("x", x)
        if x.ndim != 4:
            raise ValueError("x: expected [B,H,S,D], got shape %s" % (x.shape,))
        b, h, s, d = x.shape
        with _Scope(self) as scope:
            xt = self._upload(scope, x, _FLOAT_DTYPES[x.dtype])
            out = self._alloc(scope, (1, b, s, h * d), _FLOAT_DTYPES[x.dtype])
            _check(self._lib.clattn_merge_heads(ctypes.byref(xt), ctypes.byref(out),
                                                self._queue(), 0, None, None))
            return self._download(out, (b, s, h * d), x.dtype)

    def split_qkv(self, x, num_heads, bias=None):
        """Packed [B,S,3*H*D] (q, then k, then v) -> (q, k, v), each [B,H,S,D]; optional bias
        [3*H*D] is added (in f32) on the way."""
        x = _float_array("x", x)
        if x.ndim != 3:
            raise ValueError("x: expected [B,S,3*H*D], got shape %s" % (x.shape,))
        b, s, e3 = x.shape
        if num_heads <= 0 or e3 % (3 * num_heads):
            raise ValueError("num_heads: 3 x %r does not divide the last dim %d" % (num_heads, e3))
        d = e3 // 3 // num_heads
        with _Scope(self) as scope:
            xt = self._upload(scope, x, _FLOAT_DTYPES[x.dtype])
            bt = None
            if bias is not None:
                bias = _float_array("bias", bias)
                if bias.shape != (e3,):
                    raise ValueError("bias: expected shape (%d,), got %s" % (e3, bias.shape))
                bt = self._upload(scope, bias, _FLOAT_DTYPES[bias.dtype])
            outs = [self._alloc(scope, (b, num_heads, s, d), _FLOAT_DTYPES[x.dtype]) for _ in range(3)]
            _check(self._lib.clattn_split_qkv(
                ctypes.byref(xt), ctypes.byref(bt) if bt is not None else None, int(num_heads),
                *[ctypes.byref(o) for o in outs], self._queue(), 0, None, None))
            return tuple(self._download(o, (b, num_heads, s, d), x.dtype) for o in outs)

    def attention(self, q, k, v, scale=None, *, causal=False, window=None, global_stride=0,
                  key_lengths=None, query_lengths=None, mask=None, bias=None, alibi_slopes=None,
                  softcap=0.0, empty_rows="zero", return_lse=False, return_weights=False,
                  path="auto"):
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
        with _Scope(self) as scope:
            qt, kt, vt = (self._upload(scope, a, _FLOAT_DTYPES[a.dtype]) for a in arrays)
            ot = self._alloc(scope, out_shape, _FLOAT_DTYPES[q.dtype])
            scores = (b, hq, sq, k.shape[2])
            m = self._mask(scope, scores, causal, window, global_stride, key_lengths,
                           query_lengths, mask, bias, alibi_slopes, softcap, empty_rows)
            lse = self._alloc(scope, (1, b, hq, sq), _lib.F32) if return_lse else None
            wt = self._alloc(scope, scores, _lib.F32) if return_weights else None
            options = _lib.AttentionOptions(paths[path],
                                            ctypes.pointer(wt) if wt is not None else None, None)
            _check(self._lib.clattn_attention_ex(
                ctypes.byref(qt), ctypes.byref(kt), ctypes.byref(vt),
                0.0 if scale is None else float(scale), ctypes.byref(m), ctypes.byref(ot),
                ctypes.byref(lse) if lse is not None else None, ctypes.byref(options),
                self._queue(), 0, None, None))
            results = [self._download(ot, out_shape, q.dtype)]
            if return_weights:
                results.append(self._download(wt, scores, np.float32))
            if return_lse:
                results.append(self._download(lse, (b, hq, sq), np.float32))
            return results[0] if len(results) == 1 else tuple(results)

    def attention_backward(self, dout, q, k, v, out, lse, scale=None, *, causal=False,
                           window=None, global_stride=0, key_lengths=None, query_lengths=None,
                           mask=None, bias=None, alibi_slopes=None, softcap=0.0,
                           empty_rows="zero", return_dbias=False, path="auto"):
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
        with _Scope(self) as scope:
            qt, kt, vt, ot, dot = (self._upload(scope, a, _FLOAT_DTYPES[dt])
                                   for a in (q, k, v, out, dout))
            lt = self._upload(scope, lse.reshape(1, b, hq, sq), _lib.F32)
            grads = [self._alloc(scope, a.shape, _FLOAT_DTYPES[dt]) for a in (q, k, v)]
            scores = (b, hq, sq, k.shape[2])
            m = self._mask(scope, scores, causal, window, global_stride, key_lengths,
                           query_lengths, mask, bias, alibi_slopes, softcap, empty_rows)
            bias_shape = np.shape(bias)
            dbt = self._alloc(scope, _as_4d("bias", bias_shape), _lib.F32) if return_dbias else None
            options = _lib.AttentionBackwardOptions(
                paths[path], ctypes.pointer(dbt) if dbt is not None else None, None)
            _check(self._lib.clattn_attention_backward(
                *(ctypes.byref(t) for t in (qt, kt, vt, ot, dot, lt)),
                0.0 if scale is None else float(scale), ctypes.byref(m),
                *(ctypes.byref(g) for g in grads), ctypes.byref(options), self._queue(), 0, None,
                None))
            results = [self._download(g, a.shape, dt) for g, a in zip(grads, (q, k, v))]
            if return_dbias:
                results.append(self._download(dbt, bias_shape, np.float32))
            return tuple(results)

    def linear_attention(self, q, k, v, causal=False, feature_map="elu1", eps=1e-6, *,
                         key_lengths=None, query_lengths=None):
        """Linear attention phi(q_i)^T S / (phi(q_i)^T z + eps), S = sum_j phi(k_j) v_j^T,
        z = sum_j phi(k_j), over the visible keys (j <= i when causal; causal="bottom_right"
        aligns the last query with the last key). q [B,Hq,Sq,D], k [B,Hkv,Sk,D],
        v [B,Hkv,Sk,Dv] -> out [B,Hq,Sq,Dv]. feature_map: "elu1", "relu" or "identity"."""
        arrays = _qkv_arrays(q, k, v)
        q, k, v = arrays
        out_shape = q.shape[:3] + (v.shape[3],)
        with _Scope(self) as scope:
            qt, kt, vt = (self._upload(scope, a, _FLOAT_DTYPES[a.dtype]) for a in arrays)
            ot = self._alloc(scope, out_shape, _FLOAT_DTYPES[q.dtype])
            m = self._linear_mask(scope, q.shape[0], causal, key_lengths, query_lengths)
            options = _linear_options(feature_map, eps)
            _check(self._lib.clattn_linear_attention(
                ctypes.byref(qt), ctypes.byref(kt), ctypes.byref(vt), ctypes.byref(m),
                ctypes.byref(ot), ctypes.byref(options), self._queue(), 0, None, None))
            return self._download(ot, out_shape, q.dtype)

    def linear_attention_backward(self, dout, q, k, v, causal=False, feature_map="elu1", eps=1e-6,
                                  *, key_lengths=None, query_lengths=None):
        """The gradients of out = linear_attention(q, k, v, causal, feature_map, eps, <lengths>)
        given dout [B,Hq,Sq,Dv]: (dq, dk, dv) in the shapes of q, k, v. The forward's output is
        recomputed; the causal form runs in O(S) (running sums from both ends)."""
        q, k, v = _qkv_arrays(q, k, v)
        dout = _float_array("dout", dout, q.dtype)
        out_shape = q.shape[:3] + (v.shape[3],)
        if dout.shape != out_shape:
            raise ValueError("dout: expected shape %s, got %s" % (out_shape, dout.shape))
        with _Scope(self) as scope:
            qt, kt, vt, dt = (self._upload(scope, a, _FLOAT_DTYPES[q.dtype])
                              for a in (q, k, v, dout))
            grads = [self._alloc(scope, a.shape, _FLOAT_DTYPES[q.dtype]) for a in (q, k, v)]
            m = self._linear_mask(scope, q.shape[0], causal, key_lengths, query_lengths)
            options = _linear_options(feature_map, eps)
            _check(self._lib.clattn_linear_attention_backward(
                *(ctypes.byref(t) for t in (qt, kt, vt, dt)), ctypes.byref(m),
                *(ctypes.byref(g) for g in grads), ctypes.byref(options), self._queue(), 0, None,
                None))
            return tuple(self._download(g, a.shape, q.dtype) for g, a in zip(grads, (q, k, v)))

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
                              lengths=None):
        """The recurrent form for decoding: n new tokens q [B,Hq,n,D], k [B,Hkv,n,D],
        v [B,Hkv,n,Dv] against the running state (S [B,Hkv,D,Dv], z [B,Hkv,D], float32; None:
        zero). Returns (out [B,Hq,n,Dv], new state); steps over a sequence equal the causal
        linear_attention over it. lengths: valid new tokens per batch (the rest are left out)."""
        arrays = _qkv_arrays(q, k, v)
        q, k, v = arrays
        b, hkv, d, dv = k.shape[0], k.shape[1], k.shape[3], v.shape[3]
        if state is None:
            state = (np.zeros((b, hkv, d, dv), np.float32), np.zeros((b, hkv, d), np.float32))
        s_host, z_host = (np.ascontiguousarray(x, dtype=np.float32) for x in state)
        if s_host.shape != (b, hkv, d, dv) or z_host.shape != (b, hkv, d):
            raise ValueError("state: expected S %s and z %s, got %s and %s"
                             % ((b, hkv, d, dv), (b, hkv, d), s_host.shape, z_host.shape))
        out_shape = q.shape[:3] + (dv,)
        with _Scope(self) as scope:
            qt, kt, vt = (self._upload(scope, a, _FLOAT_DTYPES[a.dtype]) for a in arrays)
            ot = self._alloc(scope, out_shape, _FLOAT_DTYPES[q.dtype])
            st = self._upload(scope, s_host, _lib.F32)
            zt = self._upload(scope, z_host.reshape(1, b, hkv, d), _lib.F32)
            lt = self._vector(scope, "lengths", lengths, b) if lengths is not None else None
            options = _linear_options(feature_map, eps)
            _check(self._lib.clattn_linear_attention_step(
                ctypes.byref(qt), ctypes.byref(kt), ctypes.byref(vt),
                ctypes.byref(lt) if lt is not None else None, ctypes.byref(st), ctypes.byref(zt),
                ctypes.byref(ot), ctypes.byref(options), self._queue(), 0, None, None))
            out = self._download(ot, out_shape, q.dtype)
            return out, (self._download(st, s_host.shape, np.float32),
                         self._download(zt, z_host.shape, np.float32))

    def mha(self, query, key, value, num_heads, in_proj_weight, in_proj_bias, out_proj_weight,
            out_proj_bias, key_padding_mask=None, attn_mask=None, is_causal=False,
            need_weights=True, average_attn_weights=True, *, q_proj_weight=None,
            k_proj_weight=None, v_proj_weight=None):
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
        with _Scope(self) as scope:
            inputs = [self._upload(scope, a.reshape((1,) + a.shape), _FLOAT_DTYPES[a.dtype])
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
                        self._upload(scope, w.reshape(_as_4d(name, w.shape)), _FLOAT_DTYPES[w.dtype])))
            ot = self._alloc(scope, (1, b, sq, e), _FLOAT_DTYPES[query.dtype])
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
                wt = self._alloc(scope, _as_4d("weights", weights_shape), _FLOAT_DTYPES[query.dtype])
                options.weights = ctypes.pointer(wt)
                options.average_attn_weights = int(bool(average_attn_weights))
            _check(self._lib.clattn_mha_forward(
                ctypes.byref(qt), ctypes.byref(kt), ctypes.byref(vt), ctypes.byref(params),
                ctypes.byref(ot), ctypes.byref(options), self._queue(), 0, None, None))
            out = self._download(ot, (b, sq, e), query.dtype)
            weights = self._download(wt, weights_shape, query.dtype) if need_weights else None
            return out, weights

    def _torch_mask(self, scope, name, mask, shape4):
        """A torch-polarity mask as clattn takes it: bool inverted to u8 keep, float as is."""
        m = np.asarray(mask)
        if m.dtype == np.bool_:
            return self._upload(scope, (~m).astype(np.uint8).reshape(shape4), _lib.U8)
        m = _float_array(name, m)
        return self._upload(scope, m.reshape(shape4), _FLOAT_DTYPES[m.dtype])

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
            keep = np.asarray(mask)
            if keep.dtype != np.bool_:
                raise ValueError("mask: expected a bool array (True = attend), got %s" % keep.dtype)
            m.keep = ctypes.pointer(self._upload(scope, keep.astype(np.uint8).reshape(_as_4d("mask", keep.shape)), _lib.U8))
        if bias is not None:
            b = _float_array("bias", bias)
            m.bias = ctypes.pointer(self._upload(scope, b.reshape(_as_4d("bias", b.shape)), _FLOAT_DTYPES[b.dtype]))
        if alibi_slopes is not None:
            slopes = _float_array("alibi_slopes", alibi_slopes, np.float32).reshape(-1)
            if slopes.shape != (heads,):
                raise ValueError("alibi_slopes: expected %d values (one per head), got %s" % (heads, slopes.shape))
            m.alibi_slopes = ctypes.pointer(self._upload(scope, slopes, _lib.F32))
        return m

    def _vector(self, scope, name, values, n):
        array = np.asarray(values)
        if array.dtype.kind not in "iu":
            raise ValueError("%s: expected integers, got %s" % (name, array.dtype))
        array = array.astype(np.int32).reshape(-1)
        if array.shape != (n,):
            raise ValueError("%s: expected %d values (one per batch), got %d" % (name, n, array.size))
        return self._upload(scope, array, _lib.I32)


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
    """Device tensors of one call, released when it ends (downloads are blocking, so the queue
    is done with them)."""

    def __init__(self, ctx):
        super().__init__()
        self._ctx = ctx

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        for t in self:
            self._ctx._lib.clattn_tensor_free(ctypes.byref(t))
        self.clear()
