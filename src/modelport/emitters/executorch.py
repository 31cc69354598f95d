"""The ExecuTorch target: an ExecuTorch program (`model.pte`), validated in ExecuTorch's own runtime.

Routes (`emitters/routes.py`): a PyTorch source goes straight through `torch.export`
(`emitters/executorch_torch.py`, the native route); every other source (ONNX, TFLite, SavedModel,
Keras, ...) through modelport's generated PyTorch code for its ONNX IR (`pytorch_code.module_from_ir`),
so a model the generator cannot write is exit 2 naming its ops. Both then take the same steps
(`lower`):

- the module is exported (`torch.export`) on the reference's inputs. A dim declared with bounds
  (`--dim batch=1..8`; a list of sizes: its smallest to its largest) stays dynamic within them
  (ExecuTorch plans its memory for the upper bounds; XNNPACK takes bounded dynamic shapes), named in
  two more constant methods, `input_dims` and `output_dims`; every other dynamic dim is fixed at the size
  `emitters/fixed_dims.py` chooses, and the program validated against the source run at those
  sizes. A model that cannot vary a declared dim (an op that specialises it) is exit 2 naming it;
- `--precision int8`: PT2E post-training quantisation (torchao's `prepare_pt2e`/`convert_pt2e`
  with ExecuTorch's `XNNPACKQuantizer`, symmetric per-channel weights, per-tensor activations),
  calibrated on `--calibration` data cut to the fixed sizes, else on the sample inputs;
- lowered to the edge dialect and, with `--executorch-backend xnnpack` (the default), delegated to
  XNNPACK where XNNPACK takes the ops; what it leaves runs on ExecuTorch's portable kernels.
  `portable` delegates nothing (fp32 only: the int8 program is XNNPACK's);
- an op outside the Core ATen opset, or one the runtime has no kernel for, is exit 2 naming it.

The program carries the contract's names: two constant methods, `input_names` and `output_names`
(lists of strings, read with `program.load_method("input_names").execute([])`), besides `forward`,
which takes the inputs positionally in that order and returns the outputs in that order.
"""

from __future__ import annotations

import re
import tempfile
from pathlib import Path

import numpy as np

from modelport.deps import require
from modelport.emitters import Artifact, EmitOptions, pytorch_code
from modelport.emitters.executorch_kernel_fallback import Program, Screen, screen, xnnpack_configs
from modelport.emitters.executorch_options import ExecuTorchOptions
from modelport.emitters.fixed_dims import cut, dims_entry, export_dynamic_shapes, fixed_sizes, kept_bounds, reference_at
from modelport.emitters.preflight import Preflight, opset_of
from modelport.emitters.pytorch_code import module_from_ir
from modelport.errors import BadInputError, UnsupportedError, one_line
from modelport.ir import IRModel
from modelport.optimize.calibration import load_calibration
from modelport.run.quiet_call import captured_output

NAME = "executorch"
RUNTIME = "executorch"
DESCRIPTION = "an ExecuTorch program (.pte): torch.export → edge dialect, XNNPACK-delegated; fp32 or int8 (PT2E); run in ExecuTorch"
CONVERTER = "generated PyTorch code → torch.export → ExecuTorch"
FILE = "model.pte"
NAMES = ("input_names", "output_names")  # the program's constant methods holding the contract's names
# the constant methods naming the dims kept dynamic: 'TENSOR:AXIS:DIM:MIN:MAX' each
DIMS = ("input_dims", "output_dims")
CALIBRATION_SETS = 32  # at most this many calibration batches are run through the prepared model




def target_options(options: EmitOptions) -> ExecuTorchOptions:
    """The options, checked against the precision before any work: exit 2 for int8 on `portable`."""
    opts = options.target or ExecuTorchOptions()
    if options.precision == "int8" and opts.backend != "xnnpack":
        raise BadInputError(f"--precision int8 needs --executorch-backend xnnpack (the quantised program is XNNPACK's), "
                            f"not {opts.backend}", hint="drop --executorch-backend portable, or convert at fp32")
    return opts


def require_executorch(purpose: str = "the ExecuTorch target"):
    """`executorch.exir`, or exit 5 naming the extra."""

    return require("executorch.exir", purpose=purpose)


def preflight(ir: IRModel, options: EmitOptions) -> Preflight:
    """The generated-code route's: the ops modelport's PyTorch code generator cannot write."""

    target_options(options)
    code = pytorch_code.preflight(ir, options)
    pre = Preflight(NAME, "ExecuTorch (through generated PyTorch code)", None, opset_of(ir.model), None,
                    nodes=code.nodes, unsupported=code.unsupported, hint=code.hint)
    if pre.unsupported:
        pre.reason = f"cannot write the PyTorch code ExecuTorch is reached through: unsupported ops: {pre.op_counts()}"
    return pre


def emit(model: IRModel, out_dir: Path, options: EmitOptions) -> Artifact:
    """The ONNX-side route: the IR's generated PyTorch module, lowered to ExecuTorch."""

    target_options(options)
    require_executorch()
    if model.reference is None:
        raise BadInputError("the ExecuTorch target needs sample inputs to export on")
    with tempfile.TemporaryDirectory(prefix="modelport-executorch-") as tmp:
        module = module_from_ir(model, Path(tmp))
        return lower(model, module, out_dir, options, CONVERTER)


def lower(ir: IRModel, module, out_dir: Path, options: EmitOptions, converter: str) -> Artifact:
    """`module` (taking the contract's inputs in order, giving its outputs in order) as `out_dir/model.pte`."""
    import torch

    from modelport.deps import version_of

    opts = target_options(options)
    require_executorch()
    kept = kept_bounds(ir)
    sizes = fixed_sizes(ir, keep=kept)
    reference = reference_at(ir, module, sizes, "ExecuTorch")
    args = tuple(torch.from_numpy(reference.inputs[s.name].copy()) for s in ir.inputs)
    in_names, out_names = [s.name for s in ir.inputs], [s.name for s in ir.outputs]
    dynamic = export_dynamic_shapes(ir, kept, module)
    with tempfile.TemporaryDirectory(prefix="modelport-executorch-") as tmp:
        log = Path(tmp) / "convert.log"
        with captured_output(log, NAME):
            program = _export(module, args, dynamic)
            quantisation = "none"
            if options.precision == "int8":
                sets = _calibration(ir, options, reference, _at_sample(ir, reference, sizes))
                program = _quantise(module, args, sets, in_names, dynamic)
                quantisation = (f"PT2E int8 (XNNPACKQuantizer: symmetric per-channel weights, per-tensor activations), "
                                f"calibrated on {len(sets)} set(s) of {'--calibration data' if options.calibration else 'the sample inputs'}")
            produced = len(program.graph_signature.user_outputs)
            if produced != len(out_names):
                raise UnsupportedError(f"the exported program gives {produced} outputs; the contract has {len(out_names)} ({out_names})")
            names = (in_names, out_names, _dim_strings(ir, kept))
            executorch_program, info = _lower(program, opts.backend, *names)
            _check_kernels(info["operators"])
            screened = _screen(ir, program, (executorch_program, info), reference, options, names, (module, args, dynamic))
    executorch_program, info = screened.chosen.program, screened.chosen.info
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / FILE
    path.write_bytes(executorch_program.buffer)
    fixed = {s.name: {d: sizes[d] for d in s.shape if isinstance(d, str) and d in sizes}
             for s in ir.inputs if any(isinstance(d, str) and d in sizes for d in s.shape)}
    return Artifact(
        target=NAME, runtime=RUNTIME, path=path, files=[path], precision=options.precision,
        details={"converter": f"{converter} (executorch {version_of('executorch')})", "backend": opts.backend,
                 "delegated_partitions": info["delegates"], "portable_ops": info["operators"],
                 "methods": {"forward": "the inputs positionally in the contract's order, the outputs in its order",
                             NAMES[0]: in_names, NAMES[1]: out_names},
                 "fixed_dims": fixed, "dims": dims_entry(ir, sizes, kept), "quantization": quantisation,
                 **({"kernel_fallback": screened.entry} if screened.entry else {}),
                 "validation": "ExecuTorch's runtime (executorch.runtime) runs `forward` on the inputs"
                               + ("" if reference is ir.reference else
                                  f" cut to the fixed sizes {sizes}, against the source run on them")},
        runner=RUNTIME, reference=None if reference is ir.reference else reference,
        warnings=[f"{NAME}: {screened.warning}"] if screened.warning else [],
    )


def _screen(ir: IRModel, program, lowered, reference, options: EmitOptions, names, source):
    """The program screened for kernel faults (`executorch_kernel_fallback`): the program to deliver,
    with the ops kept out of XNNPACK when its kernels broke it, or lowered again from `source`
    (module, args, dynamic shapes) with shifted normalisation (`norm_fallback`) when its norms did.
    fp32 programs only."""

    first = Program(*lowered)
    backend = target_options(options).backend
    if options.precision != "fp32":
        return Screen(first)

    def relower(kept_out):  # a program that does not lower, or does not load, does not hold (`judge`)
        try:
            return Program(*_lower(program, "portable" if kept_out is None else "xnnpack", *names, keep_out=kept_out or ()),
                           tuple(kept_out or ()))
        except UnsupportedError as e:
            return Program(None, {"error": e.reason}, tuple(kept_out or ()))

    def rewrite():  # None: the module has no norm to shift
        from modelport.emitters.norm_shift_torch import Shifted

        module, args, dynamic = source
        shifted = Shifted(module)
        try:
            exported = _export(shifted, args, dynamic)
            if not shifted.shifted():
                return None
            return Program(*_lower(exported, backend, *names), shifted=tuple(shifted.shifted()))
        except UnsupportedError as e:
            return Program(None, {"error": e.reason}, shifted=tuple(shifted.shifted()))

    search = relower if backend == "xnnpack" and first.info["delegates"] else None
    return screen(first, search, reference, ir, options.precision, rewrite=rewrite)


def _export(module, args, dynamic=None):
    import torch

    try:
        return torch.export.export(module, args, dynamic_shapes=dynamic)
    except Exception as e:
        if dynamic is not None and _specialised(e):
            raise UnsupportedError(f"the model cannot keep {_declared_text(dynamic)} dynamic in ExecuTorch: "
                                   f"{one_line(e, 300, typed=True)}",
                                   hint="fix the dim with --dim NAME=N, or give bounds the model takes") from None
        raise UnsupportedError(f"torch.export could not export the model for ExecuTorch: {one_line(e, 300, typed=True)}") from None


def _specialised(e: BaseException) -> bool:
    """torch.export's refusal of a declared dynamic dim (a guard that fixes or narrows it)."""
    return type(e).__name__ in ("ConstraintViolationError", "UserError") or "Constraints violated" in str(e)


def _declared_text(dynamic) -> str:
    """The dims `dynamic` (export's dynamic_shapes, nested in a `*args` tuple or not) names."""
    names: dict[str, None] = {}
    stack = [dynamic]
    while stack:
        item = stack.pop(0)
        if isinstance(item, (tuple, list)):
            stack.extend(item)
        elif isinstance(item, dict):
            names.update(dict.fromkeys(str(getattr(d, "__name__", d)) for d in item.values()))
    return ", ".join(f"'{name}'" for name in names) or "the declared dims"


def _dim_strings(ir: IRModel, kept: dict) -> tuple[list[str], ...]:
    """The `input_dims` and `output_dims` constant methods: 'TENSOR:AXIS:DIM:MIN:MAX' per kept dim of
    an input and of an output (whose size in the program's metadata is the upper bound); none
    when no dim is kept."""
    if not kept:
        return ()
    return tuple([f"{s.name}:{axis}:{d}:{kept[d].low}:{kept[d].high}"
                  for s in specs for axis, d in enumerate(s.shape) if isinstance(d, str) and d in kept]
                 for specs in (ir.inputs, ir.outputs))


def _at_sample(ir: IRModel, reference, sizes: dict[str, int]) -> dict[str, int]:
    """`sizes` with each kept dim at the size the reference's inputs have (calibration batches)."""
    at = dict(sizes)
    for s in ir.inputs:
        for axis, d in enumerate(s.shape):
            if isinstance(d, str):
                at.setdefault(d, int(reference.inputs[s.name].shape[axis]))
    return at


def _calibration(ir: IRModel, options: EmitOptions, reference, sizes: dict[str, int]) -> list[dict[str, np.ndarray]]:
    """Calibration feed sets at the fixed sizes: `--calibration` data (split along a dynamic leading
    dim into batches of the fixed size, other dynamic dims cut), else the reference's sample sets."""

    if not options.calibration:
        return [reference.inputs] + [x.inputs for x in reference.extra]
    sets = []
    for feeds in load_calibration(options.calibration, ir):
        lead = {s.shape[0] for s in ir.inputs if s.shape and isinstance(s.shape[0], str)}
        step = sizes[next(iter(lead))] if len(lead) == 1 and all(s.shape and s.shape[0] in lead for s in ir.inputs) else None
        rows = min(len(feeds[s.name]) for s in ir.inputs) if step else 0
        chunks = [{n: a[i:i + step] for n, a in feeds.items()} for i in range(0, rows - step + 1, step)] if step else [feeds]
        for chunk in chunks:
            small = [s.name for s in ir.inputs for d, n in zip(s.shape, np.shape(chunk[s.name]), strict=False)
                     if isinstance(d, str) and n < sizes[d]]
            if small:
                raise BadInputError(f"calibration data for {sorted(set(small))} is smaller than the program's fixed sizes {sizes}",
                                    path=options.calibration)
            sets.append(cut(ir, chunk, sizes))
    return sets[:CALIBRATION_SETS]


def _quantise(module, args, sets: list[dict[str, np.ndarray]], names: list[str], dynamic=None):
    """PT2E static int8 for XNNPACK: the module prepared with observers, run on `sets`, converted, exported again."""
    import torch
    from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import XNNPACKQuantizer, get_symmetric_quantization_config
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    try:
        graph = torch.export.export(module, args, dynamic_shapes=dynamic).module()
        quantizer = XNNPACKQuantizer().set_global(get_symmetric_quantization_config(is_per_channel=True))
        prepared = prepare_pt2e(graph, quantizer)
        with torch.no_grad():
            for feeds in sets:
                prepared(*[torch.from_numpy(np.ascontiguousarray(feeds[n])) for n in names])
        return torch.export.export(convert_pt2e(prepared), args, dynamic_shapes=dynamic)
    except (BadInputError, MemoryError):
        raise
    except Exception as e:
        raise UnsupportedError(f"PT2E int8 quantisation failed: {one_line(e, 300, typed=True)}") from None


_NOT_CORE = re.compile(r"Operator (?:torch\._ops\.)?([\w.:]+) is not (?:in )?(?:Core ATen|Aten Canonical)")


def _lower(program, backend: str, in_names: list[str], out_names: list[str], dims: list[str] = (), *,
           keep_out: tuple[str, ...] = ()):
    """(the ExecuTorch program, {"delegates": N, "operators": the ops left to the runtime's kernels,
    "delegated_ops": the op types inside XNNPACK's partitions}); `keep_out`: op types
    ('aten.sqrt.default') XNNPACK's partitioner is not given (`executorch_kernel_fallback`)."""
    from executorch.exir import to_edge_transform_and_lower

    partitioner = []
    if backend == "xnnpack":
        from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner


        partitioner = [XnnpackPartitioner(configs=xnnpack_configs(keep_out)) if keep_out else XnnpackPartitioner()]
    try:
        edge = to_edge_transform_and_lower(program, partitioner=partitioner,
                                           constant_methods={NAMES[0]: list(in_names), NAMES[1]: list(out_names),
                                                             **dict(zip(DIMS, dims, strict=False))})
        et = edge.to_executorch()
    except Exception as e:
        text = str(e)
        found = _NOT_CORE.search(text)
        if found:
            raise UnsupportedError(f"ExecuTorch cannot take the op {found.group(1)}: it is not in the Core ATen opset the edge "
                                   "dialect accepts", hint="rewrite the model without it, or convert to another target") from None
        raise UnsupportedError(f"ExecuTorch could not lower the model ({backend}): {one_line(e, 300, typed=True)}") from None
    plan = next(p for p in et.executorch_program.execution_plan if p.name == "forward")
    operators = sorted({f"{o.name}.{o.overload}" if o.overload else o.name for o in plan.operators})
    return et, {"delegates": len(plan.delegates), "operators": operators, "delegated_ops": _delegated_ops(et)}


def _delegated_ops(et) -> list[str]:
    """The op types ('aten.linear.default', ...) inside the program's delegated partitions."""
    import torch

    graph = et.exported_program().graph_module
    ops = set()
    for node in graph.graph.nodes:
        if node.op == "call_function" and node.target is torch.ops.higher_order.executorch_call_delegate:
            inner = getattr(graph, node.args[0].target).original_module.graph_module
            ops.update(n.target.__name__ for n in inner.graph.nodes if n.op == "call_function")
    return sorted(ops)


def _check_kernels(operators: list[str]) -> None:
    """Exit 2 naming the ops ExecuTorch's runtime here has no kernel for (the program would not load)."""
    from executorch.extension.pybindings import portable_lib

    known = set(portable_lib._get_operator_names())
    missing = [op for op in operators if op not in known]
    if missing:
        raise UnsupportedError(f"ExecuTorch's runtime has no kernel for the op(s) {', '.join(missing)}",
                               hint="rewrite the model without them, or convert to another target")
