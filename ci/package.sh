#!/usr/bin/env bash
# The Python package as a user installs it: `pip install .` through meson-python into a fresh
# virtual environment (Debian's python3-mesonpy, offline: no build isolation, no index), then
# `python -m clattn selftest` from outside the source tree, with CLATTN_LIBRARY unset, so the
# binding must load the library installed inside the package; and that clattn.autograd imports.
#   ci/package.sh DIR    (DIR is emptied: the venv and the working directory of the selftest)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
dir=${1:?usage: ci/package.sh DIR}
rm -rf "$dir"
mkdir -p "$dir"
/usr/bin/python3 -m venv --system-site-packages "$dir/venv"
"$dir/venv/bin/pip" install --quiet --no-build-isolation --no-index --no-cache-dir "$root"
cd "$dir"
env -u CLATTN_LIBRARY -u PYTHONPATH "$dir/venv/bin/python" -m clattn selftest
# the PyTorch bridge is installed too (it imports torch, which the venv sees from the system)
env -u CLATTN_LIBRARY -u PYTHONPATH "$dir/venv/bin/python" -c \
  'import clattn.autograd; print("autograd:", clattn.autograd.__file__)'
