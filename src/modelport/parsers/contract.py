"""Building the I/O contract of a parsed model: user specs merged onto what the graph says, and
output shapes made to agree with what the source's own runtime returns."""

from __future__ import annotations

import numpy as np

from modelport.errors import BadInputError
from modelport.ir import TensorSpec, guess_layout
from modelport.resolve.specs import positional_index


def merge_specs(graph_specs: list[TensorSpec], user_specs: list[TensorSpec], *, what: str = "input",
                fixed: bool = False) -> list[TensorSpec]:
    """The graph's specs, with the user's name-matched overrides (shape, dtype, layout, preprocess).

    An unknown name is an error listing the names the model has. With `fixed` (the graph's dims
    and dtypes bind, as in an ONNX or TensorFlow graph), a spec that contradicts a fixed dim or
    the dtype is an error naming that dim, before any runtime is handed data it would reject.
    """

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


def follow_produced(outputs: list[TensorSpec], produced: list[dict], *, declared: set[str],
                    inferred=None) -> list[str]:
    """The output specs (in place) made to agree with what the source's own runtime returned on the
    sample sets (`produced`: one {name: array} per set), and a warning per output it changed.

    A declaration can be wrong (a file whose graph says [1, seqlen] where its runtime returns
    [20, 1, 8210]); every later hop is judged against the runtime's arrays, so the contract follows
    them. Only a contradiction is replaced: another rank, or a fixed size that differs. A declared
    symbolic dim stays symbolic even where every sample has one size. A replaced dim takes the
    produced size, or a symbolic dim where the sample sets differ in size or where `inferred`
    ({name: shape}, the graph's shape with the declaration set aside, asked only for the contradicted
    outputs) has a symbolic dim there. Outputs without a declared shape (not in `declared`) are left.
    """
    notes = []
    shapes = {s.name: [tuple(np.shape(p[s.name])) for p in produced if isinstance(p.get(s.name), np.ndarray)]
              for s in outputs if s.name in declared}
    wrong = [s for s in outputs if shapes.get(s.name) and _contradicts(s.shape, shapes[s.name])]
    guesses = (inferred([s.name for s in wrong]) if inferred and wrong else None) or {}
    for s in wrong:
        seen = shapes[s.name]
        told = list(seen[0]) if len(set(seen)) == 1 else " or ".join(str(list(x)) for x in sorted(set(seen)))
        if len({len(x) for x in seen}) > 1:
            notes.append(f"output '{s.name}': the model declares the shape {s.shape}, its runtime produces {told} on the "
                         "sample inputs (ranks that differ between samples); the declaration is kept")
            continue
        rank = len(seen[0])
        guess = guesses.get(s.name) or []
        guess = guess if len(guess) == rank else [None] * rank
        same_rank = len(s.shape) == rank
        new = []
        for i in range(rank):
            sizes = {x[i] for x in seen}
            if same_rank and (isinstance(s.shape[i], str) or sizes == {s.shape[i]}):
                new.append(s.shape[i])  # this dim agrees with the declaration
            elif isinstance(guess[i], str):
                new.append(guess[i])
            else:
                new.append(f"{s.name}_dim{i}" if len(sizes) > 1 else sizes.pop())
        notes.append(f"output '{s.name}': the model declares the shape {s.shape}, its runtime produces {told} on the "
                     f"sample inputs; the contract takes {new}")
        s.shape = new
        if not same_rank:
            s.layout = None
    return notes


def _contradicts(shape: list, seen: list[tuple]) -> bool:
    """Whether a declared shape disagrees with produced ones: another rank, or a fixed size that differs."""
    return any(len(x) != len(shape) or any(isinstance(d, int) and d != n for d, n in zip(shape, x, strict=True))
               for x in seen)
