"""The ctypes mirrors of python/clattn/_lib.py against the C layout of include/clattn.h.

A mirror whose fields drift from the header (a field swapped, added, retyped) still loads and
passes every call, and the library then reads garbage. tests/abi_layout.c, a test helper built
beside the runner, reports sizeof and offsetof as the C compiler lays the structs out; these
tests compare every mirrored struct with it, field by field, and the helper's table with the
header itself. CLATTN_ABI_HELPER names the helper (ci/test.sh sets it:
<build>/tests/libclattn_abi_layout.so)."""
import ctypes
import os
import re

import pytest

from clattn import _lib

# Every ctypes mirror in _lib and the C struct it mirrors.
MIRRORS = {
    "Tensor": "clattn_tensor",
    "Mask": "clattn_mask",
    "AttentionOptions": "clattn_attention_options",
    "AttentionBackwardOptions": "clattn_attention_backward_options",
    "LinearOptions": "clattn_linear_options",
    "MhaParams": "clattn_mha_params",
    "MhaOptions": "clattn_mha_options",
    "DeviceDesc": "clattn_device_desc",
}

HEADER = os.path.join(
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
    "include",
    "clattn.h",
)


@pytest.fixture(scope="module")
def helper():
    path = os.environ.get("CLATTN_ABI_HELPER")
    if not path:
        pytest.skip("CLATTN_ABI_HELPER is unset (the layout helper, build/tests/libclattn_abi_layout.so)")
    lib = ctypes.CDLL(path)
    for name, args in (
        ("clattn_test_abi_size", [ctypes.c_char_p]),
        ("clattn_test_abi_offset", [ctypes.c_char_p, ctypes.c_char_p]),
        ("clattn_test_abi_field_size", [ctypes.c_char_p, ctypes.c_char_p]),
    ):
        getattr(lib, name).restype = ctypes.c_long
        getattr(lib, name).argtypes = args
    lib.clattn_test_abi_entry.restype = ctypes.c_int
    lib.clattn_test_abi_entry.argtypes = [
        ctypes.c_long,
        ctypes.POINTER(ctypes.c_char_p),
        ctypes.POINTER(ctypes.c_char_p),
    ]
    return lib


def c_fields(helper):
    """{struct: [field, ...]} in the helper's table, in its order."""
    table, index = {}, 0
    struct, field = ctypes.c_char_p(), ctypes.c_char_p()
    while helper.clattn_test_abi_entry(index, ctypes.byref(struct), ctypes.byref(field)):
        table.setdefault(struct.value.decode(), []).append(field.value.decode())
        index += 1
    return table


def header_fields():
    """{struct: [field, ...]} as include/clattn.h declares them (typedef struct NAME {...})."""
    text = re.sub(r"/\*.*?\*/|//[^\n]*", " ", open(HEADER).read(), flags=re.S)
    table = {}
    for name, body in re.findall(r"typedef\s+struct\s+(\w+)\s*\{(.*?)\}\s*\w+\s*;", text, re.S):
        fields = []
        for declaration in body.split(";"):
            if not declaration.strip():
                continue
            # `const clattn_tensor *key_lengths, *query_lengths` or `char name[128]`: the
            # declarators after the type, each an identifier with optional * and [N]
            first, *rest = declaration.split(",")
            for declarator in [first.split()[-1]] + rest:
                fields.append(re.sub(r"[\s*]|\[.*?\]", "", declarator))
        table[name] = fields
    return table


def mirrored_classes():
    return {
        name: cls
        for name, cls in vars(_lib).items()
        if isinstance(cls, type) and issubclass(cls, ctypes.Structure) and cls is not ctypes.Structure
    }


def test_every_ctypes_struct_is_mapped_to_a_c_struct():
    unmapped = sorted(set(mirrored_classes()) - set(MIRRORS))
    assert not unmapped, "ctypes structs with no C struct in MIRRORS: %s" % unmapped


def test_the_helper_lists_every_struct_and_field_of_the_header(helper):
    declared, listed = header_fields(), c_fields(helper)
    assert declared, "no struct found in %s" % HEADER
    for struct, fields in declared.items():
        assert listed.get(struct) == fields, (
            "%s: the header declares %s, tests/abi_layout.c lists %s"
            % (struct, fields, listed.get(struct))
        )
    assert set(listed) == set(declared), "tests/abi_layout.c lists %s beyond the header" % (
        sorted(set(listed) - set(declared))
    )


def test_every_c_struct_has_a_ctypes_mirror(helper):
    missing = sorted(set(c_fields(helper)) - set(MIRRORS.values()))
    assert not missing, "C structs with no ctypes mirror in python/clattn/_lib.py: %s" % missing


@pytest.mark.parametrize("py_name", sorted(MIRRORS))
def test_ctypes_layout_matches_c(helper, py_name):
    cls, c_name = getattr(_lib, py_name), MIRRORS[py_name]
    struct = c_name.encode()
    problems = []
    c_size = helper.clattn_test_abi_size(struct)
    assert c_size > 0, "the helper does not know %s" % c_name
    if ctypes.sizeof(cls) != c_size:
        problems.append("sizeof: ctypes %d, C %d" % (ctypes.sizeof(cls), c_size))
    py_fields = [f[0] for f in cls._fields_]
    for field in py_fields:
        offset = helper.clattn_test_abi_offset(struct, field.encode())
        size = helper.clattn_test_abi_field_size(struct, field.encode())
        got = getattr(cls, field)
        if offset < 0:
            problems.append("%s: no such field in C" % field)
        elif got.offset != offset or got.size != size:
            problems.append(
                "%s: ctypes offset %d size %d, C offset %d size %d"
                % (field, got.offset, got.size, offset, size)
            )
    c_order = c_fields(helper)[c_name]
    missing = [f for f in c_order if f not in py_fields]
    if missing:
        problems.append("C fields missing in ctypes: %s" % missing)
    if not problems and py_fields != c_order:
        problems.append("field order: ctypes %s, C %s" % (py_fields, c_order))
    assert not problems, "%s (%s):\n  %s" % (py_name, c_name, "\n  ".join(problems))
