#!/usr/bin/env python3
"""Lists the functions of src/ longer than a limit (default 90 lines) and
fails if any is, naming each: file, line, name, length.

A function is a brace block opened at namespace or class level whose head
(the text since the previous ';', '{' or '}' at that level) ends like a
definition: ')' followed only by qualifiers (const, override, noexcept, final,
mutable) or a constructor's initializer list. Its length counts the lines
from its head's first line to its closing brace. Comments and string
literals are blanked first; brace initializers (`x_{..}`, `T{..}`) inside a
head are part of it. Lambdas and blocks count with the function they are in.
Usage: scripts/dev/check-function-length.py [SOURCE_DIR] [--limit N] [--list]
"""
import os
import re
import sys

QUALIFIERS = re.compile(r"\)\s*((const|override|noexcept|final|mutable)\s*)*$")
KEYWORD_HEAD = re.compile(r"^\s*((template\s*<[^{]*>\s*)?(namespace|struct|class|union|enum)\b|extern\s+\"C\")")


def blank(text):
    """Comments and string/char literals as spaces (newlines kept)."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append("".join(ch if ch == "\n" else " " for ch in text[i:j]))
            i = j
        elif text.startswith('R"', i) and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
            k = text.find("(", i)
            delim = ")" + text[i + 2:k] + '"'
            j = text.find(delim, k)
            j = n if j < 0 else j + len(delim)
            out.append("".join(ch if ch == "\n" else " " for ch in text[i:j]))
            i = j
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c:
                j += 2 if text[j] == "\\" else 1
            out.append(" " * (min(j + 1, n) - i))
            i = j + 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def functions(path):
    text = blank(open(path, encoding="utf-8", errors="replace").read())
    # Preprocessor lines take no part in the structure.
    text = re.sub(r"(?m)^[ \t]*#.*$", lambda m: " " * len(m.group(0)), text)
    stack = []        # per open brace: "scope" (namespace, class) or "body"
    head_start = 0    # where the current head began
    found = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c == ";" or c == "}":
            if c == "}" and stack:
                kind, start, name = stack.pop()
                if kind == "function":
                    first = text.count("\n", 0, start) + 1
                    last = text.count("\n", 0, i) + 1
                    found.append((last - first + 1, first, name))
            head_start = i + 1
        elif c == "{":
            inside_body = any(k != "scope" for k, _, _ in stack)
            head = text[head_start:i]
            prev = head.rstrip()[-1:] if head.strip() else ""
            if not inside_body and (prev.isalnum() or prev in "_>") and not KEYWORD_HEAD.match(head) \
                    and "(" in head and not QUALIFIERS.search(head.rstrip()):
                # A brace initializer inside a head (x_{..}): skip to its end.
                depth, j = 0, i
                while j < n:
                    depth += {"{": 1, "}": -1}.get(text[j], 0)
                    if depth == 0:
                        break
                    j += 1
                i = j + 1
                continue
            if inside_body:
                stack.append(("block", i, ""))
            elif KEYWORD_HEAD.match(head) or "(" not in head:
                stack.append(("scope", i, ""))
            else:
                stripped = head.strip()
                is_function = QUALIFIERS.search(stripped) or re.search(r"\)\s*:\s*[^:]", stripped)
                start = head_start + (len(head) - len(head.lstrip()))
                name = re.sub(r"\s+", " ", stripped.split("(")[0])[-80:]
                stack.append(("function" if is_function else "scope", start, name))
            head_start = i + 1
        i += 1
    return found


def main():
    args = sys.argv[1:]
    limit, listing = 90, "--list" in args
    if "--limit" in args:
        limit = int(args[args.index("--limit") + 1])
    roots = [a for a in args if not a.startswith("--") and not a.isdigit()]
    root = roots[0] if roots else os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
    long_ones = []
    for dirpath, _, files in os.walk(os.path.join(root, "src")):
        for f in sorted(files):
            if f.endswith((".cpp", ".h", ".cu")):
                path = os.path.join(dirpath, f)
                for length, line, name in functions(path):
                    rel = os.path.relpath(path, root)
                    if listing:
                        print(f"{length:5d} {rel}:{line} {name}")
                    if length > limit:
                        long_ones.append((length, rel, line, name))
    for length, rel, line, name in sorted(long_ones, reverse=True):
        print(f"{rel}:{line}: {name}: {length} lines (the limit is {limit})")
    if long_ones:
        print(f"check-function-length: {len(long_ones)} function(s) over {limit} lines: split them")
        return 1
    print(f"check-function-length: every function in src/ is at most {limit} lines")
    return 0


if __name__ == "__main__":
    sys.exit(main())
