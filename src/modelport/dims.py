"""Declared dims: what `--dim` says a symbolic dim takes, and the sizes an artifact is checked at.

`--dim NAME=VALUE` takes three forms:

- `batch=4`: fixed. The sample inputs take that size, and a target that fixes dynamic dims fixes
  it there (as before ranges existed);
- `batch=1..8`: a range, both ends included. A target keeps the dim dynamic within those bounds
  where its runtime can (ExecuTorch's bounded dynamic shapes, Core ML's RangeDim; ONNX, ORT and
  OpenVINO keep every dim dynamic anyway);
- `seq=128,256,512`: enumerated sizes. Core ML takes them as enumerated shapes; a target with
  bounded dynamic shapes takes the range from the smallest to the largest.

The sample inputs of a range or a list take one size inside it (`DimSpec.sample`: 2 where the
bounds allow, since a batch of two shows rows mixing, else the nearest end; the smallest listed size
of 2 or more). Every artifact that keeps a declared dim dynamic is run at the sizes `check_sizes`
picks (the smallest, one between, the largest), each against the source at that size.

The IR carries the declared bounds (`IRModel.dim_bounds`, `to_dict` forms) in its contract, and
so do the report and each artifact's entry (`dims`: per input, each symbolic dim's form).
"""

from __future__ import annotations

from dataclasses import dataclass

from modelport.errors import BadInputError

EXAMPLES = "batch=4, batch=1..8 or seq=128,256,512"


@dataclass(frozen=True)
class DimSpec:
    """A declared dim: `low`..`high`, or exactly the listed `sizes` (fixed: low == high, no sizes)."""

    low: int
    high: int
    sizes: tuple[int, ...] = ()

    @property
    def kind(self) -> str:
        """"fixed", "range" or "sizes"."""
        return "sizes" if self.sizes else "fixed" if self.low == self.high else "range"

    @property
    def sample(self) -> int:
        """The size sample inputs take (module docstring)."""
        if self.sizes:
            return next((n for n in self.sizes if n >= 2), self.sizes[0])
        return min(max(self.low, 2), self.high)

    def check_sizes(self, cap: int | None = None) -> list[int]:
        """The sizes an artifact keeping this dim is run at: the smallest, one between, the largest
        (no larger than `cap`; the listed sizes themselves where there are three or fewer)."""
        pool = list(self.sizes) if self.sizes else None
        high = self.high if cap is None else max(self.low, min(self.high, cap))
        if pool is not None:
            pool = [n for n in pool if n <= high] or [self.low]
            picked = [pool[0], pool[len(pool) // 2], pool[-1]]
        else:
            picked = [self.low, (self.low + high) // 2, high]
        return sorted(set(picked))

    def contains(self, n: int) -> bool:
        return n in self.sizes if self.sizes else self.low <= n <= self.high

    def to_dict(self) -> dict:
        if self.sizes:
            return {"kind": "sizes", "sizes": list(self.sizes)}
        if self.low == self.high:
            return {"kind": "fixed", "size": self.low}
        return {"kind": "range", "min": self.low, "max": self.high}

    @classmethod
    def from_dict(cls, d: dict) -> DimSpec:
        if d.get("sizes"):
            sizes = tuple(int(n) for n in d["sizes"])
            return cls(min(sizes), max(sizes), sizes)
        if "size" in d:
            return cls(int(d["size"]), int(d["size"]))
        return cls(int(d["min"]), int(d["max"]))

    def __str__(self) -> str:
        if self.sizes:
            return ",".join(map(str, self.sizes))
        return str(self.low) if self.low == self.high else f"{self.low}..{self.high}"


def parse_dim(text: str) -> tuple[str, DimSpec]:
    """`NAME=4`, `NAME=1..8` or `NAME=128,256,512` as (name, DimSpec); exit 2 naming the text."""
    name, _, value = str(text).partition("=")
    name, value = name.strip(), value.strip()
    bad = f"bad --dim '{text}': expected NAME=N, NAME=MIN..MAX or NAME=N1,N2,..., e.g. {EXAMPLES}"
    if not name:
        raise BadInputError(bad)
    try:
        if ".." in value:
            lo, _, hi = value.partition("..")
            low, high = int(lo), int(hi)
            if low < 1 or high < low:
                raise BadInputError(f"bad --dim '{text}': a range needs 1 <= MIN <= MAX")
            return name, DimSpec(low, high)
        if "," in value:
            sizes = tuple(sorted({int(v) for v in value.split(",")}))
            if sizes[0] < 1:
                raise BadInputError(f"bad --dim '{text}': every size must be 1 or more")
            return name, (DimSpec(sizes[0], sizes[0]) if len(sizes) == 1 else DimSpec(sizes[0], sizes[-1], sizes))
        if not value.isdigit() or int(value) < 1:
            raise BadInputError(bad)
        return name, DimSpec(int(value), int(value))
    except ValueError:
        raise BadInputError(bad) from None


def parse_dims(values) -> dict[str, DimSpec]:
    """Every `--dim` as {name: DimSpec}; a name given twice is exit 2."""
    out: dict[str, DimSpec] = {}
    for text in values or ():
        name, spec = parse_dim(text)
        if name in out:
            raise BadInputError(f"--dim {name} is given twice ({out[name]} and {spec})")
        out[name] = spec
    return out


def as_dim_spec(value) -> DimSpec:
    """A DimSpec from what the Python API takes: a DimSpec, an int, or the CLI's text ("1..8")."""
    if isinstance(value, DimSpec):
        return value
    if isinstance(value, int):
        return DimSpec(value, value)
    return parse_dim(f"dim={value}")[1]


def declared(bounds: dict, inputs, *, path=None) -> dict[str, DimSpec]:
    """The ranges and lists in `bounds` ({name: DimSpec}) that name a symbolic dim of `inputs`
    (TensorSpecs); a range or list for a dim no input has is exit 2 naming the dims there are."""
    symbolic = [d for s in inputs for d in s.shape if isinstance(d, str)]
    out = {}
    for name, spec in bounds.items():
        spec = as_dim_spec(spec)
        if spec.kind == "fixed":
            continue
        if name not in symbolic:
            raise BadInputError(f"--dim {name}={spec}: no input has a dynamic dim '{name}'"
                                + (f"; the dynamic dims are {', '.join(dict.fromkeys(symbolic))}" if symbolic else
                                   "; every input dim is fixed"), path=path,
                                hint="name a dynamic dim as the contract does (`modelport inspect` shows them), or give "
                                     "the input's shape with --input NAME:DIMS")
        out[name] = spec
    return out


def input_dims(inputs, bounds: dict[str, DimSpec], fixed: dict[str, int]) -> dict[str, dict[str, dict]]:
    """Per input with a symbolic dim, each such dim's form in an artifact: kept with its declared
    bounds (`bounds`), fixed at a size (`fixed`), else dynamic with no bounds."""
    out: dict[str, dict[str, dict]] = {}
    for s in inputs:
        for d in s.shape:
            if not isinstance(d, str):
                continue
            if d in fixed:
                form = {"kind": "fixed", "size": int(fixed[d])}
            elif d in bounds:
                form = bounds[d].to_dict()
            else:
                form = {"kind": "dynamic"}
            out.setdefault(s.name, {})[d] = form
    return out
