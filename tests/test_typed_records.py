"""`IR.provenance` and `Artifact.details` are typed records (`ir.Provenance`, `artifact.ArtifactDetails`):
every key the code writes into one is declared there, every declared key is written somewhere, and
the report schema publishes the artifact details and the provenance keys the report's `source` repeats.

The keys are read from the source (an AST scan), following what the writes use:
- `provenance=` given to any call (`IRModel(...)`, `tf_common.build_ir(...)`), `Artifact(..., details=...)`;
- `x.provenance["k"] = ...`, `x.provenance.update(k=...)`, and the same on `x.details` in the modules
  that use `Artifact` (other classes have a `details` of their own);
- in those values, dict literals (with `**` spreads of literals, conditional ones included), `dict(k=...)`,
  a comprehension over a tuple of names, a local name (each assignment to it, its `.update(...)` and
  `[k] = ...` writes), a function's `**kwargs` (the keywords its callers pass), the return values of a
  function of the package (a tuple's element where the call is unpacked), a method of the class a
  function of the package returns (`found.to_dict()`) and `getattr(x, "attr")` (each `_.attr = ...`).
A copy of a provenance already recorded (an expression that reads one) adds no key. Anything else is
`unread`, and the test fails on it: a new way of writing keys is then taught to the scan.
"""

from __future__ import annotations

import ast
import json
import typing
from dataclasses import dataclass, field
from pathlib import Path

import jsonschema
import pytest

from modelport.artifact import ArtifactDetails
from modelport.ir import Provenance
from modelport.orchestration.source import SOURCE_DETAILS
from modelport.validation.report import SCHEMA_FILE

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "modelport"
RECORDS = {"provenance": Provenance, "details": ArtifactDetails}


@dataclass
class Module:
    name: str
    path: Path
    tree: ast.Module
    imports: dict[str, str] = field(default_factory=dict)  # local name -> "module" or "module:attr"
    parents: dict[ast.AST, ast.AST] = field(default_factory=dict)


def _own_nodes(scope: ast.AST):
    """The nodes of `scope` outside the functions, lambdas and classes nested in it."""
    stack = list(ast.iter_child_nodes(scope))
    while stack:
        node = stack.pop()
        yield node
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            stack.extend(ast.iter_child_nodes(node))


class Scan:
    """The string keys written into provenance dicts and artifact details under the package `root`."""

    def __init__(self, root: Path):
        self.root = root
        self.modules: dict[str, Module] = {}
        for path in sorted(root.rglob("*.py")):
            parts = [root.name, *path.relative_to(root).with_suffix("").parts]
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            tree = ast.parse(path.read_text(), str(path))
            mod = Module(name, path, tree)
            for node in ast.walk(tree):
                for child in ast.iter_child_nodes(node):
                    mod.parents[child] = node
                if isinstance(node, ast.ImportFrom) and node.module and not node.level:
                    for a in node.names:
                        full = f"{node.module}.{a.name}"
                        mod.imports[a.asname or a.name] = full if self._is_module(full) else f"{node.module}:{a.name}"
                elif isinstance(node, ast.Import):
                    for a in node.names:
                        mod.imports[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
            self.modules[name] = mod
        self.keys: dict[str, dict[str, set[str]]] = {kind: {} for kind in RECORDS}
        self.unread: list[str] = []
        self._seen: set[tuple] = set()
        for mod in self.modules.values():
            self._scan(mod)

    # --- where the package's names lead --------------------------------------------------------

    def _is_module(self, dotted: str) -> bool:
        rel = dotted.split(".")[1:]
        return dotted.split(".")[0] == self.root.name and (
            self.root.joinpath(*rel).with_suffix(".py").is_file() or (self.root.joinpath(*rel) / "__init__.py").is_file())

    def _definition(self, module: str, name: str, depth: int = 0):
        """(Module, the top-level def or class `name` of `module`), following re-exports."""
        mod = self.modules.get(module)
        if mod is None or depth > 5:
            return None
        for node in mod.tree.body:
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name == name:
                return mod, node
        target = mod.imports.get(name, "")
        return self._definition(*target.split(":"), depth + 1) if ":" in target else None

    def _callee(self, mod: Module, func: ast.expr):
        """(Module, def) a call's `func` names in the package, or None."""
        if isinstance(func, ast.Name):
            return self._definition(mod.name, func.id)
        if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
            target = mod.imports.get(func.value.id, "")
            if target and ":" not in target:
                return self._definition(target, func.attr)
        return None

    def _scope(self, mod: Module, node: ast.AST) -> ast.AST:
        while node in mod.parents:
            node = mod.parents[node]
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                return node
        return mod.tree

    def _where(self, mod: Module, node: ast.AST) -> str:
        return f"{mod.path.relative_to(self.root.parent)}:{getattr(node, 'lineno', 0)}"

    # --- the keys of a value -------------------------------------------------------------------

    def _add(self, kind: str, key, mod: Module, node: ast.AST) -> None:
        if isinstance(key, str):
            self.keys[kind].setdefault(key, set()).add(self._where(mod, node))
        else:
            self.unread.append(f"{kind}: {self._where(mod, node)}: a key that is not a string literal")

    def _value(self, kind: str, mod: Module, node: ast.expr, index: int | None = None) -> None:
        """The keys of the dict `node` evaluates to (element `index` of the tuple it is, when given)."""
        if index is not None:
            if isinstance(node, ast.Tuple):
                self._value(kind, mod, node.elts[index])
            elif isinstance(node, ast.Call):
                self._call(kind, mod, node, index)
            else:
                self.unread.append(f"{kind}: {self._where(mod, node)}: {ast.unparse(node)}[{index}]")
            return
        if kind == "provenance" and self._copy(node):
            return  # a copy of a provenance already recorded (a clone, ir.json read back, a part's)
        if isinstance(node, ast.Constant) and node.value is None:
            return  # `getattr(x, "attr", None) or {}`
        if isinstance(node, ast.Dict):
            for k, v in zip(node.keys, node.values, strict=True):
                if k is None:
                    self._value(kind, mod, v)
                else:
                    self._add(kind, k.value if isinstance(k, ast.Constant) else None, mod, k)
        elif isinstance(node, ast.IfExp):
            self._value(kind, mod, node.body)
            self._value(kind, mod, node.orelse)
        elif isinstance(node, ast.BoolOp):
            for v in node.values:
                self._value(kind, mod, v)
        elif isinstance(node, ast.DictComp) and self._constant_keys(node) is not None:
            for k in self._constant_keys(node):
                self._add(kind, k, mod, node)
        elif isinstance(node, ast.Name):
            self._name(kind, mod, node)
        elif isinstance(node, ast.Call):
            self._call(kind, mod, node)
        else:
            self.unread.append(f"{kind}: {self._where(mod, node)}: {ast.unparse(node)}")

    @staticmethod
    def _copy(node: ast.expr) -> bool:
        """`x.provenance`, `dict(x.provenance)`, `copy.deepcopy(x.provenance)`, `meta.get("provenance", {})`."""
        if isinstance(node, ast.Attribute):
            return node.attr == "provenance"
        return isinstance(node, ast.Call) and bool(node.args) and (
            (isinstance(node.args[0], ast.Attribute) and node.args[0].attr == "provenance")
            or (isinstance(node.args[0], ast.Constant) and node.args[0].value == "provenance"))

    @staticmethod
    def _constant_keys(node: ast.DictComp) -> list | None:
        """`{k: ... for k in ("a", "b") ...}`: the names it can hold."""
        gen = node.generators[0]
        if (len(node.generators) == 1 and isinstance(node.key, ast.Name) and isinstance(gen.target, ast.Name)
                and node.key.id == gen.target.id and isinstance(gen.iter, (ast.Tuple, ast.List))
                and all(isinstance(e, ast.Constant) for e in gen.iter.elts)):
            return [e.value for e in gen.iter.elts]
        return None

    def _call(self, kind: str, mod: Module, node: ast.Call, index: int | None = None) -> None:
        func = node.func
        if index is None and isinstance(func, ast.Name) and func.id == "dict":
            self._update(kind, mod, node)
            return
        if (index is None and isinstance(func, ast.Name) and func.id == "getattr" and len(node.args) >= 2
                and isinstance(node.args[1], ast.Constant)):
            self._attribute(kind, mod, node.args[1].value, node)
            if len(node.args) > 2:
                self._value(kind, mod, node.args[2])
            return
        found = self._callee(mod, func)
        if found is None and isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
            found = self._method(mod, node, func)
        if found is None or not isinstance(found[1], ast.FunctionDef):
            self.unread.append(f"{kind}: {self._where(mod, node)}: {ast.unparse(node)}")
            return
        self._returns(kind, *found, index)

    def _returns(self, kind: str, mod: Module, fn: ast.FunctionDef, index: int | None) -> None:
        if self._once(kind, mod.name, fn.name, fn.lineno, "return", index):
            for node in _own_nodes(fn):
                if isinstance(node, ast.Return) and node.value is not None:
                    self._value(kind, mod, node.value, index)

    def _method(self, mod: Module, call: ast.Call, func: ast.Attribute):
        """`x.m()` where `x` is assigned the result of a package function that says which class it returns."""
        scope = self._scope(mod, call)
        for node in _own_nodes(scope):
            if (isinstance(node, ast.Assign) and isinstance(node.value, ast.Call)
                    and any(isinstance(t, ast.Name) and t.id == func.value.id for t in node.targets)):
                made = self._callee(mod, node.value.func)
                returns = made and isinstance(made[1], ast.FunctionDef) and made[1].returns
                if returns:
                    cls = self._definition(made[0].name, ast.unparse(returns).strip("'\""))
                    if cls and isinstance(cls[1], ast.ClassDef):
                        for item in cls[1].body:
                            if isinstance(item, ast.FunctionDef) and item.name == func.attr:
                                return cls[0], item
        return None

    def _attribute(self, kind: str, mod: Module, attr: str, at: ast.AST) -> None:
        """Each `_.attr = value` in the module."""
        hits = [n for n in ast.walk(mod.tree) if isinstance(n, ast.Assign)
                and any(isinstance(t, ast.Attribute) and t.attr == attr for t in n.targets)]
        if not hits:
            self.unread.append(f"{kind}: {self._where(mod, at)}: nothing assigns .{attr}")
        for n in hits:
            self._value(kind, mod, n.value)

    def _name(self, kind: str, mod: Module, name: ast.Name) -> None:
        """A local name: each assignment to it and its in-place writes; a `**kwargs` parameter: its callers'
        keywords; the record's own parameter (`provenance`): what the callers pass, scanned at the call."""
        scope = self._scope(mod, name)
        if not self._once(kind, mod.name, getattr(scope, "lineno", 0), name.id):
            return
        found = False
        args = getattr(scope, "args", None)
        if args is not None:
            if args.kwarg is not None and args.kwarg.arg == name.id:
                self._callers_keywords(kind, mod, scope)
                found = True
            elif name.id in {a.arg for a in [*args.posonlyargs, *args.args, *args.kwonlyargs]}:
                if name.id != kind:
                    self.unread.append(f"{kind}: {self._where(mod, name)}: the parameter {name.id}")
                found = True
        for node in _own_nodes(scope):
            if isinstance(node, (ast.Assign, ast.AnnAssign, ast.NamedExpr)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for t in targets:
                    if isinstance(t, ast.Name) and t.id == name.id and node.value is not None:
                        found = True
                        self._value(kind, mod, node.value)
                    elif isinstance(t, ast.Tuple):
                        for i, e in enumerate(t.elts):
                            if isinstance(e, ast.Name) and e.id == name.id:
                                found = True
                                self._value(kind, mod, node.value, i)
            elif isinstance(node, ast.withitem) and isinstance(node.optional_vars, ast.Name) and node.optional_vars.id == name.id:
                found = True
                self._value(kind, mod, node.context_expr)
            found |= self._in_place(kind, mod, node, lambda e: isinstance(e, ast.Name) and e.id == name.id)
        if not found:
            self.unread.append(f"{kind}: {self._where(mod, name)}: {name.id} is not assigned here")

    def _callers_keywords(self, kind: str, mod: Module, fn: ast.FunctionDef) -> None:
        named = {a.arg for a in [*fn.args.posonlyargs, *fn.args.args, *fn.args.kwonlyargs]}
        for other in self.modules.values():
            for node in ast.walk(other.tree):
                if isinstance(node, ast.Call) and self._callee(other, node.func) == (mod, fn):
                    for kw in node.keywords:
                        if kw.arg is None:
                            self._value(kind, other, kw.value)
                        elif kw.arg not in named:
                            self._add(kind, kw.arg, other, node)

    def _update(self, kind: str, mod: Module, call: ast.Call) -> None:
        """`x.update(...)` or `dict(...)`: its positional dicts and keywords."""
        for a in call.args:
            self._value(kind, mod, a)
        for kw in call.keywords:
            if kw.arg is None:
                self._value(kind, mod, kw.value)
            else:
                self._add(kind, kw.arg, mod, call)

    def _in_place(self, kind: str, mod: Module, node: ast.AST, target) -> bool:
        """`T[k] = v`, `T.update(...)`, `T.setdefault(k, v)`, `T |= v` where `target(T)`; whether `node` is one."""
        if isinstance(node, ast.Assign):
            hit = False
            for t in node.targets:
                if isinstance(t, ast.Subscript) and target(t.value):
                    hit = True
                    self._add(kind, t.slice.value if isinstance(t.slice, ast.Constant) else None, mod, t)
            return hit
        if isinstance(node, ast.AugAssign) and target(node.target):
            self._value(kind, mod, node.value)
            return True
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and target(node.func.value):
            if node.func.attr == "update":
                self._update(kind, mod, node)
                return True
            if node.func.attr == "setdefault" and node.args:
                self._add(kind, node.args[0].value if isinstance(node.args[0], ast.Constant) else None, mod, node)
                return True
        return False

    def _once(self, *key) -> bool:
        if key in self._seen:
            return False
        self._seen.add(key)
        return True

    # --- the writes ----------------------------------------------------------------------------

    def _scan(self, mod: Module) -> None:
        uses_artifact = "Artifact" in mod.imports or any(
            isinstance(n, ast.ClassDef) and n.name == "Artifact" for n in mod.tree.body)
        for node in ast.walk(mod.tree):
            if isinstance(node, ast.Call):
                named = ast.unparse(node.func).rpartition(".")[2]
                for kw in node.keywords:
                    if kw.arg == "provenance" or (kw.arg == "details" and named == "Artifact"):
                        self._value(kw.arg, mod, kw.value)
                positional = {"IRModel": (3, "provenance"), "Artifact": (5, "details")}.get(named)
                if positional and len(node.args) > positional[0]:
                    self._value(positional[1], mod, node.args[positional[0]])
            for kind in RECORDS:
                if kind == "details" and not uses_artifact:
                    continue

                def is_record(e, kind=kind):  # a local `details` is many things; a local `provenance` is one
                    return (isinstance(e, ast.Attribute) and e.attr == kind) or (
                        kind == "provenance" and isinstance(e, ast.Name) and e.id == kind)

                self._in_place(kind, mod, node, is_record)
                if isinstance(node, ast.Assign):
                    for t in node.targets:
                        if isinstance(t, ast.Attribute) and t.attr == kind:
                            self._value(kind, mod, node.value)


@pytest.fixture(scope="module")
def scan() -> Scan:
    return Scan(PACKAGE)


def declared(kind: str) -> set[str]:
    return set(typing.get_type_hints(RECORDS[kind]))


def test_the_records_are_plain_dicts_declaring_every_key_optional():
    for record in RECORDS.values():
        assert record.__total__ is False and not record.__required_keys__
        assert type(record()) is dict


@pytest.mark.parametrize("kind", list(RECORDS))
def test_the_scan_reads_every_write(scan, kind):
    assert [u for u in scan.unread if u.startswith(kind)] == []


@pytest.mark.parametrize("kind", list(RECORDS))
def test_every_key_written_is_declared(scan, kind):
    undeclared = {k: sorted(w) for k, w in scan.keys[kind].items() if k not in declared(kind)}
    assert undeclared == {}


@pytest.mark.parametrize("kind", list(RECORDS))
def test_every_declared_key_is_written(scan, kind):
    assert sorted(declared(kind) - set(scan.keys[kind])) == []


def test_the_scan_follows_each_way_a_key_is_written(scan):
    # a sample of the keys only a followed path reaches
    where = {k: " ".join(sorted(w)) for kind in RECORDS for k, w in scan.keys[kind].items()}
    assert "parsers/pytorch_checkpoints.py" in where["state_dict_key"]  # getattr -> _.checkpoint_entry -> found.to_dict()
    assert "emitters/tfjs_graph.py" in where["grappler"]  # a package function's return value
    assert "optimize/openvino_precision.py" in where["calibration_samples"]  # a tuple element, then a local .update
    assert "emitters/savedmodel_tf.py" in where["inputs_layout"]  # a **kwargs parameter's callers
    assert "parsers/huggingface.py" in where["companion_files"]  # x.provenance.update(k=...)
    assert "emitters/norm_fallback.py" in where["kernel_fallback"]  # x.details[k] = ...
    assert "emitters/tensorrt.py" in where["compute_capability"]  # a local name's .update(k=...)


def test_the_scan_finds_an_undeclared_key(tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "helpers.py").write_text("def extra():\n    d = {'from_a_helper': 1}\n    d['written_later'] = 2\n    return d\n")
    (pkg / "emit.py").write_text(
        "from pkg.helpers import extra\n"
        "from modelport.artifact import Artifact\n\n\n"
        "def parse(ir):\n"
        "    ir.provenance['invented'] = 1\n"
        "    ir.provenance.update(framework='x', also_invented=2)\n\n\n"
        "def emit(path, opaque):\n"
        "    return Artifact('t', 'r', path, [], details={'nodes': 1, 'made_up': 2, **extra(), **opaque})\n")
    found = Scan(pkg)
    assert set(found.keys["provenance"]) - declared("provenance") == {"invented", "also_invented"}
    assert set(found.keys["details"]) - declared("details") == {"made_up", "from_a_helper", "written_later"}
    assert [u.split(": ", 2)[2] for u in found.unread] == ["the parameter opaque"]


def _schema() -> dict:
    return json.loads(SCHEMA_FILE.read_text())


def test_the_schema_publishes_every_artifact_detail():
    properties = _schema()["properties"]["artifacts"]["items"]["properties"]
    assert sorted(declared("details") - set(properties)) == []
    for key in declared("details"):
        assert "type" in properties[key] or "enum" in properties[key] or "const" in properties[key], key


def test_the_schema_publishes_every_source_detail():
    source = next(o for o in _schema()["properties"]["source"]["oneOf"] if o.get("type") == "object")
    assert sorted(set(SOURCE_DETAILS) - set(source["properties"])) == []
    assert set(SOURCE_DETAILS) <= declared("provenance")


def test_the_schema_is_valid():
    jsonschema.Draft202012Validator.check_schema(_schema())
