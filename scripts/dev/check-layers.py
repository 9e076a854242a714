#!/usr/bin/env python3
"""The library graph in CMakeLists.txt declares every include edge.

Each layer is a folder (src/<layer>/, include/meshtrain/<layer>/) built into
one static library mt_<layer> by mt_library(...) in CMakeLists.txt. A file of
layer A that includes "meshtrain/B/..." needs mt_B among mt_A's (transitive)
link dependencies; otherwise the edge is undeclared and holds only because
some other target happens to link both.

  scripts/dev/check-layers.py [ROOT]                 check; exit 1 naming each undeclared edge
  scripts/dev/check-layers.py ROOT --graph           print each layer's declared and used layers
  scripts/dev/check-layers.py ROOT --tensor-free D   the .cpp files of src/D/ that never include
                                                 libtorch (directly or through a header),
                                                 ';'-separated for CMake (they skip the PCH)
"""
import re
import sys
from pathlib import Path

INCLUDE = re.compile(r'^\s*#\s*include\s*([<"])([^>"]+)[>"]', re.M)
TORCH = ("torch/", "ATen/", "c10/")


def read_graph(root):
    """mt_library(name folder deps...) lines -> {layer: set of mt_* deps}."""
    text = (root / "CMakeLists.txt").read_text()
    text = re.sub(r"#[^\n]*", "", text)
    graph = {}
    for name, folder, deps in re.findall(r"mt_library\(\s*mt_(\w+)\s+(\w+)([^)]*)\)", text):
        graph[folder] = {d[3:] for d in deps.split() if d.startswith("mt_")}
    return graph


def closure(graph, layer):
    seen, todo = set(), [layer]
    while todo:
        for d in graph.get(todo.pop(), ()):
            if d not in seen:
                seen.add(d)
                todo.append(d)
    return seen


def layer_files(root, layer):
    files = sorted((root / "src" / layer).glob("*.cpp")) + sorted((root / "src" / layer).glob("*.h"))
    return files + sorted((root / "include" / "meshtrain" / layer).glob("*.h"))


def includes(path):
    return INCLUDE.findall(path.read_text(errors="replace"))


def resolve(root, path, quoted):
    for base in (path.parent, root / "include", root / "src"):
        if (base / quoted).is_file():
            return base / quoted
    return None


def uses_torch(root, path, seen):
    """Whether path includes libtorch, following project headers."""
    if path in seen:
        return False
    seen.add(path)
    for kind, name in includes(path):
        if name.startswith(TORCH):
            return True
        if kind == '"':
            found = resolve(root, path, name)
            if found and uses_torch(root, found, seen):
                return True
    return False


def main(argv):
    root = Path(argv[1] if len(argv) > 1 and not argv[1].startswith("--") else ".").resolve()
    graph = read_graph(root)
    if "--tensor-free" in argv:
        folder = argv[argv.index("--tensor-free") + 1]
        free = [str(p) for p in sorted((root / "src" / folder).glob("*.cpp")) if not uses_torch(root, p, set())]
        print(";".join(free), end="")
        return 0
    problems, used = [], {}
    for layer in sorted(graph):
        allowed = closure(graph, layer) | {layer}
        used[layer] = set()
        for f in layer_files(root, layer):
            for _, name in includes(f):
                m = re.match(r"meshtrain/(\w+)/", name)
                if not m:
                    continue
                used[layer].add(m.group(1))
                if m.group(1) not in allowed:
                    problems.append(f"{f.relative_to(root)} includes {name}, but mt_{layer} does not link "
                                    f"mt_{m.group(1)} (CMakeLists.txt mt_library(mt_{layer} ...))")
    for folder in sorted(p.name for p in (root / "src").iterdir() if p.is_dir()):
        if folder not in graph:
            problems.append(f"src/{folder}/ has no mt_library(mt_{folder} {folder} ...) in CMakeLists.txt")
    if "--graph" in argv:
        for layer in sorted(graph):
            print(f"mt_{layer}: links {' '.join(sorted('mt_' + d for d in graph[layer])) or '-'}; "
                  f"includes {' '.join(sorted(used[layer] - {layer})) or '-'}")
    for p in problems:
        print("undeclared include edge: " + p, file=sys.stderr)
    if problems:
        return 1
    print(f"check-layers: {len(graph)} layers, every include edge is a declared link dependency")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
