"""Finding the weights in a PyTorch checkpoint as people save them, and loading them into `--arch`.

A training script rarely saves a bare state dict: `{"model_state": ..., "optimizer_state": ...,
"step": 42}`, Lightning's `{"state_dict": ...}`, an EMA copy beside the live weights, keys
prefixed `module.` by DataParallel or `_orig_mod.` by `torch.compile`. `find_state_dict` looks
at every dict of tensors up to two levels down and takes the one whose keys are the
architecture's (after removing such a common prefix); two that fit are ambiguous (exit 2 naming
both and `--state-dict-key`). The key it used goes into the report.

`load_into` loads them; a checkpoint of another configuration of the class (a "tiny" one into the
default "full" constructor) is exit 2 naming the missing and unexpected keys and the first size
mismatches, with the constructor's parameters `--arch-args` can set.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from modelport.errors import BadInputError
from modelport.specs import arch_args_text

MAX_DEPTH = 2  # checkpoint["model_state"], checkpoint["checkpoint"]["model"]
PREFIX_LEVELS = 2  # "module.", "module._orig_mod."
SHOWN = 5  # keys and mismatches named in a message


@dataclass
class Found:
    """A state dict and where in the checkpoint it was: `key` ('a' or 'a.b'; None: the file is one),
    `prefix` removed from its keys, and whether the key was found by matching keys (`searched`)."""

    state: dict
    key: str | None = None
    prefix: str = ""
    searched: bool = False

    def to_dict(self) -> dict:
        """The provenance entries (none for a plain state dict)."""
        out = {}
        if self.key is not None:
            out["state_dict_key"] = self.key
        if self.prefix:
            out["state_dict_prefix_removed"] = self.prefix
        return out

    def note(self) -> str | None:
        """The warning that says where the weights came from, when modelport chose it."""
        if not self.searched and not self.prefix:
            return None
        parts = []
        if self.key is not None and self.searched:
            parts.append(f"the weights were read from the checkpoint's '{self.key}' entry, the one dict of tensors "
                         f"whose keys fit the architecture (--state-dict-key {self.key} names it)")
        if self.prefix:
            parts.append(f"the prefix '{self.prefix}' was removed from its keys")
        return "; ".join(parts)


def _tensor_dict(obj) -> bool:
    import torch

    return (isinstance(obj, dict) and bool(obj) and all(isinstance(k, str) for k in obj)
            and all(isinstance(v, torch.Tensor) for v in obj.values()))


def candidates(obj) -> dict[str, dict]:
    """'key' or 'key.inner' -> every dict of tensors inside a checkpoint dict, up to MAX_DEPTH levels."""
    found: dict[str, dict] = {}

    def walk(node, path: str, depth: int) -> None:
        if depth > MAX_DEPTH or not isinstance(node, dict):
            return
        for k, v in node.items():
            if not isinstance(k, str):
                continue
            where = f"{path}.{k}" if path else k
            if _tensor_dict(v):
                found[where] = v
            else:
                walk(v, where, depth + 1)

    walk(obj, "", 1)
    return found


def _strip(state: dict, expected: set[str]) -> tuple[dict, str]:
    """`state` with the common dotted prefix of its keys removed (up to PREFIX_LEVELS levels) when
    that makes more of them the architecture's; else as it is."""
    best, best_prefix, best_score = state, "", len(set(state) & expected)
    keys, prefix = list(state), ""
    for _ in range(PREFIX_LEVELS):
        heads = {k.split(".", 1)[0] for k in keys}
        if len(heads) != 1 or any("." not in k for k in keys):
            break
        prefix += heads.pop() + "."
        keys = [k[len(prefix):] for k in state]
        score = len(set(keys) & expected)
        if score > best_score:
            best, best_prefix, best_score = {k[len(prefix):]: v for k, v in state.items()}, prefix, score
    return best, best_prefix


def _at(obj, key: str, path) -> dict:
    """The entry `key` names: a top-level key as it is, else 'outer.inner'."""
    node = obj.get(key) if isinstance(obj, dict) else None
    if node is None and isinstance(obj, dict) and "." in key:
        outer, _, inner = key.partition(".")
        node = obj.get(outer).get(inner) if isinstance(obj.get(outer), dict) else None
    if node is None:
        keys = sorted(k for k in obj if isinstance(k, str)) if isinstance(obj, dict) else []
        raise BadInputError(f"--state-dict-key '{key}' is not in the checkpoint (its keys: {keys[:10]})", path=path)
    if not _tensor_dict(node):
        raise BadInputError(f"the checkpoint's '{key}' is not a dict of tensors ({type(node).__name__})", path=path,
                            hint=_offer(obj))
    return node


def _offer(obj) -> str | None:
    found = candidates(obj)
    return f"dicts of tensors in it: {', '.join(found)}" if found else None


def _describe(obj) -> str:
    if isinstance(obj, dict):
        keys = [str(k) for k in list(obj)[:8]]
        return f"a dict with keys {keys}{'…' if len(obj) > 8 else ''}"
    return type(obj).__name__


def find_state_dict(obj, path: Path | None, *, expected: list[str] | None = None, key: str | None = None,
                    arch: str | None = None) -> Found:
    """The state dict in `obj` (what the file holds): `key`'s entry when given; the object itself
    when it is a dict of tensors; else the one nested dict of tensors whose keys are `expected`
    (the architecture's), or the only one there is, or the one sharing the most keys with it."""
    want = set(expected or ())
    if key:
        found = Found(_at(obj, key, path), key)
    elif _tensor_dict(obj):
        found = Found(obj)
    else:
        nested = candidates(obj)
        if not nested:
            raise BadInputError(f"expected a state dict of tensors, found {_describe(obj)} with no dict of tensors "
                                f"in it (looked {MAX_DEPTH} levels down)", path=path)
        found = Found(*_choose(nested, want, path, arch), searched=True)
    if want:
        stripped, prefix = _strip(found.state, want)
        found.state, found.prefix = stripped, prefix
    return found


def _choose(nested: dict[str, dict], want: set[str], path, arch: str | None) -> tuple[dict, str]:
    if len(nested) == 1 or not want:
        name = max(nested, key=lambda k: len(nested[k])) if len(nested) > 1 else next(iter(nested))
        return nested[name], name
    fits = [k for k, v in nested.items() if set(_strip(v, want)[0]) == want]
    if len(fits) == 1:
        return nested[fits[0]], fits[0]
    if len(fits) > 1:
        raise BadInputError(f"the checkpoint holds {len(fits)} state dicts that fit --arch {arch}: {', '.join(fits)}",
                            path=path, hint=f"pick one with --state-dict-key, e.g. --state-dict-key {fits[0]}")
    overlap = {k: len(set(_strip(v, want)[0]) & want) for k, v in nested.items()}
    best = max(overlap.values())
    top = [k for k, n in overlap.items() if n == best]
    if best and len(top) == 1:
        return nested[top[0]], top[0]
    listed = ", ".join(f"{k} ({overlap[k]} of {len(want)} keys)" for k in nested)
    raise BadInputError(f"none of the checkpoint's dicts of tensors fits --arch {arch}: {listed}", path=path,
                        hint="pick one with --state-dict-key NAME, or give the architecture the checkpoint was saved from")


def _shape(t) -> list[int]:
    return [int(d) for d in t.shape]


def _listed(items: list[str]) -> str:
    more = f", … {len(items) - SHOWN} more" if len(items) > SHOWN else ""
    return ", ".join(items[:SHOWN]) + more


def load_into(module, state: dict, *, arch: str, args: dict, path, parameters: Callable[[], list[str]]) -> None:
    """`state` loaded into `module`; exit 2 naming the missing and unexpected keys and the first size
    mismatches (name, checkpoint shape vs model shape) when it does not fit."""
    own = module.state_dict()
    try:
        result = module.load_state_dict(state, strict=False)
        missing, unexpected, mismatched = list(result.missing_keys), list(result.unexpected_keys), []
    except RuntimeError:  # size mismatches raise even with strict=False
        missing = [k for k in own if k not in state]
        unexpected = [k for k in state if k not in own]
        mismatched = [f"{k} checkpoint {_shape(state[k])} vs model {_shape(own[k])}" for k in own
                      if k in state and hasattr(state[k], "shape") and _shape(state[k]) != _shape(own[k])]
    if not (missing or unexpected or mismatched):
        return
    problems = []
    if missing:
        problems.append(f"{len(missing)} missing key(s) ({_listed(missing)})")
    if unexpected:
        problems.append(f"{len(unexpected)} unexpected key(s) ({_listed(unexpected)})")
    if mismatched:
        problems.append(f"{len(mismatched)} size mismatch(es): {_listed(mismatched)}")
    built = f" built with --arch-args {arch_args_text(args)}" if args else ""
    takes = parameters()
    hint = (f"{arch} takes {', '.join(takes)}: give the configuration the checkpoint was saved from with "
            f"--arch-args NAME=VALUE,…" if takes else
            f"{arch} takes no constructor arguments: the checkpoint is for another architecture")
    raise BadInputError(f"the state dict does not fit --arch {arch}{built}: {'; '.join(problems)}", path=path, hint=hint)
