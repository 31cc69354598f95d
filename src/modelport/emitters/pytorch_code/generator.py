"""Walk an ONNX graph in order and collect the module's source pieces and state dict.

Unsupported ops are counted over the whole graph before any code is produced; converter
failures (a configuration an op family cannot express) are collected too, and reported together.
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict

import numpy as np

from modelport.emitters.op_registry import OpRegistry
from modelport.emitters.pytorch_code.codegen import (
    ONNX_DTYPES,
    Module,
    Names,
    NodeView,
    NotConvertible,
    Value,
    identifier,
    literal,
    snake,
    torch_dtype,
)
from modelport.emitters.pytorch_code.registry import default_table

NONDETERMINISTIC = {"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial", "Bernoulli"}
OP_HINTS = {"Slice": "sliced", "Range": "positions", "Max": "maximum", "Min": "minimum", "Sum": "total",
            "Abs": "absolute", "IsNaN": "is_nan", "IsInf": "is_inf", "Pow": "power", "Round": "rounded", "Input": "x"}
FOLD_LIMIT = 1 << 20  # elements: constant subgraphs up to this size are evaluated at emit time


class GenerationFailed(Exception):
    def __init__(self, unsupported: Counter, failures: list[tuple[str, str, str]]):
        self.unsupported = unsupported
        self.failures = failures
        parts = []
        if unsupported:
            parts.append("unsupported ops: " + ", ".join(f"{op} x{n}" for op, n in sorted(unsupported.items())))
        if failures:
            shown = "; ".join(f"{op} '{name}': {why}" for op, name, why in failures[:5])
            more = f" (+{len(failures) - 5} more)" if len(failures) > 5 else ""
            parts.append(f"nodes that cannot be expressed: {shown}{more}")
        super().__init__("; ".join(parts))


RANK_ROUNDS = 8  # at most this many re-inferences for Reshape ranks (each resolves one chain link)


def _infer(model):
    import onnx

    if any(node.domain == "com.microsoft" for node in model.graph.node):
        model = _infer_contrib(model)
    try:
        model = onnx.shape_inference.infer_shapes(model, strict_mode=False, data_prop=True)
    except Exception:
        return model
    return _reshape_ranks(model)


def _reshape_ranks(model):
    """ONNX shape inference gives a Reshape to a computed target no shape at all, even when the
    target's length (the output's rank) is known, and every value after it then has an unknown rank
    (125 of the PP-OCRv4 recogniser's 860). Each round records those ranks and infers again, so they
    flow on; the rounds stop when nothing changes or after RANK_ROUNDS (the rest stays unknown and
    the converters resolve it at run time)."""
    import onnx
    from onnx import helper

    for _ in range(RANK_ROUNDS):
        g = model.graph
        known = {v.name: v.type.tensor_type for v in [*g.input, *g.value_info, *g.output] if v.type.HasField("tensor_type")}
        added = []
        for node in g.node:
            if node.op_type != "Reshape" or node.domain not in ("", "ai.onnx") or len(node.input) < 2:
                continue
            out, data, target = known.get(node.output[0]), known.get(node.input[0]), known.get(node.input[1])
            if (out is not None and out.HasField("shape")) or data is None or not data.elem_type or target is None:
                continue
            dims = target.shape.dim if target.HasField("shape") else []
            if len(dims) == 1 and dims[0].HasField("dim_value"):
                added.append(helper.make_tensor_value_info(node.output[0], data.elem_type, [None] * dims[0].dim_value))
        if not added:
            break
        kept = [v for v in g.value_info if v.name not in {a.name for a in added}]
        del g.value_info[:]
        g.value_info.extend(kept + added)
        try:
            model = onnx.shape_inference.infer_shapes(model, strict_mode=False, data_prop=True)
        except Exception:
            break
    return model


def _infer_contrib(model):
    """Shapes through onnxruntime's contrib ops (`--optimize all` writes them), which ONNX's own
    inference does not know: onnxruntime's symbolic shape inference, when it copes."""
    try:
        from onnxruntime.tools.symbolic_shape_infer import SymbolicShapeInference

        return SymbolicShapeInference.infer_shapes(model, auto_merge=True, guess_output_rank=True) or model
    except Exception:
        return model


def _shapes_and_types(model) -> tuple[dict, dict]:
    return graph_shapes_and_types(model.graph)


def graph_shapes_and_types(g) -> tuple[dict, dict]:
    shapes, dtypes = {}, {}
    for v in list(g.input) + list(g.value_info) + list(g.output):
        if not v.type.HasField("tensor_type"):
            continue
        tt = v.type.tensor_type
        if tt.elem_type in ONNX_DTYPES:
            dtypes[v.name] = ONNX_DTYPES[tt.elem_type]
        if tt.HasField("shape"):
            shapes[v.name] = [d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in tt.shape.dim]
    return shapes, dtypes


def constant_value(node) -> np.ndarray:
    from onnx import helper, numpy_helper

    a = node.attribute[0]
    v = helper.get_attribute_value(a)
    if a.name == "value":
        return numpy_helper.to_array(v)
    if a.name in ("value_float", "value_int"):
        return np.array(v, dtype=np.float32 if a.name == "value_float" else np.int64)
    if a.name in ("value_floats", "value_ints"):
        return np.array(v, dtype=np.float32 if a.name == "value_floats" else np.int64)
    raise NotConvertible(f"Constant with '{a.name}' (strings and sparse tensors are not supported)")


class Generator:
    def __init__(self, model, *, registry: OpRegistry | None = None):
        self.model = _infer(model)
        self.graph = self.model.graph
        self.registry = registry or default_table()
        self.opsets = {o.domain or "": o.version for o in self.model.opset_import}
        self.opsets.setdefault("ai.onnx", self.opsets.get("", 1))
        self.shapes, self.dtypes = _shapes_and_types(self.model)
        self.values: dict[str, Value] = {}
        self.mod = Module()
        self.attr_names = Names()
        self.local_names = Names()
        self.var_of: dict[str, str] = {}
        self.param_exprs: dict[str, str] = {}
        self.absorbed: set[int] = set()
        self.consumers: dict[str, list] = defaultdict(list)
        self.initializers = {t.name for t in self.graph.initializer}
        self.live_values = self._live()

    # ---- naming and constants
    def var_for(self, onnx_name: str, op_type: str, hint: str | None = None) -> str:
        """The local variable for an ONNX value: its name made an identifier, without an exporter's
        numeric suffix ('add_40' -> 'add'), or `hint` / the op's name when the ONNX name says nothing."""
        if onnx_name not in self.var_of:
            base = re.sub(r"_\d+$", "", onnx_name) if re.search(r"[A-Za-z]_\d+$", onnx_name) else onnx_name
            self.var_of[onnx_name] = self.local_names.make(identifier(base, hint or OP_HINTS.get(op_type, snake(op_type))))
        return self.var_of[onnx_name]

    def literal(self, value) -> str:
        text = literal(value)
        if "math." in text:
            self.mod.uses.add("math")
        return text

    def constant_expr(self, onnx_name: str) -> str:
        if onnx_name in self.param_exprs:
            return self.param_exprs[onnx_name]
        arr = self.values[onnx_name].const
        attr = self.attr_names.make(identifier(onnx_name, "const"))
        dims = ", ".join(str(d) for d in arr.shape)
        shape = f"({dims},)" if arr.ndim == 1 else f"({dims})"
        dt = "" if arr.dtype == np.float32 else f", dtype={torch_dtype(arr.dtype)}"
        if onnx_name in self.initializers and arr.dtype.kind == "f" and arr.size > 1:
            self.mod.init.append(f"self.{attr} = nn.Parameter(torch.zeros({shape}{dt}))")
        else:
            self.mod.init.append(f'self.register_buffer("{attr}", torch.zeros({shape}{dt}))')
        self.mod.state[attr] = np.ascontiguousarray(arr)
        self.param_exprs[onnx_name] = f"self.{attr}"
        return f"self.{attr}"

    # ---- analysis
    def _live(self) -> set[str]:
        """Values that reach a graph output (dead nodes are not emitted)."""
        for node in self.graph.node:
            for i in node.input:
                if i:
                    self.consumers[i].append(node)
        live = {o.name for o in self.graph.output}
        for node in reversed(self.graph.node):
            if any(o in live for o in node.output):
                live.update(i for i in node.input if i)
                for a in node.attribute:
                    if a.type == 5:  # a subgraph's reads from this scope
                        live.update(free_names(a.g))
        return live

    def _live_nodes(self):
        return [n for n in self.graph.node if any(o in self.live_values for o in n.output)]

    def unsupported(self, nodes=None) -> Counter:
        return Counter(op for _, op in self.unsupported_nodes(nodes))

    def unsupported_nodes(self, nodes=None) -> list[tuple[str, str]]:
        """(node name, op label) of every live node without a converter, subgraphs included."""
        missing = []
        for node in self._live_nodes() if nodes is None else nodes:
            for a in node.attribute:
                if a.type == 5:
                    missing += self.unsupported_nodes(a.g.node)
            if node.op_type == "Constant" and not node.domain:
                continue
            domain = node.domain or ""
            if self.registry.find(node.op_type, self.opsets.get(domain, 1), domain) is None:
                label = node.op_type if domain in ("", "ai.onnx") else f"{domain}.{node.op_type}"
                missing.append((node.name or (node.output[0] if node.output else label), label))
        return missing

    # ---- constant folding
    def _fold(self, node) -> list[np.ndarray] | None:
        if node.op_type in NONDETERMINISTIC or node.domain not in ("", "ai.onnx"):
            return None
        ins = [i for i in node.input if i]
        if not ins or not all(self.values[i].kind == "const" for i in ins):
            return None
        if sum(self.values[i].const.size for i in ins) > FOLD_LIMIT:
            return None
        try:
            from onnx import helper
            from onnx.reference import ReferenceEvaluator

            g = helper.make_graph([node], "fold", [helper.make_tensor_value_info(i, 0, None) for i in ins],
                                  [helper.make_tensor_value_info(o, 0, None) for o in node.output if o])
            m = helper.make_model(g, opset_imports=[helper.make_opsetid("", self.opsets.get("", 1))])
            outs = ReferenceEvaluator(m).run(None, {i: self.values[i].const for i in ins})
        except Exception:
            return None
        if any(not isinstance(o, np.ndarray) or o.dtype == object or o.size > FOLD_LIMIT for o in outs):
            return None
        return [np.asarray(o) for o in outs]

    # ---- the walk
    def run(self) -> Module:
        missing = self.unsupported()
        if missing:
            raise GenerationFailed(missing, [])
        g = self.graph
        for t in g.initializer:
            from onnx import numpy_helper

            self.values[t.name] = Value("const", const=numpy_helper.to_array(t))
        for v in g.input:
            if v.name in self.initializers:
                continue
            name = self.local_names.make(identifier(v.name, "x"))
            self.var_of[v.name] = name
            self.values[v.name] = Value("tensor", name)
            self.mod.args.append(name)
        failures = []
        for node in self._live_nodes():
            if id(node) in self.absorbed:
                continue
            try:
                self._convert(node)
            except NotConvertible as e:
                failures.append((node.op_type, node.name or (node.output[0] if node.output else ""), str(e)))
                for o in node.output:
                    self.values.setdefault(o, Value("tensor", "None"))
        if failures:
            raise GenerationFailed(Counter(), failures)
        for o in g.output:
            self.mod.returns.append(self._output_expr(o.name))
        return self.mod

    def _convert(self, node) -> None:
        if node.op_type == "Constant" and node.domain in ("", "ai.onnx"):
            self.values[node.output[0]] = Value("const", const=constant_value(node))
            return
        folded = self._fold(node)
        if folded is not None:
            for o, arr in zip(node.output, folded, strict=False):
                if o:
                    self.values[o] = Value("const", const=arr)
            return
        for i in node.input:
            if i and i not in self.values:
                raise NotConvertible(f"input '{i}' is not produced by any earlier node")
        domain = node.domain or ""
        opset = self.opsets.get(domain, 1)
        converter = self.registry.lookup(node.op_type, opset, domain)
        converter.fn(NodeView(self, node, opset))
        for o in node.output:
            if o and o in self.live_values and o not in self.values:
                raise NotConvertible(f"output '{o}' was not produced")

    def _output_expr(self, name: str) -> str:
        v = self.values[name]
        if v.kind == "const":
            return self.constant_expr(name)
        if v.kind in ("ints", "int"):
            dt = self.dtypes.get(name, "int64")
            return f"torch.tensor({v.expr}, dtype={torch_dtype(dt)})"
        return v.expr


def render(mod: Module, *, doc: str) -> str:
    """The model.py source text."""
    lines = [f'"""{doc.strip()}\n"""', "", "from __future__ import annotations", ""]
    std = ["import math"] if "math" in mod.uses else []
    std.append("from pathlib import Path")
    methods = [ln for _, args, body, rets in mod.methods for ln in [*args, *body, *rets]]
    body = "\n".join([*mod.helpers.values(), *mod.init, *mod.forward, *mod.returns, *methods])
    lines += std + [""] + (["import torch"] if "torch." in body else [])
    if "F" in mod.uses:
        lines.append("import torch.nn.functional as F")
    lines += ["from torch import nn", "", ""]
    for src in mod.helpers.values():
        lines += [src.strip(), "", ""]
    lines += ["class Model(nn.Module):", "    def __init__(self) -> None:", "        super().__init__()"]
    lines += [f"        {ln}" for ln in mod.init]
    lines += ["", f"    def forward(self, {', '.join(mod.args)}):" if mod.args else "    def forward(self):"]
    lines += [f"        {ln}" for ln in mod.forward]
    ret = mod.returns[0] if len(mod.returns) == 1 else ", ".join(mod.returns)
    lines += [f"        return {ret}", ""]
    for name, args, body, returns in mod.methods:
        lines += [f"    def {name}(self, {', '.join(args)}):" if args else f"    def {name}(self):"]
        lines += [f"        {ln}" for ln in body]
        lines += [f"        return {', '.join(returns)}" if returns else "        return None", ""]
    lines += [""]
    lines += [
        'def load_model(weights: str | Path | None = None) -> Model:',
        '    """The model with its trained weights (model.safetensors beside this file by default), in eval mode."""',
        "    from safetensors.torch import load_file",
        "",
        "    model = Model()",
        '    model.load_state_dict(load_file(str(weights or Path(__file__).with_name("model.safetensors"))))',
        "    return model.eval()",
        "",
    ]
    return "\n".join(lines)


def free_names(graph) -> list[str]:
    """Values a (sub)graph reads from enclosing scopes, nested subgraphs included, in first-use order."""
    defined = {i.name for i in graph.input} | {t.name for t in graph.initializer}
    free: list[str] = []
    for node in graph.node:
        used = list(node.input)
        for a in node.attribute:
            if a.type == 5:
                used += free_names(a.g)
        for name in used:
            if name and name not in defined and name not in free:
                free.append(name)
        defined.update(node.output)
    return free


class BodyGenerator(Generator):
    """A subgraph (Loop body, If branch) written as a method of the same module: it shares the
    module's submodules, parameters and helpers; values it reads from the enclosing graph are
    constants when known there, otherwise method arguments."""

    def __init__(self, parent: Generator, graph):
        self.parent = parent
        self.model = parent.model
        self.graph = graph
        self.registry = parent.registry
        self.opsets = parent.opsets
        shapes, dtypes = graph_shapes_and_types(graph)
        self.shapes, self.dtypes = {**parent.shapes, **shapes}, {**parent.dtypes, **dtypes}
        pm = parent.mod
        self.mod = Module(init=pm.init, state=pm.state, helpers=pm.helpers, uses=pm.uses, submodules=pm.submodules,
                          methods=pm.methods)
        self.attr_names = parent.attr_names
        self.local_names = Names()
        self.var_of = {}
        self.values: dict[str, Value] = {}
        self.param_exprs = parent.param_exprs
        self.absorbed = set()
        self.consumers = defaultdict(list)
        self.initializers = parent.initializers | {t.name for t in graph.initializer}
        self.live_values = self._live()
        self.captured: list[str] = []  # expressions in the enclosing scope, passed as the last arguments

    def bind_input(self, onnx_name: str, value: Value) -> None:
        self.values[onnx_name] = value

    def arg(self, onnx_name: str, hint: str, kind: str = "tensor") -> str:
        name = self.local_names.make(identifier(onnx_name, hint))
        self.var_of[onnx_name] = name
        self.values[onnx_name] = Value(kind, name)
        self.mod.args.append(name)
        return name

    def build(self, method_hint: str) -> str:
        """Writes the method; returns its name. Inputs must be bound (or made args) first."""
        from onnx import numpy_helper

        for t in self.graph.initializer:
            self.values[t.name] = Value("const", const=numpy_helper.to_array(t))
        for name in free_names(self.graph):
            if name in self.values:
                continue
            outer = self.parent.values.get(name)
            if outer is None:
                raise NotConvertible(f"subgraph reads '{name}', which the enclosing graph does not produce")
            if outer.kind == "const":
                self.values[name] = outer
                continue
            param = self.local_names.make(identifier(name, "outer"))
            self.var_of[name] = param
            self.values[name] = Value(outer.kind, param, length=outer.length)
            self.mod.args.append(param)
            self.captured.append(outer.expr)
        missing = self.unsupported()
        if missing:
            raise NotConvertible("unsupported ops in a subgraph: " + ", ".join(f"{op} x{k}" for op, k in sorted(missing.items())))
        for node in self._live_nodes():
            if id(node) not in self.absorbed:
                self._convert(node)
        self.mod.returns = [self._output_expr(o.name) for o in self.graph.output]
        method = self.attr_names.make(method_hint)
        self.parent.mod.methods.append((method, self.mod.args, self.mod.forward, self.mod.returns))
        return method
