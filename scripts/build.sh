#!/usr/bin/env bash
# Configures and builds meshtrain into build/ (BUILD_DIR overrides), with ccache.
# Usage: scripts/build.sh [target...]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${BUILD_DIR:-$ROOT/build}"
"$ROOT/scripts/setup.sh"
PREFIX="$(cat "$ROOT/.deps/torch_prefix")"
launcher=()
if command -v ccache >/dev/null; then
  # Precompiled headers need these sloppiness settings to be cached.
  export CCACHE_SLOPPINESS="pch_defines,time_macros,include_file_mtime,include_file_ctime"
  # Paths relative to the checkout, so clones of the repo share the cache.
  export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$ROOT}"
  launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
fi
extra=()
[ -n "${MESHTRAIN_CUDA:-}" ] && extra+=(-DMESHTRAIN_CUDA=ON)
# Configure every time (a second or two): new test files are picked up.
cmake -S "$ROOT" -B "$BUILD" -DCMAKE_PREFIX_PATH="$PREFIX" "${launcher[@]}" "${extra[@]}" >/dev/null
jobs="${BUILD_JOBS:-$(nproc)}"
if (($#)); then
  cmake --build "$BUILD" -j "$jobs" --target "$@"
else
  cmake --build "$BUILD" -j "$jobs"
fi
