"""ExecuTorch runner: a `.pte` program run by ExecuTorch's own runtime (`executorch.runtime.Runtime`).

The program's `forward` takes its inputs positionally. A program modelport wrote names them (and
its outputs) in two constant methods, `input_names` and `output_names` (`emitters/executorch.py`);
feeds are matched by those names, and another program's inputs are `input_0`, `input_1`, ...
(outputs `output_0`, ...), matched by name and otherwise by position. Shapes and dtypes come from
the method's metadata: static shapes, or for a dim the program keeps dynamic (the constant method
`input_dims`, 'INPUT:AXIS:DIM:MIN:MAX' each; `output_dims` for the outputs) its upper bound there, which the runner describes as
the named dim and takes any size of within its bounds.

`open_pte(path)` is `validate`'s opener (the file's identifier checked here, then loaded and run in a
child process), `inspect_pte(path)` `inspect`'s description of a file.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from modelport.deps import require
from modelport.errors import BadInputError, one_line
from modelport.ir import TensorSpec
from modelport.run.file_checks import check_model_file
from modelport.runtimes.base import Runner
from modelport.runtimes.isolated import IsolatedRunner

IDENTIFIER = b"ET"  # bytes 4..6 of a .pte flatbuffer ("ET12", ...)
METHOD = "forward"
NAMES = ("input_names", "output_names")
DIMS = ("input_dims", "output_dims")
# ExecuTorch ScalarType codes (c10's numbering) -> numpy dtype names
SCALAR_TYPES = {0: "uint8", 1: "int8", 2: "int16", 3: "int32", 4: "int64", 5: "float16", 6: "float32", 7: "float64",
                11: "bool", 15: "bfloat16"}


def require_runtime():
    """`executorch.runtime`, or exit 5 naming the extra."""

    return require("executorch.runtime", purpose="running ExecuTorch programs")


def check_header(path: Path) -> None:
    """The cheap checks: size and the flatbuffer identifier ('ET' and two digits at bytes 4..8)."""

    path = check_model_file(path, kind="ExecuTorch program")
    with open(path, "rb") as f:
        head = f.read(8)
    if len(head) < 8 or head[4:6] != IDENTIFIER or not head[6:8].isdigit():
        raise BadInputError(f"not an ExecuTorch program: identifier {head[4:8]!r}, expected b'ET' and a version", path=path)


def open_pte(path: str | Path, **options):
    """A user's `.pte`: its identifier checked here, then described and run in a child process."""

    check_header(Path(path))
    return IsolatedRunner("executorch", path, **options)


def _tensor_specs(meta, count: int, which: str, names: list[str]) -> list[TensorSpec]:
    specs = []
    for i in range(count):
        info = getattr(meta, f"{which}_tensor_meta")(i)
        dtype = SCALAR_TYPES.get(int(info.dtype()), f"scalar_type_{int(info.dtype())}")
        specs.append(TensorSpec(names[i], dtype, [int(d) for d in info.sizes()], scalar=not info.sizes()))
    return specs


def _bounds(texts) -> dict[tuple[str, int], tuple[str, int, int]]:
    """{(tensor, axis): (dim, min, max)} from a program's 'TENSOR:AXIS:DIM:MIN:MAX' strings."""
    out = {}
    for text in texts or []:
        parts = str(text).rsplit(":", 4)
        if len(parts) == 5 and parts[1].isdigit() and parts[3].isdigit() and parts[4].isdigit():
            out[(parts[0], int(parts[1]))] = (parts[2], int(parts[3]), int(parts[4]))
    return out


def _named(specs: list[TensorSpec], bounds: dict) -> list[TensorSpec]:
    """`specs` with each dim the program keeps dynamic named as the contract names it."""
    return [TensorSpec(s.name, s.dtype, [bounds[(s.name, i)][0] if (s.name, i) in bounds else d for i, d in enumerate(s.shape)],
                       scalar=s.scalar) for s in specs]


class ExecuTorchRunner(Runner):
    name = "executorch"
    imports = ("executorch", "torch")

    def __init__(self, model, *, method: str = METHOD):
        require_runtime()
        from executorch.runtime import Runtime

        self.path = Path(model)
        try:
            self.program = Runtime.get().load_program(self.path)
            self.methods = sorted(self.program.method_names)
            self.method = self.program.load_method(method)
        except Exception as e:
            raise BadInputError(f"ExecuTorch cannot load the program: "
                                f"{one_line(e, 300, typed=True)}", path=self.path) from None
        if self.method is None:
            raise BadInputError(f"the program has no method '{method}' (it has {self.methods})", path=self.path)
        meta = self.method.metadata
        self.n_in, self.n_out = meta.num_inputs(), meta.num_outputs()
        in_names = self._names(NAMES[0]) or [f"input_{i}" for i in range(self.n_in)]
        out_names = self._names(NAMES[1]) or [f"output_{i}" for i in range(self.n_out)]
        if len(in_names) != self.n_in or len(out_names) != self.n_out:
            raise BadInputError(f"the program names {len(in_names)} inputs and {len(out_names)} outputs; '{method}' takes "
                                f"{self.n_in} and gives {self.n_out}", path=self.path)
        self._inputs = _tensor_specs(meta, self.n_in, "input", in_names)
        self._outputs = _tensor_specs(meta, self.n_out, "output", out_names)
        self.bounds = _bounds(self._names(DIMS[0]))  # (input, axis) -> (dim, min, max)
        self._described = _named(self._inputs, self.bounds)
        self._outputs_described = _named(self._outputs, _bounds(self._names(DIMS[1])))

    def _names(self, method: str) -> list[str] | None:
        if method not in self.methods:
            return None
        names = self.program.load_method(method).execute([])
        return [str(n) for n in names] if isinstance(names, (list, tuple)) else None

    def input_specs(self) -> list[TensorSpec]:
        return list(self._described)

    def output_specs(self) -> list[TensorSpec]:
        return list(self._outputs_described)

    def describe(self) -> dict:
        dims: dict[str, dict] = {}
        for (name, _axis), (d, lo, hi) in self.bounds.items():
            dims.setdefault(name, {})[d] = {"kind": "range", "min": lo, "max": hi}
        return {"methods": self.methods, "inputs": [s.to_dict() for s in self._described], **({"dynamic_dims": dims} if dims else {}),
                "outputs": [s.to_dict() for s in self._outputs_described]}

    def _fits(self, spec: TensorSpec, shape) -> bool:
        if len(shape) != len(spec.shape):
            return False
        for axis, (want, got) in enumerate(zip(spec.shape, shape, strict=True)):
            bound = self.bounds.get((spec.name, axis))
            if not (bound[1] <= got <= bound[2] if bound else got == want):
                return False
        return True

    def _shape_text(self, spec: TensorSpec) -> str:
        if not any((spec.name, i) in self.bounds for i in range(len(spec.shape))):
            return f"{spec.shape}"
        return "[" + ", ".join(f"{b[0]} in {b[1]}..{b[2]}" if (b := self.bounds.get((spec.name, i))) else str(d)
                               for i, d in enumerate(spec.shape)) + "]"

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        import torch

        names = [s.name for s in self._inputs]
        if all(n in feeds for n in names):
            arrays = [feeds[n] for n in names]
        elif len(feeds) == len(names):
            arrays = list(feeds.values())
        else:
            raise BadInputError(f"the program takes inputs {names}; fed {sorted(feeds)}", path=self.path)
        args = []
        for spec, a in zip(self._inputs, arrays, strict=True):
            a = np.asarray(a)
            if not self._fits(spec, a.shape):
                kept = any((spec.name, i) in self.bounds for i in range(len(spec.shape)))
                raise BadInputError(f"input '{spec.name}' {'takes' if kept else 'is fixed at'} the shape {self._shape_text(spec)} "
                                    f"in this program; fed {list(a.shape)}", path=self.path)
            args.append(torch.from_numpy(np.ascontiguousarray(a.astype(spec.dtype, copy=False))))
        outs = self.method.execute(args)
        return {s.name: np.asarray(o.detach().numpy() if hasattr(o, "detach") else o).copy()
                for s, o in zip(self._outputs, outs, strict=True)}


def inspect_pte(path: str | Path) -> dict:
    """What `inspect` shows for a `.pte`: methods, inputs and outputs, size; read in a child process."""
    path = Path(path)
    runner = open_pte(path)
    info = runner.describe()
    return {"format": "executorch", "methods": info["methods"], "inputs": info["inputs"], "outputs": info["outputs"],
            **({"dynamic_dims": info["dynamic_dims"]} if info.get("dynamic_dims") else {}),
            "files": [str(path)], "size": path.stat().st_size}
