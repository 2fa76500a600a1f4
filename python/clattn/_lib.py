"""ctypes declarations of libclattn: the structs of include/clattn.h and the functions used."""
import ctypes
import os
from ctypes import POINTER, c_char, c_char_p, c_float, c_int, c_int64, c_size_t, c_uint, c_uint64, c_void_p

F32, F16, BF16, I32, U8 = 0, 1, 2, 3, 4
ALIGN_TOP_LEFT, ALIGN_BOTTOM_RIGHT = 0, 1


class Tensor(ctypes.Structure):
    _fields_ = [
        ("buffer", c_void_p),
        ("offset", c_size_t),
        ("dtype", c_int),
        ("shape", c_int64 * 4),
        ("strides", c_int64 * 4),
    ]


class Mask(ctypes.Structure):
    _fields_ = [
        ("causal", c_int),
        ("align", c_int),
        ("window", c_int),
        ("window_left", c_int64),
        ("window_right", c_int64),
        ("global_stride", c_int64),
        ("softcap", c_float),
        ("empty_rows_nan", c_int),
        ("key_lengths", POINTER(Tensor)),
        ("query_lengths", POINTER(Tensor)),
        ("keep", POINTER(Tensor)),
        ("bias", POINTER(Tensor)),
        ("alibi_slopes", POINTER(Tensor)),
    ]


class AttentionOptions(ctypes.Structure):
    _fields_ = [
        ("path", c_int),
        ("weights", POINTER(Tensor)),
        ("workspace", c_void_p),
    ]


PATH_AUTO, PATH_FUSED, PATH_COMPOSED = 0, 1, 2


class AttentionBackwardOptions(ctypes.Structure):
    _fields_ = [
        ("path", c_int),
        ("dbias", POINTER(Tensor)),
        ("workspace", c_void_p),
    ]


class LinearOptions(ctypes.Structure):
    _fields_ = [
        ("feature_map", c_int),
        ("eps", c_float),
        ("workspace", c_void_p),
    ]


FEATURE_MAPS = {"elu1": 0, "relu": 1, "identity": 2}


class MhaParams(ctypes.Structure):
    _fields_ = [("num_heads", c_int)] + [
        (name, POINTER(Tensor))
        for name in ("in_proj_weight", "q_proj_weight", "k_proj_weight", "v_proj_weight",
                     "in_proj_bias", "out_proj_weight", "out_proj_bias")
    ]


class MhaOptions(ctypes.Structure):
    _fields_ = [
        ("key_padding_mask", POINTER(Tensor)),
        ("attn_mask", POINTER(Tensor)),
        ("is_causal", c_int),
        ("weights", POINTER(Tensor)),
        ("average_attn_weights", c_int),
        ("workspace", c_void_p),
    ]


class DeviceDesc(ctypes.Structure):
    _fields_ = [
        ("platform_index", c_int),
        ("device_index", c_int),
        ("platform", c_void_p),
        ("device", c_void_p),
        ("type", c_uint64),
        ("platform_name", c_char * 128),
        ("name", c_char * 128),
        ("vendor", c_char * 128),
        ("version", c_char * 128),
        ("driver", c_char * 64),
    ]


_OPENCL = None


def opencl():
    """The OpenCL ICD loader (the library links it): clFinish on the env's queue, and the
    barrier and marker that order calls on a caller's out-of-order queue."""
    global _OPENCL
    if _OPENCL is None:
        _OPENCL = ctypes.CDLL("libOpenCL.so.1")
        _OPENCL.clFinish.restype = ctypes.c_int32
        _OPENCL.clFinish.argtypes = [c_void_p]
        for name in ("clEnqueueBarrierWithWaitList", "clEnqueueMarkerWithWaitList"):
            fn = getattr(_OPENCL, name)
            fn.restype = ctypes.c_int32
            fn.argtypes = [c_void_p, c_uint, c_void_p, c_void_p]
    return _OPENCL


def _candidates():
    explicit = os.environ.get("CLATTN_LIBRARY")
    if explicit:
        return [explicit]
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(os.path.dirname(here))
    build = os.environ.get("CLATTN_BUILD_DIR", "build")
    return [os.path.join(here, "libclattn.so"), os.path.join(root, build, "libclattn.so")]


def load():
    tried = []
    for path in _candidates():
        if os.path.exists(path):
            return _declare(ctypes.CDLL(path))
        tried.append(path)
    raise OSError(
        "libclattn.so not found (tried %s); install the package with `pip install .`, or "
        "build the library with `bash ci/build.sh` (or point CLATTN_LIBRARY at it)"
        % ", ".join(tried)
    )


def _declare(lib):
    env_p = c_void_p
    queue = c_void_p
    tail = [queue, c_uint, c_void_p, c_void_p]
    size = [queue, POINTER(c_size_t)]  # the *_workspace_size queries' last two
    signatures = {
        "clattn_status_name": (c_char_p, [c_int]),
        "clattn_dtype_size": (c_size_t, [c_int]),
        "clattn_last_error": (c_char_p, []),
        "clattn_list_devices": (c_int, [POINTER(DeviceDesc), c_size_t, POINTER(c_size_t)]),
        "clattn_env_create": (c_int, [c_char_p, POINTER(env_p)]),
        "clattn_env_wrap": (c_int, [c_void_p, POINTER(env_p)]),
        "clattn_env_release": (None, [env_p]),
        "clattn_env_queue": (queue, [env_p]),
        "clattn_env_device_desc": (POINTER(DeviceDesc), [env_p]),
        "clattn_device_facts": (c_int, [c_void_p, c_char_p, c_size_t]),
        "clattn_matrix_units": (c_int, [queue, POINTER(c_uint)]),
        "clattn_matrix_unit_name": (c_char_p, [c_uint]),
        "clattn_env_alloc": (c_int, [env_p, c_int, POINTER(c_int64), POINTER(Tensor)]),
        "clattn_env_upload": (c_int, [env_p, POINTER(Tensor), c_void_p]),
        "clattn_env_download": (c_int, [env_p, POINTER(Tensor), c_void_p]),
        "clattn_tensor_free": (None, [POINTER(Tensor)]),
        "clattn_cache_clear": (None, [c_void_p]),
        "clattn_copy": (c_int, [POINTER(Tensor), POINTER(Tensor), POINTER(Tensor)] + tail),
        "clattn_split_heads": (c_int, [POINTER(Tensor), c_int, POINTER(Tensor)] + tail),
        "clattn_merge_heads": (c_int, [POINTER(Tensor), POINTER(Tensor)] + tail),
        "clattn_split_qkv": (
            c_int,
            [POINTER(Tensor), POINTER(Tensor), c_int] + [POINTER(Tensor)] * 3 + tail,
        ),
        "clattn_softmax": (
            c_int,
            [POINTER(Tensor), c_float, POINTER(Mask), POINTER(Tensor), POINTER(Tensor)] + tail,
        ),
        "clattn_attention": (
            c_int,
            [POINTER(Tensor)] * 3 + [c_float, POINTER(Mask), POINTER(Tensor), POINTER(Tensor)] + tail,
        ),
        "clattn_attention_ex": (
            c_int,
            [POINTER(Tensor)] * 3
            + [c_float, POINTER(Mask), POINTER(Tensor), POINTER(Tensor), POINTER(AttentionOptions)]
            + tail,
        ),
        "clattn_linear_attention": (
            c_int,
            [POINTER(Tensor)] * 3
            + [POINTER(Mask), POINTER(Tensor), POINTER(LinearOptions)]
            + tail,
        ),
        "clattn_linear_attention_backward": (
            c_int,
            [POINTER(Tensor)] * 4
            + [POINTER(Mask)]
            + [POINTER(Tensor)] * 3
            + [POINTER(LinearOptions)]
            + tail,
        ),
        "clattn_linear_attention_step": (
            c_int,
            [POINTER(Tensor)] * 7 + [POINTER(LinearOptions)] + tail,
        ),
        "clattn_mha_forward": (
            c_int,
            [POINTER(Tensor)] * 3
            + [POINTER(MhaParams), POINTER(Tensor), POINTER(MhaOptions)]
            + tail,
        ),
        "clattn_attention_backward": (
            c_int,
            [POINTER(Tensor)] * 6
            + [c_float, POINTER(Mask)]
            + [POINTER(Tensor)] * 3
            + [POINTER(AttentionBackwardOptions)]
            + tail,
        ),
        "clattn_softmax_backward": (
            c_int,
            [POINTER(Tensor), POINTER(Tensor), c_float, POINTER(Tensor)] + tail,
        ),
        "clattn_attention_workspace_size": (
            c_int,
            [POINTER(Tensor)] * 3
            + [POINTER(Mask), POINTER(Tensor), POINTER(Tensor), POINTER(AttentionOptions)]
            + size,
        ),
        "clattn_attention_backward_workspace_size": (
            c_int,
            [POINTER(Tensor)] * 6
            + [POINTER(Mask)]
            + [POINTER(Tensor)] * 3
            + [POINTER(AttentionBackwardOptions)]
            + size,
        ),
        "clattn_linear_attention_workspace_size": (
            c_int,
            [POINTER(Tensor)] * 3 + [POINTER(Mask), POINTER(Tensor), POINTER(LinearOptions)] + size,
        ),
        "clattn_linear_attention_backward_workspace_size": (
            c_int,
            [POINTER(Tensor)] * 4
            + [POINTER(Mask)]
            + [POINTER(Tensor)] * 3
            + [POINTER(LinearOptions)]
            + size,
        ),
        "clattn_mha_workspace_size": (
            c_int,
            [POINTER(Tensor)] * 3
            + [POINTER(MhaParams), POINTER(Tensor), POINTER(MhaOptions)]
            + size,
        ),
    }
    for name, (restype, argtypes) in signatures.items():
        fn = getattr(lib, name)
        fn.restype = restype
        fn.argtypes = argtypes
    return lib
