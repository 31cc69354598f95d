"""The package's layers: every import (lazy ones inside functions included) points down the stack,
and no files import each other in a loop.

    cli (and the `modelport` API facade)
      → orchestration                       convert, validate, inspect, the optimise/package stages
        → parsers, optimize, emitters, serving, zoo, zoo_builders
          → frameworks                      framework loading parsers and native routes share
            → validation, runtimes          tolerances, the comparator, the run record; runners
              → base                        ir, dims, errors, targets, registry; onnxfile, resolve, reference, run

Imports within one layer are allowed (serving uses emitters), loops are not. Run
`python -m tests.test_layers` for the table of imports by layer and any violation.
"""

from __future__ import annotations

import ast
import shutil
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "modelport"

# (layer name, module prefixes); a module takes the layer of its longest matching prefix
LAYERS = [
    ("base", ["modelport.errors", "modelport.registry", "modelport.deps", "modelport.version", "modelport.targets",
              "modelport.ir", "modelport.dims", "modelport.artifact", "modelport.onnxfile", "modelport.resolve",
              "modelport.reference", "modelport.run"]),
    ("validation/runtimes", ["modelport.validation", "modelport.runtimes"]),
    ("frameworks", ["modelport.frameworks"]),
    ("stages", ["modelport.parsers", "modelport.optimize", "modelport.emitters", "modelport.packaging", "modelport.serving", "modelport.zoo",
                "modelport.zoo_builders"]),
    ("orchestration", ["modelport.orchestration"]),
    ("cli", ["modelport.cli", "modelport.__main__", "modelport"]),
]


def _module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(root: Path = PACKAGE) -> dict[str, set[str]]:
    """module -> the package's modules it imports, read from the source (every import statement,
    wherever it stands). `from pkg import name` counts as importing `pkg.name` when that is a module."""
    modules = {_module_name(p, root): p for p in root.rglob("*.py")}

    def known(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets: set[str | None] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets.update(known(a.name) for a in node.names if a.name.split(".")[0] == "modelport")
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(parts + ([base] if base else []))
                if base.split(".")[0] != "modelport":
                    continue
                for a in node.names:
                    full = f"{base}.{a.name}"
                    targets.add(full if full in modules else known(base))
        graph[name] = {t for t in targets if t and t != name}
    return graph


def layer_of(module: str) -> int | None:
    best = None
    for index, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and (best is None or len(prefix) > best[1]):
                best = (index, len(prefix))
    return best[0] if best else None


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    out = []
    for module, targets in sorted(graph.items()):
        for target in sorted(targets):
            lm, lt = layer_of(module), layer_of(target)
            if lm is not None and lt is not None and lt > lm:
                out.append(f"{module} ({LAYERS[lm][0]}) imports {target} ({LAYERS[lt][0]})")
    return out


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph.get(start, ()))))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def package_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """The same imports between the package's top-level parts (`modelport.parsers`, `modelport.zoo`, …)."""
    def part(module: str) -> str:
        return ".".join(module.split(".")[:2])

    out: dict[str, set[str]] = {}
    for module, targets in graph.items():
        for target in targets:
            if part(module) != part(target):
                out.setdefault(part(module), set()).add(part(target))
    return out


def test_every_module_has_a_layer():
    assert [m for m in import_graph() if layer_of(m) is None] == []


def test_imports_point_down_the_stack():
    assert upward_imports(import_graph()) == []


def test_no_import_cycles():
    assert cycles(import_graph()) == []


def test_no_cycles_between_packages():
    """Within one layer too, two packages never import each other (parsers and zoo did, through SourceSpec)."""
    assert cycles(package_graph(import_graph())) == []


def _copy_with(tmp_path: Path, module: str, line: str) -> Path:
    root = tmp_path / "modelport"
    shutil.copytree(PACKAGE, root, ignore=shutil.ignore_patterns("__pycache__"))
    path = root.joinpath(*module.split(".")[1:]).with_suffix(".py")
    path.write_text(path.read_text() + f"\n\ndef _added():\n    {line}\n")
    return root


@pytest.mark.parametrize(("module", "line", "what"), [
    ("modelport.validation.compare", "from modelport.orchestration import convert", "upward"),
    ("modelport.runtimes.onnxruntime", "import modelport.emitters.onnx", "upward"),
    ("modelport.ir", "from modelport import validation", "upward"),
    ("modelport.parsers.onnx", "from modelport.cli import app", "upward"),
    ("modelport.emitters.onnx", "from ..orchestration import convert", "upward"),
    ("modelport.optimize.pipeline", "from modelport.optimize.auto import auto_select", "cycle"),
    ("modelport.packaging.bundle", "from modelport.packaging.tfserving import package", "cycle"),
    ("modelport.zoo", "from modelport.parsers import SourceSpec", "package cycle"),
])
def test_an_added_upward_import_or_loop_is_caught(tmp_path, module, line, what):
    """The checks read lazy imports too: one line inside a function is enough to fail them."""
    graph = import_graph(_copy_with(tmp_path, module, line))
    if what == "upward":
        assert [v for v in upward_imports(graph) if v.startswith(module + " ")], line
    elif what == "cycle":
        assert cycles(graph), line
    else:
        assert cycles(package_graph(graph)), line


if __name__ == "__main__":
    graph = import_graph()
    counts: dict[str, int] = {}
    for module in graph:
        name = LAYERS[layer_of(module)][0] if layer_of(module) is not None else "(no layer)"
        counts[name] = counts.get(name, 0) + 1
    for name, _ in LAYERS:
        print(f"{name:22s} {counts.get(name, 0):4d} modules")
    bad = upward_imports(graph)
    loops = cycles(graph)
    print(f"upward imports: {len(bad)}")
    for line in bad:
        print("  " + line)
    print(f"cycles: {len(loops)}")
    for loop in loops:
        print("  " + " <-> ".join(loop))
    package_loops = cycles(package_graph(graph))
    print(f"cycles between packages: {len(package_loops)}")
    for loop in package_loops:
        print("  " + " <-> ".join(loop))
    sys.exit(1 if bad or loops or package_loops else 0)
