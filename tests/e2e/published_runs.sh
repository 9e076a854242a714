#!/usr/bin/env bash
# docs/scaling.md's "Published runs" table, recomputed: each row's `plan`
# arguments are run as a user runs them, and the estimate it prints must be
# the table's (within its rounding), the ratio the estimate over the reported
# figure, a source cited, and a reason given wherever the ratio is off by more
# than 30%. Fails when the doc is stale or the step model drifts.
source "$(dirname "$0")/common.sh" "$@"

python3 - "$BIN" "$SRC" <<'PY'
import json, re, shlex, subprocess, sys

binary, src = sys.argv[1], sys.argv[2]
text = open(f"{src}/docs/scaling.md").read()
section = text.split("\n## Published runs\n", 1)
if len(section) != 2:
    print("FAIL - docs/scaling.md has no '## Published runs' section")
    sys.exit(1)
body = section[1].split("\n## ", 1)[0]
rows = [l for l in body.splitlines() if l.startswith("|") and not re.match(r"^\|[-: |]+\|$", l)][1:]
failed = 0

def check(ok, name, detail=""):
    global failed
    print(("ok   - " if ok else "FAIL - ") + name + ("" if ok or not detail else f": {detail}"))
    failed += 0 if ok else 1

def number(cell):
    return float(cell.strip().replace(",", ""))

check(len(rows) >= 5, f"at least five published runs ({len(rows)})")
for row in rows:
    cells = [c.strip() for c in row.strip().strip("|").split("|")]
    if len(cells) != 8:
        check(False, f"row has 8 columns: {row}")
        continue
    run, hardware, mesh, args, reported, estimate, ratio, why = cells
    name = re.sub(r"\s*\(.*", "", run)
    check(re.search(r"\]\(https?://", run) is not None, f"{name}: source cited (a link)")
    m = re.fullmatch(r"`([^`]+)`", args)
    if not m:
        check(False, f"{name}: plan arguments in backticks", args)
        continue
    cmd = [binary, "plan"] + [a.replace("configs/", f"{src}/configs/", 1) if a.startswith("configs/") else a
                              for a in shlex.split(m.group(1))] + ["--json"]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        check(False, f"{name}: plan exits 0", p.stderr[-500:] + p.stdout[-500:])
        continue
    last = [l for l in p.stdout.splitlines() if l.startswith("{")][-1]
    got = json.loads(last)["estimate"]["tokens_per_sec_per_gpu"]
    doc_est, doc_rep, doc_ratio = number(estimate), number(reported), number(ratio)
    # The table rounds to 3 significant digits (at least to the unit).
    tol = max(0.5, abs(got) * 0.005)
    check(abs(got - doc_est) <= tol, f"{name}: estimate {got:.1f} tokens/s a GPU, the table's {estimate}")
    check(abs(doc_est / doc_rep - doc_ratio) <= 0.006,
          f"{name}: ratio {doc_ratio} is the estimate over the reported ({doc_est / doc_rep:.3f})")
    if abs(doc_ratio - 1) > 0.30:
        check(len(why) > 10, f"{name}: off by {abs(doc_ratio - 1) * 100:.0f}%, the table says why")
print(f"{len(rows)} published runs")
sys.exit(1 if failed else 0)
PY
rc=$?
check "published runs table recomputed" test $rc -eq 0
finish
