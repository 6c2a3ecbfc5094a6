"""The package boundary, checked by `make lint`: every import in alfwrapper runs down.

LAYERS lists alfwrapper's packages (and top-level modules) from the ground up.  A
module may import its own layer and the layers below it, never one above; and no
modules may import each other in a circle, whether the imports are at the top or
inside a function.  Prints one line per breach and exits 1, or exits 0 quietly.

    python tests/layers.py [PACKAGE_DIR]
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

LAYERS = (
    "record",  # value classes, without dataclasses' exec (its text says why)
    "errors",
    "host",  # what Python lacks: bpf(2), libc, namespaces, capabilities, Landlock
    "policy",  # the pure model
    "bpf",  # the filter: parts, plan, tables, compiler
    "state",  # the pinned tree and the Store seam (a package: its modules never import __init__)
    "sets",  # named sets: the host's shared lists, pinned beside the services
    "loader",  # the loader's protocol, client, quota and server
    "lifecycle",  # start-up, the running service, the processes beside it
    "observe",  # read-only questions
    "cli",  # the command line: a package, a module per group of subcommands
    "supervise",  # the bind supervisor's entry: builds policies as the command line does
    "completion",
    "door",  # the way in: a kept verdict's denial, else the command line
    "__main__",
)


def module_name(path: Path, root: Path) -> str:
    parts = path.relative_to(root.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path, name: str) -> set[str]:
    """The alfwrapper modules this file imports, anywhere in it."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*up, base] if base else up)
            if base.split(".")[0] == "alfwrapper":
                found |= {f"{base}.{a.name}" for a in node.names} | {base}
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.split(".")[0] == "alfwrapper"}
    return found


def layer(name: str) -> int | None:
    """The layer of alfwrapper.X[.Y]; None for the package itself (its face)."""
    parts = name.split(".")
    return LAYERS.index(parts[1]) if len(parts) > 1 and parts[1] in LAYERS else None


def breaches(root: Path) -> list[str]:
    files = {module_name(p, root): p for p in sorted(root.rglob("*.py"))}
    graph: dict[str, set[str]] = {}
    found = []
    for name, path in files.items():
        if len(name.split(".")) > 1 and name.split(".")[1] not in LAYERS:
            found.append(f"{path}: in no layer: add it to LAYERS in tests/layers.py")
            continue
        targets = {t for t in imports(path, name) if t in files and t != name}
        graph[name] = targets
        mine = layer(name)
        for target in sorted(targets):
            theirs = layer(target)
            if mine is not None and theirs is not None and theirs > mine:
                found.append(
                    f"{path}: imports {target}, a layer above it "
                    f"({LAYERS[mine]} < {LAYERS[theirs]}): move the shared part down"
                )
    found += [f"circle: {' -> '.join(c)}" for c in circles(graph)]
    return found


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Each circle of imports once, found by depth-first search."""
    seen: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str, path: list[str]) -> None:
        if node in path:
            found.append([*path[path.index(node) :], node])
            return
        if node in seen:
            return
        seen.add(node)
        for nxt in sorted(graph.get(node, ())):
            visit(nxt, [*path, node])

    for node in sorted(graph):
        visit(node, [])
    return found


def main() -> int:
    root = Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).parent.parent / "alfwrapper")
    problems = breaches(root.resolve())
    for line in problems:
        print(f"layers: {line}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
