"""PyTorch → ONNX export, route after route until one produces a model.

Routes, in the order tried:

- `dynamo`: `torch.onnx.export(dynamo=True)` on the module, with a named `torch.export.Dim` per
  named dim of the input specs (the exporter traces the module itself);
- `dynamo-decomposed`: `torch.export.export` of the module, `run_decompositions()` with torch's
  default (core ATen) table, then the ONNX exporter on that program. The ONNX exporter's own
  decomposition of a training-IR program fails on some real graphs ("Failed to decompose the FX
  graph for ONNX compatibility": a `view` of a tensor whose strides the `contiguous`/`reshape`
  pair no longer makes viewable once decomposed, seen in Swin and T5 attention); lowering to core
  ATen first avoids it. For a `.pt2` whose input shapes the user kept, the saved program itself is
  lowered instead (`dynamo-program-decomposed`, nothing traced again), then exported as it is
  (`dynamo-program`);
- `torchscript`: the TorchScript exporter (`dynamo=False`, opset 17). On a program's module it
  traces Python ints where the program had symbolic sizes, so the model it gives is valid only at
  the sample sizes: its dynamic dims are fixed to them, and the attempt says so. A TorchScript
  module (`torch.jit.load`) goes this route only: torch.export takes no ScriptModule.

Every attempt is recorded (route, ok, one-line reason, seconds); when all fail the error names
each route's reason.
"""

from __future__ import annotations

import io
import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from modelport.deps import require
from modelport.errors import BadInputError, one_line
from modelport.run.progress import tick
from modelport.run.quiet_call import captured_output

log = logging.getLogger(__name__)

EXPORTERS = {
    "dynamo": "torch.onnx dynamo",
    "dynamo-program": "torch.onnx dynamo (saved program)",
    "dynamo-program-decomposed": "torch.onnx dynamo (saved program, core ATen decompositions)",
    "dynamo-decomposed": "torch.onnx dynamo (core ATen decompositions)",
    "torchscript": "torch.onnx torchscript",
}


@dataclass
class Attempt:
    route: str
    ok: bool
    reason: str | None
    seconds: float

    def to_dict(self) -> dict:
        return {"route": self.route, "ok": self.ok, "reason": self.reason, "seconds": self.seconds}


@dataclass
class Exported:
    """The model the first working route produced, the route's name and every attempt made."""

    model: object
    route: str
    attempts: list[Attempt] = field(default_factory=list)
    fixed_dims: set[str] = field(default_factory=set)  # dynamic dims the route could only export at their sample size
    stored: object = None  # the folder of the data file the model's large initializers refer to (`weights_dir`), or None

    @property
    def exporter(self) -> str:
        return EXPORTERS[self.route]


class ExportFailedError(BadInputError):
    """Every export route failed; `attempts` holds each one (route, reason, seconds)."""

    def __init__(self, reason: str, *, attempts: list[Attempt], **kwargs):
        self.attempts = attempts
        super().__init__(reason, **kwargs)


class ExportedCall:
    """Marker base for modules that call a loaded ExportedProgram's module."""


def positional_program(ep):
    """A module calling `ep.module()` with the program's user inputs as positional tensors, in the
    program's own flat order (whether it was exported with args or keyword arguments), whose
    `train()`/`eval()` only set a flag (the unlifted program refuses them, and the TorchScript
    exporter calls them)."""
    import torch
    from torch.utils import _pytree as pytree

    inner = ep.module()
    spec = ep.call_spec.in_spec

    class ProgramModule(torch.nn.Module, ExportedCall):
        def __init__(self):
            super().__init__()
            self.program = inner
            self.training = False

        def forward(self, *flat):
            args, kwargs = pytree.tree_unflatten(list(flat), spec)
            return self.program(*args, **kwargs)

        def train(self, mode: bool = True):
            self.training = mode
            return self

        def eval(self):
            return self.train(False)

    return ProgramModule()


def reason_of(e: BaseException) -> str:
    """One line: the error's first line, with the underlying exception the ONNX exporter's
    summary names ("… (ValueError: Cannot view a tensor …)")."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(e)).strip()
    first = one_line(text, 300) or type(e).__name__
    first = re.sub(r"\s*This is step \d/\d of exporting.*$", "", first)
    cause = re.search(r"<class '(?:[\w.]+\.)?(\w+)'>: (.+)", text)
    if cause and cause.group(2).strip() not in first:
        first = f"{first.rstrip('.')} ({cause.group(1)}: {cause.group(2).strip()})"
    # the TorchScript exporter names an internal graph value; the source line it marks says more
    first = re.sub(r"\s*\[Caused by the value .*$", "", first)
    where = re.search(r'node defined in\s+File "([^"]+)", line (\d+)\n((?:.*\n)*?)\s*~+ <--- HERE', text)
    if where:
        code = [ln.strip() for ln in where.group(3).splitlines() if ln.strip()]
        first += f" (at {where.group(1).rsplit('/', 1)[-1]}:{where.group(2)}{': ' + code[-1] if code else ''})"
    return one_line(first, 300)


def export_model(module, args, specs, output_names, *, opset=None, ranges=None, program=None,
                 program_shapes_kept: bool = False, path=None, weights_dir=None) -> Exported:
    """The ONNX model of the first route that works (see the module docstring).

    `weights_dir`: the dynamo routes write the model's large tensors from the torch tensors straight
    to a data file in a new folder there, and the model comes back as its graph alone
    (`Exported.stored` names the folder): the torch model and a second copy of its weights are never
    held together. The caller reads them in once the torch model is gone."""
    torch = _torch()
    input_names = [s.name for s in specs]
    from_program = isinstance(module, ExportedCall)
    where: dict = {}
    routes: list[tuple[str, Callable[[], object]]] = [
        ("dynamo", lambda: _onnx_from_module(module, args, specs, input_names, output_names, opset, ranges,
                                             weights_dir=weights_dir, where=where)),
    ]
    if program is not None and program_shapes_kept:
        routes.append(("dynamo-program-decomposed", lambda: _onnx_from_program(
            program.run_decompositions(), input_names, output_names, opset, weights_dir=weights_dir, where=where)))
        routes.append(("dynamo-program", lambda: _onnx_from_program(program, input_names, output_names, opset,
                                                                    weights_dir=weights_dir, where=where)))
    else:
        routes.append(("dynamo-decomposed", lambda: _onnx_from_program(
            _export_program(torch, module, args, specs, ranges).run_decompositions(), input_names, output_names, opset,
            weights_dir=weights_dir, where=where)))
    routes.append(("torchscript", lambda: _onnx_torchscript(module, args, specs, input_names, output_names, opset,
                                                            static=from_program)))
    if isinstance(module, torch.jit.ScriptModule):  # torch.export refuses ScriptModules: only the TorchScript exporter applies
        routes = routes[-1:]

    attempts: list[Attempt] = []
    for route, run in routes:
        t = time.perf_counter()
        try:
            model = _quietly(route, run)
        except Exception as e:
            attempts.append(Attempt(route, False, reason_of(e), round(time.perf_counter() - t, 3)))
            log.info("export route %s failed: %s", route, attempts[-1].reason)
            continue
        model = _without_stack_traces(_name_dims(model, specs))
        fixed = {d for s in specs for d in s.dynamic_dims.values()} if route == "torchscript" and from_program else set()
        attempts.append(Attempt(route, True, None, round(time.perf_counter() - t, 3)))
        return Exported(model, route, attempts, fixed, stored=where.get("stored"))
    last = "; ".join(f"{a.route}: {a.reason}" for a in attempts)
    if isinstance(module, torch.jit.ScriptModule):
        raise ExportFailedError(f"the TorchScript exporter failed (a TorchScript module has no other route: torch.export "
                                f"takes no ScriptModule): {last}", attempts=attempts, path=path)
    raise ExportFailedError(f"every export route failed: {last}", attempts=attempts, path=path)


def _without_stack_traces(model):
    """The exporter records each node's Python stack trace (`pkg.torch.onnx.stack_trace`): local
    file paths and per-process counters (`<eval_with_key>.N`) that would make the artifact differ
    from one run to the next and leak the converting machine's paths. They are dropped."""
    for graph in _graphs(model.graph):
        for node in graph.node:
            kept = [p for p in node.metadata_props if p.key != "pkg.torch.onnx.stack_trace"]
            if len(kept) != len(node.metadata_props):
                del node.metadata_props[:]
                node.metadata_props.extend(kept)
    return model


def _graphs(graph):
    yield graph
    for node in graph.node:
        for attr in node.attribute:
            if attr.g.node:
                yield from _graphs(attr.g)
            for g in attr.graphs:
                yield from _graphs(g)


def _torch():

    return require("torch", purpose="PyTorch sources")


def _quietly(route: str, run):
    """Run an exporter with its progress lines off stdout and stderr (kept for the debug log), at
    the file-descriptor level too: the TorchScript exporter prints the whole TorchScript graph from
    C++ when it fails (56 KB for silero-vad), which the error message then sums up in one line."""
    import tempfile
    from pathlib import Path


    logging.getLogger("torch.onnx").setLevel(logging.ERROR)
    logging.getLogger("torch.export").setLevel(logging.ERROR)
    with tempfile.TemporaryDirectory(prefix="modelport-export-") as tmp:
        captured = Path(tmp) / "export.log"
        try:
            with captured_output(captured, f"torch.onnx.export, {route}"):
                return run()
        finally:
            text = captured.read_text(errors="replace") if captured.exists() else ""
            if text:
                log.debug("exporter output (%s):\n%s", route, text)


def _dynamic_shapes(torch, specs, ranges, *, varargs: bool):
    dims: dict[str, object] = {}
    shapes = [{i: dims.setdefault(d, _export_dim(torch, d, (ranges or {}).get(d))) for i, d in s.dynamic_dims.items()} or None
              for s in specs]
    if not any(shapes):
        return None
    return (tuple(shapes),) if varargs else tuple(shapes)


def _onnx_from_module(module, args, specs, input_names, output_names, opset, ranges, *, weights_dir=None, where=None):
    torch = _torch()
    shapes = _dynamic_shapes(torch, specs, ranges, varargs=isinstance(module, ExportedCall))
    kwargs = {"dynamic_shapes": shapes} if shapes else {}
    prog = torch.onnx.export(module, tuple(args), dynamo=True, input_names=input_names, output_names=output_names,
                             opset_version=opset, external_data=False, optimize=True, **kwargs)
    return _proto_of(prog, weights_dir, where)


STORED_MIN_BYTES = 1024  # tensors at least this large go to the data file (smaller ones: shape inference reads them)


def _proto_of(prog, weights_dir, where):
    """The exported ModelProto: whole, or (`weights_dir`) its graph with the large tensors in a data
    file of a new folder under `weights_dir`, written from the torch tensors one at a time; the folder
    goes into `where["stored"]`."""
    if weights_dir is None:
        return prog.model_proto
    import tempfile
    from pathlib import Path

    import onnx
    import onnx_ir


    folder = Path(tempfile.mkdtemp(prefix="export-", dir=weights_dir))
    path = folder / "model.onnx"
    onnx_ir.save(prog.model, path, external_data=path.name + ".data", size_threshold_bytes=STORED_MIN_BYTES, max_workers=1,
                 callback=lambda tensor, info: tick("writing", tensor.name or "a tensor", info.index, info.total))
    where["stored"] = folder
    return onnx.load(str(path), load_external_data=False)


def _export_program(torch, module, args, specs, ranges):
    shapes = _dynamic_shapes(torch, specs, ranges, varargs=isinstance(module, ExportedCall))
    return torch.export.export(module, tuple(args), dynamic_shapes=shapes, strict=False)


def _onnx_from_program(program, input_names, output_names, opset, *, weights_dir=None, where=None):
    torch = _torch()
    prog = torch.onnx.export(program, (), dynamo=True, input_names=input_names, output_names=output_names,
                             opset_version=opset, external_data=False, optimize=True)
    return _proto_of(prog, weights_dir, where)


def _onnx_torchscript(module, args, specs, input_names, output_names, opset, *, static: bool):
    import onnx

    torch = _torch()
    f = io.BytesIO()
    axes = None if static else ({s.name: dict(s.dynamic_dims) for s in specs if s.dynamic_dims} or None)
    torch.onnx.export(module, tuple(args), f, dynamo=False, input_names=input_names, output_names=output_names,
                      opset_version=opset or 17, dynamic_axes=axes)
    return onnx.load_from_string(f.getvalue())


def _export_dim(torch, name: str, bounds: tuple[int, int | None] | None):
    """A torch.export.Dim for a named dim, within the range the source program declared for it."""
    lo, hi = bounds or (0, None)
    kwargs = {k: v for k, v in (("min", lo if lo > 0 else None), ("max", hi)) if v is not None}
    return torch.export.Dim(_dim_ident(name), **kwargs)


def _dim_ident(name: str) -> str:
    ident = "".join(c if c.isalnum() or c == "_" else "_" for c in name)
    return ident if ident and not ident[0].isdigit() else f"d_{ident}"


def _name_dims(model, specs):
    """Give the graph's symbolic dims the input specs' names (a program exports its own symbols,
    `s72`): each symbol at a graph input axis the spec names is renamed everywhere it appears."""
    by_name = {s.name: s for s in specs}
    rename: dict[str, str] = {}
    for vi in model.graph.input:
        spec = by_name.get(vi.name)
        if spec is None:
            continue
        for axis, d in enumerate(vi.type.tensor_type.shape.dim):
            if axis < len(spec.shape) and isinstance(spec.shape[axis], str) and d.dim_param and d.dim_param != spec.shape[axis]:
                rename.setdefault(d.dim_param, spec.shape[axis])
    if not rename:
        return model
    for vi in [*model.graph.input, *model.graph.output, *model.graph.value_info]:
        for d in vi.type.tensor_type.shape.dim:
            if d.dim_param in rename:
                d.dim_param = rename[d.dim_param]
    return model
