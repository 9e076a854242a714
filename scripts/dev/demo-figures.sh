#!/usr/bin/env bash
# Prints the figures the README quotes for the demo (section "First hour"),
# from a real run, so that they can be checked and regenerated instead of
# going stale:
#   scripts/run.sh 2>&1 | tee run.log; scripts/dev/demo-figures.sh run.log
# Reads the machine (cores, CPU), the run's metrics.jsonl (first and last
# training loss, final validation loss, tokens/s), the run.sh log (times, the
# lines printed before training, any line with ERROR or a traceback) and, when
# present, the last ctest run (build/Testing/Temporary/LastTest.log) and the
# test venv's install time (.deps/pyenv-setup.log).
# Usage: scripts/dev/demo-figures.sh RUN_LOG [RUN_DIR (default runs/tiny-moe-mla)]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
LOG="${1:?usage: scripts/dev/demo-figures.sh RUN_LOG [RUN_DIR]}"
RUN_DIR="${2:-$ROOT/runs/tiny-moe-mla}"
[ -f "$LOG" ] || { echo "demo-figures: no run log $LOG (scripts/run.sh 2>&1 | tee $LOG)" >&2; exit 1; }
[ -f "$RUN_DIR/metrics.jsonl" ] || { echo "demo-figures: no $RUN_DIR/metrics.jsonl (run scripts/run.sh first)" >&2; exit 1; }
python3 - "$LOG" "$RUN_DIR" "$ROOT" <<'PY'
import json, os, re, statistics, sys
log_path, run_dir, root = sys.argv[1:4]
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
print(f"machine: {os.cpu_count()} cores, {cpu}")
rows = [json.loads(l) for l in open(os.path.join(run_dir, "metrics.jsonl"))]
train = [r for r in rows if "loss" in r]
val = [r for r in rows if "val_loss" in r]
tps = [r["tokens_per_sec"] for r in train[5:]] or [0]
print(f"run: {run_dir}, {len(train)} steps")
print(f"loss: step {train[0]['step']} {train[0]['loss']:.2f}, step {train[-1]['step']} {train[-1]['loss']:.2f}; "
      f"validation {val[-1]['val_loss']:.2f} at step {val[-1]['step']}" if val else "validation: none")
print(f"tokens/s (median over steps 6..): {statistics.median(tps):,.0f}")
lines = open(log_path, errors="replace").read().splitlines()
before = next((i for i, l in enumerate(lines) if l.startswith("== training")), len(lines))
print(f"lines printed by set-up, build and prepare-data (before '== training'): {before}")
bad = [l for l in lines if "ERROR" in l or "Traceback" in l or "terminate called" in l]
print(f"lines with ERROR or a stack trace: {len(bad)}" + "".join("\n  " + l for l in bad[:5]))
done = next((l for l in lines if l.startswith("== done in")), None)
print(f"times: {done[3:] if done else 'no == done line (run.sh did not finish)'}")
# A sample may span lines: it runs until the next log line or "==" line.
starts = [i for i, l in enumerate(lines) if "sample: " in l]
if starts:
    i = starts[-1]
    text = [lines[i].split("sample: ", 1)[1]]
    for l in lines[i + 1:]:
        if l.startswith("[") or l.startswith("=="):
            break
        text.append(l)
    print(f"end-of-run sample: {chr(10).join(text)!r}")
else:
    print("end-of-run sample: none")
last_test = os.path.join(root, "build", "Testing", "Temporary", "LastTest.log")
if os.path.exists(last_test):
    text = open(last_test, errors="replace").read()
    secs = sum(float(m) for m in re.findall(r'Test time =\s*([\d.]+) sec', text))
    n = len(re.findall(r'Test time =', text))
    span = re.findall(r'^(?:Start|End) testing: (.*)$', text, re.M)
    print(f"last ctest run: {n} tests, {secs:.0f} s of test time summed, " + " to ".join(span)
          + " (build/Testing/Temporary/LastTest.log)")
else:
    print("last ctest run: none in build/")
venv_log = os.path.join(root, ".deps", "pyenv-setup.log")
took = [l for l in open(venv_log, errors="replace")] if os.path.exists(venv_log) else []
took = [l.strip() for l in took if l.startswith("setup-pyenv: installed in")]
print(f"test venv (.deps/pyenv): {took[-1] if took else 'install time not recorded'}")
PY
