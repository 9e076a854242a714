#!/usr/bin/env python3
"""The documentation's links and sizes (ctest unit.check_docs).

Checks README.md and docs/*.md of a checkout:
  - every relative markdown link ([text](path), [text](path#heading),
    [text](#heading)) outside code reaches a file or folder that exists, and
    its #heading one of the target file's headings (GitHub's anchors);
  - README.md is at most 350 lines and docs/ARCHITECTURE.md at most 500:
    the README is the first hour and a map, the guides in docs/ hold the rest.
Exit 1 naming every problem (file:line), 0 when there is none.

Usage: scripts/dev/check-docs.py [ROOT]
"""
import os
import re
import sys

LIMITS = {"README.md": 350, "docs/ARCHITECTURE.md": 500}
LINK = re.compile(r"!?\[(?:[^\]\[]|\[[^\]]*\])*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
FENCE = re.compile(r"^\s*(```|~~~)")


def prose_lines(text):
    """(line number, line) outside fenced code, inline code blanked."""
    fenced = False
    for n, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            yield n, re.sub(r"`[^`]*`", "``", line)


def slug(heading):
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip())  # a link's text only
    text = re.sub(r"[^\w\- ]", "", text.lower())
    return text.replace(" ", "-")


def headings(path):
    """The anchors of a file's headings (GitHub's: a repeated one gets -1, -2, ...)."""
    found, seen = set(), {}
    fenced = False
    with open(path, encoding="utf-8") as f:
        for line in f.read().splitlines():
            if FENCE.match(line):
                fenced = not fenced
                continue
            m = None if fenced else re.match(r"^(#{1,6})\s+(.*?)\s*#*\s*$", line)
            if m:
                base = slug(m.group(2))
                n = seen.get(base, 0)
                seen[base] = n + 1
                found.add(base if n == 0 else f"{base}-{n}")
    return found


def check_file(root, rel):
    problems = []
    path = os.path.join(root, rel)
    with open(path, encoding="utf-8") as f:
        text = f.read()
    limit = LIMITS.get(rel)
    lines = text.count("\n")
    if limit is not None and lines > limit:
        problems.append(f"{rel}: {lines} lines, more than {limit}: move detail into a guide in docs/")
    for n, line in prose_lines(text):
        for m in LINK.finditer(line):
            target = m.group(1)
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto:, ...
                continue
            file_part, _, anchor = target.partition("#")
            dest = os.path.normpath(os.path.join(os.path.dirname(path), file_part)) if file_part else path
            if not os.path.exists(dest):
                problems.append(f"{rel}:{n}: link to {target}: {os.path.relpath(dest, root)} does not exist")
                continue
            if anchor and dest.endswith(".md") and os.path.isfile(dest) and anchor not in headings(dest):
                problems.append(f"{rel}:{n}: link to {target}: no heading #{anchor} in {os.path.relpath(dest, root)}")
    return problems


def main(argv):
    root = os.path.abspath(argv[1] if len(argv) > 1 else os.path.join(os.path.dirname(__file__), "..", ".."))
    files = ["README.md"] + sorted(
        os.path.join("docs", f) for f in os.listdir(os.path.join(root, "docs")) if f.endswith(".md"))
    problems = []
    for rel in files:
        problems += check_file(root, rel)
    for p in problems:
        print(p)
    if problems:
        print(f"check-docs: {len(problems)} problem(s) in {len(files)} files")
        return 1
    print(f"check-docs: {len(files)} files, every relative link resolves, README.md and docs/ARCHITECTURE.md "
          f"within {LIMITS['README.md']} and {LIMITS['docs/ARCHITECTURE.md']} lines")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
