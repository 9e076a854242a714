#!/usr/bin/env bash
# The CUDA build on a machine without a GPU (not part of CI: it compiles
# everything against the full CUDA PyTorch wheel, ~5 GB, and takes a while).
# Builds with MESHTRAIN_CUDA=ON against the torch of .deps/pyenv
# (scripts/dev/setup-pyenv.sh) into build-cuda/, then runs the whole ctest suite
# with that build; without a GPU the CUDA-only tests skip visibly and every
# other test runs on CPU. Extra arguments go to ctest (e.g. -R unit).
# Env: BUILD_DIR (default build-cuda), BUILD_JOBS, TEST_JOBS (default 1).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
BUILD="${BUILD_DIR:-$ROOT/build-cuda}"
PY="$("$ROOT/scripts/dev/setup-pyenv.sh" | tail -n 1)"
PREFIX="$("$PY" -c 'import torch; print(torch.utils.cmake_prefix_path)')"
"$PY" -c 'import torch, sys; sys.exit(0 if torch.version.cuda else 1)' ||
  { echo "check-cuda-build: the torch of $PY is not a CUDA build" >&2; exit 1; }
launcher=()
if command -v ccache >/dev/null; then
  export CCACHE_SLOPPINESS="pch_defines,time_macros,include_file_mtime,include_file_ctime"
  export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$ROOT}"
  launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
fi
# The fused kernels are part of a CUDA build: no nvcc (PATH, CUDA_HOME,
# /usr/local/cuda) fails the configure. Carried -dev packages
# (scripts/gpu/gpu-carry.sh) are used when .carry/ holds some.
extra=(-DMESHTRAIN_REQUIRE_CUDA_KERNELS=ON)
if compgen -G "$ROOT/.carry/debs/*.deb" >/dev/null; then
  "$ROOT/scripts/gpu/gpu-carry.sh" --unpack
  extra+=(-DMESHTRAIN_DEPS_PREFIX="$ROOT/.carry/prefix/usr")
fi
echo "check-cuda-build: configuring $BUILD against $PREFIX (MESHTRAIN_CUDA=ON)"
cmake -S "$ROOT" -B "$BUILD" -DCMAKE_PREFIX_PATH="$PREFIX" -DMESHTRAIN_CUDA=ON "${extra[@]}" "${launcher[@]}"
[ -f "$BUILD/libmt_ops_cuda.a" ] || grep -q 'mt_ops_cuda' "$BUILD/Makefile" 2>/dev/null ||
  { echo "check-cuda-build: the configured build has no fused CUDA kernels (mt_ops_cuda)" >&2; exit 1; }
cmake --build "$BUILD" -j "${BUILD_JOBS:-$(nproc)}"
# The binary must really carry the CUDA libraries (not libtorch.so, see
# cmake/Dependencies.cmake) and load them on a machine without a GPU.
ldd "$BUILD/meshtrain" | grep libtorch_cuda.so >/dev/null ||
  { echo "check-cuda-build: $BUILD/meshtrain does not load libtorch_cuda.so" >&2; exit 1; }
if ldd "$BUILD/meshtrain" | grep 'libtorch\.so' >/dev/null; then
  echo "check-cuda-build: $BUILD/meshtrain loads libtorch.so (its std::filesystem breaks on Debian 12)" >&2
  exit 1
fi
echo "check-cuda-build: the binary loads:"
ldd "$BUILD/meshtrain" | grep -E 'libtorch|libc10|libnccl|libcudart' | sed 's/^/  /'
export OMP_NUM_THREADS=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
rc=0
ctest --test-dir "$BUILD" --output-on-failure -j "${TEST_JOBS:-1}" "$@" || rc=$?
"$ROOT/scripts/dev/skipped-tests.sh" "$BUILD"
if [ "$rc" -ne 0 ]; then
  echo "check-cuda-build: FAILED: some tests failed ($BUILD)" >&2
  exit "$rc"
fi
echo "check-cuda-build: OK ($BUILD)"
