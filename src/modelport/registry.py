"""Registries keyed by the names users type, whose entries are imported only when looked up.

Every extension point shares this one mechanism: parsers (`--from`), passes (`--passes`),
emitters (`--to`), packagers (`--for`), runtimes, inspectors and the file kinds `validate` runs.
An entry is `"package.module"` or `"package.module:attribute"`, a duplicate registration is an
error, aliases (MMdnn's spellings, common synonyms) resolve to one canonical key, and an unknown
name is a BadInputError that lists the known ones. A registry is a read-only mapping of
name -> target, in registration order, so the CLI's help text is generated from it. Registries
of file handlers also map file-name endings to names (`suffixes`, first match wins; `"/"`
matches a folder), so a file is looked up rather than tested in an if-chain.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from modelport.errors import BadInputError


class Registry(Mapping[str, str]):
    def __init__(self, kind: str, entries: dict[str, str], *, aliases: dict[str, str] | None = None,
                 suffixes: dict[str, str] | None = None):
        self.kind = kind
        self._entries: dict[str, str] = {}
        self.aliases: dict[str, str] = dict(aliases or {})
        self.suffixes: dict[str, str] = {}  # file-name ending (lower case) or "/" (a folder) -> name
        for name, target in entries.items():
            self.register(name, target)
        for suffix, name in (suffixes or {}).items():
            self.register_suffix(suffix, name)

    def __getitem__(self, name: str) -> str:
        return self._entries[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def register(self, name: str, target: str, *, suffixes: Iterable[str] = ()) -> None:
        if name in self._entries and self._entries[name] != target:
            raise ValueError(f"{self.kind} '{name}' is already registered as {self._entries[name]}")
        self._entries[name] = target
        for suffix in suffixes:
            self.register_suffix(suffix, name)

    def unregister(self, name: str) -> None:
        """Remove `name`, its aliases and its suffixes (a target taken out again, e.g. by a test)."""
        self._entries.pop(name, None)
        self.aliases = {a: n for a, n in self.aliases.items() if n != name}
        self.suffixes = {s: n for s, n in self.suffixes.items() if n != name}

    def register_suffix(self, suffix: str, name: str) -> None:
        suffix = suffix.lower()
        if self.suffixes.get(suffix, name) != name:
            raise ValueError(f"{self.kind} for '{suffix}' files is already registered as {self.suffixes[suffix]}")
        self.suffixes[suffix] = name

    def name_for(self, path: str | Path) -> str | None:
        """The name registered for this file's ending (or for a folder, under "/"; a folder holding
        FILE, under "/FILE"), or None."""
        p = Path(path)
        for suffix, name in self.suffixes.items():
            if suffix.startswith("/"):
                if p.is_dir() and (suffix == "/" or (p / suffix[1:]).is_file()):
                    return name
            elif p.name.lower().endswith(suffix):
                return name
        return None

    def canonical(self, name: str) -> str:
        key = name.strip().lower()
        key = self.aliases.get(key, key)
        if key not in self._entries:
            raise BadInputError(f"unknown {self.kind} '{name}'; known: {', '.join(sorted(self._entries))}")
        return key

    def names(self, text: str | Iterable[str], *, hint: str | None = None) -> list[str]:
        """'a,b' (or a list of such) -> canonical names, in order, without repeats; an unknown name or
        none at all is a BadInputError (`hint` says where names are given)."""
        items = text.split(",") if isinstance(text, str) else [p for t in text for p in t.split(",")]
        out: list[str] = []
        for item in items:
            if item.strip() and (name := self.canonical(item)) not in out:
                out.append(name)
        if not out:
            raise BadInputError(f"no {self.kind} given", hint=f"{hint + '; ' if hint else ''}known: {', '.join(self)}")
        return out

    def load(self, name: str) -> Any:
        """The module (or module attribute) registered under `name` or one of its aliases."""
        module, _, attr = self._entries[self.canonical(name)].partition(":")
        loaded = importlib.import_module(module)
        return getattr(loaded, attr) if attr else loaded


def choice(value: str | None, known, what: str) -> str | None:
    """`value` (lower-cased, aliases resolved) when it is one of `known`, else exit 2 listing them.

    `known` is a Registry (its aliases count) or a collection of names. Every choice option goes
    through here, in the options class that owns it, before any work.
    """
    if value is None:
        return None
    key = value.strip().lower()
    if hasattr(known, "canonical"):
        key = known.aliases.get(key, key)
    names = list(known)
    if key not in names:
        raise BadInputError(f"unknown {what} '{value}'; known: {', '.join(names)}")
    return key


# The registries whose names the CLI's help lists are declared here, in the base layer, so that
# building the command line imports neither `modelport.emitters` nor `modelport.packaging`; those
# packages re-export them (and their `register_*` functions) as before.
def from_targets(kind: str, pick, *, aliases: bool = False, suffixes: bool = False) -> Registry:
    """A registry of `modelport.targets` entries (`pick(target)` -> its entry, or None to leave it
    out) that keeps up with targets registered later."""
    from modelport import targets
    registry = Registry(kind, {})

    def add(t) -> None:
        entry = pick(t)
        if entry is None:
            return
        registry.register(t.name, entry, suffixes=t.suffixes if suffixes else ())
        if aliases:
            for alias in t.aliases:
                registry.aliases.setdefault(alias, t.name)

    def remove(t) -> None:
        if registry.get(t.name) == pick(t):
            registry.unregister(t.name)

    for t in targets.TARGETS.values():
        add(t)
    targets.on_register(add, remove)
    return registry


# `--to` names: the emitters of `modelport.targets.TARGETS`, with their aliases
EMITTERS = from_targets("target", lambda t: t.emitter, aliases=True)

PACKAGERS = Registry("serving system", {
    "triton": "modelport.packaging.triton",
    "torchserve": "modelport.packaging.torchserve",
    "tfserving": "modelport.packaging.tfserving",
    "k8s": "modelport.packaging.kubernetes",
    "kserve": "modelport.packaging.kserve",
    "ovms": "modelport.packaging.ovms",
    "ray-serve": "modelport.packaging.rayserve",
}, aliases={"kubernetes": "k8s", "tf-serving": "tfserving", "tensorflow-serving": "tfserving", "openvino-model-server": "ovms",
            "rayserve": "ray-serve"})
