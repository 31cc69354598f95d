"""Loop and If as Python control flow: a subgraph becomes a method of the module, called from a
`for` loop (Loop) or from the two arms of an `if` (If).

Loop: the body takes (iteration, condition, carried values...) and returns (condition, carried
values..., per-iteration outputs...); per-iteration outputs are stacked on a new first axis. A
carried value that is a constant and that the body passes through unchanged (the weights of a
tf2onnx recurrent loop) stays a parameter of the module instead of a loop variable.
"""

from __future__ import annotations

import numpy as np

from modelport.emitters.pytorch_code.codegen import Value, identifier
from modelport.emitters.pytorch_code.generator import BodyGenerator
from modelport.emitters.pytorch_code.registry import CONVERTERS


def _body_hint(n, suffix: str) -> str:
    base = identifier(n.node.name, "") if n.node.name else ""
    base = base if base and not base.lower().startswith("node") else n.op_type.lower()
    return f"{base}_{suffix}"


def _true_const(n, i: int) -> bool:
    c = n.const(i) if n.has(i) else np.array(True)
    return c is not None and bool(np.asarray(c).reshape(-1)[0])


@CONVERTERS.register("Loop")
def loop(n):

    body = n.graphs["body"]
    carried_count = len(n.inputs) - 2
    scan_count = len(body.output) - 1 - carried_count
    b_in, b_out = [v.name for v in body.input], [v.name for v in body.output]
    cond_passthrough = b_out[0] == b_in[1]
    static_cond = _true_const(n, 1) and (cond_passthrough or _const_true_output(body, b_out[0]))
    if not n.has(0) and static_cond:
        n.fail("Loop with neither a trip count nor a condition (it never ends)")

    gen = BodyGenerator(n.gen, body)
    gen.arg(b_in[0], "step", kind="int")
    if static_cond:
        gen.bind_input(b_in[1], Value("const", const=np.array(True)))
    else:
        gen.arg(b_in[1], "keep_going")
    fixed = {}  # carried index -> constant kept out of the loop state
    for k in range(carried_count):
        init = n.const(2 + k)
        if init is not None and b_out[1 + k] == b_in[2 + k]:
            fixed[k] = init
            gen.bind_input(b_in[2 + k], Value("const", const=init))
        else:
            gen.arg(b_in[2 + k], "state")
    method = gen.build(_body_hint(n, "body"))
    returns = gen.mod.returns
    if static_cond:
        returns[0] = None
    for k in fixed:
        returns[1 + k] = None
    gen.parent.mod.methods[-1] = (method, gen.mod.args, gen.mod.forward, [r for r in returns if r is not None])

    # loop state: the carried values' final variables, assigned their initial values
    state = []
    for k in range(carried_count):
        if k in fixed:
            n.gen.values[n.outputs[k]] = Value("const", const=fixed[k])
            continue
        name = n.var(k) if n.used(k) else n.tmp("state")
        n.line(f"{name} = {n.t(2 + k)}")
        state.append(name)
        n.gen.values[n.outputs[k]] = Value("tensor", name)
    scans = []
    for _ in range(scan_count):
        name = n.tmp("steps")
        n.line(f"{name} = []")
        scans.append(name)
    step = n.tmp("step")
    keep = None if static_cond else n.tmp("keep_going")
    if keep:
        n.line(f"{keep} = {n.t(1) if n.has(1) else 'torch.tensor(True)'}")
    head = f"for {step} in range({n.scalar(0)}):" if n.has(0) else f"{step} = 0\nwhile {keep}:"
    lines = head.split("\n")
    inner = []
    if keep and n.has(0):
        inner.append(f"if not {keep}:")
        inner.append("    break")
    scan_vars = [n.tmp("step_out") for _ in scans]
    targets = ([keep] if keep else []) + state + scan_vars
    call = f"self.{method}({', '.join([step] + ([keep] if keep else []) + state + gen.captured)})"
    inner.append(f"{', '.join(targets)} = {call}" if targets else call)
    for lst, var in zip(scans, scan_vars, strict=True):
        inner.append(f"{lst}.append({var})")
    if not n.has(0):
        inner.append(f"{step} += 1")
    for ln in lines:
        n.line(ln)
    for ln in inner:
        n.line(f"    {ln}")
    for j, lst in enumerate(scans):
        out = carried_count + j
        if n.used(out):
            n.emit(f"torch.stack({lst})", out)


def _const_true_output(graph, name: str) -> bool:
    from onnx import numpy_helper

    for t in graph.initializer:
        if t.name == name:
            return bool(numpy_helper.to_array(t).reshape(-1)[0])
    for node in graph.node:
        if node.op_type == "Constant" and name in node.output and node.attribute[0].name == "value":
            return bool(numpy_helper.to_array(node.attribute[0].t).reshape(-1)[0])
    return False


@CONVERTERS.register("If")
def if_(n):

    cond = n.const(0)
    arms = {}
    for key in ("then_branch", "else_branch"):
        if cond is not None and bool(np.asarray(cond).reshape(-1)[0]) != (key == "then_branch"):
            continue
        gen = BodyGenerator(n.gen, n.graphs[key])
        method = gen.build(_body_hint(n, key.split("_")[0]))
        arms[key] = (method, gen.captured, gen.mod.returns)
    names = [n.var(j) if n.used(j) else "_" for j in range(len(n.outputs))]
    target = ", ".join(names)
    if cond is not None:
        (method, captured, _), = arms.values()
        n.line(f"{target} = self.{method}({', '.join(captured)})")
    else:
        n.line(f"if {n.t(0)}:")
        for key in ("then_branch", "else_branch"):
            if key == "else_branch":
                n.line("else:")
            method, captured, _ = arms[key]
            n.line(f"    {target} = self.{method}({', '.join(captured)})")
    for j, name in enumerate(names):
        if name != "_":
            n.gen.values[n.outputs[j]] = Value("tensor", name)
