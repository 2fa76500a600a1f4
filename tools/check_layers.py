#!/usr/bin/env python3
"""Checks the library's layering (docs/design.md, Architecture) from its #include lines.

    python3 tools/check_layers.py [SRC_DIR]

src/runtime may include only src/runtime; src/ops the runtime and src/ops; src/api anything.
runtime/testing.h (what only tests call) is included by no op and no api file. No include cycle
between modules, where a module is a .c file and its .h (tensor.c and tensor.h are one). Prints
each violation and exits 1, or prints a one-line summary and exits 0.
"""
import os
import re
import sys

LAYERS = ("runtime", "ops", "api")  # each may include only itself and the layers before it
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def sources(src):
    for layer in LAYERS:
        folder = os.path.join(src, layer)
        for name in sorted(os.listdir(folder)):
            if name.endswith((".c", ".h", ".def")):
                yield os.path.join(layer, name)


def resolve(src, including, name):
    """The src-relative path of a quoted include, or None for one outside src (clattn.h, a
    generated file)."""
    for base in (os.path.dirname(including), ""):
        candidate = os.path.normpath(os.path.join(base, name))
        if os.path.isfile(os.path.join(src, candidate)):
            return candidate
    return None


def module(path):
    return os.path.splitext(path)[0]


def find_cycle(graph):
    """One cycle of module names, or None (iterative depth-first search)."""
    state = {}
    for start in sorted(graph):
        if state.get(start):
            continue
        stack = [(start, iter(sorted(graph[start])))]
        path = [start]
        state[start] = 1
        while stack:
            node, edges = stack[-1]
            nxt = next(edges, None)
            if nxt is None:
                state[node] = 2
                stack.pop()
                path.pop()
            elif state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            elif not state.get(nxt):
                state[nxt] = 1
                stack.append((nxt, iter(sorted(graph.get(nxt, ())))))
                path.append(nxt)
    return None


def main():
    src = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "src")
    errors, graph, files = [], {}, 0
    for path in sources(src):
        files += 1
        layer = LAYERS.index(path.split(os.sep)[0])
        with open(os.path.join(src, path), encoding="utf-8") as f:
            text = f.read()
        graph.setdefault(module(path), set())
        for name in INCLUDE.findall(text):
            target = resolve(src, path, name)
            if target is None:
                continue
            target_layer = LAYERS.index(target.split(os.sep)[0])
            if target_layer > layer:
                errors.append("%s includes %s: src/%s may not include src/%s" %
                              (path, name, LAYERS[layer], LAYERS[target_layer]))
            if target == os.path.join("runtime", "testing.h") and layer > 0:
                errors.append("%s includes %s, which only tests (and the runtime files that "
                              "implement it) include" % (path, name))
            if module(target) != module(path):
                graph[module(path)].add(module(target))
    cycle = find_cycle(graph)
    if cycle:
        errors.append("include cycle: " + " -> ".join(cycle))
    for e in errors:
        print("check_layers: " + e)
    if not errors:
        edges = sum(len(v) for v in graph.values())
        print("check_layers: %d files, %d modules, %d dependencies: layers and no cycle" %
              (files, len(graph), edges))
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
