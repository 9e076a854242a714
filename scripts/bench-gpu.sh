#!/usr/bin/env bash
# GPU benchmarks (issue: fast on an H100): builds against the machine's PyTorch
# with CUDA, prepares the corpus, and runs `meshtrain bench` for GPT-2 124M and
# the moe1B shape on one GPU, then prints one table.
# Usage: scripts/bench-gpu.sh [--steps N] [--peak-tflops X]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
STEPS=20
PEAK=""
while (($#)); do
  case "$1" in
    --steps) STEPS="${2:?--steps needs a number}"; shift 2 ;;
    --peak-tflops) PEAK="${2:?--peak-tflops needs a number}"; shift 2 ;;
    -h|--help) sed -n '2,5p' "$0"; exit 0 ;;
    *) echo "bench-gpu.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
command -v nvidia-smi >/dev/null || { echo "bench-gpu.sh: no GPU here (nvidia-smi not found)" >&2; exit 1; }
MESHTRAIN_TORCH_PREFIX="$(python3 -c 'import torch; print(torch.utils.cmake_prefix_path)')"
export MESHTRAIN_TORCH_PREFIX MESHTRAIN_CUDA=1 BUILD_DIR="${BUILD_DIR:-$ROOT/build-gpu}"
scripts/build.sh meshtrain
BIN="$BUILD_DIR/meshtrain"
[ -f data/fortunes/manifest.json ] ||
  "$BIN" prepare-data --input /usr/share/games/fortunes --output data/fortunes --vocab-size 4096
extra=()
[ -n "$PEAK" ] && extra=(--peak-tflops "$PEAK")
run() {  # NAME CONFIG SETS...
  local name="$1" config="$2"
  shift 2
  "$BIN" bench --config "$config" --steps "$STEPS" "${extra[@]}" --set device_config.device=cuda "$@" 2>&1 |
    tail -1 | python3 -c "import json,sys; r=json.loads(sys.stdin.read()); r['name']='$name'; print(json.dumps(r))"
}
{
  run gpt2-124m configs/gpt2-124m.json --n_device_axis 1 1 1
  run moe1b-1gpu configs/moe1b.json --n_device_axis 1 1 1 --set data_config.train_batch_size=8 \
    --set data_config.micro_batch_size=0
} | python3 -c "
import json, sys
rows = [json.loads(l) for l in sys.stdin if l.strip()]
keys = ['name', 'device', 'tokens_per_sec', 'tflops_per_device', 'mfu', 'peak_memory_bytes', 'peak_memory_kind']
print(' | '.join(keys))
for r in rows:
    print(' | '.join(str(r.get(k, '')) for k in keys))
"
