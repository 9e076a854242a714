#!/usr/bin/env bash
# The main job, on a fresh machine: set-up, build, prepare the embedded corpus
# (Debian's fortunes), train a tiny MoE + MLA model on several MPI ranks,
# evaluate it, and sample from it. Idempotent; ~5 minutes on 2 cores.
# Env: NP (ranks, default 4), MESH ("DP PP TP", default "2 1 2" for NP=4), STEPS.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
NP="${NP:-4}"
MESH="${MESH:-2 1 2}"
STEPS="${STEPS:-1200}"
CONFIG="${CONFIG:-configs/tiny-moe-mla.json}"

echo "== set-up and build"
scripts/build.sh meshtrain
BIN="${BUILD_DIR:-$ROOT/build}/meshtrain"

if [ ! -f data/fortunes/manifest.json ]; then
  echo "== preparing the corpus (fortunes) -> data/fortunes"
  "$BIN" prepare-data --input /usr/share/games/fortunes --output data/fortunes --vocab-size 512
fi

MPIRUN=(mpirun --oversubscribe --bind-to none -x OMP_NUM_THREADS=1)
[ "$(id -u)" -eq 0 ] && MPIRUN+=(--allow-run-as-root)
# shellcheck disable=SC2086
set -- $MESH

echo "== training $CONFIG on $NP ranks, mesh dp=$1 pp=$2 tp=$3, $STEPS steps"
"${MPIRUN[@]}" -np "$NP" "$BIN" train --config "$CONFIG" --n_device_axis "$1" "$2" "$3" \
  --training_steps "$STEPS" --set lr.end_steps="$STEPS" --checkpoint_steps 200 --set sample_every=400 --set log_every=50 --fresh

echo "== evaluating the final checkpoint"
"${MPIRUN[@]}" -np "$NP" "$BIN" eval --config "$CONFIG" --n_device_axis "$1" "$2" "$3"

echo "== sampling"
"$BIN" generate --config "$CONFIG" --n_device_axis 1 1 1 --prompt "The meaning of life" --max_tokens 40 \
  --temperature 0.8 --top_k 40
