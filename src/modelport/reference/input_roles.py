"""What an input is for, read from the ONNX graph that consumes it: which sample values are valid.

Random integers are valid for few integer inputs: token ids index an embedding table, a mask takes
0/1, a size or an index must stay what it was. A name says so only when the exporter kept it (a
`.pt2` exported with positional arguments names its inputs `args_0`, `args_1`). So each input is
followed through the ops that only move its values (Reshape, Unsqueeze, Transpose, a Cast to an
integer type, …) to the ops that read them:

- `ids`: the indices of a Gather whose data is a constant table (an embedding), or of a OneHot of
  constant depth: valid values are [0, rows of the table);
- `mask`: a Cast to bool, Not/And/Or/Xor, the condition of a Where, a comparison with 0 or 1, or,
  cast to a float, `1 - mask` or `mask * c` with |c| >= 1000 (the additive attention bias): sampled
  as ones, as the Hugging Face parsers declare `attention_mask` (`value_range` [1, 2]): no row of
  an attention is fully masked, where frameworks legitimately disagree on outputs nobody reads;
- `control`: a shape, size, scale, axis, count or index operand (Reshape's shape, Resize's scales,
  Range, Expand, Slice, TopK's k, a Gather's indices into a computed tensor, …): structured sample
  sets keep its first set's values (a large constant as a Resize scale asks for a huge image).

Several readers of one input combine as mask, then ids, then control (ones are valid ids of any
table of two rows or more), except ids that a mask is made from by comparing them with a padding
id 0 or 1 (`input_ids != pad`): those take [pad + 1, rows), real tokens only. Where no reader
says, the input has no role and sampling stays as it was (integers 0..9). `onnx` is imported
inside the function that reads tensors.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from modelport.reference.samples import MASK as MASK_NAME

# ops that pass their first input's values on unchanged (moved, sliced, repeated, relabelled)
MOVES = {"Reshape", "Unsqueeze", "Squeeze", "Flatten", "Identity", "Transpose", "Expand", "Tile", "Slice",
         "Concat", "Split", "Gather", "CastLike", "Cast"}
# (op, input slot) pairs whose values are a shape, size, scale, axis, count or index
CONTROL_SLOTS = {
    "Reshape": {1}, "Expand": {1}, "Tile": {1}, "ConstantOfShape": {0}, "Range": {0, 1, 2}, "Slice": {1, 2, 3, 4},
    "Resize": {1, 2, 3}, "Upsample": {1}, "Pad": {1, 3}, "TopK": {1}, "OneHot": {1}, "Squeeze": {1}, "Unsqueeze": {1},
    "Split": {1}, "CumSum": {1}, "Trilu": {1}, "Loop": {0}, "GatherElements": {1}, "GatherND": {1},
    "ScatterND": {1}, "ScatterElements": {1}, "NonMaxSuppression": {2, 3, 4}, "Gather": {1},
    "ReduceSum": {1}, "ReduceMean": {1}, "ReduceMax": {1}, "ReduceMin": {1}, "ReduceProd": {1},
}
COMPARISONS = {"Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual"}
LOGICAL = {"Not", "And", "Or", "Xor"}
BOOL = 9  # onnx.TensorProto.BOOL
FLOATS = {1, 10, 11, 16}  # FLOAT, FLOAT16, DOUBLE, BFLOAT16
MASK_BIAS = 1e3  # |c| of `mask * c` from which c is an attention bias (-10000, finfo.min)
MAX_HOPS = 12  # ops followed from an input before giving up (a role is read near the input)
MAX_CONSTANT = 64  # elements of a constant read to compare it with 0/1 or a bias
SCALAR_ATTRIBUTES = ("value_float", "value_int", "value_floats", "value_ints")


@dataclass(frozen=True)
class Role:
    """An input's role and the value range its samples take (`[low, high)`; None: keep the values)."""

    kind: str  # ids | mask | control
    value_range: tuple[int, int] | None = None
    padding: int | None = field(default=None, compare=False)  # the 0 or 1 a comparison tests the input against


MASK = Role("mask", (1, 2))


class _Graph:
    """The consumers of every tensor (subgraphs included) and the constants of a model."""

    def __init__(self, model):
        self.consumers: dict[str, list] = {}
        self.tables: dict[str, object] = {}  # constant name -> TensorProto (initializers, Constant nodes)
        self.scalars: dict[str, np.ndarray] = {}  # Constant nodes given as value_float(s)/value_int(s)
        self.casts: dict[str, str] = {}  # output of a Cast/Identity of a constant -> that constant
        graphs = [model.graph]
        while graphs:
            g = graphs.pop()
            self.tables.update({t.name: t for t in g.initializer})
            for node in g.node:
                for slot, name in enumerate(node.input):
                    if name:
                        self.consumers.setdefault(name, []).append((node, slot))
                for a in node.attribute:
                    if node.op_type == "Constant" and a.name == "value":
                        self.tables[node.output[0]] = a.t
                    elif node.op_type == "Constant" and a.name in SCALAR_ATTRIBUTES:
                        self.scalars[node.output[0]] = np.asarray(
                            [a.f] if a.name == "value_float" else [a.i] if a.name == "value_int" else [*a.floats, *a.ints])
                    graphs.extend([a.g] if a.type == a.GRAPH else list(a.graphs))
            for node in g.node:  # a table stored in another precision and cast before use
                if node.op_type in ("Cast", "Identity", "DequantizeLinear") and node.input and node.input[0] in self.tables:
                    self.casts[node.output[0]] = node.input[0]

    def table(self, name: str):
        """The TensorProto of a constant, seen through a Cast or Identity; else None."""
        return self.tables.get(self.casts.get(name, name))

    def values(self, name: str) -> np.ndarray | None:
        """A small constant's values (flat), else None."""
        if name in self.scalars:
            return self.scalars[name]
        t = self.table(name)
        if t is None or t.data_location == t.EXTERNAL or _count(t.dims) > MAX_CONSTANT:
            return None
        from onnx import numpy_helper

        return numpy_helper.to_array(t).ravel()


def _count(dims) -> int:
    n = 1
    for d in dims:
        n *= d
    return n


def _attr(node, name: str, default):
    for a in node.attribute:
        if a.name == name:
            return a.i if a.type == a.INT else default
    return default


def _other(node, slot: int) -> str | None:
    others = [n for i, n in enumerate(node.input[:2]) if i != slot and n]
    return others[0] if others else None


def _reader(graph: _Graph, node, slot: int, as_float: bool) -> Role | None:
    """The role a value arriving at `node`'s input `slot` has there (None: no role; `as_float`:
    the input was cast to a float on the way)."""
    op = node.op_type
    if op == "Gather" and slot == 1:
        table = graph.table(node.input[0])
        if table is not None and table.dims:
            rows = int(table.dims[_attr(node, "axis", 0) % len(table.dims)])
            return Role("ids", (0, rows)) if rows > 0 else Role("control")
    if op == "OneHot" and slot == 0:
        depth = graph.values(node.input[1])
        if depth is not None and depth.size == 1 and int(depth[0]) > 0:
            return Role("ids", (0, int(depth[0])))
    if (op == "Cast" and _attr(node, "to", 0) == BOOL) or op in LOGICAL or (op == "Where" and slot == 0):
        return MASK
    if op in COMPARISONS or (op == "Sub" and slot == 1 and as_float) or (op == "Mul" and as_float):
        other = _other(node, slot)
        values = graph.values(other) if other else None
        if values is not None and values.size:
            if op in COMPARISONS and set(values.tolist()) <= {0, 1}:
                return Role("mask", MASK.value_range, padding=int(values.max()))
            if op == "Sub" and (values == 1).all():
                return MASK
            if op == "Mul" and (abs(values) >= MASK_BIAS).all():
                return MASK
    if slot in CONTROL_SLOTS.get(op, ()):
        return Role("control")
    return None


def _role_of(graph: _Graph, name: str) -> Role | None:
    """The combined role of what reads input `name` (module docstring)."""
    found: list[Role] = []
    seen: set[str] = set()
    frontier = [(name, False)]
    for _ in range(MAX_HOPS):
        step = []
        for tensor, as_float in frontier:
            for node, slot in graph.consumers.get(tensor, []):
                role = _reader(graph, node, slot, as_float)
                if role is not None:
                    found.append(role)
                    continue
                moves = node.op_type in MOVES and (slot == 0 or node.op_type == "Concat")
                cast = node.op_type == "Cast" and _attr(node, "to", 0) in FLOATS
                for out in node.output if moves else ():
                    if out and out not in seen:
                        seen.add(out)
                        step.append((out, as_float or cast))
        if not step:
            break
        frontier = step
    masks = [r for r in found if r.kind == "mask"]
    rows = min((r.value_range[1] for r in found if r.kind == "ids"), default=None)
    if masks and rows is not None and all(r.padding is not None for r in masks):
        low = max(r.padding for r in masks) + 1  # ids whose padding id a mask is made from: none padded
        if low < rows:
            return Role("ids", (low, rows))
    if masks and (rows is None or rows >= 2):
        return MASK
    if rows is not None:
        return Role("ids", (0, rows))
    return Role("control") if found else None


def input_roles(model) -> dict[str, Role]:
    """{input name: its Role} for each graph input of an ONNX ModelProto that a reader gives one."""
    graph = _Graph(model)
    inits = {t.name for t in model.graph.initializer}
    roles = {}
    for value in model.graph.input:
        if value.name not in inits:
            role = _role_of(graph, value.name)
            if role is not None:
                roles[value.name] = role
    return roles


def apply_roles(specs, model, given=None) -> dict[str, Role]:
    """Give `specs` (TensorSpecs) the value ranges `model`'s graph shows: an integer input with no
    declared range that is not pinned (`given`) gets its ids' or mask's range. Returns the roles
    found ({name: Role}), which `sample_sets.sample_sets` reads through `keep` (`controls`)."""
    roles = input_roles(model)
    for spec in specs:
        role = roles.get(spec.name)
        if role and role.value_range and spec.value_range is None and spec.name not in (given or {}) and _integer(spec):
            spec.value_range = list(role.value_range)
    return roles


def controls(roles: dict[str, Role], specs) -> set[str]:
    """The inputs whose values structured sample sets keep: every input with a role but an integer
    input's ids or mask, whose declared range the sets already follow."""
    integer = {s.name for s in specs if _integer(s)}
    return {name for name, role in roles.items() if role.kind == "control" or name not in integer}


def guessed_inputs(specs, given=None) -> list[str]:
    """The inputs whose sample values are a guess: integer inputs (but 8-bit data) and bool ones
    with no declared range (`apply_roles` declares what the graph shows), no mask name
    (`samples.MASK`) and no pinned value. A hop that fails on random data may fail on values they
    never take: the error names them with `--value`/`--data`."""

    return [s.name for s in specs if (s.dtype == "bool" or (_integer(s) and s.dtype not in ("uint8", "int8")))
            and not s.value_range and s.name not in (given or {}) and MASK_NAME not in s.name.lower()]


def _integer(spec) -> bool:
    return spec.dtype.startswith(("int", "uint"))
