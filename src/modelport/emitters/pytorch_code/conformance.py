"""Conformance against the ONNX backend node tests that ship with the `onnx` package.

The installed wheel carries the node cases as Python (`onnx.backend.test.case.node`), each with a
model and input/expected-output arrays; `collect_cases()` builds them in-process. `run_case()`
writes the case's PyTorch code, executes it and compares with the expected outputs using the
case's own tolerances.
"""

from __future__ import annotations

import re
import types
import warnings
from dataclasses import dataclass

import numpy as np

from modelport.emitters.pytorch_code import generate_source
from modelport.errors import UnsupportedError


@dataclass
class Case:
    name: str
    op: str
    model: object
    inputs: list
    outputs: list
    rtol: float
    atol: float


@dataclass
class Outcome:
    name: str
    op: str
    ok: bool
    stage: str  # "pass", "unsupported", "generate", "run", "mismatch"
    detail: str = ""


def collect_cases(names: set[str] | None = None) -> list[Case]:
    """Every node case (or those named), grouped by op: `test_x_expanded` counts for x's op."""
    from onnx.backend.test.case import node

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        raw = node.collect_testcases(None)
    single = {c.name: c.model.graph.node[0].op_type for c in raw if len(c.model.graph.node) == 1}
    cases = []
    for c in raw:
        if names is not None and c.name not in names:
            continue
        base = re.sub(r"_expanded(_ver\d+)?$", "", c.name)
        op = single.get(base) or single.get(c.name) or _op_from_name(c)
        ins, outs = c.data_sets[0]
        cases.append(Case(c.name, op, c.model, [_array(a) for a in ins], [_array(a) for a in outs], c.rtol, c.atol))
    return cases


def _array(value):
    from onnx import TensorProto, numpy_helper

    if isinstance(value, TensorProto):
        try:
            return numpy_helper.to_array(value)
        except Exception:
            return value
    if isinstance(value, (np.generic, int, float, bool)):
        return np.asarray(value)
    return value


def to_torch(a: np.ndarray):
    import torch

    if a.dtype.name == "bfloat16":
        return torch.from_numpy(np.ascontiguousarray(a).view(np.uint16)).view(torch.bfloat16)
    return torch.from_numpy(np.array(a))


def _op_from_name(c) -> str:
    ops = [n.op_type for n in c.model.graph.node]
    return ops[0] if len(set(ops)) == 1 else "+".join(sorted(set(ops)))[:40]


def load_source(text: str, name: str = "modelport_conformance_case"):
    module = types.ModuleType(name)
    module.__file__ = f"<{name}>"
    exec(compile(text, module.__file__, "exec"), module.__dict__)
    return module


def run_case(case: Case) -> Outcome:
    import torch


    if not all(isinstance(a, np.ndarray) for a in case.inputs + case.outputs):
        return Outcome(case.name, case.op, False, "unsupported", "sequence/optional/map values")
    try:
        text, state, _ = generate_source(case.model)
    except UnsupportedError as e:
        return Outcome(case.name, case.op, False, "unsupported", e.reason[:200])
    except Exception as e:  # a converter bug is a failed case, not a crashed run
        return Outcome(case.name, case.op, False, "generate", f"{type(e).__name__}: {e}"[:200])
    try:
        module = load_source(text)
        model = module.Model()
        model.load_state_dict({k: to_torch(v) for k, v in state.items()})
        args = [to_torch(a) for a in case.inputs]
        with torch.no_grad():
            out = model(*args)
        outs = list(out) if isinstance(out, tuple) else [out]
    except Exception as e:
        return Outcome(case.name, case.op, False, "run", f"{type(e).__name__}: {e}"[:200])
    if len(outs) != len(case.outputs):
        return Outcome(case.name, case.op, False, "mismatch", f"{len(outs)} outputs, expected {len(case.outputs)}")
    for got, want in zip(outs, case.outputs, strict=False):
        why = compare(got, want, case.rtol, case.atol)
        if why:
            return Outcome(case.name, case.op, False, "mismatch", why)
    return Outcome(case.name, case.op, True, "pass")


def compare(got, want: np.ndarray, rtol: float, atol: float) -> str:
    """'' when `got` matches `want` (shape, dtype kind and values within tolerance), else why not."""
    if hasattr(got, "detach"):
        got = got.detach().cpu()
        got = got.float().numpy() if str(got.dtype) == "torch.bfloat16" else got.numpy()
    got = np.asarray(got)
    if want.dtype.name == "bfloat16":
        want = want.astype(np.float32)
    if got.shape != want.shape:
        return f"shape {got.shape} != {want.shape}"
    if want.dtype.kind != got.dtype.kind and not (want.dtype.kind in "iu" and got.dtype.kind in "iu"):
        return f"dtype {got.dtype} != {want.dtype}"
    if want.dtype.kind in "fcV":
        ok = np.allclose(got.astype(np.float64), want.astype(np.float64), rtol=rtol, atol=atol, equal_nan=True)
    else:
        ok = np.array_equal(got, want)
    return "" if ok else "values differ"
