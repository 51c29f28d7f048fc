"""Measure the shape of the source tree: import circles, hidden imports, room sizes.

Prints, for ``src/gpuyard``:
- the import circles between gpuyard modules (strongly connected components of the
  import graph, counting imports made inside functions too, since those are how a
  circle is usually hidden), one line per circle;
- the function-level imports of gpuyard modules (imports under ``TYPE_CHECKING``
  are not counted: they never run);
- the largest folder by modules and lines, and the largest file.

``--check`` exits 1 when there is a circle, a function-level import of a gpuyard
module outside ``gpuyard.cli`` (the command line imports the server's parts when a
command needs them, so that ``gpuyard --help`` stays fast; the circle count still
sees those imports), a source file over 800 lines, or a folder of more than 25
modules; ``make lint`` runs it that way.
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "src"
PACKAGE = "gpuyard"
MAX_LINES = 800
MAX_MODULES = 25


def module_name(path: Path) -> str:
    """The dotted name of the module at ``path`` (a package's ``__init__`` is the package)."""
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _resolve(module: str, node: ast.ImportFrom, is_package: bool) -> str:
    if node.level == 0:
        return node.module or ""
    base = module.split(".")
    if not is_package:
        base = base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def imports_of(
    path: Path, known: set[str], with_types: bool = False
) -> tuple[set[str], list[tuple[int, str]]]:
    """(every gpuyard module ``path`` imports, its function-level ones).

    ``with_types`` counts the imports under ``TYPE_CHECKING`` too: they never run,
    but a circle through them is still two modules that need each other.
    """
    module = module_name(path)
    is_package = path.name == "__init__.py"
    tree = ast.parse(path.read_text(), str(path))
    found: set[str] = set()
    nested: list[tuple[int, str]] = []

    def targets(node: ast.Import | ast.ImportFrom) -> list[str]:
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        else:
            base = _resolve(module, node, is_package)
            for alias in node.names:
                candidate = f"{base}.{alias.name}"
                names.append(candidate if candidate in known else base)
        return [n for n in names if n == PACKAGE or n.startswith(PACKAGE + ".")]

    def walk(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child):
                if with_types:
                    for stmt in child.body:
                        for name in (
                            targets(stmt) if isinstance(stmt, (ast.Import, ast.ImportFrom)) else []
                        ):
                            while name not in known and "." in name:
                                name = name.rsplit(".", 1)[0]
                            found.add(name)
                for stmt in child.orelse:
                    walk(stmt, in_function)
                continue
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                for name in targets(child):
                    while name not in known and "." in name:
                        name = name.rsplit(".", 1)[0]
                    found.add(name)
                    if in_function:
                        nested.append((child.lineno, name))
                continue
            inner = in_function or isinstance(
                child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)
            )
            walk(child, inner)

    walk(tree, False)
    found.discard(module)
    return found, nested


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    result: list[list[str]] = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work: list[tuple[str, list[str]]] = [(start, sorted(graph[start]))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, pending = work[-1]
            if pending:
                nxt = pending.pop()
                if nxt not in graph:
                    continue
                if nxt not in index:
                    index[nxt] = low[nxt] = counter
                    counter += 1
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, sorted(graph[nxt])))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component: list[str] = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    result.append(sorted(component))
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 on any finding")
    args = parser.parse_args()
    files = sorted((ROOT / PACKAGE).rglob("*.py"))
    known = {module_name(f) for f in files}
    graph: dict[str, set[str]] = {}
    typed_graph: dict[str, set[str]] = {}
    nested: list[str] = []
    for path in files:
        name = module_name(path)
        found, inner = imports_of(path, known)
        typed, _ = imports_of(path, known, with_types=True)
        # A package's __init__ is imported by every submodule: an edge to it is not a circle.
        graph[name] = {m for m in found if not name.startswith(m + ".")}
        typed_graph[name] = {m for m in typed if not name.startswith(m + ".")}
        nested += [f"{path.relative_to(ROOT)}:{line} imports {name}" for line, name in inner]
    found_circles = circles(graph)
    typed_circles = [c for c in circles(typed_graph) if c not in found_circles]
    folders: dict[Path, list[int]] = defaultdict(list)
    sizes = {path: len(path.read_text().splitlines()) for path in files}
    for path, lines in sizes.items():
        folders[path.parent].append(lines)
    big_folder = max(folders, key=lambda f: len(folders[f]))
    big_file = max(sizes, key=lambda f: sizes[f])
    over = [f"{p.relative_to(ROOT)} ({n} lines)" for p, n in sizes.items() if n > MAX_LINES]
    crowded = [
        f"{f.relative_to(ROOT)} ({len(n) - (f / '__init__.py').exists()} modules)"
        for f, n in folders.items()
        # Migrations are a numbered sequence, read one at a time, not a room.
        if len(n) - (f / "__init__.py").exists() > MAX_MODULES and "migrations" not in f.parts
    ]
    print(f"import circles: {len(found_circles)}")
    for component in found_circles:
        print("  " + " <-> ".join(component))
    print(f"more import circles through TYPE_CHECKING imports: {len(typed_circles)}")
    for component in typed_circles:
        print("  " + " <-> ".join(component))
    print(f"function-level imports of gpuyard modules: {len(nested)}")
    for line in nested:
        print("  " + line)
    print(
        f"largest folder: {big_folder.relative_to(ROOT)} "
        f"({len(folders[big_folder])} modules, {sum(folders[big_folder])} lines)"
    )
    print(f"largest file: {big_file.relative_to(ROOT)} ({sizes[big_file]} lines)")
    print(f"files over {MAX_LINES} lines: {len(over)}")
    for line in over:
        print("  " + line)
    hidden = [line for line in nested if not line.startswith(f"{PACKAGE}/cli/")]
    print(f"folders of more than {MAX_MODULES} modules: {len(crowded)}")
    for line in crowded:
        print("  " + line)
    if args.check and (found_circles or typed_circles or hidden or over or crowded):
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
