#!/usr/bin/env bash
# scripts/gpu/gpu-check.sh --preflight on faked machines: it lists every missing
# build need with its fix in seconds, without building; optional tools
# (ccache, git, shellcheck, ...) never fail it; nvcc is found through
# CUDA_HOME when not on PATH; carried -dev packages (.carry/, gpu-carry.sh)
# count; and a full gpu-check.sh run stops before the build when it fails.
# The machine is faked by a PATH holding only chosen tools, a prefix tree
# standing for /usr (MESHTRAIN_SYSTEM_PREFIXES), CUDA roots
# (MESHTRAIN_CUDA_ROOTS) and a python whose torch import fails.
source "$(dirname "$0")/common.sh" "$@"

mkdir -p fake/scripts/gpu bin root/include root/lib/cmake nocuda notorch/torch
cp "$SRC"/scripts/gpu/gpu-check.sh "$SRC"/scripts/gpu/gpu-preflight.sh "$SRC"/scripts/gpu/gpu-carry.sh \
  "$SRC"/scripts/gpu/gpu-summary.py fake/scripts/gpu/
# Tools of the faked machine: no nvcc, ccache, shellcheck, git, pkg-config, nvidia-smi.
for t in bash sh env dirname basename cat cut date grep head tail tr sed sort mkdir rm ls nproc sha256sum \
         gcc g++ cc c++ cmake make mpicc mpirun python3; do
  p="$(command -v "$t")" && ln -s "$p" "bin/$t"
done
# The interpreter itself, not a version manager's shim (it needs its own PATH).
ln -sf "$(python3 -c 'import sys; print(sys.executable)')" bin/python3
# CMake packages and zlib present; PCRE2 and zstd absent.
for pkg in nlohmann_json spdlog CLI11 GTest; do mkdir -p "root/lib/cmake/$pkg"; touch "root/lib/cmake/$pkg/${pkg}Config.cmake"; done
mkdir -p root/lib/cmake/fmt && touch root/lib/cmake/fmt/fmt-config.cmake
touch root/include/zlib.h root/lib/libz.so
echo 'raise ImportError("torch is not installed (test stub)")' > notorch/torch/__init__.py
FAKE=(env -i "PATH=$WORK/bin" "HOME=$WORK" "MESHTRAIN_SYSTEM_PREFIXES=$WORK/root" "PYTHONPATH=$WORK/notorch"
      "PYTHON=python3")

start=$(date +%s)
out="$("${FAKE[@]}" "MESHTRAIN_CUDA_ROOTS=$WORK/nocuda" bash fake/scripts/gpu/gpu-check.sh --preflight 2>&1)"
rc=$?
secs=$(( $(date +%s) - start ))
check "missing needs: exit 1" test "$rc" -eq 1
check "missing needs: done in seconds ($secs s)" test "$secs" -le 20
has() { [[ "$out" == *"$1"* ]] || { echo "   not in output: $1"; printf '%s\n' "$out" | sed 's/^/   | /'; return 1; }; }
missing_line() { printf '%s\n' "$out" | grep -E "^  MISSING +$1 .*fix: .*$2" >/dev/null || { echo "   no MISSING line for $1 with '$2'"; printf '%s\n' "$out" | sed 's/^/   | /'; return 1; }; }
check "nvcc missing, fix names CUDA_HOME" missing_line "nvcc" "CUDA_HOME"
check "PyTorch missing, fix names PYTHON" missing_line "PyTorch with CUDA" "PYTHON"
check "PCRE2 missing, fix names gpu-carry.sh" missing_line "PCRE2" "gpu-carry.sh"
check "zstd missing, fix names libzstd-dev" missing_line "zstd" "libzstd-dev"
check "zlib and CMake packages found" bash -c '! grep -E "MISSING +(zlib|spdlog|fmt|CLI11|GoogleTest|nlohmann)" <<<"$1"' _ "$out"
check "ccache is optional" has "optional  ccache"
check "shellcheck and git are optional" bash -c 'grep -q "optional  shellcheck" <<<"$1" && grep -q "optional  git" <<<"$1"' _ "$out"
check "the summary names the missing needs, not the optional ones" \
  bash -c 'l="$(grep "^preflight:" <<<"$1")"; [[ "$l" == *nvcc* && "$l" == *PCRE2* && "$l" != *ccache* && "$l" != *shellcheck* ]]' _ "$out"

# nvcc through CUDA_HOME (not on PATH), PCRE2 and zstd carried in .carry/prefix.
mkdir -p cuda/bin fake/.carry/prefix/usr/include fake/.carry/prefix/usr/lib
printf '#!/bin/sh\necho nvcc stub\n' > cuda/bin/nvcc && chmod +x cuda/bin/nvcc
touch fake/.carry/prefix/usr/include/pcre2.h fake/.carry/prefix/usr/lib/libpcre2-8.a \
      fake/.carry/prefix/usr/include/zstd.h fake/.carry/prefix/usr/lib/libzstd.a
out="$("${FAKE[@]}" "CUDA_HOME=$WORK/cuda" bash fake/scripts/gpu/gpu-check.sh --preflight 2>&1)"
check "nvcc found in CUDA_HOME/bin" bash -c 'grep -qE "^  ok +nvcc .*'"$WORK"'/cuda/bin/nvcc" <<<"$1"' _ "$out"
check "carried PCRE2 and zstd count" bash -c 'grep -qE "^  ok +PCRE2" <<<"$1" && grep -qE "^  ok +zstd" <<<"$1"' _ "$out"
check "only PyTorch and what is found through it are still missing" bash -c \
  'l="$(grep "^preflight:" <<<"$1")"; [[ "$l" == *"missing: PyTorch with CUDA, libtorch CMake files, NCCL"* && "$l" != *nvcc* && "$l" != *PCRE2* && "$l" != *zstd* ]]' _ "$out"

# A CPU-only PyTorch (torch.version.cuda is None) is not enough; its CMake files are found.
mkdir -p cputorch/torch/utils cputorch/torch/share/cmake/Torch
touch cputorch/torch/share/cmake/Torch/TorchConfig.cmake
printf '__version__ = "2.11.0+cpu"\nclass version:\n    cuda = None\n' > cputorch/torch/__init__.py
printf 'import os\ncmake_prefix_path = os.path.join(os.path.dirname(os.path.dirname(__file__)), "share", "cmake")\n' \
  > cputorch/torch/utils/__init__.py
out="$("${FAKE[@]}" "PYTHONPATH=$WORK/cputorch" "CUDA_HOME=$WORK/cuda" bash fake/scripts/gpu/gpu-check.sh --preflight 2>&1)"
check "CPU-only PyTorch: missing, its version shown" bash -c \
  'grep -qE "^  MISSING +PyTorch with CUDA" <<<"$1" && grep -qE "^  ok +libtorch CMake files" <<<"$1"' _ "$out"

# The whole gpu-check stops before building when the pre-flight fails.
"${FAKE[@]}" "MESHTRAIN_CUDA_ROOTS=$WORK/nocuda" "BUILD_DIR=$WORK/build-gpu" bash fake/scripts/gpu/gpu-check.sh out \
  > full.log 2>&1
rc=$?
check "gpu-check with needs missing: non-zero exit" test "$rc" -ne 0
check "gpu-check: the preflight step failed" grep -qE "^preflight +FAILED" full.log
check "gpu-check: the build was not run" grep -qE "^build +not run \(preflight failed\)" full.log
check "gpu-check: nothing was configured" test ! -e build-gpu
check "gpu-check: the results folder is written all the same (no GPU, no git: unknown-gpu, nogit)" \
  grep -q '"status": "FAILED (exit 1)"' fake/bench/results/"$(date +%F)"-unknown-gpu-nogit/summary.json
finish
