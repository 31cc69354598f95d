"""The tolerance policy: how close a candidate's outputs must be to the reference's.

One constructor, `tolerance_for`, builds every tolerance a run uses: the defaults of the
candidate's precision, then a zoo entry's values, then the user's flags, then per-output
overrides (`--atol probs=0.1`). The rule the comparator applies is in `validation/compare.py`.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from modelport.errors import BadInputError

KEYS = ("atol", "rtol", "min_cosine")


@dataclass(frozen=True)
class Tolerance:
    atol: float = 1e-4
    rtol: float = 1e-3
    min_cosine: float = 0.999
    scaled: bool = True  # atol times the output's scale max(1, max|reference|)
    # per-output overrides: output name -> {"atol"|"rtol"|"min_cosine": value}
    overrides: dict = field(default_factory=dict, compare=False, hash=False)
    basis: str = field(default="", compare=False)  # why the defaults are not the candidate's precision's own

    def for_output(self, name: str) -> Tolerance:
        """The tolerance one output is judged with (an override replaces the default's value)."""
        over = self.overrides.get(name)
        return replace(self, overrides={}, **over) if over else self

    def with_overrides(self, overrides: dict | None) -> Tolerance:
        return replace(self, overrides=dict(overrides or {}))

    def to_dict(self) -> dict:
        out = {k: getattr(self, k) for k in KEYS}
        out["scaled"] = self.scaled
        if self.basis:
            out["basis"] = self.basis
        if self.overrides:
            out["outputs"] = {n: {k: finite_or_none(float(x)) for k, x in v.items()} for n, v in self.overrides.items()}
        return out


def parse_tolerance_flags(**flags: list[str] | str | float | None) -> tuple[dict, dict]:
    """CLI tolerance flags (`atol=["1e-3", "probs=0.1,logits=0.5"]`, rtol=…, min_cosine=…) as
    (defaults {key: value}, per-output overrides {name: {key: value}}). A plain value sets the
    default; NAME=VALUE sets that output's; items may be repeated or comma-separated."""
    defaults: dict[str, float] = {}
    overrides: dict[str, dict[str, float]] = {}
    for key, values in flags.items():
        if values is None:
            continue
        if isinstance(values, (int, float)):
            defaults[key] = float(values)
            continue
        flag = "--" + key.replace("_", "-")
        for part in (p.strip() for v in ([values] if isinstance(values, str) else values) for p in str(v).split(",")):
            if not part:
                continue
            name, eq, text = part.rpartition("=")
            try:
                value = float(text)
            except ValueError:
                raise BadInputError(f"{flag} '{part}': expected a number or OUTPUT=number") from None
            if value != value or (key != "min_cosine" and value < 0):
                raise BadInputError(f"{flag} '{part}': must be a non-negative number")
            if eq and not name.strip():
                raise BadInputError(f"{flag} '{part}': empty output name")
            if eq:
                overrides.setdefault(name.strip(), {})[key] = value
            else:
                defaults[key] = value
    return defaults, overrides


def check_override_names(tol: Tolerance, names, path=None) -> None:
    """Per-output tolerances must name outputs the model has (a typo would silently do nothing)."""
    unknown = sorted(set(tol.overrides) - set(names))
    if unknown:
        raise BadInputError(f"tolerance given for unknown output(s) {unknown}; the model's outputs are {list(names)}", path=path)


# Defaults per precision of the candidate: quantised models are judged mostly on cosine.
DEFAULT_TOLERANCES = {
    "fp32": Tolerance(1e-4, 1e-3, 0.999),
    "fp16": Tolerance(1e-2, 1e-2, 0.999),
    "int8": Tolerance(float("inf"), float("inf"), 0.98),
    "uint8": Tolerance(float("inf"), float("inf"), 0.99),  # 8-bit weights, float activations (TF.js)
    "bf16": Tolerance(2e-2, 2e-2, 0.999),  # 8-bit mantissa: about 3 significant digits per rounding
}


# Sources that compute below fp32 themselves (a parser records it as the IR's `source_precision`),
# and the precision whose defaults their references are judged with: a hop against them cannot be
# closer than the source is to a float computation of its own weights.
SOURCE_PRECISIONS = {
    "int8-dynamic-range": "int8",  # int8 weights, float activations quantised to int8 per run by the kernels
}


def tolerance_for(precision: str = "fp32", *, zoo: dict | None = None, user: dict | None = None,
                  overrides: dict | None = None, scaled: bool = True, source: str | None = None) -> Tolerance:
    """The tolerance a candidate of `precision` is judged with.

    Layers, each replacing the one before where it names a value: the precision's defaults
    (`DEFAULT_TOLERANCES`, fp32's for a precision without its own), widened to those of the
    precision the source computes at (`source`, a key of `SOURCE_PRECISIONS`: per key the looser
    value, and `basis` says so), a zoo entry's `tolerance`, the user's flags
    (`--atol/--rtol/--min-cosine`), then per-output overrides on top.
    """
    base = DEFAULT_TOLERANCES.get(precision or "fp32", DEFAULT_TOLERANCES["fp32"])
    values = {k: getattr(base, k) for k in KEYS}
    basis = ""
    if source:
        own = SOURCE_PRECISIONS[source]
        theirs = DEFAULT_TOLERANCES[own]
        wider = {"atol": max(values["atol"], theirs.atol), "rtol": max(values["rtol"], theirs.rtol),
                 "min_cosine": min(values["min_cosine"], theirs.min_cosine)}
        if wider != values:
            values = wider
            which = f"the {own} defaults" if wider == {k: getattr(theirs, k) for k in KEYS} else \
                f"the wider of the {precision or 'fp32'} and {own} defaults"
            basis = f"{which}, as the source computes in {source}"
    for layer in (zoo or {}, user or {}):
        values.update({k: float(v) for k, v in layer.items() if k in KEYS and v is not None})
    return Tolerance(**values, scaled=scaled, overrides=dict(overrides or {}), basis=basis)


def finite_or_none(v):
    return None if isinstance(v, float) and not np.isfinite(v) else v
