"""Graph passes over a ModelProto without a second copy of its weights.

With the upb protobuf runtime (protobuf 4 and later) all of a ModelProto's bytes live in one arena
that is freed only with the whole message: a weight removed from the graph or replaced stays
allocated as long as the model lives, and `del graph.initializer[:]` followed by `extend(kept)`
copies every kept weight. A pass that rewrites weights in a proto therefore grows it by what it
rewrote, and an onnx-ir round trip (`to_proto`) copies every weight once more.

Here the large initializers stay out of the proto while graph passes run. `detach` replaces each
large in-memory initializer of an onnx-ir model by a placeholder external-data reference before it
is serialised (the tensor itself stays where it was, in the proto the model was read from);
initializers that already live in a file (an export written with external data) stay references to
it. Passes read values with `array(tensor)`; new weights they create are ordinary in-memory
initializers. `attach` then fills in the bytes of the initializers the graph still uses, one
tensor at a time, so the finished proto holds each live weight once and nothing else.
"""

from __future__ import annotations

from pathlib import Path

from modelport.run.progress import tick

PLACEHOLDER = "modelport-detached:"  # the external-data location of a detached tensor (never a file)
DETACH_BYTES = 1024  # initializers at least this large are detached (onnx's own external-data threshold)


class WeightStore:
    """The weights of a proto whose large initializers are references: placeholders for tensors
    held by the source model (`detach`), or external data in `base_dir`."""

    def __init__(self, base_dir: str | Path | None = None):
        self.base_dir = Path(base_dir) if base_dir is not None else None
        self.detached: dict[str, object] = {}  # placeholder location -> onnx_ir TensorProtoTensor

    def detach(self, model, *, min_bytes: int = DETACH_BYTES) -> int:
        """Replace the large in-memory initializers of onnx-ir `model`'s main graph by placeholders
        (those created by a pass and those already external stay); returns how many."""
        import onnx_ir
        from onnx_ir.serde import TensorProtoTensor

        count = 0
        for value in model.graph.initializers.values():
            tensor = value.const_value
            if not isinstance(tensor, TensorProtoTensor) or tensor.nbytes < min_bytes:
                continue
            location = f"{PLACEHOLDER}{len(self.detached)}"
            self.detached[location] = tensor
            value.const_value = onnx_ir.ExternalTensor(location, 0, tensor.nbytes, tensor.dtype,
                                                       shape=onnx_ir.Shape(tensor.shape.numpy()), name=tensor.name)
            count += 1
        return count

    def _source(self, tensor):
        """(the TensorProto holding `tensor`'s data, base dir to read it from)."""
        import onnx

        if tensor.data_location != onnx.TensorProto.EXTERNAL:
            return tensor, None
        location = next((e.value for e in tensor.external_data if e.key == "location"), "")
        if location.startswith(PLACEHOLDER):
            return self.detached[location].raw, None
        if self.base_dir is None:
            raise ValueError(f"initializer {tensor.name!r} refers to external data but no folder was given")
        return tensor, self.base_dir

    def array(self, tensor):
        """The value of a TensorProto, wherever its data is."""
        import onnx.numpy_helper as nh

        source, base_dir = self._source(tensor)
        return nh.to_array(source, str(base_dir)) if base_dir is not None else nh.to_array(source)

    def materialize(self, tensor):
        """A TensorProto with `tensor`'s data in memory (itself when it has it already)."""
        import onnx

        source, base_dir = self._source(tensor)
        if source is tensor and base_dir is None:
            return tensor
        out = onnx.TensorProto()
        self._fill(out, tensor)
        return out

    def attach(self, model) -> None:
        """Fill in, in place, the data of every initializer of `model`'s main graph that is a
        reference into this store (once each, tensor by tensor)."""
        import onnx


        total = len(model.graph.initializer)
        for index, tensor in enumerate(model.graph.initializer):
            if tensor.data_location == onnx.TensorProto.EXTERNAL:
                tick("reading", tensor.name, index, total)
                self._fill(tensor, tensor)

    def _fill(self, out, tensor) -> None:
        import onnx.external_data_helper as edh

        source, base_dir = self._source(tensor)
        if base_dir is None:
            name = tensor.name
            out.CopyFrom(source)
            out.name = name
            return
        if out is not tensor:
            out.CopyFrom(tensor)
        edh.load_external_data_for_tensor(out, str(base_dir))
        out.ClearField("data_location")
        del out.external_data[:]


def drop_unused_initializers(graph, used: set[str]) -> None:
    """Remove, in place, the initializers of `graph` not named in `used`. (Deleting by index: rebuilding
    the list with `del [:]` + `extend` would copy every weight kept, see the module docstring.)"""
    for index in reversed([i for i, t in enumerate(graph.initializer) if t.name not in used]):
        del graph.initializer[index]


MATCH_STATE = ("_graph", "_match", "_current_node", "_tracer")


def forget_onnxscript_matches() -> int:
    """Let go of the graphs onnxscript's pattern matchers still hold; returns how many matchers.

    onnxscript's rewrite rules are module-level objects, and each rule's matcher keeps the graph of
    its last match (`_graph`, `_match`) until its next one: after `torch.onnx.export` that is the
    export's graph, whose initializers wrap the torch model's parameters, and after a fusion pass the
    graph it rewrote, with the weights of the model it was read from. Without this the transformers
    model (or the unfused export) stays in memory for the rest of the process (measured: the 311 MB
    embedding of a 195 MB bf16 checkpoint outlived the model it came from). Each match sets these
    attributes afresh before reading them."""
    import gc
    import sys

    module = sys.modules.get("onnxscript.rewriter._matcher")
    matcher = getattr(module, "PatternMatcher", None)
    if matcher is None:
        return 0
    count = 0
    for obj in gc.get_objects():
        # type(), not isinstance(): isinstance falls back to `obj.__class__`, which a dead weak proxy
        # raises from and a deprecated alias (torch.distributed.reduce_op) warns from
        if issubclass(type(obj), matcher):
            for name in MATCH_STATE:
                if name in obj.__dict__:
                    obj.__dict__[name] = None
            count += 1
    return count
