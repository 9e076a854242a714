#!/usr/bin/env python3
"""The measured-performance table of docs/gpus.md, generated from bench/results.

Renders a markdown table from the newest results folder under bench/results
(newest by the date its name starts with, then by name; scripts/gpu/gpu-check.sh
writes one per GPU run through scripts/gpu/gpu-summary.py) and puts it in
docs/gpus.md (or the --doc given) between the lines

  <!-- perf-table:begin -->
  <!-- perf-table:end -->

With no results folder yet, the text between them says so and how to make one.

Usage:
  scripts/gpu/perf-table.py [--doc docs/gpus.md] [--results-root bench/results]
  scripts/gpu/perf-table.py --check    exit 1 naming the file when its table is stale
  scripts/gpu/perf-table.py --print    the generated text only, nothing written
"""
import argparse
import json
import os
import re
import sys
import textwrap

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BEGIN = "<!-- perf-table:begin -->"
END = "<!-- perf-table:end -->"
FOLDER = re.compile(r"^(\d{4}-\d{2}-\d{2})-(.+?)(?:-(\d{1,3}))?$")
HOW = ("`scripts/gpu/gpu-check.sh OUT_DIR` on a GPU machine (or `scripts/gpu/gpu-check.sh OUT_DIR --bin "
       ".carry/bin/meshtrain` with a binary built here) writes `bench/results/<date>-<device>-<commit>/`; "
       "commit that folder and run `scripts/gpu/perf-table.py` to put it here.")


def newest(results_root):
    """The newest results folder (by the date in its name, then its name, -2 after -1), or None."""
    found = []
    if os.path.isdir(results_root):
        for name in os.listdir(results_root):
            m = FOLDER.match(name)
            if m and os.path.isfile(os.path.join(results_root, name, "summary.json")):
                found.append(((m.group(1), m.group(2), int(m.group(3) or 1)), name))
    return os.path.join(results_root, max(found)[1]) if found else None


def prose(text):
    return textwrap.fill(text, 78, break_on_hyphens=False, break_long_words=False)


def thousands(v):
    return "-" if v is None else f"{v:,.0f}"


def cell(v, fmt):
    return "-" if v is None else fmt.format(v)


def render(results_root, shown_root):
    folder = newest(results_root)
    if folder is None:
        return prose(f"No GPU result is recorded under `{shown_root}/` yet. {HOW}") + "\n"
    with open(os.path.join(folder, "summary.json")) as f:
        s = json.load(f)
    name = os.path.basename(folder)
    steps = s.get("steps", [])
    not_ok = [f"`{x['step']}` {x['status']}" for x in steps if x.get("status") != "ok"]
    lines = [prose(f"The newest GPU run kept in `{shown_root}/{name}/` (`summary.json`, `table.txt`, "
                   f"`profile_<config>.txt`): {s.get('gpus') or '?'} x {s.get('device', '?')}, "
                   f"PyTorch {s.get('torch') or '?'}, {len(steps) - len(not_ok)} of {len(steps)} steps ok."),
             "",
             "| config | device | date | commit | meshtrain tokens/s | MFU | PyTorch eager tokens/s "
             "| `torch.compile` tokens/s | ratio to compile | peak memory |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for c in s.get("configs", []):
        peak = c.get("peak_memory_bytes")
        lines.append("| " + " | ".join([
            f"`{c['config']}`" + ("" if c.get("status") == "ok" else f", {c.get('status')}"),
            c.get("device") or s.get("device", "-"),
            s.get("date", "-"),
            f"`{s.get('commit', '-')}`",
            thousands(c.get("tokens_per_sec")),
            cell(None if c.get("mfu") is None else 100 * c["mfu"], "{:.1f}%"),
            thousands(c.get("eager_tokens_per_sec")),
            thousands(c.get("compile_tokens_per_sec")),
            cell(c.get("ratio_to_compile"), "{:.3f}"),
            cell(None if peak is None else peak / 2**30, "{:.1f} GiB"),
        ]) + " |")
    if not_ok:
        lines += ["", prose("Steps of that run not ok: " + ", ".join(not_ok) + ".")]
    return "\n".join(lines) + "\n"


def section(doc_text):
    """(before, between, after) around the markers, or None when they are missing."""
    b = doc_text.find(BEGIN + "\n")
    e = doc_text.find("\n" + END, b)
    if b < 0 or e < 0 or e < b:
        return None
    start = b + len(BEGIN) + 1
    return doc_text[:start], doc_text[start:e + 1], doc_text[e + 1:]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    # --readme: its name when the table lived in README.md.
    ap.add_argument("--doc", "--readme", dest="doc", default=os.path.join(ROOT, "docs", "gpus.md"),
                    help="the markdown file holding the table (default docs/gpus.md)")
    ap.add_argument("--results-root", default=os.path.join(ROOT, "bench", "results"))
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--check", action="store_true", help="exit 1 when the file's table is stale")
    mode.add_argument("--print", action="store_true", help="print the generated text only")
    a = ap.parse_args()
    root = os.path.abspath(a.results_root)
    shown = os.path.relpath(root, ROOT) if root.startswith(ROOT + os.sep) else root
    text = render(root, shown)
    if a.print:
        sys.stdout.write(text)
        return 0
    with open(a.doc) as f:
        doc = f.read()
    parts = section(doc)
    if parts is None:
        print(f"perf-table: {a.doc} has no '{BEGIN}' ... '{END}' lines", file=sys.stderr)
        return 2
    if parts[1] == text:
        if a.check:
            print(f"perf-table: {a.doc} is up to date with {newest(root) or root}")
        return 0
    if a.check:
        print(f"perf-table: {a.doc} is stale: its perf-table section differs from what "
              f"{newest(root) or root} gives; run scripts/gpu/perf-table.py and commit "
              f"{os.path.relpath(a.doc, ROOT) if os.path.abspath(a.doc).startswith(ROOT + os.sep) else a.doc}",
              file=sys.stderr)
        return 1
    with open(a.doc, "w") as f:
        f.write(parts[0] + text + parts[2])
    print(f"perf-table: wrote {a.doc} from {newest(root) or root}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
