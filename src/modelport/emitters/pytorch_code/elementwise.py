"""Arithmetic, comparison, logic, math functions, Where/Max/Min/Sum/Mean, Clip, Cast.

Shape arithmetic (a value computed from `Shape`) stays in Python ints when every operand is one,
so reshapes built from it remain dynamic.
"""

from __future__ import annotations

from modelport.emitters.pytorch_code.codegen import ONNX_DTYPES, torch_dtype
from modelport.emitters.pytorch_code.registry import CONVERTERS

BINARY = {"Add": "+", "Sub": "-", "Mul": "*"}
COMPARE = {"Equal": "==", "Greater": ">", "Less": "<", "GreaterOrEqual": ">=", "LessOrEqual": "<="}
UNARY = {
    "Abs": "torch.abs", "Neg": "torch.neg", "Exp": "torch.exp", "Log": "torch.log", "Sqrt": "torch.sqrt",
    "Reciprocal": "torch.reciprocal", "Floor": "torch.floor", "Ceil": "torch.ceil", "Round": "torch.round",
    "Sign": "torch.sign", "Sin": "torch.sin", "Cos": "torch.cos", "Tan": "torch.tan", "Asin": "torch.asin",
    "Acos": "torch.acos", "Atan": "torch.atan", "Sinh": "torch.sinh", "Cosh": "torch.cosh", "Asinh": "torch.asinh",
    "Acosh": "torch.acosh", "Atanh": "torch.atanh", "Erf": "torch.erf", "IsNaN": "torch.isnan",
    "Not": "torch.logical_not", "BitwiseNot": "torch.bitwise_not",
}
LOGIC = {"And": "torch.logical_and", "Or": "torch.logical_or", "Xor": "torch.logical_xor",
         "BitwiseAnd": "torch.bitwise_and", "BitwiseOr": "torch.bitwise_or", "BitwiseXor": "torch.bitwise_xor"}
INT_DTYPES = {"int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"}
PY_INT_OPS = {"Add": "+", "Sub": "-", "Mul": "*", "Div": "//"}


def _shape_arith(n, op: str) -> bool:
    """Add/Sub/Mul/Div over Python ints and int lists (shape arithmetic)."""
    kinds = [n.kind(i) for i in range(2)]
    if not all(k in ("int", "ints", "const") for k in kinds) or "const" == kinds[0] == kinds[1]:
        return False
    if any(k == "const" and n.const(i).size != 1 for i, k in enumerate(kinds)):
        return False
    sym = PY_INT_OPS[op]
    scal = [n.scalar(i) if k != "ints" else None for i, k in enumerate(kinds)]
    if "ints" not in kinds:
        n.emit_int(f"{scal[0]} {sym} {scal[1]}")
        return True
    ints = [i for i, k in enumerate(kinds) if k == "ints"]
    if len(ints) == 2:
        a, b = n.value(0), n.value(1)
        if a.length == 1 and b.length == 1:
            n.emit_ints(f"[{a.expr}[0] {sym} {b.expr}[0]]", 1)
        else:
            n.emit_ints(f"[a {sym} b for a, b in zip({a.expr}, {b.expr}, strict=True)]", a.length)
        return True
    i = ints[0]
    other = scal[1 - i]
    v = n.value(i)
    expr = f"[d {sym} {other} for d in {v.expr}]" if i == 0 else f"[{other} {sym} d for d in {v.expr}]"
    n.emit_ints(expr, v.length)
    return True


@CONVERTERS.register(("Add", "Sub", "Mul"))
def binary(n):
    if _shape_arith(n, n.op_type):
        return
    n.emit(f"{n.operand(0, 1)} {BINARY[n.op_type]} {n.operand(1, 0)}")


@CONVERTERS.register("Div")
def div(n):
    if _shape_arith(n, "Div"):
        return
    if (n.dtype(0) or n.dtype(1)) in INT_DTYPES:
        n.emit(f'torch.div({n.t(0)}, {n.operand(1, 0)}, rounding_mode="trunc")')
    else:
        n.emit(f"{n.operand(0, 1)} / {n.operand(1, 0)}")


@CONVERTERS.register("Pow")
def pow_(n):
    expr = f"torch.pow({n.t(0)}, {n.operand(1, 0)})"
    if n.dtype(0) and n.dtype(1) and n.dtype(0) != n.dtype(1):
        expr = f"{expr}.to({torch_dtype(n.dtype(0))})"
    n.emit(expr)


@CONVERTERS.register("Mod")
def mod(n):
    fn = "torch.fmod" if n.attr("fmod", 0) else "torch.remainder"
    n.emit(f"{fn}({n.t(0)}, {n.t(1)})")


@CONVERTERS.register(tuple(COMPARE))
def compare(n):
    n.emit(f"{n.operand(0, 1)} {COMPARE[n.op_type]} {n.operand(1, 0)}")


@CONVERTERS.register(tuple(LOGIC))
def logic(n):
    n.emit(f"{LOGIC[n.op_type]}({n.t(0)}, {n.t(1)})")


@CONVERTERS.register("BitShift")
def bitshift(n):
    fn = "torch.bitwise_left_shift" if n.attr("direction") == "LEFT" else "torch.bitwise_right_shift"
    n.emit(f"{fn}({n.t(0)}, {n.t(1)})")


@CONVERTERS.register(tuple(UNARY))
def unary(n):
    n.emit(f"{UNARY[n.op_type]}({n.t(0)})")


@CONVERTERS.register("IsInf")
def isinf(n):
    pos, neg = n.attr("detect_positive", 1), n.attr("detect_negative", 1)
    x = n.t(0)
    if pos and neg:
        n.emit(f"torch.isinf({x})")
    elif pos:
        n.emit(f"torch.isposinf({x})")
    elif neg:
        n.emit(f"torch.isneginf({x})")
    else:
        n.emit(f"torch.zeros_like({x}, dtype=torch.bool)")


@CONVERTERS.register("Where")
def where(n):
    n.emit(f"torch.where({n.t(0)}, {n.t(1)}, {n.t(2)})")


def _fold(n, fn: str) -> str:
    args = [n.t(i) for i in range(len(n.inputs)) if n.has(i)]
    expr = args[0]
    for a in args[1:]:
        expr = f"{fn}({expr}, {a})"
    return expr


@CONVERTERS.register("Max")
def maximum(n):
    if len(n.inputs) == 2 and all(n.kind(i) in ("int", "const") for i in range(2)) and "int" in (n.kind(0), n.kind(1)):
        n.emit_int(f"max({n.scalar(0)}, {n.scalar(1)})")
        return
    n.emit(_fold(n, "torch.maximum"))


@CONVERTERS.register("Min")
def minimum(n):
    if len(n.inputs) == 2 and all(n.kind(i) in ("int", "const") for i in range(2)) and "int" in (n.kind(0), n.kind(1)):
        n.emit_int(f"min({n.scalar(0)}, {n.scalar(1)})")
        return
    n.emit(_fold(n, "torch.minimum"))


@CONVERTERS.register("Sum")
def sum_(n):
    n.emit(" + ".join(n.t(i) for i in range(len(n.inputs)) if n.has(i)))


@CONVERTERS.register("Mean")
def mean(n):
    args = [n.t(i) for i in range(len(n.inputs)) if n.has(i)]
    n.emit(f"({' + '.join(args)}) / {len(args)}" if len(args) > 1 else args[0])


@CONVERTERS.register("Clip", since=11)
def clip(n):
    lo = n.scalar(1) if n.has(1) and n.const(1) is not None else (n.t(1) if n.has(1) else None)
    hi = n.scalar(2) if n.has(2) and n.const(2) is not None else (n.t(2) if n.has(2) else None)
    if lo is None and hi is None:
        n.alias(0)
        return
    if lo is not None and hi is not None and n.const(1) is None and n.const(2) is None:
        n.emit(f"torch.minimum(torch.maximum({n.t(0)}, {lo}), {hi})")
        return
    if (lo is not None and n.has(1) and n.const(1) is None) or (hi is not None and n.has(2) and n.const(2) is None):
        x = n.t(0)
        expr = f"torch.maximum({x}, {lo})" if lo is not None else x
        expr = f"torch.minimum({expr}, {hi})" if hi is not None else expr
        n.emit(expr)
        return
    args = [n.t(0)] + ([f"min={lo}"] if lo is not None else []) + ([f"max={hi}"] if hi is not None else [])
    n.emit(f"torch.clamp({', '.join(args)})")


@CONVERTERS.register("Clip", until=10)
def clip_attrs(n):
    lo, hi = n.attr("min"), n.attr("max")
    args = [n.t(0)] + ([f"min={n.gen.literal(lo)}"] if lo is not None else []) + ([f"max={n.gen.literal(hi)}"] if hi is not None else [])
    n.emit(f"torch.clamp({', '.join(args)})")


@CONVERTERS.register("Cast")
def cast(n):

    to = n.attr("to")
    if to not in ONNX_DTYPES:
        n.fail(f"cast to ONNX type {to} (no torch equivalent)")
    if n.kind(0) in ("ints", "int") and ONNX_DTYPES[to] in INT_DTYPES:
        n.alias(0)
        return
    src = n.dtype(0)
    if src and src not in INT_DTYPES and src != "bool" and ONNX_DTYPES[to] in INT_DTYPES:
        # ONNX truncates toward zero, as torch does; out-of-range values are undefined in both.
        pass
    n.emit(f"{n.t(0)}.to({torch_dtype(ONNX_DTYPES[to])})")


@CONVERTERS.register("CastLike")
def cast_like(n):
    n.emit(f"{n.t(0)}.to({n.t(1)}.dtype)")


@CONVERTERS.register(("Identity", "Dropout"))
def identity(n):
    if n.op_type == "Dropout":
        if n.has(2) and (n.const(2) is None or bool(n.const(2).reshape(-1)[0])):
            n.fail("Dropout in training mode (random output)")
        if n.used(1):
            n.emit(f"torch.ones_like({n.t(0)}, dtype=torch.bool)", 1)
    n.alias(0)
