"""The runner protocol: what every runtime's runner does, and the optional abilities it declares.

Every runner runs a model (`run(feeds) -> outputs`) and describes what to feed it (`input_specs`);
the rest has a default here that a runner replaces where its runtime can do more. What a caller
may rely on beyond that is declared in the class's `capabilities`, read before anything is
loaded, never probed with `getattr`:

    localize      `tensor_order()` and `tensor_values(feeds, names)` give the float tensors inside the
                  graph, in execution order, under the names the ONNX graph gave them (onnxruntime,
                  OpenVINO): `validate --localize` pairs two such runners tensor by tensor
    plain_load    the runtime may compile a file at another precision than the one it was validated
                  at (OpenVINO picks bf16 on CPUs that have it): `describe()` says both, `plain_options()`
                  opens the file as a plain load does, `plain_load_warning()` words the difference
    in_process    artifacts are validated in this process, where the hardware is (TensorRT on a GPU),
                  not in a clean child process
    generates     the runtime generates text by its own search (onnxruntime-genai):
                  `generate(prompts, new_tokens, vocab_size)`, which a decoder's validation compares
                  with greedy generation by onnxruntime on the same model file

and `cannot_run()` says why this machine cannot run the runtime's models at all (Core ML off
macOS), so a caller checks their inputs and outputs without running them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from modelport.ir import TensorSpec


@dataclass(frozen=True)
class Capabilities:
    localize: bool = False
    plain_load: bool = False
    in_process: bool = False
    generates: bool = False


class Runner:
    """The base of every runner: subclasses implement `run` and `input_specs`."""

    name = "runner"
    distribution = None  # the package whose version a benchmark records (None: the one named as the runner)
    imports: tuple[str, ...] = ()  # the frameworks a user of its models has: all a clean child lets it import
    capabilities = Capabilities()

    @classmethod
    def frameworks(cls) -> tuple[str, ...]:
        """The frameworks (top-level modules) a clean child validating its models may import (`imports`)."""
        return cls.imports

    @classmethod
    def open(cls, path, *, threads: int | None = None) -> Runner:
        """A user's file, loaded in this process as its users load it, for timing (`bench`);
        `threads`: the runtime's intra-op threads, where it has such a setting."""
        return cls(path)

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        raise NotImplementedError

    def input_specs(self) -> list[TensorSpec]:
        raise NotImplementedError

    def run_many(self, feeds: list[dict[str, np.ndarray]]) -> list[dict[str, np.ndarray]]:
        """Each feed set's outputs (a runner in a child process runs them all in one child)."""
        return [self.run(f) for f in feeds]

    def output_specs(self) -> list[TensorSpec] | None:
        """The outputs as the model file describes them; None where the runtime does not say."""
        return None

    def describe(self) -> dict:
        """What the runtime reports about the loaded model beyond its I/O (precision it runs at, format)."""
        return {}

    def io_note(self) -> str | None:
        """A note on how inputs and outputs are converted on the way in and out (quantised I/O), or None."""
        return None

    @classmethod
    def cannot_run(cls) -> str | None:
        """Why this machine cannot run the runtime's models (None: it can)."""
        return None

    def ran_in(self) -> dict | None:
        """Where the model ran and with which frameworks loaded, when not in this process (a clean child), else None."""
        return None

    # --- declared abilities (capabilities) ------------------------------------------------------

    def tensor_order(self) -> list[tuple[str, str, str]]:
        """`localize`: (tensor, producing node, op type) of the float tensors inside the graph, in execution order."""
        raise NotImplementedError(f"the {self.name} runner does not localize")

    def tensor_values(self, feeds: dict[str, np.ndarray], names: list[str]) -> dict[str, np.ndarray]:
        """`localize`: the values of the tensors `names` (of `tensor_order`) on `feeds`."""
        raise NotImplementedError(f"the {self.name} runner does not localize")

    def plain_options(self) -> dict | None:
        """`plain_load`: options that open the file as a plain load runs it, when that is not what `run` computes."""
        return None

    def generate(self, prompts: list[list[int]], new_tokens: int, vocab_size: int):
        """`generates`: greedy generation by the runtime's own search: (tokens, logits, producer)."""
        raise NotImplementedError(f"the {self.name} runner does not generate")

    @classmethod
    def plain_load_warning(cls, target: str, entry: dict) -> str | None:
        """`plain_load`: the warning for an artifact (its report entry) that a plain load runs at another precision."""
        return None
