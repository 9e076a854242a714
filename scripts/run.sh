#!/usr/bin/env bash
# The main job, on a fresh machine: set-up, build, prepare the embedded corpus
# (Debian's fortunes), train a tiny MoE + MLA model on several MPI ranks (it
# prints a sample of its text at the end), and evaluate it. Idempotent; on a
# 2-core machine about 2 minutes of training once built (README, "First hour").
# Prints one line per step; the build's own output goes to build/build.log.
# Env: NP (ranks, default 4), MESH ("DP PP TP", default "2 1 2" for NP=4), STEPS.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
NP="${NP:-4}"
MESH="${MESH:-2 1 2}"
STEPS="${STEPS:-1200}"
CONFIG="${CONFIG:-configs/tiny-moe-mla.json}"
BUILD="${BUILD_DIR:-$ROOT/build}"
BIN="$BUILD/meshtrain"

echo "== set-up (installs only what is missing)"
scripts/setup.sh
echo "== building meshtrain (the first build takes a while: ~150 C++ files; output in build/build.log)"
mkdir -p "$BUILD"
if ! scripts/build.sh meshtrain > "$BUILD/build.log" 2>&1; then
  tail -n 30 "$BUILD/build.log"
  echo "run.sh: the build failed; its whole output is in $BUILD/build.log" >&2
  exit 1
fi

if [ ! -f data/fortunes/manifest.json ]; then
  echo "== preparing the corpus (fortunes) -> data/fortunes"
  "$BIN" prepare-data --input /usr/share/games/fortunes --output data/fortunes --vocab-size 512
fi

MPIRUN=(mpirun --oversubscribe --bind-to none -x OMP_NUM_THREADS=1)
[ "$(id -u)" -eq 0 ] && MPIRUN+=(--allow-run-as-root)
# shellcheck disable=SC2086
set -- $MESH

t_train=$SECONDS
echo "== training $CONFIG on $NP ranks, mesh dp=$1 pp=$2 tp=$3, $STEPS steps"
"${MPIRUN[@]}" -np "$NP" "$BIN" train --config "$CONFIG" --n_device_axis "$1" "$2" "$3" \
  --training_steps "$STEPS" --set lr.end_steps="$STEPS" --checkpoint_steps 200 --set log_every=50 --fresh

t_eval=$SECONDS
echo "== evaluating the final checkpoint"
"${MPIRUN[@]}" -np "$NP" "$BIN" eval --config "$CONFIG" --n_device_axis "$1" "$2" "$3"

RUN_DIR="$(python3 -c 'import json,sys; c=json.load(open(sys.argv[1])); print(c.get("output_dir","runs")+"/"+c.get("name","run"))' "$CONFIG")"
echo "== done in $SECONDS s (training $((t_eval - t_train)) s, evaluation $((SECONDS - t_eval)) s)"
echo "== $RUN_DIR holds metrics.jsonl, tb/ (TensorBoard) and checkpoints/; more text: ${BIN#"$ROOT"/} generate --config $CONFIG --prompt \"...\""
