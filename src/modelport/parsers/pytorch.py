"""PyTorch sources: ExportedProgram (.pt2), TorchScript, pickled nn.Module, state dicts
(.pt/.pth/.safetensors) with an architecture, and nn.Module objects passed from Python.

Safety: a plain state dict is read with `torch.load(weights_only=True)` or safetensors; anything
that runs code from the file (a pickled module, TorchScript) or imports code (`--arch pkg.mod:Class`)
is refused unless `trust` is set. `--arch zoo:NAME` builds our own zoo architecture, which needs
no trust.

Export: `torch.onnx.export(dynamo=True)` (torch.export-based, opset 18+), with named
`torch.export.Dim`s for every symbolic dim of the input specs. When it fails, the TorchScript
exporter (`dynamo=False`, opset 17) is tried with the same dynamic axes, and the report says which
exporter produced the model. The exporter's progress lines are kept off stdout.
"""

from __future__ import annotations

import json
import logging
import pickle
import struct
import zipfile
from pathlib import Path

from modelport.deps import require
from modelport.errors import BadInputError, ModelportError, UnsafeInputError
from modelport.file_checks import check_model_file
from modelport.ir import IRModel, Reference, TensorSpec, guess_layout, specs_from_onnx

NAME = "pytorch"
DESCRIPTION = "PyTorch: .pt2 ExportedProgram, TorchScript, pickled nn.Module, state dict (.pt/.pth/.safetensors) + --arch"
SUFFIXES = {".pt", ".pth", ".pt2", ".bin", ".ckpt", ".safetensors", ".torchscript", ".jit"}
MIN_TORCH = (2, 6)  # weights_only=True is unsafe before 2.6 (CVE-2025-32434)
SAFETENSORS_MAX_HEADER = 100 * 1024 * 1024


def _torch():
    return require("torch", purpose="PyTorch sources")

log = logging.getLogger(__name__)


def sniff(path: Path) -> bool:
    return path.is_file() and path.suffix.lower() in SUFFIXES


def _zip_names(path: Path) -> list[str]:
    try:
        with zipfile.ZipFile(path) as z:
            return z.namelist()
    except (zipfile.BadZipFile, OSError):
        return []


def file_format(path: Path) -> str:
    """'safetensors', 'exported_program', 'torchscript', 'pickle' (torch.save zip or legacy)."""
    if path.suffix.lower() == ".safetensors":
        return "safetensors"
    names = _zip_names(path)
    if any(n.endswith("serialized_exported_program.json") or "/models/" in n and n.endswith(".json") for n in names) or (
        path.suffix.lower() == ".pt2" and names
    ):
        return "exported_program"
    if any(n.endswith("/constants.pkl") for n in names) and any("/code/" in n for n in names):
        return "torchscript"
    if names:
        return "pickle"
    with open(path, "rb") as f:
        head = f.read(2)
    if head and head[0] == 0x80:  # legacy (non-zip) pickle protocol marker
        return "pickle"
    raise BadInputError("truncated or not a PyTorch file", path=path)


def _check_torch_version():
    torch = _torch()

    major, minor = (int(x) for x in torch.__version__.split("+")[0].split(".")[:2])
    if (major, minor) < MIN_TORCH:
        raise UnsafeInputError(
            f"torch {torch.__version__} cannot load weights safely (CVE-2025-32434)", hint="install torch>=2.6"
        )


def check_safetensors_header(path: Path) -> dict:
    size = path.stat().st_size
    with open(path, "rb") as f:
        raw = f.read(8)
        if len(raw) < 8:
            raise BadInputError("truncated safetensors file", path=path)
        (n,) = struct.unpack("<Q", raw)
        if n > SAFETENSORS_MAX_HEADER or n > size - 8:
            raise BadInputError(f"safetensors header of {n} bytes is larger than the file allows", path=path)
        try:
            header = json.loads(f.read(n))
        except (UnicodeDecodeError, json.JSONDecodeError):
            raise BadInputError("corrupt safetensors header", path=path) from None
    data_len = size - 8 - n
    for key, info in header.items():
        if key == "__metadata__":
            continue
        start, end = info.get("data_offsets", (0, 0))
        if not (0 <= start <= end <= data_len):
            raise BadInputError(f"safetensors tensor '{key}' has offsets outside the file", path=path)
    return header


def read_checkpoint(path: Path):
    """What a state-dict file holds, read without running code: a safetensors file's tensors, or
    the object `torch.load(weights_only=True)` gives (a state dict, or a checkpoint dict around one)."""
    torch = _torch()

    fmt = file_format(path)
    if fmt == "safetensors":
        check_safetensors_header(path)
        load_file = require("safetensors.torch", purpose="safetensors state dicts").load_file
        try:
            return load_file(str(path))
        except Exception as e:
            raise BadInputError(f"cannot read safetensors: {e}", path=path) from None
    try:
        return torch.load(str(path), map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        raise UnsafeInputError(f"unsafe pickle global, refusing to load: {_first_line(e)}", path=path, hint="a plain state dict loads without --trust") from None


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return text[0] if text else type(e).__name__


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

    from modelport.specs import ARCH_ARGS_EXAMPLE, arch_args_text, check_arch_args

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
        raise BadInputError(f"cannot build --arch '{arch}'{given}: {type(e).__name__}: {_first_line(e)}",
                            hint=None if args else f"give its constructor arguments with --arch-args, e.g. {ARCH_ARGS_EXAMPLE}") from None


def arch_parameters(arch: str, module) -> list[str]:
    """The constructor parameters `--arch-args` may set for `arch` (for an error's hint)."""
    from modelport.specs import check_arch_args

    if arch.startswith("zoo:"):
        from modelport import zoo

        return zoo.parameters(arch[4:])
    return check_arch_args(type(module), {}, arch)


def load_exported(path: Path):
    """The ExportedProgram of a `.pt2`, on the CPU: a program saved on a GPU is read from a copy of
    its archive with every device moved to the CPU (parsers/pytorch_devices.py); `saved_on` on the
    program names the devices the file had."""
    import tempfile

    from modelport.parsers.pytorch_containers import register_unknown_containers
    from modelport.parsers.pytorch_devices import archive_devices, cpu_archive

    register_unknown_containers(path)
    devices = sorted(d for d in archive_devices(path) if d != "cpu")
    try:
        if not devices:
            ep = _torch().export.load(str(path))
        else:
            with tempfile.TemporaryDirectory(prefix="modelport-pt2-") as tmp:
                ep = _torch().export.load(str(cpu_archive(path, Path(tmp))))
    except Exception as e:
        raise BadInputError(f"cannot load ExportedProgram: {_first_line(e)}", path=path) from None
    ep.saved_on = devices
    return ep


def _load_pickled_module(path: Path):
    """A whole pickled object (`torch.save(model)`, --trust given): its classes must be importable
    here, which a model saved from a script or notebook (`__main__`) never is."""
    try:
        return _torch().load(str(path), map_location="cpu", weights_only=False)
    except (AttributeError, ModuleNotFoundError, ImportError) as e:
        raise BadInputError(f"the pickled model's code cannot be imported here ({_first_line(e)})", path=path,
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
    _check_torch_version()
    fmt = file_format(path)
    if fmt == "exported_program":
        ep = load_exported(path)
        carried = exported_program_specs(ep)
        from modelport.parsers.pytorch_export import positional_program

        try:
            module = positional_program(ep)
            module.exported_program = ep
            module.saved_on = ep.saved_on
            return module, fmt, carried
        except Exception as e:
            raise BadInputError(f"cannot load ExportedProgram: {_first_line(e)}", path=path) from None
    if fmt == "torchscript":
        if not spec.trust:
            raise UnsafeInputError("TorchScript runs code from the file", path=path, hint="pass --trust if you trust it")
        from modelport.parsers.pytorch_devices import move_constants_to_cpu

        module = torch.jit.load(str(path), map_location="cpu").eval()
        module.saved_on = sorted(set(move_constants_to_cpu(module)))
        return module, fmt, None
    if fmt == "pickle" and not spec.arch:
        try:
            obj = torch.load(str(path), map_location="cpu", weights_only=True)
        except pickle.UnpicklingError as e:
            if not spec.trust:
                raise UnsafeInputError(f"unsafe pickle global, refusing to load: {_first_line(e)}", path=path, hint="pass --trust only if you trust the file") from None
            obj = _load_pickled_module(path)
        except Exception as e:
            raise BadInputError(f"truncated or not a PyTorch file: {_first_line(e)}", path=path) from None
        if isinstance(obj, torch.nn.Module):
            return obj.eval(), "pickled nn.Module", None
        raise BadInputError("a state dict needs an architecture", path=path, hint="pass --arch zoo:NAME or --arch package.module:Class")
    if not spec.arch:
        raise BadInputError("a state dict needs an architecture", path=path, hint="pass --arch zoo:NAME or --arch package.module:Class")
    from modelport.parsers.pytorch_checkpoints import find_state_dict, load_into

    try:
        checkpoint = read_checkpoint(path)
    except ModelportError:
        raise
    except Exception as e:
        raise BadInputError(f"truncated or not a PyTorch file: {_first_line(e)}", path=path) from None
    module = build_arch(spec.arch, trust=spec.trust, args=spec.arch_args)
    found = find_state_dict(checkpoint, path, expected=list(module.state_dict()), key=spec.state_dict_key, arch=spec.arch)
    load_into(module, found.state, arch=spec.arch, args=spec.arch_args, path=path,
              parameters=lambda: arch_parameters(spec.arch, module))
    module.checkpoint_entry = {**found.to_dict(), **({"warnings": [found.note()]} if found.note() else {})}
    return module.eval(), f"state dict ({fmt}) + {spec.arch}", None


def exported_program_specs(ep) -> tuple[list[TensorSpec], dict[str, int], dict[str, tuple[int, int | None]]]:
    """The input contract a `torch.export` program carries: (specs, sample dims, dim ranges).

    Names and dtypes come from the user-input placeholders, shapes from their fake tensors. A
    dynamic dim is a symbol (`s31`) whose name the saved program no longer knows: the symbol at
    axis 0 of the first input is `batch`, any other is named after the first input and axis it
    appears at (`mask_dim1`); inputs sharing a symbol share the name. Its range constraint bounds
    the sample size (the default 2, moved into the range) and goes back into the re-export.
    """
    torch = _torch()

    user = [s.arg.name for s in ep.graph_signature.input_specs if s.kind.name == "USER_INPUT"]
    nodes = {n.name: n for n in ep.graph.nodes if n.op == "placeholder"}
    ranges_by_symbol = {str(k): v for k, v in ep.range_constraints.items()}
    names = _dim_names(ep)
    specs, sample_dims, ranges = [], {}, {}
    for name in user:
        val = nodes[name].meta.get("val") if name in nodes else None
        if not isinstance(val, torch.Tensor):
            raise BadInputError(f"input '{name}' of the exported program is not a tensor ({type(val).__name__})",
                                hint="export the program with tensor inputs only")
        shape: list = []
        for d in val.shape:
            if isinstance(d, int):
                shape.append(d)
                continue
            symbol = str(d)
            if names[symbol] not in ranges:
                vr = ranges_by_symbol.get(symbol)
                lo = (_finite_int(vr.lower) or 0) if vr is not None else 0
                hi = _finite_int(vr.upper) if vr is not None else None
                ranges[names[symbol]] = (lo, hi)
                size = max(2, lo)
                if hi is not None:
                    size = min(size, hi)
                if size != 2 or lo > 1:  # a lower bound above 1 declares the size: a fixed-shape route keeps it
                    sample_dims[names[symbol]] = size
            shape.append(names[symbol])
        dtype = str(val.dtype).replace("torch.", "")
        specs.append(TensorSpec(name=name, dtype=dtype, shape=shape, layout=guess_layout(shape)))
    return specs, sample_dims, ranges


def _finite_int(bound) -> int | None:
    """A range bound as an int; None for torch's `int_oo` (which calls itself finite) or sympy's oo."""
    try:
        value = int(bound)
    except (TypeError, ValueError, AttributeError, OverflowError):
        return None
    return value if abs(value) < 1 << 62 else None


def _dim_names(ep) -> dict[str, str]:
    """symbol -> dim name, by first appearance among the user inputs (see exported_program_specs)."""
    user = [s.arg.name for s in ep.graph_signature.input_specs if s.kind.name == "USER_INPUT"]
    vals = {n.name: n.meta.get("val") for n in ep.graph.nodes if n.op == "placeholder"}
    names: dict[str, str] = {}
    for i, name in enumerate(user):
        for axis, d in enumerate(getattr(vals.get(name), "shape", ())):
            if not isinstance(d, int):
                names.setdefault(str(d), "batch" if (i == 0 and axis == 0) else f"{name}_dim{axis}")
    return names


def _exported_outputs(ep) -> list[dict]:
    """Name, dtype and shape (dynamic dims named as the inputs' are) of each user output."""
    names = _dim_names(ep)
    user = [s.arg.name for s in ep.graph_signature.output_specs if s.kind.name == "USER_OUTPUT"]
    out_node = next(n for n in ep.graph.nodes if n.op == "output")
    vals = {getattr(a, "name", None): a.meta.get("val") for a in out_node.args[0] if hasattr(a, "meta")}
    shown = _output_names_of_program(ep, len(user)) or user
    rows = []
    for name, label in zip(user, shown, strict=True):
        val = vals.get(name)
        shape = [d if isinstance(d, int) else names.get(str(d), str(d)) for d in val.shape] if hasattr(val, "shape") else None
        rows.append({"name": label, "dtype": str(val.dtype).replace("torch.", "") if hasattr(val, "dtype") else None,
                     "shape": shape})
    return rows


def _output_names_of_program(ep, count: int) -> list[str] | None:
    """The names `convert` gives the program's outputs (the keys of a dict or ModelOutput result)."""
    torch = _torch()
    from torch.utils import _pytree as pytree

    try:
        structure = pytree.tree_unflatten([torch.empty(0)] * count, ep.call_spec.out_spec)
    except Exception:
        return None
    names = output_names_of(structure)
    return names if len(names) == count else None


def zoo_specs(source, spec) -> list[TensorSpec]:
    """Input specs a zoo architecture declares, when the user gave none."""
    arch = source if isinstance(source, str) and source.startswith("zoo:") else spec.arch
    if arch and arch.startswith("zoo:"):
        from modelport import zoo

        return zoo.get(arch[4:]).input_specs()
    return []


def output_names_of(out, prefix: str = "") -> list[str]:
    """Names for a module's flattened outputs: dict/ModelOutput keys, else output_<i>."""
    torch = _torch()

    if isinstance(out, torch.Tensor):
        return [prefix or "output"]
    if isinstance(out, dict) or hasattr(out, "to_tuple"):
        keys = list(out.keys())
        names = []
        for k in keys:
            names += output_names_of(out[k], f"{prefix}{k}" if not prefix else f"{prefix}.{k}")
        return names
    if isinstance(out, (list, tuple)):
        names = []
        for i, v in enumerate(out):
            names += output_names_of(v, f"{prefix}{'_' if prefix else 'output_'}{i}")
        return names
    return []


def parse(source, spec) -> IRModel:
    import numpy as np
    torch = _torch()

    from modelport.parsers.onnx import convert_opset, infer_and_check
    from modelport.parsers.pytorch_export import export_model
    from modelport.runtimes.torch import TorchRunner, flatten_outputs
    from modelport.samples import make_inputs, reference_samples

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
            raise BadInputError(f"the model does not run on inputs {shapes}: {_first_line(e)}", path=spec.path) from None
    n_out = len(flatten_outputs(out))
    names = spec.output_names or output_names_of(out)
    if len(names) != n_out:
        raise BadInputError(f"{len(names)} output names given for {n_out} outputs", path=spec.path)
    runner = TorchRunner(module, input_names=[s.name for s in specs], output_names=names, inputs=specs)
    ref = runner.run(sample)
    varies, extra, skipped = reference_samples(runner.run, specs, sample, ref, spec.sample_dims, seed=spec.seed,
                                               given=spec.given, path=spec.path, **spec.sampling)

    program = getattr(module, "exported_program", None)
    kept = own_shapes == [(s.dtype, list(s.shape)) for s in specs]  # the saved program fits the contract as it is
    exported = export_model(module, args, specs, names, opset=spec.opset, ranges=ranges, program=program,
                            program_shapes_kept=kept, path=spec.path, weights_dir=spec.weights_dir)
    model, stored = exported.model, exported.stored
    fixed: dict[str, int] = {}
    for s in specs:  # a route that traced the sizes as constants fixed these dims to the sample's
        for i, d in enumerate(s.shape):
            if d in exported.fixed_dims:
                fixed[d] = int(sample[s.name].shape[i])
        s.shape = [fixed.get(d, d) if isinstance(d, str) else d for d in s.shape]
    if spec.opset:
        if stored is not None:  # the version converter is given the whole model
            from modelport.onnx_io import attach_external

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
                            extra=extra),
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
        from modelport.specs import positional_index

        for s in spec.inputs:
            index = positional_index(s.name)
            if index is not None:
                s.name = "input" if index == 0 else f"input_{index}"
            if not s.shape and not s.scalar:
                raise BadInputError(f"input '{s.name}' needs a shape, e.g. {s.name}:1x3x224x224 "
                                    f"(or {s.name}:scalar:int64 for a 0-d one)")
            s.layout = s.layout or guess_layout(s.shape)
        return spec.inputs, ranges
    from modelport.parsers.contract import merge_specs
    from modelport.specs import positional_index

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
        info["inputs"] = [{"name": s.name, "dtype": s.dtype, "shape": list(s.shape)} for s in exported_program_specs(ep)[0]]
        info["outputs"] = _exported_outputs(ep)
        info["ops"] = dict(sorted(_ep_ops(ep).items(), key=lambda kv: -kv[1]))
        info["parameters"] = int(sum(p.numel() for p in ep.state_dict.values()))
        return info
    if fmt == "torchscript":
        info["note"] = "TorchScript: contents not inspected without --trust (loading runs code)"
        return info
    from modelport.parsers.pytorch_checkpoints import find_state_dict

    found = find_state_dict(read_checkpoint(path), path)
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
