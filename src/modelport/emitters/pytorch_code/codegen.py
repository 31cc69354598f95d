"""Writing PyTorch source from an ONNX graph: names, values, the per-node view converters use, rendering.

The generator walks the graph in order. Every ONNX value becomes one of:

- a *tensor*: a local variable in `forward` (or a graph input);
- a *constant*: an initializer or a folded Constant, known now; converters may inline it as a
  literal (shapes, axes, scalars) or register it as a parameter (float initializers, trainable)
  or a buffer (everything else);
- *ints* / *int*: shape arithmetic (a `Shape` and what is computed from it) kept as Python lists
  and ints, so `x.reshape(batch, -1, 64)` stays dynamic and `torch.export` can trace it.

Converters (one module per op family) receive a `NodeView` and write lines through it; they
raise `NotConvertible` with a reason for a configuration they cannot express.
"""

from __future__ import annotations

import keyword
import re
from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from modelport.emitters.pytorch_code.helpers import HELPERS

TORCH_DTYPES = {
    "float32": "torch.float32", "float64": "torch.float64", "float16": "torch.float16",
    "bfloat16": "torch.bfloat16", "int8": "torch.int8", "int16": "torch.int16", "int32": "torch.int32",
    "int64": "torch.int64", "uint8": "torch.uint8", "uint16": "torch.uint16", "uint32": "torch.uint32",
    "uint64": "torch.uint64", "bool": "torch.bool",
}
# ONNX elem_type -> numpy dtype name (those torch can hold)
ONNX_DTYPES = {1: "float32", 2: "uint8", 3: "int8", 4: "uint16", 5: "int16", 6: "int32", 7: "int64",
               9: "bool", 10: "float16", 11: "float64", 12: "uint32", 13: "uint64", 16: "bfloat16"}
RESERVED = set(keyword.kwlist) | {"self", "torch", "nn", "F", "math", "Path", "Model", "load_model", "super",
                                  "list", "tuple", "int", "float", "len", "range", "min", "max", "sum", "abs",
                                  "zip", "slice", "print", "input", "type", "id", "map", "all", "any",
                                  "onnx_reshape", "onnx_slice", "gather_nd", "scatter_nd", "onnx_one_hot",
                                  "onnx_recurrence", "onnx_unsqueeze", "onnx_pad"} | set(HELPERS)
_FX_NAMES = {"getitem", "to_copy", "val", "tmp", "const_fold_opt"}
_MEANINGLESS = re.compile(r"^(val|_v|tmp|v|t|onnx|node)?_?\d+$|^$", re.IGNORECASE)


class NotConvertible(Exception):
    """A node whose configuration the converter cannot express; the message says why."""


def torch_dtype(dtype) -> str:
    name = np.dtype(dtype).name if not isinstance(dtype, str) else dtype
    if name not in TORCH_DTYPES:
        raise NotConvertible(f"dtype {name} has no torch equivalent")
    return TORCH_DTYPES[name]


def snake(op_type: str) -> str:
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", op_type).lower()


def identifier(name: str, fallback: str = "x") -> str:
    """A readable Python identifier for an ONNX name: '/layer1/conv1/Conv_output_0' -> 'layer1_conv1_conv'."""
    name = name.split(";")[0]  # TFLite joins fused tensor names with ';'
    parts = [p for p in re.split(r"[/:]", name) if p]
    if len(name) > 40 and len(parts) > 2:
        name = "/".join(parts[-2:])
    text = re.sub(r"_output_\d+$", "", name.strip("/"))
    text = re.sub(r"[^0-9a-zA-Z_]+", "_", text).strip("_")
    text = re.sub(r"_+", "_", text)
    if not text or _MEANINGLESS.match(text) or re.sub(r"_\d+$", "", text.lower()) in _FX_NAMES:
        text = fallback
    if text and text[0].isdigit():
        text = f"{fallback}_{text}"
    return text


class Names:
    """Unique identifiers within one namespace; a taken name gets `_1`, `_2`, ..."""

    def __init__(self, taken: set[str] | None = None):
        self.taken = set(RESERVED) | set(taken or ())

    def make(self, hint: str) -> str:
        base = hint if hint not in RESERVED else f"{hint}_"
        name, i = base, 0
        while name in self.taken:
            i += 1
            name = f"{base}_{i}"
        self.taken.add(name)
        return name


def literal(value) -> str:
    """Python source for a number or (nested) list of numbers."""
    if isinstance(value, np.ndarray):
        return literal(value.tolist())
    if isinstance(value, (list, tuple)):
        inner = ", ".join(literal(v) for v in value)
        return f"[{inner}]"
    if isinstance(value, (bool, np.bool_)):
        return "True" if value else "False"
    if isinstance(value, (int, np.integer)):
        return str(int(value))
    f = float(value)
    if np.isnan(f):
        return "math.nan"
    if np.isinf(f):
        return "math.inf" if f > 0 else "-math.inf"
    return repr(f)


@dataclass
class Value:
    kind: str  # "tensor", "const", "ints", "int"
    expr: str | None = None
    const: np.ndarray | None = None
    length: int | None = None  # for "ints"
    items: list[str] | None = None  # for "ints" built from known parts: each an expression or "*" + a list expression


@dataclass
class Module:
    """What the generator produced: source pieces, the state dict, and the I/O names."""

    init: list[str] = field(default_factory=list)
    forward: list[str] = field(default_factory=list)
    state: dict[str, np.ndarray] = field(default_factory=dict)
    helpers: dict[str, str] = field(default_factory=dict)
    uses: set[str] = field(default_factory=set)  # "F", "math"
    args: list[str] = field(default_factory=list)
    returns: list[str] = field(default_factory=list)
    submodules: Counter = field(default_factory=Counter)
    methods: list[tuple[str, list[str], list[str], list[str]]] = field(default_factory=list)  # name, args, body, returns


class NodeView:
    """One ONNX node as a converter sees it: inputs as expressions, outputs to assign."""

    def __init__(self, gen, node, opset: int):
        self.gen = gen
        self.node = node
        self.opset = opset
        self.op_type = node.op_type
        self.inputs = list(node.input)
        self.outputs = list(node.output)
        from onnx import helper

        self.attrs = {}
        self.graphs = {}
        for a in node.attribute:
            if a.type == 5:  # GRAPH: the body of Loop / Scan, the branches of If
                self.graphs[a.name] = a.g
                continue
            if a.type == 10:
                raise NotConvertible(f"attribute '{a.name}' holds a list of subgraphs")
            v = helper.get_attribute_value(a)
            if isinstance(v, bytes):
                v = v.decode()
            elif isinstance(v, list) and v and isinstance(v[0], bytes):
                v = [s.decode() for s in v]
            self.attrs[a.name] = v

    # ---- attributes and inputs
    def attr(self, name: str, default=None):
        return self.attrs.get(name, default)

    def has(self, i: int) -> bool:
        return i < len(self.inputs) and self.inputs[i] != ""

    def value(self, i: int) -> Value:
        return self.gen.values[self.inputs[i]]

    def kind(self, i: int) -> str:
        return self.value(i).kind

    def const(self, i: int) -> np.ndarray | None:
        if not self.has(i):
            return None
        return self.value(i).const

    def const_ints(self, i: int) -> list[int] | None:
        c = self.const(i)
        return None if c is None else [int(v) for v in np.asarray(c).reshape(-1)]

    def shape(self, i: int) -> list | None:
        if not self.has(i):
            return None
        v = self.value(i)
        if v.const is not None:
            return list(v.const.shape)
        return self.gen.shapes.get(self.inputs[i])

    def rank(self, i: int) -> int | None:
        s = self.shape(i)
        return None if s is None else len(s)

    def static_shape(self, i: int) -> list[int] | None:
        s = self.shape(i)
        return s if s is not None and all(isinstance(d, int) for d in s) else None

    def dtype(self, i: int) -> str | None:
        if not self.has(i):
            return None
        v = self.value(i)
        if v.const is not None:
            return v.const.dtype.name
        if v.kind in ("ints", "int"):
            return "int64"
        return self.gen.dtypes.get(self.inputs[i])

    def out_dtype(self, j: int = 0) -> str | None:
        return self.gen.dtypes.get(self.outputs[j])

    def out_rank(self, j: int = 0) -> int | None:
        s = self.gen.shapes.get(self.outputs[j])
        return None if s is None else len(s)

    def t(self, i: int) -> str:
        """Input i as a tensor expression (constants become parameters or buffers)."""
        name = self.inputs[i]
        v = self.gen.values[name]
        if v.kind == "tensor":
            return v.expr
        if v.kind == "const":
            return self.gen.constant_expr(name)
        if v.kind == "ints":
            return f"torch.tensor({v.expr}, dtype=torch.int64)"
        return f"torch.tensor({v.expr}, dtype=torch.int64)"

    def operand(self, i: int, other: int | None = None) -> str:
        """Input i for an elementwise op: a scalar constant becomes a Python literal when that keeps
        the result's dtype and shape (same dtype as `other`, rank 0 or no higher than other's)."""
        v = self.value(i)
        if v.kind == "const" and v.const.size == 1 and other is not None and self.has(other):
            same = self.dtype(other) == v.const.dtype.name and v.const.dtype.name in ("float32", "int64", "float64")
            rank_other = self.rank(other)
            if same and (v.const.ndim == 0 or (rank_other is not None and v.const.ndim <= rank_other)):
                return self.gen.literal(v.const.reshape(-1)[0])
        if v.kind == "int" and other is not None and self.dtype(other) == "int64" and self.kind(other) in ("int",):
            return v.expr
        return self.t(i)

    def ints(self, i: int) -> str:
        """Input i (a 1-D int64 tensor in ONNX) as a Python list expression."""
        v = self.value(i)
        if v.kind == "const":
            return literal([int(x) for x in v.const.reshape(-1)])
        if v.kind == "ints":
            return v.expr
        if v.kind == "int":
            return f"[{v.expr}]"
        return f"{v.expr}.tolist()"

    def scalar(self, i: int) -> str:
        """Input i (a 0-D or 1-element tensor) as a Python number expression."""
        v = self.value(i)
        if v.kind == "const":
            return self.gen.literal(v.const.reshape(-1)[0])
        if v.kind == "int":
            return v.expr
        if v.kind == "ints":
            return f"{v.expr}[0]"
        return f"{v.expr}.item()"

    # ---- outputs
    def used(self, j: int = 0) -> bool:
        return j < len(self.outputs) and self.outputs[j] != "" and self.outputs[j] in self.gen.live_values

    def var(self, j: int = 0) -> str:
        return self.gen.var_for(self.outputs[j], self.op_type)

    def emit(self, expr: str, j: int = 0) -> str:
        """`out_j = expr`; returns the variable. A submodule call names a meaningless output after the submodule."""
        m = re.match(r"self\.(\w+)\(", expr)
        name = self.gen.var_for(self.outputs[j], self.op_type, m.group(1) if m else None)
        self.gen.mod.forward.append(f"{name} = {expr}")
        self.gen.values[self.outputs[j]] = Value("tensor", name)
        return name

    def bind(self, expr: str, j: int = 0) -> None:
        """Output j is an existing variable `expr`: no line is written."""
        self.gen.values[self.outputs[j]] = Value("tensor", expr)

    def alias(self, i: int, j: int = 0) -> None:
        """Output j is input i (Identity and friends): no line is written."""
        self.gen.values[self.outputs[j]] = self.gen.values[self.inputs[i]]

    def emit_many(self, expr: str, count: int | None = None) -> list[str]:
        """`a, b, _ = expr` for a call returning a tuple; unused outputs become `_`."""
        count = count or len(self.outputs)
        names = []
        for j in range(count):
            if j < len(self.outputs) and self.used(j):
                names.append(self.var(j))
            else:
                names.append("_")
        if all(n == "_" for n in names):
            return names
        self.gen.mod.forward.append(f"{', '.join(names)} = {expr}")
        for j, n in enumerate(names):
            if n != "_":
                self.gen.values[self.outputs[j]] = Value("tensor", n)
        return names

    def emit_ints(self, expr: str, length: int | None = None, j: int = 0, items: list[str] | None = None) -> str:
        name = self.var(j)
        self.gen.mod.forward.append(f"{name} = {expr}")
        self.gen.values[self.outputs[j]] = Value("ints", name, length=length, items=items)
        return name

    def emit_int(self, expr: str, j: int = 0) -> str:
        name = self.var(j)
        self.gen.mod.forward.append(f"{name} = {expr}")
        self.gen.values[self.outputs[j]] = Value("int", name)
        return name

    def line(self, text: str) -> None:
        self.gen.mod.forward.append(text)

    def tmp(self, hint: str) -> str:
        return self.gen.local_names.make(hint)

    # ---- module state
    def submodule(self, hint: str, ctor: str, tensors: dict[str, np.ndarray]) -> str:
        """`self.<name> = <ctor>` in __init__, with its state under `<name>.<key>`; returns `self.<name>`."""
        name = self.gen.attr_names.make(hint)
        self.gen.mod.init.append(f"self.{name} = {ctor}")
        for k, arr in tensors.items():
            self.gen.mod.state[f"{name}.{k}"] = np.ascontiguousarray(arr)
        self.gen.mod.submodules[ctor.split("(")[0]] += 1
        return f"self.{name}"

    def module_hint(self, i: int | None = None) -> str:
        """A submodule name from a weight's name ('layer1.conv1.weight' -> 'layer1_conv1') or the node."""
        if i is not None and self.has(i) and len(self.gen.consumers.get(self.inputs[i], [])) == 1:
            w = re.sub(r"[./](weight|bias|W|kernel|w|filters)$", "", self.inputs[i])
            ident = identifier(w, "")
            if ident:
                return ident
        if self.node.name:
            ident = identifier(self.node.name, "")
            if ident and not ident.lower().startswith("node"):
                return ident
        out = self.outputs[0] if self.outputs else ""
        users = self.consumers(0) if out else []
        if len(users) == 1 and users[0].op_type == "Add" and self.op_type == "MatMul":
            out = users[0].output[0]
        out = re.sub(r"_\d+$", "", out) if re.search(r"[A-Za-z]_\d+$", out) else out
        return identifier(out, snake(self.op_type))

    def use(self, what: str) -> None:
        self.gen.mod.uses.add(what)

    def helper(self, name: str) -> str:
        from modelport.emitters.pytorch_code.helpers import HELPERS

        for dep in HELPERS[name][1]:
            self.helper(dep)
        self.gen.mod.helpers[name] = HELPERS[name][0]
        return name

    def consumers(self, j: int = 0) -> list:
        return self.gen.consumers.get(self.outputs[j], [])

    def absorb(self, node) -> None:
        """Mark a following `node` as handled by this converter (it then emits that node's output)."""
        self.gen.absorbed.add(id(node))

    def emit_as(self, onnx_name: str, expr: str, hint_op: str | None = None) -> str:
        """`<var of onnx_name> = expr` for a value of an absorbed node."""
        name = self.gen.var_for(onnx_name, hint_op or self.op_type)
        self.gen.mod.forward.append(f"{name} = {expr}")
        self.gen.values[onnx_name] = Value("tensor", name)
        return name

    def fail(self, reason: str):
        raise NotConvertible(reason)

    def axis(self, a: int, rank: int | None) -> int:
        if a >= 0:
            return a
        if rank is None:
            self.fail("a negative axis on a value of unknown rank")
        return a + rank
