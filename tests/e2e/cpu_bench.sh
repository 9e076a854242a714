#!/usr/bin/env bash
# The PyTorch anchor of scripts/dev/cpu-bench.py (and gpu-check.sh) on the CPU:
#  - tiny MoE + MLA: meshtrain and the PyTorch model both train 2 steps and
#    report tokens/s, with the same parameter count;
#  - the moe1B one-GPU shape and the dense tiny model, counted on the meta
#    device: the PyTorch model's parameters equal meshtrain's `plan` count;
#  - a setting the PyTorch model lacks is refused by name.
# Needs the reference venv's torch (scripts/dev/setup-pyenv.sh, never installed
# here): without it the test is skipped (exit 77) with the reason printed.
source "$(dirname "$0")/common.sh" "$@"

if ! PY=$(MESHTRAIN_OFFLINE=1 "$SRC/scripts/dev/setup-pyenv.sh" 2>setup-pyenv.err | tail -1) || [ ! -x "$PY" ]; then
  echo "SKIPPED: no PyTorch for the anchor: scripts/dev/setup-pyenv.sh (offline) says: $(cat setup-pyenv.err)"
  exit 77
fi
BENCH="$SRC/scripts/dev/cpu-bench.py"
field() { python3 -c "import json,sys; print(json.loads(sys.argv[1].splitlines()[-1])[sys.argv[2]])" "$1" "$2"; }
plan_params() { "$BIN" plan --config "$1" --json 2>/dev/null | tail -n 1 | python3 -c 'import json,sys; print(json.load(sys.stdin)["total_params"])'; }

out=$("$PY" "$BENCH" --config "$SRC/configs/tiny-moe-mla.json" --bin "$BIN" --steps 2 --warmup 1 2>&1)
rc=$?
echo "$out" | tail -n 5
if [ "$rc" -ne 0 ]; then
  bad "cpu-bench.py runs tiny-moe-mla on both sides (exit $rc)" "$out"
else
  check "both sides report tokens/s" python3 -c "
import json,sys; r=json.loads(sys.argv[1].splitlines()[-1])
sys.exit(0 if r['meshtrain_tokens_per_sec'] > 0 and r['pytorch_tokens_per_sec'] > 0 else 1)" "$out"
  mt=$(field "$out" meshtrain_params) pt=$(field "$out" pytorch_params)
  check "tiny-moe-mla: PyTorch parameters ($pt) equal meshtrain's ($mt)" test "$pt" = "$mt" -a "$pt" -gt 0
fi

for c in moe1b-1gpu tiny; do
  pt=$(field "$("$PY" "$BENCH" --params-only --config "$SRC/configs/$c.json" 2>&1)" pytorch_params)
  mt=$(plan_params "$SRC/configs/$c.json")
  check "$c: PyTorch parameters on the meta device ($pt) equal meshtrain plan's ($mt)" test "$pt" = "$mt" -a -n "$mt"
done

out=$("$PY" "$BENCH" --params-only --config "$SRC/configs/tiny-moe-mla.json" \
  --set 'model_config.mlp_activation="swiglu"' 2>&1)
rc=$?
check "an option the PyTorch model lacks is refused by name (exit $rc: $out)" \
  bash -c '[ "$1" -ne 0 ] && grep -q "model_config.mlp_activation" <<<"$2"' _ "$rc" "$out"
finish
