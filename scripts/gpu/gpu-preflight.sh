#!/usr/bin/env bash
# What scripts/gpu/gpu-check.sh needs to build meshtrain with CUDA on this machine,
# checked in seconds without building (gpu-check.sh --preflight runs this):
# each build need prints ok or MISSING with its fix; optional tools (ccache,
# git, shellcheck, python3-venv, pkg-config, the fortunes) only note what
# their absence costs. Checks what the build uses (commands, headers, CMake
# package files, the PyTorch of $PYTHON), not package names: GPU images
# install things in many ways (CMake from pip, PyTorch in a venv).
# Exit status: 0 when every build need is there, 1 otherwise.
# Env: PYTHON (default python3), CUDA_HOME; MESHTRAIN_SYSTEM_PREFIXES (default
# "/usr /usr/local": where headers and CMake packages are looked for) and
# MESHTRAIN_CUDA_ROOTS (default "$CUDA_HOME /usr/local/cuda": where nvcc is
# looked for when not on PATH) exist so tests can fake a machine.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
PY="${PYTHON:-python3}"
ARCH="$(gcc -dumpmachine 2>/dev/null || echo x86_64-linux-gnu)"
read -r -a PREFIXES <<< "${MESHTRAIN_SYSTEM_PREFIXES:-/usr /usr/local}"
read -r -a CUDA_ROOTS <<< "${MESHTRAIN_CUDA_ROOTS:-${CUDA_HOME:-} /usr/local/cuda}"
CARRIED="$ROOT/.carry/prefix/usr"
CARRY_FIX="run scripts/gpu/gpu-carry.sh on a machine with apt and bring .carry/ along (device tool: carry [\".carry\"])"

missing=()
line() { printf '  %-9s %-24s %s\n' "$1" "$2" "$3"; }
need() {  # NAME DETAIL-IF-OK FIX -- test command...
  local name="$1" detail="$2" fix="$3"
  shift 4
  if "$@" >/dev/null 2>&1; then line ok "$name" "$detail"; else line MISSING "$name" "fix: $fix"; missing+=("$name"); fi
}
optional() {  # NAME COST -- test command...
  local name="$1" cost="$2"
  shift 3
  if "$@" >/dev/null 2>&1; then line ok "$name" "(optional)"; else line optional "$name" "not found: $cost"; fi
}

# A file under any prefix (also lib/<arch>, and the carried prefix when asked).
has_file() {  # [--carried] RELATIVE-GLOB...
  local roots=("${PREFIXES[@]}")
  if [ "$1" = --carried ]; then roots+=("$CARRIED"); shift; fi
  local r g
  for r in "${roots[@]}"; do
    for g in "$@"; do
      g="${g//@ARCH@/$ARCH}"
      compgen -G "$r/$g" >/dev/null && return 0
    done
  done
  return 1
}
cmake_package() {  # NAME: its <Name>Config.cmake or <name>-config.cmake
  local lower="${1,,}"
  has_file "lib/cmake/$1/$1Config.cmake" "lib/@ARCH@/cmake/$1/$1Config.cmake" "share/cmake/$1/$1Config.cmake" \
    "lib/cmake/$1/$lower-config.cmake" "lib/@ARCH@/cmake/$1/$lower-config.cmake" "share/$lower/cmake/$1Config.cmake" \
    "lib64/cmake/$1/$1Config.cmake"
}
c_library() {  # HEADER LIB: header and a static or shared library, system or carried
  has_file --carried "include/$1" && has_file --carried "lib/$2.a" "lib/$2.so" "lib/@ARCH@/$2.a" "lib/@ARCH@/$2.so" \
    "lib64/$2.so" "lib64/$2.a"
}
cmake_new_enough() {
  local v
  v="$(cmake --version 2>/dev/null | sed -n '1s/[^0-9]*\([0-9]*\.[0-9]*\).*/\1/p')"
  [ -n "$v" ] && [ "$(printf '%s\n3.22\n' "$v" | sort -V | head -n1)" = 3.22 ]
}
find_nvcc() {
  command -v nvcc && return 0
  local r
  for r in "${CUDA_ROOTS[@]}"; do [ -n "$r" ] && [ -x "$r/bin/nvcc" ] && { echo "$r/bin/nvcc"; return 0; }; done
  return 1
}

echo "gpu-check preflight: the build needs of a CUDA build (nothing is built)"
need "C++ compiler" "$(command -v "${CXX:-g++}") ($("${CXX:-g++}" -dumpfullversion 2>/dev/null))" \
  "install g++ >= 9 (apt-get install build-essential)" -- command -v "${CXX:-g++}"
need "cmake >= 3.22" "$(cmake --version 2>/dev/null | head -n1)" \
  "install CMake >= 3.22 (apt-get install cmake, or the cmake wheel: pip install cmake)" -- cmake_new_enough
need "make or ninja" "$(command -v make || command -v ninja)" "install make (build-essential) or ninja" -- \
  bash -c 'command -v make || command -v ninja'
need "OpenMPI (mpicc, mpirun)" "$(command -v mpicc)" "apt-get install libopenmpi-dev openmpi-bin" -- \
  bash -c 'command -v mpicc && command -v mpirun'
need "nlohmann_json" "CMake package" "apt-get install nlohmann-json3-dev" -- cmake_package nlohmann_json
need "spdlog" "CMake package" "apt-get install libspdlog-dev" -- cmake_package spdlog
need "fmt" "CMake package (spdlog's)" "apt-get install libfmt-dev" -- cmake_package fmt
need "CLI11" "CMake package" "apt-get install libcli11-dev" -- cmake_package CLI11
need "GoogleTest" "CMake package" "apt-get install libgtest-dev" -- cmake_package GTest
need "PCRE2 (libpcre2-8)" "pcre2.h" "apt-get install libpcre2-dev, or $CARRY_FIX" -- c_library pcre2.h libpcre2-8
need "zstd" "zstd.h" "apt-get install libzstd-dev, or $CARRY_FIX" -- c_library zstd.h libzstd
need "zlib" "zlib.h" "apt-get install zlib1g-dev, or $CARRY_FIX" -- c_library zlib.h libz
# One python start (importing torch takes seconds): version, CUDA version,
# whether TorchConfig.cmake exists, and the site-packages folder.
IFS='|' read -r TORCH_VERSION TORCH_CUDA TORCH_CMAKE SITE < <("$PY" -c '
import os, torch, torch.utils
cfg = os.path.join(torch.utils.cmake_prefix_path, "Torch", "TorchConfig.cmake")
print(torch.__version__, torch.version.cuda or "", "yes" if os.path.isfile(cfg) else "",
      os.path.dirname(os.path.dirname(torch.__file__)), sep="|")' 2>/dev/null || true)
need "PyTorch with CUDA" "$PY: torch ${TORCH_VERSION:-} cuda ${TORCH_CUDA:-}" \
  "set PYTHON to the python whose PyTorch 2.11 is a CUDA build (import torch; torch.version.cuda)" -- \
  test -n "${TORCH_CUDA:-}"
need "libtorch CMake files" "TorchConfig.cmake" "an importable PyTorch (above) with share/cmake/Torch (reinstall it)" -- \
  test -n "${TORCH_CMAKE:-}"
SITE="${SITE:-}"
# shellcheck disable=SC2016  # the inner bash expands them
need "NCCL (nccl.h)" "${SITE:+$SITE/nvidia/nccl}" \
  "the nvidia-nccl wheel beside PyTorch (looked for through it), or set NCCL_ROOT (cmake/NcclDiscovery.cmake)" -- \
  bash -c 'for r in "$1/nvidia/nccl" "${NCCL_ROOT:-/none}" /usr; do [ -f "$r/include/nccl.h" ] && exit 0; done; exit 1' _ "$SITE"
# shellcheck disable=SC2016  # the inner bash expands them
need "CUDA runtime headers" "cuda_runtime_api.h" "the nvidia-cuda-runtime wheel beside PyTorch, or set CUDA_HOME" -- \
  bash -c 'for r in "$@"; do [ -n "$r" ] && [ -f "$r/include/cuda_runtime_api.h" ] && exit 0; done; exit 1' _ \
  "${SITE:+$SITE/nvidia/cu13}" "${SITE:+$SITE/nvidia/cuda_runtime}" "${CUDA_ROOTS[@]}"
NVCC="$(find_nvcc)"
need "nvcc (fused kernels)" "$NVCC" \
  "set CUDA_HOME to the CUDA toolkit (nvcc is searched on PATH, in \$CUDA_HOME/bin and /usr/local/cuda/bin); without it the fused kernels are not built and gpu-check refuses to benchmark" -- \
  test -n "$NVCC"
optional ccache "every build compiles from scratch" -- command -v ccache
optional git "scripts report no commit" -- command -v git
optional pkg-config "CMake finds PCRE2/zstd/zlib by their files instead" -- command -v pkg-config
optional shellcheck "the shell lint test skips" -- command -v shellcheck
optional python3-venv "scripts/dev/setup-pyenv.sh cannot create .deps/pyenv" -- python3 -m venv --help
optional fortunes "bench's corpus is the repository's own text" -- test -d /usr/share/games/fortunes
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  line ok "GPU" "$(nvidia-smi -L 2>/dev/null | head -n1)"
else
  line note "GPU" "none visible (nvidia-smi): the build works; the CUDA tests and bench need one"
fi
if ((${#missing[@]})); then
  joined="$(IFS=,; echo "${missing[*]}")"
  echo "preflight: ${#missing[@]} build need(s) missing: ${joined//,/, }"
  exit 1
fi
echo "preflight: every build need is there"
