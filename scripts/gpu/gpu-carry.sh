#!/usr/bin/env bash
# Brings the build needs an offline GPU machine may lack, as Debian packages,
# in a git-ignored folder that travels with the working tree: .carry/.
#
#   here (online, Debian/Ubuntu with apt):  scripts/gpu/gpu-carry.sh [PACKAGE...]
#       downloads the .debs (default: libpcre2-dev libzstd-dev zlib1g-dev,
#       the -dev packages prepare-data's PCRE2/zstd/zlib need) into .carry/debs
#   here, after scripts/gpu/check-cuda-build.sh: scripts/gpu/gpu-carry.sh --binary [BUILD_DIR]
#       copies BUILD_DIR/meshtrain (default build-cuda; configure it with
#       -DMESHTRAIN_PARQUET=OFF: pyarrow's version differs there) and the
#       shared libraries it loads that are neither PyTorch's, CUDA's, MPI's
#       nor the C library's (spdlog, fmt) into .carry/bin, for a GPU machine
#       that builds slowly: scripts/gpu/gpu-check.sh DIR --bin .carry/bin/meshtrain;
#       the CUDA test binary BUILD_DIR/tests/dist/cuda_test too when it is
#       there (gpu-check.sh runs it when it lies beside the binary), and COMMIT, the commit they were built from (what
#       gpu-check.sh names the results folder after). It warns above ~60 MiB:
#       the device tool carries 64 MiB at most.
#   there (offline):                        scripts/gpu/gpu-carry.sh --unpack
#       unpacks them into the local prefix .carry/prefix (dpkg -x, or ar + tar
#       without dpkg); scripts/gpu/gpu-check.sh does this itself and builds with
#       -DMESHTRAIN_DEPS_PREFIX=.carry/prefix/usr (cmake/Dependencies.cmake).
#
# Nothing is installed system-wide. The -dev packages' .so links are removed
# in the prefix, so the build links their static archives (.a): the binary
# needs no library there that the machine does not have. Headers and static
# libraries of Debian 12 work on Ubuntu 24.04 (same architecture, an older
# glibc than the machine's). .carry/ is git-ignored: a tool that copies the
# working tree must be told to bring it (the device tool: carry [".carry"]),
# or copy the folder by hand (rsync -a .carry host:meshtrain/).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
CARRY="${MESHTRAIN_CARRY_DIR:-$ROOT/.carry}"
DEBS="$CARRY/debs"
PREFIX="$CARRY/prefix"
DEFAULT_PKGS=(libpcre2-dev libzstd-dev zlib1g-dev)

unpack() {
  shopt -s nullglob
  local debs=("$DEBS"/*.deb)
  ((${#debs[@]})) || { echo "gpu-carry: no .deb in $DEBS (run scripts/gpu/gpu-carry.sh on a machine with apt first)" >&2; return 1; }
  local stamp="$PREFIX/.unpacked"
  # Idempotent: unpack again only when the .debs changed.
  local want
  want="$(find "$DEBS" -maxdepth 1 -name '*.deb' -printf '%f %s\n' | sort | sha256sum | cut -c1-16)"
  [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && return 0
  rm -rf "$PREFIX"
  mkdir -p "$PREFIX"
  for d in "${debs[@]}"; do
    if command -v dpkg-deb >/dev/null; then
      dpkg-deb -x "$d" "$PREFIX"
    else
      local tmp
      tmp="$(mktemp -d)"
      (cd "$tmp" && ar x "$d" && tar -xf data.tar.* -C "$PREFIX")
      rm -rf "$tmp"
    fi
  done
  # Static archives only: drop the .so links (they point at runtime
  # libraries of the packaging machine's versions).
  find "$PREFIX/usr/lib" -name '*.so' -type l -delete 2>/dev/null || true
  # pkg-config files name the packaging machine's /usr.
  find "$PREFIX/usr" -name '*.pc' -exec sed -i "s|^prefix=.*|prefix=$PREFIX/usr|" {} + 2>/dev/null || true
  echo "$want" > "$stamp"
  echo "gpu-carry: unpacked ${#debs[@]} package(s) into $PREFIX/usr"
}

# The binary and the libraries of this machine it needs beside PyTorch's.
binary() {
  local build="${1:-$ROOT/build-cuda}" bin="$CARRY/bin"
  [ -x "$build/meshtrain" ] || { echo "gpu-carry: no $build/meshtrain (scripts/gpu/check-cuda-build.sh builds it)" >&2; return 1; }
  ldd "$build/meshtrain" | grep libtorch_cuda.so >/dev/null ||
    { echo "gpu-carry: $build/meshtrain is not a CUDA build (it does not load libtorch_cuda.so)" >&2; return 1; }
  ldd "$build/meshtrain" | grep 'libparquet' >/dev/null &&
    { echo "gpu-carry: $build/meshtrain loads pyarrow's libparquet; configure with -DMESHTRAIN_PARQUET=OFF" >&2; return 1; }
  rm -rf "$bin"
  mkdir -p "$bin"
  local exes=("$build/meshtrain") e
  if [ -x "$build/tests/dist/cuda_test" ]; then
    exes+=("$build/tests/dist/cuda_test")
  elif [ -x "$build/cuda_test" ]; then
    exes+=("$build/cuda_test")
  else
    echo "gpu-carry: no $build/tests/dist/cuda_test: gpu-check.sh --bin will not run the CUDA tests" >&2
  fi
  for e in "${exes[@]}"; do
    cp "$e" "$bin/"
    strip --strip-unneeded "$bin/$(basename "$e")" 2>/dev/null || true
  done
  ldd "${exes[@]}" | awk '/=> \// {print $3}' | { grep -E 'lib(spdlog|fmt)\.so' || true; } | sort -u | xargs -r cp -L -t "$bin/"
  # The commit the binaries were built from (the tree may have moved on
  # since), "dirty" after it when tracked files differed from it.
  local commit dirty=""
  commit="$(cd "$ROOT" && git rev-parse --short HEAD 2>/dev/null)" || commit=nogit
  [ "$commit" != nogit ] && [ -n "$(cd "$ROOT" && git status --porcelain --untracked-files=no 2>/dev/null)" ] &&
    dirty=" dirty"
  echo "$commit$dirty" > "$bin/COMMIT"
  du -sh "$bin" | sed 's/^/gpu-carry: /'
  local kib all
  kib="$(du -sk "$bin" | cut -f1)" all="$(du -sk "$CARRY" | cut -f1)"
  ((kib <= 60 * 1024 && all <= 60 * 1024)) ||
    echo "gpu-carry: warning: $bin is $((kib / 1024)) MiB ($CARRY $((all / 1024)) MiB), over ~60 MiB:" \
      "the device tool carries 64 MiB in all" >&2
  echo "gpu-carry: carry $CARRY; there: scripts/gpu/gpu-check.sh DIR --bin $bin/meshtrain"
}

case "${1:-}" in
  --unpack) unpack; exit $? ;;
  --binary) binary "${2:-}"; exit $? ;;
  -h|--help) sed -n '2,31p' "$0"; exit 0 ;;
esac

command -v apt-get >/dev/null || { echo "gpu-carry: apt-get is needed here to download .debs" >&2; exit 1; }
pkgs=("$@")
((${#pkgs[@]})) || pkgs=("${DEFAULT_PKGS[@]}")
mkdir -p "$DEBS"
grep -qx '/.carry/' "$ROOT/.gitignore" 2>/dev/null ||
  echo "gpu-carry: warning: .carry/ is not in .gitignore; do not commit it" >&2
echo "gpu-carry: downloading ${pkgs[*]} into $DEBS"
# apt-get download writes into the current folder; as root it warns that
# the download is not sandboxed (the _apt user cannot write here).
(cd "$DEBS" && { apt-get download -q "${pkgs[@]}" 2>&1 | grep -v 'unsandboxed as root'; true; })
for p in "${pkgs[@]}"; do
  ls "$DEBS/${p}_"*.deb >/dev/null 2>&1 || { echo "gpu-carry: $p was not downloaded (apt-get update first?)" >&2; exit 1; }
done
unpack
du -sh "$CARRY" | sed 's/^/gpu-carry: /'
echo "gpu-carry: carry $CARRY to the GPU machine (device tool: carry [\".carry\"]); gpu-check.sh uses it there"
