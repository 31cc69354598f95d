"""Finding the weights in a PyTorch checkpoint as people save them, and loading them into `--arch`.

A training script rarely saves a bare state dict: `{"model_state": ..., "optimizer_state": ...,
"step": 42}`, Lightning's `{"state_dict": ...}`, an EMA copy beside the live weights, keys
prefixed `module.` by DataParallel, `_orig_mod.` by `torch.compile` or `model.` by a
LightningModule, or an architecture that holds the saved network under a prefix of its own
(`self.net = Net()`), or a LightningModule whose network is one attribute beside state of its own
(`encoder.*` and a top-level `shift` buffer). `find_state_dict` looks at every dict of tensors up to
two levels down and takes the one whose keys are the architecture's, after removing the
checkpoint's common prefix and/or adding the architecture's (up to two levels each) when that makes
every key fit; failing that, the keys under one prefix of the checkpoint (`encoder.`,
`model.encoder.`) when they are exactly the architecture's, the others left out. Two that fit are
ambiguous (exit 2 naming both: `--state-dict-key` for two entries, the two prefixes for two
subtrees). The key it used, the prefix it removed or added and the keys it left out go into the
report, with a warning; when nothing fits, the misfit names the prefix whose keys came closest.

`load_into` loads them; a checkpoint of another configuration of the class (a "tiny" one into the
default "full" constructor) is exit 2 naming the missing and unexpected keys and the first size
mismatches, with the constructor's parameters `--arch-args` can set.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from modelport.errors import BadInputError
from modelport.resolve.specs import arch_args_text

MAX_DEPTH = 2  # checkpoint["model_state"], checkpoint["checkpoint"]["model"]
PREFIX_LEVELS = 2  # "module.", "module._orig_mod."
SHOWN = 5  # keys and mismatches named in a message


@dataclass
class Found:
    """A state dict and where in the checkpoint it was: `key` ('a' or 'a.b'; None: the file is one),
    the `prefix` removed from its keys and the one `added` to them to fit `arch`, and whether the
    key was found by matching keys (`searched`)."""

    state: dict
    key: str | None = None
    prefix: str = ""
    searched: bool = False
    added: str = ""
    arch: str | None = None
    left_out: list[str] = field(default_factory=list)
    closest: str | None = None

    def to_dict(self) -> dict:
        """The provenance entries (none for a plain state dict)."""
        out = {}
        if self.key is not None:
            out["state_dict_key"] = self.key
        if self.prefix:
            out["state_dict_prefix_removed"] = self.prefix
        if self.added:
            out["state_dict_prefix_added"] = self.added
        if self.left_out:
            out["state_dict_keys_left_out"] = list(self.left_out)
        return out

    def note(self) -> str | None:
        """The warning that says where the weights came from, when modelport chose it."""
        parts = []
        if self.key is not None and self.searched:
            parts.append(f"the weights were read from the checkpoint's '{self.key}' entry, the one dict of tensors "
                         f"whose keys fit the architecture (--state-dict-key {self.key} names it)")
        fit = f" to fit --arch {self.arch}" if self.arch else ""
        if self.left_out:
            added = f", the prefix '{self.added}' added" if self.added else ""
            parts.append(f"only the keys under the prefix '{self.prefix}' were taken (the prefix removed{added}){fit}; "
                         f"{len(self.left_out)} key(s) of the checkpoint left out: {_listed(self.left_out)}")
        elif self.prefix and self.added:
            parts.append(f"the prefix '{self.prefix}' of the checkpoint's keys was replaced by '{self.added}'{fit}")
        elif self.prefix:
            parts.append(f"the prefix '{self.prefix}' was removed from the checkpoint's keys{fit}")
        elif self.added:
            parts.append(f"the prefix '{self.added}' was added to the checkpoint's keys{fit}")
        return "; ".join(parts) or None


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


def _prefixes(keys) -> list[str]:
    """'' and the dotted prefixes every one of `keys` starts with, up to PREFIX_LEVELS levels
    ('', 'module.', 'module._orig_mod.')."""
    found, prefix, rest = [""], "", list(keys)
    for _ in range(PREFIX_LEVELS):
        heads = {k.split(".", 1)[0] for k in rest}
        if len(heads) != 1 or any("." not in k for k in rest):
            break
        head = heads.pop() + "."
        prefix += head
        rest = [k[len(head):] for k in rest]
        found.append(prefix)
    return found


def _heads(keys) -> dict[str, list[str]]:
    """Each dotted prefix some of `keys` sit under, up to PREFIX_LEVELS levels ('encoder.',
    'model.encoder.') -> the keys under it."""
    under: dict[str, list[str]] = {}
    for k in keys:
        parts = k.split(".")[:-1][:PREFIX_LEVELS]
        for i in range(1, len(parts) + 1):
            under.setdefault(".".join(parts[:i]) + ".", []).append(k)
    return under


@dataclass(frozen=True)
class Fit:
    """`state` with its keys made the architecture's: the prefix `removed` and the one `added`, the
    checkpoint's keys `left_out` (those outside the subtree taken), the prefixes of two subtrees that
    both fit (`ambiguous`), and when nothing fits the subtree that came `closest` in words."""

    state: dict
    removed: str = ""
    added: str = ""
    left_out: tuple[str, ...] = ()
    ambiguous: tuple[str, ...] = ()
    closest: str | None = None


def _subtrees(keys: set[str], expected: set[str], *, sized: bool) -> list[tuple[str, str, frozenset, int]]:
    """(prefix removed, prefix added, the checkpoint keys taken, how many land on `expected`) for each
    prefix of the checkpoint's keys that does not hold them all, with the architecture's prefix that
    fits it best; `sized`: only prefixes holding as many keys as `expected` (a fit needs that). One
    row per set of keys taken (`encoder.` and `encoder.net.` may hold the same), the fewest levels."""
    rows: dict[frozenset, tuple[str, str, frozenset, int]] = {}
    adds = _prefixes(expected)
    heads = _heads(keys)
    for head in sorted(heads, key=lambda h: (h.count("."), h)):
        taken = frozenset(heads[head])
        if len(taken) == len(keys) or (sized and len(taken) != len(expected)):
            continue
        for added in adds:
            score = len({added + k[len(head):] for k in taken} & expected)
            if score > rows.get(taken, ("", "", taken, -1))[3]:
                rows[taken] = (head, added, taken, score)
    return list(rows.values())


def _refit(state: dict, expected: set[str]) -> Fit:
    """`state` with its keys made the architecture's.

    A common prefix of the checkpoint's keys removed and/or one of the architecture's added, the
    fewest levels first, when that makes the keys exactly `expected`; failing that, the keys under
    one prefix of the checkpoint when they (with an architecture's prefix added, if needed) are
    exactly `expected`, the rest left out: a network saved as one attribute of a LightningModule
    beside state of its own. A subtree must hold `expected` and nothing more: keys of its own that
    the architecture lacks mean another architecture, which the load names. Failing that, the
    checkpoint's prefix removed when it makes more keys the architecture's (so that a misfit is
    reported in the architecture's names), else `state` as it is, with the subtree that shares the
    most keys named. Each change keeps keys distinct, so equal sets mean every key has its place."""
    keys = set(state)
    if not keys or not expected or keys == expected:
        return Fit(state)
    changes = sorted(((r, a) for r in _prefixes(keys) for a in _prefixes(expected) if r or a),
                     key=lambda ra: (ra[0].count(".") + ra[1].count("."), bool(ra[1])))
    for removed, added in changes:
        if {added + k[len(removed):] for k in keys} == expected:
            return Fit({added + k[len(removed):]: v for k, v in state.items()}, removed, added)
    fits = [row for row in _subtrees(keys, expected, sized=True) if row[3] == len(expected)]
    if len(fits) > 1:
        return Fit(state, ambiguous=tuple(row[0] for row in fits))
    if fits:
        removed, added, taken, _ = fits[0]
        return Fit({added + k[len(removed):]: v for k, v in state.items() if k in taken}, removed, added,
                   left_out=tuple(k for k in state if k not in taken))
    best, best_prefix, best_score = state, "", len(keys & expected)
    for prefix in _prefixes(keys)[1:]:
        score = len({k[len(prefix):] for k in keys} & expected)
        if score > best_score:
            best, best_prefix, best_score = {k[len(prefix):]: v for k, v in state.items()}, prefix, score
    near = [row for row in _subtrees(keys, expected, sized=False) if row[3] > best_score]
    top = max((row[3] for row in near), default=0)
    near = [row for row in near if row[3] == top]
    closest = None
    if len(near) == 1:
        head, _, taken, score = near[0]
        closest = (f"closest: the {len(taken)} key(s) under the prefix '{head}' hold {score} of the "
                   f"architecture's {len(expected)}")
    return Fit(best, best_prefix, "", closest=closest)


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
        fit = _refit(found.state, want)
        if fit.ambiguous:
            where = f"the checkpoint's '{found.key}' entry" if found.key else "the checkpoint"
            raise BadInputError(f"{where} holds the architecture's keys under {len(fit.ambiguous)} prefixes that "
                                f"each fit --arch {arch}: {', '.join(repr(p) for p in fit.ambiguous)}", path=path,
                                hint="save the one you mean as its own state dict, its prefix removed")
        found.state, found.prefix, found.added, found.arch = fit.state, fit.removed, fit.added, arch
        found.left_out, found.closest = list(fit.left_out), fit.closest
    return found


def _choose(nested: dict[str, dict], want: set[str], path, arch: str | None) -> tuple[dict, str]:
    if len(nested) == 1 or not want:
        name = max(nested, key=lambda k: len(nested[k])) if len(nested) > 1 else next(iter(nested))
        return nested[name], name
    fits = [k for k, v in nested.items() if set(_refit(v, want).state) == want]
    if len(fits) == 1:
        return nested[fits[0]], fits[0]
    if len(fits) > 1:
        raise BadInputError(f"the checkpoint holds {len(fits)} state dicts that fit --arch {arch}: {', '.join(fits)}",
                            path=path, hint=f"pick one with --state-dict-key, e.g. --state-dict-key {fits[0]}")
    overlap = {k: len(set(_refit(v, want).state) & want) for k, v in nested.items()}
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


def load_into(module, state: dict, *, arch: str, args: dict, path, parameters: Callable[[], list[str]],
              closest: str | None = None) -> None:
    """`state` loaded into `module`; exit 2 naming the missing and unexpected keys, the first size
    mismatches (name, checkpoint shape vs model shape) and the `closest` subtree, when it does not fit."""
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
    if closest and (missing or unexpected):
        problems.append(closest)
    built = f" built with --arch-args {arch_args_text(args)}" if args else ""
    takes = parameters()
    hint = (f"{arch} takes {', '.join(takes)}: give the configuration the checkpoint was saved from with "
            f"--arch-args NAME=VALUE,…" if takes else
            f"{arch} takes no constructor arguments: the checkpoint is for another architecture")
    raise BadInputError(f"the state dict does not fit --arch {arch}{built}: {'; '.join(problems)}", path=path, hint=hint)
