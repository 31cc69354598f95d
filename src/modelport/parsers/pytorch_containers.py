"""Output (and input) containers a `.pt2` names but this process has never registered.

A program exported from a Hugging Face model returns a `ModelOutput` subclass
(`transformers.models.swin.modeling_swin.SwinModelOutput`); the saved program records the type by
name in its input/output tree specs, and `torch.export.load` refuses the file unless that exact type
is registered with torch's pytree first. transformers registers each class only when one of its
instances is created, so a fresh process can never load such a file, and importing a module named
by the file to register it would run code the file chose.

Instead each unknown type name gets a stand-in registered under that name: a `dict` (keys from the
tree spec's context, the field names transformers stores there) or, when the context is not a list
of keys, a `tuple`. Outputs come back as plain named containers, which is all a converter needs;
nothing from the file is imported or run.
"""

from __future__ import annotations

import json
import zipfile
from pathlib import Path


class StandInMapping(dict):
    """A dict standing for a container type this process does not know (`type_name` says which)."""

    type_name = ""


class StandInSequence(tuple):
    """A tuple standing for a sequence-like container type this process does not know."""

    type_name = ""


_STAND_INS: dict[str, type] = {}


def spec_type_names(path: Path) -> set[str]:
    """Every container type a `.pt2`'s module call signatures name (in_spec/out_spec trees)."""
    names: set[str] = set()
    try:
        with zipfile.ZipFile(path) as z:
            members = [n for n in z.namelist() if n.endswith(".json") and "/models/" in n]
            for member in members:
                try:
                    doc = json.loads(z.read(member))
                except (ValueError, UnicodeDecodeError):
                    continue
                calls = (doc.get("graph_module") or {}).get("module_call_graph") or [] if isinstance(doc, dict) else []
                for call in calls:
                    sig = call.get("signature") if isinstance(call, dict) else None
                    for key in ("in_spec", "out_spec"):
                        if isinstance(sig, dict) and isinstance(sig.get(key), str):
                            _collect(sig[key], names)
    except (zipfile.BadZipFile, OSError):
        pass
    return names


def _collect(spec_text: str, names: set[str]) -> None:
    try:
        doc = json.loads(spec_text)
    except ValueError:
        return
    stack = [doc[1] if isinstance(doc, list) and len(doc) == 2 else doc]
    while stack:
        node = stack.pop()
        if not isinstance(node, dict):
            continue
        if isinstance(node.get("type"), str):
            names.add(node["type"])
        stack.extend(node.get("children_spec") or [])


def register_unknown_containers(path: Path) -> list[str]:
    """Register a stand-in for each container type the file names that pytree cannot deserialize;
    returns the names registered (now or by an earlier call) for this file."""
    from torch.utils import _pytree as pytree

    done = []
    for name in sorted(spec_type_names(path)):
        if name in pytree.SERIALIZED_TYPE_TO_PYTHON_TYPE:
            if name in _STAND_INS:
                done.append(name)
            continue
        mapping = type(f"StandIn_{name.rsplit('.', 1)[-1]}", (StandInMapping,), {"type_name": name})
        pytree.register_pytree_node(
            mapping, _flatten_mapping, _unflatten(mapping), serialized_type_name=name,
            to_dumpable_context=json.dumps, from_dumpable_context=_loads_context,
            flatten_with_keys_fn=pytree._dict_flatten_with_keys,
        )
        _STAND_INS[name] = mapping
        done.append(name)
    return done


def _loads_context(text: str):
    """The context as JSON (how pytree writes it by default), else the text itself."""
    try:
        return json.loads(text)
    except (TypeError, ValueError):
        return text


def _keys(context, n: int) -> list[str] | None:
    """Field names from a tree spec context: a list of keys (transformers' ModelOutput, dicts) or
    `[field names, None-valued field names]` (`torch.utils._pytree.register_dataclass`)."""
    for keys in (context, context[0] if isinstance(context, list) and len(context) == 2 else None):
        if isinstance(keys, list) and len(keys) == n and all(isinstance(k, str) for k in keys):
            return keys
    return None


def _flatten_mapping(d):
    return list(d.values()), list(d.keys())


def _unflatten(mapping: type):
    sequence = type(f"StandInSeq_{mapping.type_name.rsplit('.', 1)[-1]}", (StandInSequence,), {"type_name": mapping.type_name})

    def unflatten(values, context):
        values = list(values)
        keys = _keys(context, len(values))
        return mapping(zip(keys, values, strict=True)) if keys else sequence(values)

    return unflatten
