"""Compare the training rows of two metrics.jsonl files: loss and grad_norm
of every step of the first must match the second within a relative tolerance.
A step logged twice (a resumed run replays steps) counts with its last row.
Usage: python3 compare.py A B [TOL]; prints the largest differences."""
import json
import sys


def rows(path):
    out = {}
    for line in open(path):
        r = json.loads(line)
        if "loss" in r and "step" in r:
            out[r["step"]] = r
    return out


a, b = rows(sys.argv[1]), rows(sys.argv[2])
tol = float(sys.argv[3]) if len(sys.argv) > 3 else 1e-4
if not a or sorted(a) != sorted(b):
    sys.exit(f"steps differ: {sorted(a)} vs {sorted(b)}")
worst = {}
for key in ("loss", "grad_norm"):
    worst[key] = max(abs(a[s][key] - b[s][key]) / max(abs(b[s][key]), 1e-12) for s in a)
print(f"{len(a)} steps; largest relative difference: loss {worst['loss']:.2e}, grad_norm {worst['grad_norm']:.2e}")
sys.exit(0 if all(v <= tol for v in worst.values()) else 1)
