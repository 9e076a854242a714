#!/usr/bin/env bash
# Installs everything meshtrain needs on a fresh Debian 12 machine, idempotently:
# apt packages (compiler, OpenMPI, nlohmann-json, spdlog, CLI11, GoogleTest,
# ccache, the fortunes corpus, PCRE2/zlib/zstd for prepare-data) and libtorch 2.11.0 from PyPI into .deps/venv
# (git-ignored). Prints nothing when everything is already there; otherwise one
# line per install and a last "setup: ready" line. What apt-get and pip print
# goes to .deps/setup.log, shown only when they fail.
# Env: MESHTRAIN_TORCH_PREFIX=<dir with TorchConfig.cmake> uses an existing
# PyTorch (GPU machines: python3 -c 'import torch;print(torch.utils.cmake_prefix_path)').
# The network is touched only to install something missing, and never when
# MESHTRAIN_OFFLINE=1 or MESHTRAIN_TORCH_PREFIX is set (offline GPU machines,
# often without root): then a missing piece is an error that names it.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DEPS="$ROOT/.deps"
TORCH_VERSION=2.11.0
OFFLINE=""
[ -n "${MESHTRAIN_OFFLINE:-}" ] && [ "${MESHTRAIN_OFFLINE}" != 0 ] && OFFLINE="MESHTRAIN_OFFLINE=1"
[ -z "$OFFLINE" ] && [ -n "${MESHTRAIN_TORCH_PREFIX:-}" ] && OFFLINE="MESHTRAIN_TORCH_PREFIX is set"
# Called before anything that would use the network: offline, it stops here.
need_network() {  # WHAT FIX
  [ -z "$OFFLINE" ] && return 0
  echo "setup: $1 is missing and $OFFLINE (no network access): $2" >&2
  exit 1
}
LOG="$DEPS/setup.log"
installed=""  # what this call installed, for the ready line
# Runs an install with its output in $LOG; on failure shows the end of it.
quietly() {
  mkdir -p "$DEPS"
  echo "== $(date '+%F %T') $*" >> "$LOG"
  if ! "$@" >> "$LOG" 2>&1; then
    echo "setup: this failed: $*" >&2
    tail -n 20 "$LOG" | sed 's/^/  | /' >&2
    echo "setup: the whole output is in $LOG" >&2
    exit 1
  fi
}
# Packages the build does not need (the demo corpus, the shell lint test,
# build caching, commit names, creating .deps/pyenv, the multi-host tests):
# offline, missing ones are a warning. scripts/gpu/gpu-preflight.sh checks a GPU
# machine's build needs by their files instead of package names.
# openssh-server, tmux and SLURM (slurmctld, slurmd, slurm-client, munge): the
# multi-host tests (tests/hosts/testbed.sh) run an sshd per test host and a
# two-node SLURM cluster inside network namespaces; no daemon is started here.
test_pkgs=(openssh-server tmux slurmctld slurmd slurm-client munge)
optional_pkgs=(fortunes fortunes-min shellcheck ccache git python3-venv "${test_pkgs[@]}")

apt_pkgs=(build-essential cmake git ccache pkg-config python3 python3-venv
          libopenmpi-dev openmpi-bin nlohmann-json3-dev libspdlog-dev libcli11-dev
          libgtest-dev fortunes fortunes-min shellcheck "${test_pkgs[@]}"
          libpcre2-dev zlib1g-dev libzstd-dev)
missing=()
for p in "${apt_pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})) && [ -n "$OFFLINE" ]; then
  required=()
  for p in "${missing[@]}"; do
    [[ " ${optional_pkgs[*]} " == *" $p "* ]] || required+=("$p")
  done
  ((${#required[@]})) &&
    need_network "the Debian package(s) ${required[*]}" "install them first (apt-get install ${required[*]})"
  echo "setup: warning: optional package(s) ${missing[*]} missing (the build does not need them: only some tests," \
       "the demo corpus, build caching and .deps/pyenv do)" >&2
  missing=()
fi
if ((${#missing[@]})); then
  echo "setup: installing Debian packages: ${missing[*]}"
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO=sudo
  quietly $SUDO apt-get update -qq
  quietly $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}"
  installed+="${installed:+, }${#missing[@]} Debian packages"
fi

mkdir -p "$DEPS"
if [ -n "${MESHTRAIN_TORCH_PREFIX:-}" ]; then
  [ -f "$MESHTRAIN_TORCH_PREFIX/Torch/TorchConfig.cmake" ] || {
    echo "setup: MESHTRAIN_TORCH_PREFIX=$MESHTRAIN_TORCH_PREFIX has no Torch/TorchConfig.cmake" \
         "(use: python3 -c 'import torch;print(torch.utils.cmake_prefix_path)')" >&2
    exit 1
  }
  echo "$MESHTRAIN_TORCH_PREFIX" > "$DEPS/torch_prefix"
  exit 0
fi

PY="$DEPS/venv/bin/python"
site() { "$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])'; }
if [ ! -x "$PY" ]; then
  need_network "the libtorch venv $DEPS/venv" "run scripts/setup.sh once online, or set MESHTRAIN_TORCH_PREFIX"
  quietly python3 -m venv "$DEPS/venv"
fi
SITE="$(site)"
# Every wheel is pinned and installed with --no-deps: the CPU build links
# libtorch_cpu only, which needs just the CUDA runtime and CUPTI libraries at
# load time, not torch's other dependencies (cuDNN, NCCL, triton, sympy, ...).
# Without --no-deps, pip would pull those in (GBs) or, after a --no-deps torch,
# print an "ERROR: pip's dependency resolver ..." line per missing one on
# every later install, although nothing is wrong.
wheels=()
if [ ! -f "$SITE/torch/share/cmake/Torch/TorchConfig.cmake" ] ||
   ! grep -q "__version__ = '$TORCH_VERSION" "$SITE/torch/version.py" 2>/dev/null; then
  wheels+=("torch==$TORCH_VERSION")
fi
[ -e "$SITE/nvidia/cu13/lib/libcudart.so.13" ] || wheels+=(nvidia-cuda-runtime==13.0.96)
[ -e "$SITE/nvidia/cu13/lib/libcupti.so.13" ] || wheels+=(nvidia-cuda-cupti==13.0.85)
# Python's safetensors: the checkpoint test checks that exported files load there.
"$PY" -c "import safetensors" 2>/dev/null || wheels+=(safetensors==0.8.0)
# pyarrow: its wheel carries Arrow/Parquet C++ (headers + libs) that
# prepare-data links for .parquet inputs (cmake/Dependencies.cmake).
"$PY" -c "import pyarrow" 2>/dev/null || wheels+=(pyarrow==26.0.1)
if ((${#wheels[@]})); then
  need_network "${wheels[*]} in $DEPS/venv" "run scripts/setup.sh once online, or set MESHTRAIN_TORCH_PREFIX"
  size=""; [[ " ${wheels[*]}" == *" torch=="* ]] && size=" (~1 GB download, a few minutes)"
  echo "setup: installing ${wheels[*]} into .deps/venv$size"
  quietly "$PY" -m pip install -q --disable-pip-version-check --no-deps "${wheels[@]}"
  installed+="${installed:+, }${#wheels[@]} Python wheels"
fi
echo "$SITE/torch/share/cmake" > "$DEPS/torch_prefix"
[ -z "$installed" ] || echo "setup: ready (installed $installed; their output: $LOG)"
