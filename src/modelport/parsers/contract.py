"""Building the I/O contract of a parsed model: user specs merged onto what the graph says."""

from __future__ import annotations

from modelport.errors import BadInputError
from modelport.ir import TensorSpec, guess_layout


def merge_specs(graph_specs: list[TensorSpec], user_specs: list[TensorSpec], *, what: str = "input",
                fixed: bool = False) -> list[TensorSpec]:
    """The graph's specs, with the user's name-matched overrides (shape, dtype, layout, preprocess).

    An unknown name is an error listing the names the model has. With `fixed` (the graph's dims
    and dtypes bind, as in an ONNX or TensorFlow graph), a spec that contradicts a fixed dim or
    the dtype is an error naming that dim, before any runtime is handed data it would reject.
    """
    from modelport.specs import positional_index

    by_name = {s.name: s for s in graph_specs}
    for u in user_specs:
        index = positional_index(u.name)
        if index is not None:
            if index >= len(graph_specs):
                raise BadInputError(f"{index + 1} {what} specs given, the model has {len(graph_specs)}: {list(by_name)}")
            u.name = graph_specs[index].name
        if u.name not in by_name:
            raise BadInputError(f"unknown {what} '{u.name}'; the model's {what}s are {list(by_name)}")
        g = by_name[u.name]
        if u.scalar and g.shape:
            raise BadInputError(f"{what} '{u.name}' has rank {len(g.shape)} {g.shape}, the spec gives a scalar (0-d)")
        if u.shape:
            if len(u.shape) != len(g.shape) and g.shape:
                raise BadInputError(f"{what} '{u.name}' has rank {len(g.shape)} {g.shape}, the spec gives {u.shape}")
            if fixed:
                check_fixed_dims(g, u.shape, what)
            g.shape = list(u.shape)
        if u.dtype and u.dtype != "float32":
            if fixed and g.dtype and u.dtype != g.dtype:
                raise BadInputError(f"{what} '{u.name}' is {g.dtype} in the model, the spec gives {u.dtype}")
            g.dtype = u.dtype
        g.layout = u.layout or g.layout
        g.preprocess = u.preprocess or g.preprocess
        g.value_range = u.value_range or g.value_range
    for g in graph_specs:
        if g.layout is None:
            g.layout = guess_layout(g.shape)
    return graph_specs


def check_fixed_dims(graph: TensorSpec, shape: list, what: str = "input") -> None:
    """A user shape may size the graph's dynamic dims, not change its fixed ones."""
    for i, (g, u) in enumerate(zip(graph.shape, shape, strict=False)):
        if isinstance(g, int) and g != u:
            given = f"{u}" if isinstance(u, int) else f"'{u}' (a dynamic dim)"
            raise BadInputError(f"{what} '{graph.name}' dim {i} is fixed at {g} in the model {graph.shape}, "
                                f"the spec gives {given}")
