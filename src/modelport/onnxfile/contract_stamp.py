"""The I/O contract a modelport-written ONNX file carries in its `metadata_props`: stamping it for
the time a file is written, and reading it back."""

from __future__ import annotations

CONTRACT_KEY = "modelport.contract"


class stamped_contract:
    """Within the block, the IR's ONNX model carries its I/O contract in `metadata_props`.

    The key is removed again afterwards, so the IR itself is left as it was (no copy of a
    possibly large model is made).
    """

    def __init__(self, ir):
        self.ir = ir

    def __enter__(self):
        import json

        props = self.ir.model.metadata_props
        self._old = {p.key: p.value for p in props if p.key == CONTRACT_KEY}
        _drop_prop(props, CONTRACT_KEY)
        entry = props.add()
        entry.key, entry.value = CONTRACT_KEY, json.dumps(self.ir.contract(), sort_keys=True)
        return self.ir.model

    def __exit__(self, *exc):
        props = self.ir.model.metadata_props
        _drop_prop(props, CONTRACT_KEY)
        for k, v in self._old.items():
            e = props.add()
            e.key, e.value = k, v
        return False


def _drop_prop(props, key: str) -> None:
    keep = [(p.key, p.value) for p in props if p.key != key]
    del props[:]
    for k, v in keep:
        e = props.add()
        e.key, e.value = k, v


def read_contract(model) -> dict | None:
    """The contract a modelport-written ONNX file carries, or None."""
    import json

    for p in model.metadata_props:
        if p.key == CONTRACT_KEY:
            try:
                return json.loads(p.value)
            except json.JSONDecodeError:
                return None
    return None
