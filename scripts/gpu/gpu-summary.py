#!/usr/bin/env python3
"""The table and summaries of one scripts/gpu/gpu-check.sh run.

Reads the run's OUT_DIR: steps.tsv (one row per step: name, status, seconds,
log) and the step logs, whose JSON lines are `meshtrain bench`'s (the
performance model's estimate with "est_tokens_per_sec", then the measured
step with "tokens_per_sec" and, with --profile, "profile") and the PyTorch
anchors' (scripts/dev/cpu-bench.py --torch-only: {"anchor": "eager"|"compile",
"tokens_per_sec": ...}). It prints the table gpu-check.sh shows, writes
OUT_DIR/summary.json (every step and bench row, as before), and keeps the
run in the repository: RESULTS_ROOT/<date>-<device>-<commit>/ (-2, -3 ...
when that folder exists; never overwritten) with small text files only:

  summary.json          per config: tokens/s, MFU, TFLOP/s per device, peak
                        memory, attention backend, the model's estimate, the
                        anchors' tokens/s and meshtrain's ratio to each, every
                        other field bench printed; the device, date, commit
                        and every step's status
  table.txt             the table as printed
  profile_<config>.txt  bench --profile's ms per step by category, the gaps
                        and the largest kernels

Usage:
  scripts/gpu/gpu-summary.py OUT_DIR [--results-root DIR] [--date YYYY-MM-DD]
      [--commit SHA] [--commit-file FILE] [--device NAME] [--no-results]

--results-root defaults to bench/results of this repository (what
scripts/gpu/perf-table.py renders into docs/gpus.md). The commit is --commit, else
the first word of --commit-file (gpu-carry.sh --binary writes .carry/bin/COMMIT
beside the binary it built; "dirty" after it when tracked files differed from
the commit, kept as uncommitted_changes), else `git rev-parse --short HEAD` here, else
.git/HEAD read by hand (no git on the machine), else "nogit". The device is
--device, else the GPU name bench reports, else nvidia-smi -L's first GPU in
environment.log; the folder name uses its short slug (h100-80gb-hbm3, h200).
Exit 1 when the results folder cannot be written; the table is printed first.
"""
import argparse
import datetime
import json
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# Steps left out on purpose (the CUDA tests of a binary built elsewhere): no failure.
NOT_RUN_ON_PURPOSE = ("not run (--bin", "not run (no cuda_test beside --bin")


def json_lines(path, prefix="{"):
    """The JSON objects among a log's lines (a torn or foreign line is skipped)."""
    rows = []
    if not path or not os.path.exists(path):
        return rows
    with open(path, errors="replace") as f:
        for line in f:
            line = line.strip()
            if not line.startswith(prefix):
                continue
            try:
                row = json.loads(line)
            except ValueError:
                continue
            if isinstance(row, dict):
                rows.append(row)
    return rows


def read_steps(rows_file):
    steps = []
    with open(rows_file) as f:
        for line in f:
            if not line.strip():
                continue
            name, status, secs, log = (line.rstrip("\n").split("\t") + ["", "", ""])[:4]
            steps.append({"step": name, "status": status, "seconds": int(secs or 0), "log": log})
    return steps


def bench_rows(out, steps):
    """One row per bench_<config> step: the measured step, the model's estimate, the fit."""
    bench = []
    for s in steps:
        if not s["step"].startswith("bench_"):
            continue
        rows = json_lines(os.path.join(out, s["log"])) if s["log"] else []
        model = [x for x in rows if "est_tokens_per_sec" in x]
        measured = [x for x in rows if "est_tokens_per_sec" not in x and "tokens_per_sec" in x]
        r = dict(measured[-1]) if measured else {}
        if model:
            r["model"] = model[-1]
            r["est_tokens_per_sec"] = model[-1]["est_tokens_per_sec"]
            r["est_step_ms"] = model[-1].get("est_step_ms")
        r["name"] = s["step"][len("bench_"):]
        r["status"] = s["status"]
        bench.append(r)
    # The performance model fitted to the profile: the efficiencies and the gap
    # per kernel that make bench --device meta's formula give the measured step
    # (pass them back as --efficiency, --attention-efficiency,
    # --memory-efficiency, --kernel-gap-us).
    for r in bench:
        m, p = r.get("model"), r.get("profile")
        if not m or not p or "ms_per_step" not in p:
            continue
        ms, a = p["ms_per_step"], m.get("assumed", {})
        peak, bw = a.get("peak_tflops", 989.0), a.get("bandwidth_tbps", 3.35)
        fit = {}
        if ms.get("gemm") and "gemm_tflop" in m:
            fit["gemm_efficiency"] = m["gemm_tflop"] / (ms["gemm"] * 1e-3) / peak
        if ms.get("attention") and "attention_tflop" in m:
            fit["attention_efficiency"] = m["attention_tflop"] / (ms["attention"] * 1e-3) / peak
        mem_ms = ms.get("other", 0) + ms.get("copy", 0)
        if mem_ms and "non_gemm_gb" in m:
            fit["memory_efficiency"] = m["non_gemm_gb"] / (mem_ms * 1e-3) / 1e3 / bw
        if m.get("kernels") and p.get("gap_ms_per_step") is not None:
            fit["kernel_gap_us"] = p["gap_ms_per_step"] * 1e3 / m["kernels"]
        r["fitted"] = fit
    return bench


def anchor_rows(out, steps, bench):
    """The anchors: PyTorch's tokens/s on the same model, and meshtrain's ratio to each."""
    anchors = []
    for s in steps:
        if not s["step"].startswith("anchor_"):
            continue
        parts = s["step"].split("_", 2)
        if len(parts) != 3:
            continue
        _, kind, name = parts
        rows = json_lines(os.path.join(out, s["log"]), '{"anchor"') if s["log"] else []
        # The config's rows: its plain bench and variants of it (NAME-graphs).
        mts = [b for b in bench if b["name"] == name or b["name"].startswith(name + "-")]
        mt = next((b for b in mts if b["name"] == name), {})
        r = {"name": f"{name} (PyTorch {kind})", "config": name, "anchor": kind, "device": "cuda",
             "status": s["status"]}
        if rows:
            row = rows[-1]
            r["extra"] = {k: v for k, v in row.items() if k not in ("anchor", "tokens_per_sec", "pytorch_params")}
            r["tokens_per_sec"] = row.get("tokens_per_sec")
            r["pytorch_params"] = row.get("pytorch_params")  # meshtrain's count: plan_*.log
            for b in mts:
                if b.get("tokens_per_sec") and r["tokens_per_sec"]:
                    b[f"ratio_to_{kind}"] = b["tokens_per_sec"] / r["tokens_per_sec"]
            if mt.get("tokens_per_sec") and r["tokens_per_sec"] and mt.get("mfu") is not None:
                # the same model: the same FLOPs per token
                r["mfu"] = mt["mfu"] * r["tokens_per_sec"] / mt["tokens_per_sec"]
        anchors.append(r)
    return anchors


def is_ok(steps):
    return all(s["status"] == "ok" or s["status"].startswith(NOT_RUN_ON_PURPOSE) for s in steps)


def render_table(steps, rows):
    lines = ["", f"{'step':<26} {'status':<22} {'seconds':>7}"]
    for s in steps:
        lines.append(f"{s['step']:<26} {s['status']:<22} {s['seconds']:>7}")
    lines.append("")
    cols = [("name", "{}"), ("device", "{}"), ("attention_backend", "{}"), ("tokens_per_sec", "{:.0f}"),
            ("est_tokens_per_sec", "{:.0f}"),
            ("tflops_per_device", "{:.1f}"),
            ("mfu", "{:.3f}"), ("peak_memory_bytes", "{:.2e}"), ("last_loss", "{:.3f}"),
            ("ratio_to_eager", "{:.3f}"), ("ratio_to_compile", "{:.3f}")]
    lines.append(" | ".join(c for c, _ in cols))
    for r in rows:
        cells = []
        for c, f in cols:
            v = r.get(c)
            cells.append("-" if v is None else (v if isinstance(v, str) else f.format(v)))
        lines.append(" | ".join(cells))
    fitted = [r for r in rows if r.get("fitted")]
    if fitted:
        lines.append("")
        lines.append("performance model fitted to the profiles (assumed -> fitted):")
        for r in fitted:
            a = r["model"].get("assumed", {})
            cells = [f"{k} {a.get(k, float('nan')):.3g} -> {v:.3g}" for k, v in r["fitted"].items()]
            lines.append(f"  {r['name']}: " + ", ".join(cells))
    return "\n".join(lines) + "\n"


def render_profile(r):
    """bench --profile's summary of one config as a small text table."""
    p = r.get("profile")
    if not p or "ms_per_step" not in p:
        return f"profile of {r['name']}: none recorded (bench_{r['name']}: {r['status']})\n"
    step = p.get("step_ms") or 0.0
    pct = (lambda ms: f"{100.0 * ms / step:6.1f}%") if step else (lambda ms: "      -")
    calls = p.get("calls_per_step", {})
    out = [f"profile of {r['name']}: {p.get('steps', '?')} profiled step(s), {step:.2f} ms per step, "
           f"{p.get('source', '?')} (meshtrain bench --profile)",
           "",
           f"{'category':<12} {'ms/step':>9} {'of step':>8} {'calls/step':>11}"]
    for cat, ms in sorted(p["ms_per_step"].items(), key=lambda kv: -kv[1]):
        out.append(f"{cat:<12} {ms:9.2f} {pct(ms):>8} {calls.get(cat, ''):>11}")
    if p.get("gap_ms_per_step") is not None:
        out.append(f"{'gaps':<12} {p['gap_ms_per_step']:9.2f} {pct(p['gap_ms_per_step']):>8}"
                   "   (the step's wall time no kernel covers)")
    if p.get("busy_ms_per_step") is not None:
        out.append(f"{'busy':<12} {p['busy_ms_per_step']:9.2f} {pct(p['busy_ms_per_step']):>8}")
    top = p.get("top") or []
    if top:
        n = p.get("steps") or 1
        out += ["", "largest kernels, over all profiled steps:",
                f"{'ms':>9} {'ms/step':>9} {'calls':>7}  {'category':<10} name"]
        for k in top:
            name = str(k.get("name", ""))
            name = name if len(name) <= 120 else name[:117] + "..."
            ms = k.get("ms", 0.0)
            out.append(f"{ms:9.2f} {ms / n:9.2f} {k.get('calls', 0):>7}  {k.get('category', ''):<10} {name}")
    return "\n".join(out) + "\n"


def slug(text):
    s = re.sub(r"^nvidia[\s_-]+", "", text.strip().lower())
    s = re.sub(r"[^a-z0-9]+", "-", s).strip("-")
    return s or "unknown-gpu"


def environment(out):
    """nvidia-smi -L's GPUs and torch's version, from the environment step's log."""
    env = {"gpus": [], "torch": None, "cuda": None}
    path = os.path.join(out, "environment.log")
    if not os.path.exists(path):
        return env
    with open(path, errors="replace") as f:
        for line in f:
            m = re.match(r"^GPU \d+: (.*?)(?: \(UUID: .*\))?\s*$", line)
            if m:
                env["gpus"].append(m.group(1))
            m = re.match(r"^torch (\S+) cuda (\S+)", line)
            if m:
                env["torch"], env["cuda"] = m.group(1), m.group(2)
    return env


def device_name(given, bench, env):
    if given:
        return given
    for r in bench:
        d = r.get("device")
        if d and d not in ("cuda", "cpu", "meta"):
            return d
    return env["gpus"][0] if env["gpus"] else "unknown GPU"


def git_head_by_hand(root):
    """HEAD's commit from .git without git: a detached sha, a loose ref or packed-refs."""
    git = os.path.join(root, ".git")
    try:
        head = open(os.path.join(git, "HEAD")).read().strip()
        if not head.startswith("ref: "):
            return head[:7] if re.fullmatch(r"[0-9a-f]{40}", head) else None
        ref = head[5:]
        if os.path.exists(os.path.join(git, ref)):
            sha = open(os.path.join(git, ref)).read().strip()
            return sha[:7] if re.fullmatch(r"[0-9a-f]{40}", sha) else None
        for line in open(os.path.join(git, "packed-refs")):
            parts = line.split()
            if len(parts) == 2 and parts[1] == ref:
                return parts[0][:7]
    except OSError:
        return None
    return None


def git(root, *args):
    try:
        r = subprocess.run(["git", "-C", root, *args], capture_output=True, text=True, timeout=20)
        return r.stdout.strip() if r.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        return None


def resolve_commit(given, commit_file, root):
    """(commit, where it came from, whether tracked files differed from it: None when unknown)."""
    if given:
        return given, "--commit", None
    if commit_file and os.path.exists(commit_file):
        words = open(commit_file).read().split()
        if words:
            return words[0], os.path.basename(commit_file), "dirty" in words[1:]
    sha = git(root, "rev-parse", "--short", "HEAD")
    if sha:
        status = git(root, "status", "--porcelain", "--untracked-files=no")
        return sha, "git", None if status is None else bool(status)
    sha = git_head_by_hand(root)
    if sha:
        return sha, ".git/HEAD", None
    return "nogit", "none", None


def config_entries(bench, anchors):
    """Per config: the measured bench row (every field bench printed) plus the anchors."""
    configs = []
    for b in bench:
        c = {"config": b["name"]}
        for k, v in b.items():
            if k == "name":
                continue
            if k == "profile" and isinstance(v, dict):
                v = {pk: pv for pk, pv in v.items() if pk != "trace"}  # a path on that machine
            c[k] = v
        c["anchors"] = {}
        for a in anchors:
            if a["config"] != b["name"]:
                continue
            c["anchors"][a["anchor"]] = {k: a.get(k) for k in ("status", "tokens_per_sec", "pytorch_params", "mfu")
                                         if k in a}
            c["anchors"][a["anchor"]].update(a.get("extra", {}))
            c[f"{a['anchor']}_tokens_per_sec"] = a.get("tokens_per_sec")
        configs.append(c)
    return configs


def results_folder(root, name):
    """root/name, or name-2, name-3 ... when taken: made here, never reused."""
    os.makedirs(root, exist_ok=True)
    n = 1
    while True:
        path = os.path.join(root, name if n == 1 else f"{name}-{n}")
        try:
            os.mkdir(path)
            return path
        except FileExistsError:
            n += 1


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out", metavar="OUT_DIR", help="gpu-check.sh's output folder (steps.tsv and the logs)")
    ap.add_argument("--rows", help="the step rows (default OUT_DIR/steps.tsv)")
    ap.add_argument("--results-root", default=os.path.join(ROOT, "bench", "results"))
    ap.add_argument("--no-results", action="store_true", help="print and write OUT_DIR/summary.json only")
    ap.add_argument("--date", help="YYYY-MM-DD (default: today)")
    ap.add_argument("--commit")
    ap.add_argument("--commit-file")
    ap.add_argument("--device", help="the GPU's name (default: bench's, else nvidia-smi's)")
    a = ap.parse_args()
    out = os.path.abspath(a.out)
    rows_file = a.rows or os.path.join(out, "steps.tsv")
    if not os.path.exists(rows_file):
        sys.exit(f"gpu-summary: no step rows at {rows_file}")
    date = a.date or datetime.date.today().isoformat()
    if not re.fullmatch(r"\d{4}-\d{2}-\d{2}", date):
        sys.exit(f"gpu-summary: --date {date} is not YYYY-MM-DD")

    steps = read_steps(rows_file)
    bench = bench_rows(out, steps)
    anchors = anchor_rows(out, steps, bench)
    rows = bench + anchors
    # OUT_DIR/summary.json: the run's own record (log names, trace paths).
    summary = {"ok": is_ok(steps), "steps": steps,
               "bench": [{k: v for k, v in r.items() if k not in ("config", "anchor", "extra")} for r in rows]}
    with open(os.path.join(out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    table = render_table(steps, rows)
    sys.stdout.write(table)
    print()
    print(f"summary: {os.path.join(out, 'summary.json')}")
    if a.no_results:
        return 0

    env = environment(out)
    device = device_name(a.device, bench, env)
    commit, commit_source, dirty = resolve_commit(a.commit, a.commit_file, ROOT)
    commit_slug = re.sub(r"[^A-Za-z0-9]+", "-", commit).strip("-") or "nogit"
    kept = {"date": date, "commit": commit, "commit_source": commit_source, "uncommitted_changes": dirty,
            "device": device,
            "device_slug": slug(device), "gpus": len(env["gpus"]) or None, "torch": env["torch"],
            "cuda": env["cuda"], "ok": summary["ok"],
            "steps": [{k: s[k] for k in ("step", "status", "seconds")} for s in steps],
            "configs": config_entries(bench, anchors)}
    try:
        path = results_folder(os.path.abspath(a.results_root), f"{date}-{slug(device)}-{commit_slug}")
        kept["folder"] = os.path.basename(path)
        with open(os.path.join(path, "summary.json"), "w") as f:
            json.dump(kept, f, indent=1)
            f.write("\n")
        with open(os.path.join(path, "table.txt"), "w") as f:
            f.write(table.lstrip("\n"))
        for r in bench:
            with open(os.path.join(path, f"profile_{slug_file(r['name'])}.txt"), "w") as f:
                f.write(render_profile(r))
    except OSError as e:
        print(f"gpu-summary: could not write the results folder under {a.results_root}: {e}", file=sys.stderr)
        return 1
    print(f"results: {path} (commit it; scripts/gpu/perf-table.py puts it in docs/gpus.md)")
    return 0


def slug_file(name):
    return re.sub(r"[^A-Za-z0-9._-]+", "-", name)


if __name__ == "__main__":
    sys.exit(main())
