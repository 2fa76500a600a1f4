"""The PTX of the program-cache entries (CLATTN_CACHE_DIR) that define a kernel.

    python3 tools/cached_ptx.py CACHE_DIR OUT_DIR KERNEL[,KERNEL...]

NVIDIA's OpenCL driver returns PTX text as a program's binary; this writes each such binary
that has `.entry KERNEL` (any of the comma-separated ones) to OUT_DIR/<entry file>.ptx, and its build options beside it
(.options), so that CUDA's ptxas and cuobjdump can show the machine code
(tools/gpu_session.sh). The entry format is src/runtime/program_binary.c's.
"""
import os
import struct
import sys

HEADER = 52  # magic, version, text hash, binary size, six string lengths


def entries(cache):
    for name in sorted(os.listdir(cache)):
        if not name.endswith(".clbin"):  # not a half-written .tmp file
            continue
        with open(os.path.join(cache, name), "rb") as f:
            data = f.read()
        if data[:8] != b"CLATTNPB":
            continue
        size = struct.unpack_from("<Q", data, 20)[0]
        lengths = struct.unpack_from("<6I", data, 28)
        options_at = HEADER + lengths[0]
        options = data[options_at:options_at + lengths[1]].decode(errors="replace")
        binary_at = HEADER + sum(lengths)
        yield name, options, data[binary_at:binary_at + size].rstrip(b"\0")


def main(cache, out, kernel):
    os.makedirs(out, exist_ok=True)
    for name, options, binary in entries(cache):
        if not any(b".entry " + k.encode() in binary for k in kernel.split(",")):
            continue
        stem = os.path.join(out, name.split(".")[0])
        with open(stem + ".ptx", "wb") as f:
            f.write(binary)
        with open(stem + ".options", "w") as f:
            f.write(options + "\n")
        print(f"{os.path.basename(stem)}.ptx: {options}")


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    main(*sys.argv[1:])
