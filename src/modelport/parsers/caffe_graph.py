"""The ONNX graph a Caffe net is translated into, and one Caffe layer as a translation sees it."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from modelport.errors import BadInputError
from modelport.parsers.caffe_files import Blob


class FixBatch(Exception):
    """A layer works across the batch axis: the batch dim must take its declared size."""


@dataclass
class Graph:
    """The ONNX graph as it is built: nodes, initializers, each tensor's shape, and which tensor
    holds each Caffe blob now (in-place layers give a blob a new tensor)."""

    dynamic: bool
    nodes: list = field(default_factory=list)
    initializers: list = field(default_factory=list)
    shapes: dict = field(default_factory=dict)
    current: dict = field(default_factory=dict)
    used: set = field(default_factory=set)

    def fresh(self, base: str) -> str:
        name, i = base, 0
        while name in self.used:
            i += 1
            name = f"{base}_{i}"
        self.used.add(name)
        return name

    def const(self, layer: str, what: str, value) -> str:
        from onnx import numpy_helper

        name = self.fresh(f"{layer}/{what}")
        self.initializers.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def node(self, op: str, inputs: list[str], shape: list, layer: str, **attrs) -> str:
        from onnx import helper

        out = self.fresh(f"{layer}/{op}")
        self.nodes.append(helper.make_node(op, inputs, [out], name=self.fresh(f"{layer}#{op}"), **attrs))
        self.shapes[out] = list(shape)
        return out

    def across_batch(self, axis: int) -> None:
        if axis == 0 and self.dynamic:
            raise FixBatch


@dataclass
class Layer:
    """One Caffe layer as a converter sees it: its parameters, its inputs' tensors and shapes, and
    its blobs (checked against what its parameters need with `blobs`)."""

    proto: object
    inputs: list[str]
    shapes: list[list]
    weights: list[Blob] | None

    @property
    def name(self) -> str:
        return self.proto.name

    @property
    def type(self) -> str:
        return self.proto.type

    def error(self, reason: str) -> BadInputError:
        return BadInputError(f"layer '{self.name}' of type {self.type}: {reason}")

    def blobs(self, *needed: tuple[str, list[int]]) -> list[np.ndarray]:
        """The layer's blobs, reshaped to the shapes its parameters need (an element count must
        match; Caffe's legacy 4-D blobs hold 1-D and 2-D parameters)."""
        have = self.weights or []
        if len(have) != len(needed):
            names = ", ".join(f"{what} {shape}" for what, shape in needed)
            raise self.error(f"{len(have)} blobs in the weights, its parameters need {len(needed)} ({names})")
        out = []
        for blob, (what, shape) in zip(have, needed, strict=True):
            if blob.values.size != math.prod(shape):
                raise self.error(f"blob {blob.index} ({what}) has the shape {blob.shape}, its parameters need {shape}")
            out.append(blob.values.reshape(shape))
        return out

    def axis(self, axis: int, rank: int | None = None) -> int:
        rank = len(self.shapes[0]) if rank is None else rank
        if not -rank <= axis < rank:
            raise self.error(f"axis {axis} is out of range for a {rank}-D input {self.shapes[0]}")
        return axis % rank

    def static(self, dims: list, what: str) -> list[int]:
        if not all(isinstance(d, int) for d in dims):
            raise self.error(f"{what} needs fixed sizes, the input is {self.shapes[0]}")
        return list(dims)
