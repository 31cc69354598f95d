"""LiteRT (TFLite) interpreter runner.

Inputs are matched by name (TFLite names such as 'serving_default_x:0' are matched on their
stripped form) and otherwise by position; dynamic dims are resized before allocation.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from modelport.errors import BadInputError


def load_interpreter(path: str | Path, threads: int | None = None):
    from modelport.deps import require

    try:
        Interpreter = require("ai_edge_litert.interpreter", purpose="running TFLite models").Interpreter
    except Exception:
        Interpreter = require("tensorflow", purpose="running TFLite models").lite.Interpreter
    try:
        return Interpreter(model_path=str(path), num_threads=threads)
    except ValueError as e:
        raise BadInputError(f"not a valid TFLite model: {str(e).splitlines()[0]}", path=path) from None


def tflite_name(name: str) -> str:
    """'serving_default_input_1:0' -> 'input_1'; 'x:0' -> 'x'."""
    n = re.sub(r":\d+$", "", name)
    return re.sub(r"^serving_default_", "", n)


class TFLiteRunner:
    name = "tflite"

    def __init__(self, model, *, threads: int | None = None, input_names: list[str] | None = None,
                 output_names: list[str] | None = None, input_transpose: dict[str, list[int]] | None = None,
                 output_transpose: dict[str, list[int]] | None = None):
        self.path = Path(model)
        self.interpreter = load_interpreter(self.path, threads)
        self.inputs = self.interpreter.get_input_details()
        self.outputs = self.interpreter.get_output_details()
        self.input_names = input_names  # our names, in the interpreter's input order
        self.output_names = output_names
        self.input_transpose = input_transpose or {}
        self.output_transpose = output_transpose or {}

    def _match_inputs(self, feeds: dict[str, np.ndarray]) -> list[tuple[str, np.ndarray]]:
        """(our name, array) pairs in the interpreter's input order."""
        if self.input_names:
            return [(n, feeds[n]) for n in self.input_names]
        by_name = {tflite_name(d["name"]): i for i, d in enumerate(self.inputs)}
        if set(feeds) <= set(by_name) and len(feeds) == len(self.inputs):
            return sorted(feeds.items(), key=lambda kv: by_name[kv[0]])
        if len(feeds) != len(self.inputs):
            raise BadInputError(f"{len(feeds)} inputs given, the TFLite model takes {len(self.inputs)}", path=self.path)
        return list(feeds.items())

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        pairs = [(n, np.transpose(a, self.input_transpose[n]) if n in self.input_transpose else a)
                 for n, a in self._match_inputs(feeds)]
        it = self.interpreter
        for (_, a), d in zip(pairs, self.inputs, strict=True):
            if tuple(d["shape"]) != a.shape:
                it.resize_tensor_input(d["index"], list(a.shape), strict=False)
        it.allocate_tensors()
        for (_, a), d in zip(pairs, it.get_input_details(), strict=True):
            it.set_tensor(d["index"], np.ascontiguousarray(a.astype(d["dtype"], copy=False)))
        it.invoke()
        outs = {}
        details = it.get_output_details()
        names_out = self.output_names or [tflite_name(d["name"]) for d in details]
        if len(set(names_out)) < len(names_out):  # 'StatefulPartitionedCall:0', ':1' strip to one name
            names_out = [d["name"] for d in details]
        for name, d in zip(names_out, details, strict=True):
            v = it.get_tensor(d["index"])
            if d.get("quantization") and d["dtype"] in (np.int8, np.uint8) and d["quantization"][0]:
                scale, zero = d["quantization"]
                v = (v.astype(np.float32) - zero) * scale
            if name in self.output_transpose:
                v = np.transpose(v, self.output_transpose[name])
            outs[name] = v
        return outs
