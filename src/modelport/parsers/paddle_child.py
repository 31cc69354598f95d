"""The Paddle parser's child-process side (`parsers/paddle.py` runs `convert_in_child` through
`runtimes.isolated.call_in_child`): everything that imports Paddle happens here.

The program is read with Paddle's own deserialisers (PIR JSON; a legacy ProgramDesc is translated
to PIR, as paddle2onnx's Python front end does, and written as JSON for the export). Its contract:
the feed/data ops give the inputs (name, dtype, shape; -1 is `batch` on axis 0, else
`<input>_dim<axis>`; 4-D float inputs are NCHW, Paddle's layout), the fetch ops the outputs, in
their column order. Before any loader reads the weights, `paddle.check_params` walks them against
the program's persistable tensors, and the ops are screened against paddle2onnx's converters:
paddle2onnx aborts the process on an op it lacks, so a model with such ops is refused naming them all.

References come from Paddle Inference as a user's default CPU predictor runs it (IR optimisation
on), with oneDNN off: its fused kernels round differently on each CPU generation (3e-6 from the
plain kernels on a small CNN), while the plain CPU kernels match the dynamic-graph model exactly.
The ONNX graph comes from paddle2onnx's C++ export at opset 17, called directly: its Python
`export` exits the process on an error (its logger's `error` calls `sys.exit`) and wants
polygraphy or onnxoptimizer for an optional folding; modelport's own passes optimise later. The
weights it writes as Constant nodes are made initializers.
"""

from __future__ import annotations

import contextlib
import os
from collections import Counter
from pathlib import Path

import numpy as np

from modelport.errors import BadInputError, UnsupportedError, one_line
from modelport.ir import IRModel, Reference, TensorSpec, guess_layout
from modelport.parsers.paddle import check_params

OPSET = 17
# ops the export handles itself (feeds, fetches, parameters, control flow it walks into)
EXPORT_HANDLES = {"pd_op.data", "pd_op.feed", "pd_op.fetch", "pd_op.if", "pd_op.while", "cf.yield", "pd_op.print",
                  "builtin.parameter", "builtin.constant", "builtin.shadow_output", "builtin.set_parameter"}
# PIR op name (without `pd_op.`) -> the converter name paddle2onnx registers it under
CONVERTER_NAMES = {
    "matmul": "matmul_v2", "batch_norm_": "batch_norm", "topk": "top_k_v2", "expand": "expand_v2",
    "repeat_interleave_with_tensor_index": "repeat_interleave", "assign_value_": "assign_value",
    "flatten": "flatten_contiguous_range", "unsqueeze": "unsqueeze2", "arange": "range", "argmax": "arg_max",
    "floor_divide": "elementwise_floordiv", "subtract": "elementwise_sub", "multiply": "elementwise_mul",
    "divide": "elementwise_div", "remainder": "elementwise_mod", "minimum": "elementwise_min",
    "maximum": "elementwise_max", "min": "reduce_min", "max": "reduce_max", "mean": "reduce_mean", "sum": "reduce_sum",
    "prod": "reduce_prod", "any": "reduce_any", "all": "reduce_all", "numel": "size", "hardswish": "hard_swish",
    "hardsigmoid": "hard_sigmoid", "add": "elementwise_add", "add_n": "sum", "grid_sample": "grid_sampler",
    "nonzero": "where_index",
}
PADDLE_DTYPES = {"float32": "float32", "float16": "float16", "bfloat16": "bfloat16", "float64": "float64",
                 "int64": "int64", "int32": "int32", "int16": "int16", "int8": "int8", "uint8": "uint8", "bool": "bool"}


def import_paddle():
    from modelport.deps import require

    os.environ.setdefault("GLOG_minloglevel", "3")
    paddle = require("paddle", purpose="PaddlePaddle sources")
    require("paddle2onnx", purpose="converting PaddlePaddle models to ONNX")
    paddle.enable_static()
    return paddle


def load_program(paddle, model: Path, work: Path):
    """(the PIR program, the JSON file paddle2onnx exports from): a .json as it is; a .pdmodel
    translated from its ProgramDesc (a protobuf) and written beside the child's other files."""
    try:
        if model.suffix.lower() == ".pdmodel":
            with paddle.pir_utils.OldIrGuard():
                legacy = paddle.static.deserialize_program(model.read_bytes())
            program = paddle.pir.translate_to_pir(legacy.desc)
            exported = work / "program.json"
            paddle.core.serialize_pir_program(program, str(exported), True, False, True)
            float_scales(exported)
            return program, exported
        program = paddle.static.Program()
        paddle.base.core.deserialize_pir_program(str(model), program)
        return program, model
    except Exception as e:
        raise BadInputError(f"not a readable Paddle program: {one_line(e, 300)}", path=model) from None


def float_scales(program_json: Path) -> int:
    """The translator of legacy programs writes an interpolation's `scale` list as doubles, which
    paddle2onnx 2.1 refuses ("the 0th elementwise MUST be ir::FloatAttribute"; PP-OCR's detector);
    Paddle's own interp ops take floats. Rewritten in the file paddle2onnx reads (the reference runs
    the original program); returns how many lists were."""
    import json

    doc = json.loads(program_json.read_text())
    changed = 0

    def walk(node):
        nonlocal changed
        if isinstance(node, dict):
            at = node.get("AT")
            if node.get("N") == "scale" and isinstance(at, dict) and at.get("#") == "0.a_array" \
                    and at.get("D") and all(isinstance(e, dict) and e.get("#") == "0.a_f64" for e in at["D"]):
                for e in at["D"]:
                    e["#"] = "0.a_f32"
                changed += 1
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(doc)
    if changed:
        program_json.write_text(json.dumps(doc, separators=(",", ":")))
    return changed


def all_ops(block):
    for op in block.ops:
        yield op
        for inner in op.blocks() if op.name() in ("pd_op.if", "pd_op.while") else ():
            yield from all_ops(inner)


def unsupported_ops(program) -> Counter:
    """{PIR op: count} of the ops paddle2onnx has no converter for."""
    import paddle2onnx.paddle2onnx_cpp2py_export as p2o

    known = set(p2o.get_all_supported_operators_pir())
    missing: Counter = Counter()
    for op in all_ops(program.global_block()):
        name = op.name()
        if name in EXPORT_HANDLES:
            continue
        dialect, _, short = name.partition(".")
        converter = CONVERTER_NAMES.get(short, short) if dialect == "pd_op" else f"{dialect}_{short}"
        if converter not in known:
            missing[name] += 1
    return missing


def persistable_tensors(program) -> list[tuple[str, list | None]]:
    """(name, shape) of what the weights file holds for this program: its parameters and persistable data."""
    from paddle.static.pir_io import get_pir_parameters

    params, opts = get_pir_parameters(program)
    return [(v.name, [int(d) for d in v.shape]) for v in (*params, *opts) if v.persistable]


def _dtype(value) -> str:
    name = str(value).rpartition(".")[2].lower()
    if name not in PADDLE_DTYPES:
        raise UnsupportedError(f"a tensor of dtype {name}; the ONNX route takes {', '.join(PADDLE_DTYPES)}")
    return PADDLE_DTYPES[name]


def contract(program) -> tuple[list[TensorSpec], list[tuple[str, list]]]:
    """(input specs, [(output name, shape)]) from the program's feed/data and fetch ops, in column order."""
    feeds, fetches = [], []
    for i, op in enumerate(program.global_block().ops):
        name = op.name()
        if name in ("pd_op.data", "pd_op.feed"):
            feeds.append((op.attrs().get("col", i), op.attrs()["name"], op.result(0)))
        elif name == "pd_op.fetch":
            fetches.append((op.attrs().get("col", i), op.attrs()["name"], op.operand_source(0)))
    inputs = []
    for _, name, value in sorted(feeds, key=lambda t: t[0]):
        dtype = _dtype(value.dtype)
        shape = [int(d) if d >= 0 else ("batch" if axis == 0 else f"{name}_dim{axis}") for axis, d in enumerate(value.shape)]
        layout = "NCHW" if len(shape) == 4 and dtype.startswith(("float", "bfloat")) else guess_layout(shape)
        inputs.append(TensorSpec(name=name, dtype=dtype, shape=shape, layout=layout))
    if not inputs or not fetches:
        raise BadInputError(f"the program has {len(inputs)} feed and {len(fetches)} fetch ops; an inference program "
                            "(paddle.jit.save, save_inference_model) has both")
    outputs = [(name, [int(d) for d in value.shape]) for _, name, value in sorted(fetches, key=lambda t: t[0])]
    return inputs, outputs


class PaddleInferenceRunner:
    """A Paddle Inference predictor on the CPU (IR optimisation on, oneDNN off: see the module
    docstring); `run(feeds)` returns the fetch targets under the contract's output names."""

    def __init__(self, model: Path, weights: Path, output_names: list[str]):
        from paddle import inference

        config = inference.Config(str(model), str(weights))
        config.disable_gpu()
        config.disable_mkldnn()
        config.disable_glog_info()
        config.switch_ir_optim(True)
        self.predictor = inference.create_predictor(config)
        fetched = self.predictor.get_output_names()
        if len(fetched) != len(output_names):
            raise BadInputError(f"Paddle Inference fetches {len(fetched)} outputs, the program {len(output_names)}", path=model)
        self.fetch = dict(zip(output_names, fetched, strict=True))

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        for name, value in feeds.items():
            handle = self.predictor.get_input_handle(name)
            handle.reshape(list(np.shape(value)))
            handle.copy_from_cpu(np.ascontiguousarray(value))
        self.predictor.run()
        return {name: self.predictor.get_output_handle(fetched).copy_to_cpu() for name, fetched in self.fetch.items()}


@contextlib.contextmanager
def captured_stdout(into: Path):
    """File descriptor 1 (where paddle2onnx's C++ logger writes) sent to a file for the block."""
    import sys

    sys.stdout.flush()
    saved = os.dup(1)
    with open(into, "wb") as f:
        os.dup2(f.fileno(), 1)
        try:
            yield
        finally:
            os.dup2(saved, 1)
            os.close(saved)


def export(program_json: Path, weights: Path, opset: int, work: Path, path: Path):
    """paddle2onnx's C++ export (its checker on, its optimiser on) as an onnx.ModelProto."""
    import onnx
    import paddle2onnx.paddle2onnx_cpp2py_export as p2o

    log = work / "paddle2onnx.log"
    failure = None
    with captured_stdout(log):
        try:
            data = p2o.export(str(program_json), str(weights), opset, True, False, True, True, True, {}, "onnxruntime",
                              "", "", False)
        except Exception as e:
            data, failure = b"", one_line(e, 300)
    errors = [line.split("[ERROR]", 1)[1].strip() for line in log.read_text(errors="replace").splitlines() if "[ERROR]" in line]
    if failure or not data or errors:
        reason = failure or "; ".join(errors[:2]) or "it returned no model"
        raise BadInputError(f"paddle2onnx could not convert the program: {reason[:400]}", path=path)
    return onnx.load_from_string(data)


def lift_constants(model) -> int:
    """paddle2onnx writes every weight as a `Constant` node; here they become initializers (in
    place), where converters look for weights (onnx2tf fails on a Conv whose bias comes through a
    Constant node). Returns how many were lifted; a Constant that is a graph output stays."""
    graph = model.graph
    outputs = {v.name for v in graph.output}
    kept = []
    for node in graph.node:
        attrs = node.attribute
        if node.op_type == "Constant" and len(attrs) == 1 and attrs[0].name == "value" and node.output[0] not in outputs:
            tensor = graph.initializer.add()
            tensor.CopyFrom(attrs[0].t)
            tensor.name = node.output[0]
        else:
            kept.append(node)
    lifted = len(graph.node) - len(kept)
    del graph.node[:]
    graph.node.extend(kept)
    return lifted


def scalar_concat_inputs(model) -> int:
    """paddle2onnx 2.1 concatenates a 0-D shape value (Paddle 3 slices `x.shape[0]` to a scalar)
    with 1-D ones, as in `reshape(x, [x.shape[0], 200])`; ONNX's Concat needs one rank, so
    onnxruntime refuses the file (PP-OCR's recogniser and classifier, converted from their
    .pdmodel). Each 0-D input of a Concat whose other inputs are 1-D is unsqueezed to [1], in
    place; returns how many. Ranks come from onnx's shape inference; an unknown rank is left."""
    import onnx
    from onnx import helper

    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False)
    rank = {v.name: len(v.type.tensor_type.shape.dim) for v in [*inferred.graph.value_info, *inferred.graph.input,
                                                                 *inferred.graph.output]
            if v.type.tensor_type.HasField("shape")}
    rank.update({t.name: len(t.dims) for t in model.graph.initializer})
    for node in model.graph.node:
        if node.op_type == "Constant" and node.attribute and node.attribute[0].name == "value":
            rank[node.output[0]] = len(node.attribute[0].t.dims)
    fixed, nodes = 0, []
    axes = helper.make_tensor("modelport.unsqueeze_axes_0", onnx.TensorProto.INT64, [1], [0])
    for node in model.graph.node:
        ranks = [rank.get(i) for i in node.input]
        if node.op_type == "Concat" and 0 in ranks and 1 in ranks and None not in ranks:
            for k, (name, r) in enumerate(zip(list(node.input), ranks, strict=True)):
                if r == 0:
                    lifted = f"{name}.as_1d.{fixed}"
                    nodes.append(helper.make_node("Unsqueeze", [name, axes.name], [lifted], name=f"modelport.unsqueeze.{fixed}"))
                    node.input[k] = lifted
                    fixed += 1
        nodes.append(node)
    if fixed:
        model.graph.initializer.append(axes)
        del model.graph.node[:]
        model.graph.node.extend(nodes)
    return fixed


def folded(model):
    """`model` with its constant subgraphs folded and its Identity nodes gone, as paddle2onnx's own
    `export()` leaves it (it folds with Polygraphy; the C++ export called here does not): its raw
    graph keeps ~230 Identity nodes and the shape arithmetic of every reshape, on which onnx2tf
    builds a wrong TFLite model (PaddleOCR's classifier: cosine 0.80 against Paddle Inference;
    1.000000 folded). None when onnxscript (the `optimize` extra) is not installed."""
    try:
        import onnx_ir as ir
        import onnx_ir.passes.common as common
        from onnxscript.optimizer import fold_constants_ir
    except ImportError:
        return None
    graph = ir.from_proto(model)
    fold_constants_ir(graph)
    for step in (common.IdentityEliminationPass(), common.RemoveUnusedNodesPass()):
        step(graph)
    return ir.to_proto(graph)


def _named_outputs(outputs: list[tuple[str, list]], has_batch: bool) -> list[TensorSpec]:
    specs = []
    for name, shape in outputs:
        dims = [d if d >= 0 else ("batch" if axis == 0 and has_batch else f"{name}_dim{axis}") for axis, d in enumerate(shape)]
        specs.append(TensorSpec(name=name, shape=dims, layout="NC" if len(dims) == 2 else None))
    return specs


def inspect_in_child(work: Path, request: dict) -> dict:
    """`paddle.inspect`'s child side: the program's contract and op histogram, without its weights."""
    paddle = import_paddle()
    model = Path(request["model"])
    program, _ = load_program(paddle, model, work)
    inputs, outputs = contract(program)
    return {"format": "paddle pdmodel" if model.suffix.lower() == ".pdmodel" else "paddle pir json",
            "inputs": [{"name": s.name, "dtype": s.dtype, "shape": s.shape} for s in inputs],
            "outputs": [{"name": name, "shape": shape} for name, shape in outputs],
            "ops": dict(Counter(op.name() for op in all_ops(program.global_block())).most_common()),
            "unsupported_ops": dict(unsupported_ops(program)) or None, "size": model.stat().st_size}


def convert_in_child(work: Path, request: dict) -> dict:
    """Read, screen, reference, export and assemble the IR into `work/ir` (see the module docstring)."""
    from modelport.ir import specs_from_onnx
    from modelport.onnxfile.ir_version_fit import fit_ir_version
    from modelport.parsers.contract import follow_produced, merge_specs
    from modelport.parsers.onnx import convert_opset, infer_and_check
    from modelport.parsers.tf_common import rename_outputs, rename_values, set_dims, spec_from_dict
    from modelport.reference.input_roles import guessed_inputs
    from modelport.reference.sample_sets import reference_samples
    from modelport.reference.samples import sample_reference

    model, weights = Path(request["model"]), Path(request["weights"])
    spec = spec_from_dict(request["spec"])
    paddle = import_paddle()
    import paddle2onnx

    program, program_json = load_program(paddle, model, work)
    missing = unsupported_ops(program)
    if missing:
        listed = ", ".join(f"{name} ({n})" if n > 1 else name for name, n in sorted(missing.items()))
        raise UnsupportedError(f"paddle2onnx {paddle2onnx.__version__} has no converter for {len(missing)} op type(s): {listed}",
                               path=model)
    check_params(weights, persistable_tensors(program))
    inputs, fetched = contract(program)
    inputs = merge_specs(inputs, spec.inputs, fixed=True)
    names = rename_outputs([n for n, _ in fetched], spec, model)
    outputs = _named_outputs([(n, shape) for n, (_, shape) in zip(names, fetched, strict=True)],
                             any("batch" in s.shape for s in inputs))
    try:
        runner = PaddleInferenceRunner(model, weights, names)
    except BadInputError:
        raise
    except Exception as e:
        raise BadInputError(f"Paddle Inference cannot load the model: {one_line(e, 300)}", path=model) from None
    sampled = sample_reference(runner.run, inputs, spec.sample_dims, seed=spec.seed, given=spec.given, path=spec.path)
    sample, reference, spec.sample_dims = sampled.feeds, sampled.outputs, sampled.dims
    varies, extra, skipped = reference_samples(runner.run, inputs, sample, reference, spec.sample_dims, seed=spec.seed,
                                               given=spec.given, path=spec.path, **spec.sampling)

    onnx_model = export(program_json, weights, spec.opset or OPSET, work, model)
    graph_in = [v.name for v in onnx_model.graph.input if v.name not in {i.name for i in onnx_model.graph.initializer}]
    if len(graph_in) != len(inputs) or len(onnx_model.graph.output) != len(outputs):
        raise BadInputError(f"paddle2onnx gave {len(graph_in)} inputs and {len(onnx_model.graph.output)} outputs, the program "
                            f"has {len(inputs)} and {len(outputs)}", path=model)
    by_name = {s.name for s in inputs}
    mapping = dict(zip(graph_in, graph_in if set(graph_in) == by_name else [s.name for s in inputs], strict=True))
    mapping.update(zip([v.name for v in onnx_model.graph.output], names, strict=True))
    rename_values(onnx_model, mapping)
    lift_constants(onnx_model)
    scalars = scalar_concat_inputs(onnx_model)
    onnx_model = folded(onnx_model) or onnx_model
    repaired = (f"paddle2onnx concatenated {scalars} 0-D value(s) with 1-D ones, which onnxruntime refuses; each was "
                "unsqueezed to [1]") if scalars else None
    for values, specs in ((onnx_model.graph.input, inputs), (onnx_model.graph.output, outputs)):
        set_dims(values, specs)
    ir_note = fit_ir_version(onnx_model)
    if spec.opset:
        onnx_model = convert_opset(onnx_model, spec.opset, model)
    onnx_model = infer_and_check(onnx_model, model)
    graph_out = {s.name: s for s in specs_from_onnx(onnx_model.graph.output)}
    for o in outputs:
        o.dtype = graph_out[o.name].dtype if o.name in graph_out else o.dtype
    shape_notes = follow_produced(outputs, [reference, *(s.outputs for s in extra)], declared={o.name for o in outputs})
    if shape_notes:
        set_dims(onnx_model.graph.output, outputs)
    opset = next((o.version for o in onnx_model.opset_import if o.domain in ("", "ai.onnx")), None)
    producer = f"paddle {paddle.__version__} inference (CPU, IR optimisation on, oneDNN off)"
    ir = IRModel(
        model=onnx_model, inputs=inputs, outputs=outputs,
        provenance={"framework": "paddle", "format": "paddle pdmodel" if model.suffix.lower() == ".pdmodel" else "paddle pir json",
                    "path": str(model), "weights": str(weights), "paddle": paddle.__version__, "opset": opset,
                    "exporter": f"paddle2onnx {paddle2onnx.__version__}", "ir_version_note": ir_note,
                    "reference_varies": varies, "samples_skipped": skipped or None,
                    **({"warnings": notes} if (notes := [n for n in (sampled.note, *shape_notes, repaired) if n]) else {})},
        reference=Reference(sample, {o.name: np.asarray(reference[o.name]) for o in outputs}, producer=producer, extra=extra,
                            guessed=guessed_inputs(inputs, spec.given)),
        sample_dims=dict(spec.sample_dims),
    )
    ir.save(work / "ir")
    return {"producer": producer}
