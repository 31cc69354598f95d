"""Code run in an interpreter of its own, for tests that measure memory.

A test worker's process tree may hold other tests' children (servers, a Ray cluster), and its own
high-water mark is that of every test it ran before. A fresh interpreter measures with
`memory.own_peak()` (VmHWM), never with `getrusage(RUSAGE_SELF).ru_maxrss`: on Linux a process
started by a worker inherits the worker's mark in the latter (a 200 MB quantisation measured 2.2 GB
from a 2.4 GB worker), which hides growth below it and adds the worker's size above it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_alone(code: str, *args: str, timeout: float = 300) -> str:
    """`code`'s stdout, run by a fresh interpreter with `args` as sys.argv[1:]; fails the test on a
    non-zero exit, showing the end of its stderr."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=env, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


def reset_peak() -> None:
    """Start this process's high-water mark (VmHWM) afresh from its resident memory now (Linux's
    /proc/self/clear_refs), so that a peak measured next is not one reached while a test built its model."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def matmul_ir(count: int, *, identities: bool = False, reference: bool = False):
    """An IRModel of `count` chained MatMuls on x[2, 1024], each weight 1024x1024 float32 (4 MiB,
    seeded); with `identities` each product passes through an Identity (which dce removes); with
    `reference`, onnxruntime's outputs on a seeded input are its reference. Afterwards the process
    holds the weights once (the lists and the graph the model was copied from are let go)."""
    import numpy as np
    import onnx
    from onnx import helper, numpy_helper

    from modelport.ir import IRModel, Reference, TensorSpec
    from modelport.run.memory import give_back

    rng = np.random.default_rng(0)
    nodes, inits, prev = [], [], "x"
    for i in range(count):
        inits.append(numpy_helper.from_array(rng.standard_normal((1024, 1024), dtype=np.float32) / 32, f"w{i}"))
        nodes.append(helper.make_node("MatMul", [prev, f"w{i}"], [f"m{i}" if identities else f"h{i}"]))
        if identities:
            nodes.append(helper.make_node("Identity", [f"m{i}"], [f"h{i}"]))
        prev = f"h{i}"
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 1024])],
                              [helper.make_tensor_value_info(prev, onnx.TensorProto.FLOAT, [2, 1024])], inits)
    del inits
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    del graph
    ref = None
    if reference:
        from modelport.runtimes.onnxruntime import OnnxRuntimeRunner

        x = {"x": rng.standard_normal((2, 1024), dtype=np.float32)}
        ref = Reference(x, OnnxRuntimeRunner(model).run(x))
    ir = IRModel(model, [TensorSpec("x", "float32", [2, 1024])], [TensorSpec(prev, "float32", [2, 1024])], reference=ref)
    give_back()
    return ir
