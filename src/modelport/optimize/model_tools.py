"""Small helpers the passes share: sizes and node counts, onnx-ir round trips, temporary files.

Everything here is careful about models over the protobuf limit: such a model cannot be
serialised in one piece, so sizes are summed from tensors and temporary copies are written with
external data.
"""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Iterator
from pathlib import Path

from modelport.ir import IRModel
from modelport.onnxfile.onnx_io import save_onnx
from modelport.onnxfile.proto_pieces import serialized_size
from modelport.onnxfile.tensor_sizes import is_large, stored_bytes, tensor_bytes


def model_size(model) -> int:
    """Bytes the model takes on disk (graph + tensors), without serialising it; the weights of a
    model whose initializers refer to files count at their length there."""

    if is_large(model):
        return tensor_bytes(model)
    return serialized_size(model) + stored_bytes(model)


def node_count(model) -> int:
    return len(model.graph.node)


def to_onnx_ir(model):
    """An onnx-ir Model holding a copy of the proto's graph (the proto is left untouched)."""
    import onnx_ir as ir

    return ir.serde.deserialize_model(model)


def from_onnx_ir(model):
    import onnx_ir as ir

    return ir.serde.serialize_model(model)


def with_model(ir: IRModel, model) -> IRModel:
    """A new IRModel around `model`, carrying over the contract and references of `ir`."""
    return ir.clone(model=model)


def name_nodes(model) -> None:
    """Give every unnamed node a unique name, in place (block lists and reports refer to names)."""
    seen = {n.name for n in model.graph.node if n.name}
    for i, n in enumerate(model.graph.node):
        if not n.name:
            name = f"{n.op_type}_{i}"
            while name in seen:
                name += "_"
            n.name = name
            seen.add(name)


def drop_value_info(model) -> None:
    """Remove intermediate value_info in place: exporters leave stale shapes that break tools."""
    del model.graph.value_info[:]


@contextlib.contextmanager
def temp_model_file(model, name: str = "model.onnx", *, base_dir: Path | None = None) -> Iterator[Path]:
    """The model written to a temporary folder (external data when large, or when its weights are
    read from files in `base_dir`); removed afterwards."""

    with tempfile.TemporaryDirectory(prefix="modelport-opt-") as d:
        path = Path(d) / name
        save_onnx(model, path, external=is_large(model) or base_dir is not None, base_dir=base_dir)
        yield path


def load_model_file(path: Path):
    """Load a model a tool wrote into one of our temporary folders (external data read in)."""
    import onnx

    return onnx.load(str(path), load_external_data=True)


def opset_of(model) -> int | None:
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None)


def _reads(node) -> set[str]:
    """The values a node reads: its inputs and, for control flow, what its subgraphs take from outside."""
    from onnx import AttributeProto

    names = {n for n in node.input if n}
    graphs = [a.g for a in node.attribute if a.type == AttributeProto.GRAPH]
    graphs += [g for a in node.attribute if a.type == AttributeProto.GRAPHS for g in a.graphs]
    for g in graphs:
        inner = {i.name for i in g.input} | {t.name for t in g.initializer} | {o for n in g.node for o in n.output}
        for n in g.node:
            names |= _reads(n) - inner
    return names


def sort_nodes(graph) -> bool:
    """Put the graph's nodes in topological order, in place, keeping the given order where it already holds.

    Returns False (and leaves the graph as it was) when no such order exists: a cycle, or a node
    reading a value that nothing produces.
    """
    import heapq

    nodes = list(graph.node)
    producer = {o: i for i, n in enumerate(nodes) for o in n.output if o}
    deps = [{producer[v] for v in _reads(n) if v in producer} - {i} for i, n in enumerate(nodes)]
    users: dict[int, list[int]] = {}
    for i, d in enumerate(deps):
        for j in d:
            users.setdefault(j, []).append(i)
    waiting = [len(d) for d in deps]
    ready = [i for i, w in enumerate(waiting) if w == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        i = heapq.heappop(ready)
        order.append(i)
        for u in users.get(i, []):
            waiting[u] -= 1
            if waiting[u] == 0:
                heapq.heappush(ready, u)
    if len(order) != len(nodes):
        return False
    if order != list(range(len(nodes))):
        del graph.node[:]
        graph.node.extend(nodes[i] for i in order)
    return True
