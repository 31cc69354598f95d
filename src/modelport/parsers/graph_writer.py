"""An ONNX graph written as it is built: its nodes, and its initializers appended one by one to a
data file, so that no weight is kept once written (the decoder writer, parsers/hf_decoder_graph.py,
builds its graphs this way).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from modelport.onnxfile.external_data_files import DataFile


@dataclass
class GraphWriter:
    """Nodes, initializers and a data file written as the graph is built (weights never kept)."""

    data: Path
    reuse: dict = field(default_factory=dict)  # name -> TensorProto already in a data file of this folder
    nodes: list = field(default_factory=list)
    initializers: list = field(default_factory=list)
    _file: object = None

    def close(self):
        if self._file is not None:
            self._file.close()
            if self._file.offset == 0:  # every tensor was small or shared: no data file
                self.data.unlink()

    def tensor(self, name: str, value) -> str:
        """An initializer: small ones inline, the rest appended to the data file (created when first
        needed). `value` is an array or a function giving it, called only when the tensor is not
        one of `reuse` (a tensor another form of the graph already wrote)."""
        if name in self.reuse:
            self.initializers.append(self.reuse[name])
            return name
        if self._file is None:

            self._file = DataFile(self.data)
        self.initializers.append(self._file.add(name, np.asarray(value() if callable(value) else value)))
        return name

    def node(self, op: str, inputs: list[str], outputs: list[str] | int = 1, *, name: str, domain: str = "", **attrs):
        """Add a node; returns its output name (or names when `outputs` is a list or a count > 1)."""
        import onnx

        if isinstance(outputs, int):
            outs = [f"{name}/out{i}" if outputs > 1 else f"{name}/out" for i in range(outputs)]
        else:
            outs = list(outputs)
        self.nodes.append(onnx.helper.make_node(op, inputs, outs, name=name, domain=domain, **attrs))
        return outs[0] if len(outs) == 1 else outs
