"""SavedModel runner: a TensorFlow SavedModel run through its serving signature, as TF Serving
runs it (inputs and outputs by the signature's names)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from modelport.deps import require
from modelport.errors import BadInputError, one_line
from modelport.ir import TensorSpec
from modelport.runtimes.base import Runner

SIGNATURE = "serving_default"


def _tf():

    return require("tensorflow", purpose="running a SavedModel")


def _spec_from_tf(name: str, t) -> TensorSpec:
    """A signature tensor's spec; an unknown rank is an empty shape not marked `scalar`."""
    if t.shape.rank is None:
        return TensorSpec(name=name, dtype=t.dtype.name, shape=[])
    shape = [int(d) if d is not None else f"{name}_dim{i}" for i, d in enumerate(t.shape.as_list())]
    if shape and isinstance(shape[0], str):
        shape[0] = "batch"
    return TensorSpec(name=name, dtype=t.dtype.name, shape=shape, scalar=not shape)


def _signature(path: Path, signature: str = SIGNATURE):
    tf = _tf()
    try:
        loaded = tf.saved_model.load(str(path))
    except Exception as e:  # TF raises many kinds for a bad folder
        raise BadInputError(f"not a loadable SavedModel: {one_line(e)}", path=path) from None
    if signature not in loaded.signatures:
        raise BadInputError(f"the SavedModel has no '{signature}' signature (has {list(loaded.signatures)})", path=path)
    return loaded, loaded.signatures[signature]


def signature_specs(path: Path, signature: str = SIGNATURE) -> tuple[list[TensorSpec], list[TensorSpec]]:
    """The contract of a SavedModel's serving signature (inputs sorted by name, as TF Serving does)."""
    _, fn = _signature(path, signature)
    _, kwargs = fn.structured_input_signature
    inputs = [_spec_from_tf(n, kwargs[n]) for n in sorted(kwargs)]
    outputs = [_spec_from_tf(n, t) for n, t in sorted(fn.structured_outputs.items())]
    return inputs, outputs


def run_signature(path: Path, feeds: dict[str, np.ndarray], signature: str = SIGNATURE) -> dict[str, np.ndarray]:
    return SavedModelRunner(path, signature=signature).run(feeds)


class SavedModelRunner(Runner):
    name = "savedmodel"
    distribution = "tensorflow"
    imports = ("tensorflow", "keras")  # a SavedModel's users have TensorFlow (which depends on keras 3), not tf_keras

    def __init__(self, model, *, signature: str = SIGNATURE):
        self.path = Path(model)
        self._loaded, self._fn = _signature(self.path, signature)  # the loaded object keeps the function's variables alive

    def input_specs(self) -> list[TensorSpec]:
        _, kwargs = self._fn.structured_input_signature
        return [_spec_from_tf(n, kwargs[n]) for n in sorted(kwargs)]

    def output_specs(self) -> list[TensorSpec]:
        return [_spec_from_tf(n, t) for n, t in sorted(self._fn.structured_outputs.items())]

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        tf = _tf()
        outs = self._fn(**{k: tf.constant(v) for k, v in feeds.items()})
        return {k: v.numpy() for k, v in outs.items()}
