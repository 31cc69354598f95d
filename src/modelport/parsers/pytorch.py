"""PyTorch sources: ExportedProgram (.pt2), TorchScript, pickled nn.Module, state dicts
(.pt/.pth/.safetensors) with an architecture, and nn.Module objects passed from Python.

Safety: a plain state dict is read with `torch.load(weights_only=True)` or safetensors; anything
that runs code from the file (a pickled module, TorchScript, a checkpoint with pickled objects
beside its weights) or imports code (`--arch pkg.mod:Class`) is refused unless `trust` is set.
`--arch zoo:NAME` builds our own zoo architecture, which needs no trust. What kind of file a path
is and how its weights are read: parsers/pytorch_files.py.

Inputs: a zoo entry's or a `.pt2`'s own contract (parsers/pytorch_signature.py) with `--input`
overriding by name, else `--input` alone; outputs are named after the keys of a dict or
ModelOutput result, else `output_<i>`.

Export: `torch.onnx.export(dynamo=True)` (torch.export-based, opset 18+), with named
`torch.export.Dim`s for every symbolic dim of the input specs. When it fails, the TorchScript
exporter (`dynamo=False`, opset 17) is tried with the same dynamic axes, and the report says which
exporter produced the model. The exporter's progress lines are kept off stdout.
"""

from __future__ import annotations

import logging
import pickle
from pathlib import Path

from modelport.deps import require
from modelport.errors import BadInputError, ModelportError, UnsafeInputError, one_line
from modelport.ir import IRModel, Reference, TensorSpec, guess_layout, specs_from_onnx
from modelport.onnxfile.external_data_files import attach_external
from modelport.parsers.contract import merge_specs
from modelport.parsers.onnx import convert_opset, infer_and_check
from modelport.parsers.pytorch_checkpoints import find_state_dict, load_into
from modelport.parsers.pytorch_containers import register_unknown_containers
from modelport.parsers.pytorch_devices import archive_devices, cpu_archive, move_constants_to_cpu
from modelport.parsers.pytorch_export import export_model, positional_program
from modelport.parsers.pytorch_files import check_torch_version, file_format, read_checkpoint
from modelport.parsers.pytorch_signature import exported_outputs, exported_program_specs, output_names_of
from modelport.reference.input_roles import apply_roles, controls, guessed_inputs
from modelport.reference.sample_sets import reference_samples
from modelport.reference.samples import make_inputs, run_reference
from modelport.resolve.specs import ARCH_ARGS_EXAMPLE, arch_args_text, check_arch_args, positional_index
from modelport.run.file_checks import check_model_file
from modelport.runtimes.torch import TorchRunner, flatten_outputs

NAME = "pytorch"
DESCRIPTION = "PyTorch: .pt2 ExportedProgram, TorchScript, pickled nn.Module, state dict (.pt/.pth/.safetensors) + --arch"
SUFFIXES = {".pt", ".pth", ".pt2", ".bin", ".ckpt", ".safetensors", ".torchscript", ".jit"}


def _torch():
    return require("torch", purpose="PyTorch sources")

log = logging.getLogger(__name__)


def sniff(path: Path) -> bool:
    return path.is_file() and path.suffix.lower() in SUFFIXES


def build_arch(arch: str, *, trust: bool, args: dict | None = None):
    """An nn.Module from 'zoo:NAME' or 'package.module:Class' (the latter imports code), built
    with `args` (`--arch-args`) as keyword arguments; an argument the constructor does not take,
    or a constructor that fails on them, is exit 2."""
    args = dict(args or {})
    if arch.startswith("zoo:"):
        from modelport import zoo
        return zoo.build(arch[4:], args=args)
    if ":" not in arch:
        raise BadInputError(f"--arch '{arch}' must be 'zoo:NAME' or 'package.module:Class'")
    if not trust:
        raise UnsafeInputError(f"--arch '{arch}' imports and runs code", hint="pass --trust if you trust it")
    import importlib


    mod, _, cls = arch.partition(":")
    try:
        factory = getattr(importlib.import_module(mod), cls)
    except (ImportError, AttributeError) as e:
        raise BadInputError(f"cannot build --arch '{arch}': {e}") from None
    check_arch_args(factory, args, f"--arch {arch}")
    try:
        return factory(**args)
    except Exception as e:
        given = f" with --arch-args {arch_args_text(args)}" if args else ""
        raise BadInputError(f"cannot build --arch '{arch}'{given}: {one_line(e, typed=True)}",
                            hint=None if args else f"give its constructor arguments with --arch-args, e.g. {ARCH_ARGS_EXAMPLE}") from None


def arch_parameters(arch: str, module) -> list[str]:
    """The constructor parameters `--arch-args` may set for `arch` (for an error's hint)."""

    if arch.startswith("zoo:"):
        from modelport import zoo
        return zoo.parameters(arch[4:])
    return check_arch_args(type(module), {}, arch)


def load_exported(path: Path):
    """The ExportedProgram of a `.pt2`, on the CPU: a program saved on a GPU is read from a copy of
    its archive with every device moved to the CPU (parsers/pytorch_devices.py); `saved_on` on the
    program names the devices the file had."""
    import tempfile


    register_unknown_containers(path)
    devices = sorted(d for d in archive_devices(path) if d != "cpu")
    try:
        if not devices:
            ep = _torch().export.load(str(path))
        else:
            with tempfile.TemporaryDirectory(prefix="modelport-pt2-") as tmp:
                ep = _torch().export.load(str(cpu_archive(path, Path(tmp))))
    except Exception as e:
        raise BadInputError(f"cannot load ExportedProgram: {one_line(e)}", path=path) from None
    ep.saved_on = devices
    return ep


def _load_pickled_module(path: Path):
    """A whole pickled object (`torch.save(model)`, --trust given): its classes must be importable
    here, which a model saved from a script or notebook (`__main__`) never is."""
    try:
        return _torch().load(str(path), map_location="cpu", weights_only=False)
    except (AttributeError, ModuleNotFoundError, ImportError) as e:
        raise BadInputError(f"the pickled model's code cannot be imported here ({one_line(e)})", path=path,
                            hint="save a .pt2 (torch.export), TorchScript, or a state dict and pass --arch") from None


def load_module(source, spec):
    """(the nn.Module (in eval mode) a source names, how it was loaded, the input contract the
    file carries: `exported_program_specs` of a `.pt2`, else None)."""
    torch = _torch()

    if isinstance(source, torch.nn.Module):
        return source.eval(), "nn.Module", None
    if isinstance(source, str) and source.startswith("zoo:"):
        return build_arch(source, trust=spec.trust, args=spec.arch_args).eval(), "zoo", None
    path = check_model_file(source, kind="PyTorch model")
    check_torch_version()
    fmt = file_format(path)
    if fmt == "exported_program":
        ep = load_exported(path)
        carried = exported_program_specs(ep)

        try:
            module = positional_program(ep)
            module.exported_program = ep
            module.saved_on = ep.saved_on
            return module, fmt, carried
        except Exception as e:
            raise BadInputError(f"cannot load ExportedProgram: {one_line(e)}", path=path) from None
    if fmt == "torchscript":
        if not spec.trust:
            raise UnsafeInputError("TorchScript runs code from the file", path=path, hint="pass --trust if you trust it")

        module = torch.jit.load(str(path), map_location="cpu").eval()
        module.saved_on = sorted(set(move_constants_to_cpu(module)))
        return module, fmt, None
    if fmt == "pickle" and not spec.arch:
        try:
            obj = torch.load(str(path), map_location="cpu", weights_only=True)
        except pickle.UnpicklingError as e:
            if not spec.trust:
                raise UnsafeInputError(f"unsafe pickle global, refusing to load: {one_line(e)}", path=path, hint="pass --trust only if you trust the file") from None
            obj = _load_pickled_module(path)
        except Exception as e:
            raise BadInputError(f"truncated or not a PyTorch file: {one_line(e)}", path=path) from None
        if isinstance(obj, torch.nn.Module):
            return obj.eval(), "pickled nn.Module", None
        raise BadInputError("a state dict needs an architecture", path=path, hint="pass --arch zoo:NAME or --arch package.module:Class")
    if not spec.arch:
        raise BadInputError("a state dict needs an architecture", path=path, hint="pass --arch zoo:NAME or --arch package.module:Class")

    try:
        checkpoint, trusted = read_checkpoint(path, trust=spec.trust)
    except ModelportError:
        raise
    except Exception as e:
        raise BadInputError(f"truncated or not a PyTorch file: {one_line(e)}", path=path) from None
    module = build_arch(spec.arch, trust=spec.trust, args=spec.arch_args)
    found = find_state_dict(checkpoint, path, expected=list(module.state_dict()), key=spec.state_dict_key, arch=spec.arch)
    load_into(module, found.state, arch=spec.arch, args=spec.arch_args, path=path,
              parameters=lambda: arch_parameters(spec.arch, module), closest=found.closest)
    warnings = [w for w in (trusted, found.note()) if w]
    module.checkpoint_entry = {**found.to_dict(), **({"warnings": warnings} if warnings else {})}
    return module.eval(), f"state dict ({fmt}) + {spec.arch}", None


def zoo_specs(source, spec) -> list[TensorSpec]:
    """Input specs a zoo architecture declares, when the user gave none."""
    arch = source if isinstance(source, str) and source.startswith("zoo:") else spec.arch
    if arch and arch.startswith("zoo:"):
        from modelport import zoo
        return zoo.get(arch[4:]).input_specs()
    return []


def parse(source, spec) -> IRModel:
    import numpy as np
    torch = _torch()


    module, how, carried = load_module(source, spec)
    own_shapes = [(c.dtype, list(c.shape)) for c in carried[0]] if carried is not None else None
    specs, ranges = _input_specs(source, spec, carried)
    sample = make_inputs(specs, spec.sample_dims, seed=spec.seed, given=spec.given, path=spec.path)
    args = [torch.from_numpy(sample[s.name]) for s in specs]
    torch.manual_seed(spec.seed)
    with torch.no_grad():
        try:
            out = module(*args)
        except Exception as e:
            shapes = {s.name: list(s.shape) for s in specs}
            raise BadInputError(f"the model does not run on inputs {shapes}: {one_line(e)}", path=spec.path) from None
    n_out = len(flatten_outputs(out))
    names = spec.output_names or output_names_of(out)
    if len(names) != n_out:
        raise BadInputError(f"{len(names)} output names given for {n_out} outputs", path=spec.path)
    program = getattr(module, "exported_program", None)
    kept = own_shapes == [(s.dtype, list(s.shape)) for s in specs]  # the saved program fits the contract as it is
    exported = export_model(module, args, specs, names, opset=spec.opset, ranges=ranges, program=program,
                            program_shapes_kept=kept, path=spec.path, weights_dir=spec.weights_dir)
    model, stored = exported.model, exported.stored
    # what the exported graph shows of each input (token ids, a mask, a size): an integer input
    # given a range gets samples it can take, and the references are computed on those
    ranges_before = [s.value_range for s in specs]
    keep = controls(apply_roles(specs, model, spec.given), specs)
    if [s.value_range for s in specs] != ranges_before:
        sample = make_inputs(specs, spec.sample_dims, seed=spec.seed, given=spec.given, path=spec.path)
    runner = TorchRunner(module, input_names=[s.name for s in specs], output_names=names, inputs=specs)
    torch.manual_seed(spec.seed)
    ref = run_reference(runner.run, sample, specs, spec.given, spec.path)
    varies, extra, skipped = reference_samples(runner.run, specs, sample, ref, spec.sample_dims, seed=spec.seed,
                                               given=spec.given, path=spec.path, keep=keep, **spec.sampling)
    fixed: dict[str, int] = {}
    for s in specs:  # a route that traced the sizes as constants fixed these dims to the sample's
        for i, d in enumerate(s.shape):
            if d in exported.fixed_dims:
                fixed[d] = int(sample[s.name].shape[i])
        s.shape = [fixed.get(d, d) if isinstance(d, str) else d for d in s.shape]
    if spec.opset:
        if stored is not None:  # the version converter is given the whole model

            attach_external(model, stored)
            stored = None
        model = convert_opset(model, spec.opset, spec.path)
    model = infer_and_check(model, spec.path)
    outputs = specs_from_onnx(model.graph.output)
    # Keep the user's layout/preprocess on inputs; the graph's shapes for outputs.
    graph_in = {s.name: s for s in specs_from_onnx(model.graph.input)}
    for s in specs:
        if s.name in graph_in and graph_in[s.name].dtype != s.dtype:
            s.dtype = graph_in[s.name].dtype
    for o in outputs:
        o.layout = guess_layout(o.shape) if len(o.shape) == 2 else None
    src = str(spec.path) if spec.path else (source if isinstance(source, str) else type(module).__name__)
    return IRModel(
        model=model,
        inputs=specs,
        outputs=outputs,
        provenance={
            "framework": "pytorch", "format": how, "path": src, "exporter": exported.exporter,
            "exporter_fallback_reason": next((a.reason for a in exported.attempts if not a.ok), None),
            "export_attempts": [a.to_dict() for a in exported.attempts],
            "fixed_dims": fixed or None,
            "opset": next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None),
            "reference_varies": varies,
            "samples_skipped": skipped or None,
            "saved_on": getattr(module, "saved_on", None) or None,
            **({"arch": spec.arch} if spec.arch else {}), **({"arch_args": dict(spec.arch_args)} if spec.arch_args else {}),
            **(getattr(module, "checkpoint_entry", None) or {}),
        },
        reference=Reference(sample, {k: np.asarray(v) for k, v in ref.items()}, producer=f"torch {torch.__version__}",
                            extra=extra, guessed=guessed_inputs(specs, spec.given)),
        sample_dims=dict(spec.sample_dims),
        stored=stored,
    )


def _input_specs(source, spec, carried=None) -> tuple[list[TensorSpec], dict[str, tuple[int, int | None]]]:
    """(input specs, dim ranges): a zoo entry's or the `.pt2`'s own, with `--input` overriding by
    name; else `--input` alone (an nn.Module, TorchScript or a state dict carries none)."""
    base, ranges = zoo_specs(source, spec), {}
    if carried is not None:
        base, carried_dims, ranges = carried
        spec.sample_dims = {**carried_dims, **spec.sample_dims}  # --dim wins
    if not spec.inputs:
        if not base:
            raise BadInputError(
                "PyTorch sources need input specs", path=spec.path,
                hint="pass --input NAME:SHAPE[:DTYPE], e.g. --input input:batch,3,224,224",
            )
        return base, ranges
    if not base:

        for s in spec.inputs:
            index = positional_index(s.name)
            if index is not None:
                s.name = "input" if index == 0 else f"input_{index}"
            if not s.shape and not s.scalar:
                raise BadInputError(f"input '{s.name}' needs a shape, e.g. {s.name}:1x3x224x224 "
                                    f"(or {s.name}:scalar:int64 for a 0-d one)")
            s.layout = s.layout or guess_layout(s.shape)
        return spec.inputs, ranges

    given = [s.name for s in spec.inputs]
    if carried is not None and len(given) == len(base) and not any(
            n in {b.name for b in base} or positional_index(n) is not None for n in given):
        # A `.pt2` with --input naming every input anew (as before programs carried names): the
        # names are the user's, in order; shapes and dtypes still come from the program unless given.
        for b, name in zip(base, given, strict=True):
            b.name = name
    return merge_specs(base, spec.inputs), ranges


def inspect(path: Path) -> dict:
    """Format, tensors and parameter count of a PyTorch file, loading nothing that runs code."""
    _torch()  # a missing torch is exit 5 before the file is read
    path = check_model_file(path, kind="PyTorch model")
    fmt = file_format(path)
    info: dict = {"format": fmt, "size": path.stat().st_size}
    if fmt == "exported_program":
        ep = load_exported(path)
        specs, _, ranges = exported_program_specs(ep)
        info["inputs"] = [{"name": s.name, "dtype": s.dtype, "shape": list(s.shape)} for s in specs]
        # the program's range constraints: a dim bounded above is a range (`inspect` shows it, orchestration/inspect.add_dims)
        bounded = {s.name: {d: {"kind": "range", "min": max(ranges[d][0], 0), "max": ranges[d][1]}
                            for d in s.shape if isinstance(d, str) and ranges.get(d, (0, None))[1] is not None}
                   for s in specs}
        if any(bounded.values()):
            info["dynamic_dims"] = {name: dims for name, dims in bounded.items() if dims}
        info["outputs"] = exported_outputs(ep)
        info["ops"] = dict(sorted(_ep_ops(ep).items(), key=lambda kv: -kv[1]))
        info["parameters"] = int(sum(p.numel() for p in ep.state_dict.values()))
        return info
    if fmt == "torchscript":
        info["note"] = "TorchScript: contents not inspected without --trust (loading runs code)"
        return info

    found = find_state_dict(read_checkpoint(path)[0], path)
    state = found.state
    if found.key is not None:
        info["state_dict_key"] = found.key  # the checkpoint entry these figures describe
    info["tensors"] = len(state)
    info["parameters"] = int(sum(t.numel() for t in state.values()))
    info["dtypes"] = sorted({str(t.dtype).replace("torch.", "") for t in state.values()})
    return info


def _ep_ops(ep) -> dict:
    from collections import Counter

    return Counter(str(n.target) for n in ep.graph.nodes if n.op == "call_function")
