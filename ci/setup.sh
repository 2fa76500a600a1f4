#!/usr/bin/env bash
# Installs the Debian 12 packages clattn needs to build, test and benchmark. As root it installs
# what is missing (apt-get); otherwise it lists what is missing and fails.
set -euo pipefail

packages=(
  gcc pkg-config meson ninja-build          # the build
  ocl-icd-opencl-dev opencl-c-headers       # OpenCL ICD loader and headers
  libclblast-dev                            # GEMMs
  pocl-opencl-icd                           # the CPU OpenCL device CI runs on
  oclgrind                                  # the strict simulator lane
  clang libclang-rt-14-dev valgrind         # the asan, fuzz (libFuzzer) and valgrind lanes
  clinfo clpeak                             # device inspection
  python3-numpy python3-torch python3-pytest  # Python binding tests (pytest), PyTorch peer and parity
  python3-pyopencl                          # the binding's PyOpenCL interop tests
  python3-mesonpy python3-venv python3-pip  # pip install . (the package check)
  python3-matplotlib                        # benchmark plots
  libopenblas0-pthread                      # so PyTorch's GEMMs are not on the reference BLAS
  mesa-opencl-icd                           # Mesa's rusticl: the second OpenCL implementation
  intel-opencl-icd clang-15 libclc-15       # the compile lane: ocloc, clang's AMD and NVIDIA back ends
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0

if [ "$(id -u)" -ne 0 ]; then
  echo "ci/setup.sh: missing Debian packages (run as root to install them):" >&2
  echo "  apt-get install ${missing[*]}" >&2
  exit 1
fi
echo "ci/setup.sh: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -q
apt-get install -y -q --no-install-recommends "${missing[@]}"
