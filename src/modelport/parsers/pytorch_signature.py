"""The inputs and outputs of a PyTorch model as `convert` names them: the input contract a
`torch.export` program carries (names, dtypes, shapes with named dynamic dims and their ranges), the
names of a model's outputs (dict or ModelOutput keys, else `output_<i>`), and a program's outputs
as `inspect` shows them.
"""

from __future__ import annotations

from modelport.deps import require
from modelport.errors import BadInputError
from modelport.ir import TensorSpec, guess_layout


def _torch():
    return require("torch", purpose="PyTorch sources")


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


def exported_outputs(ep) -> list[dict]:
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
