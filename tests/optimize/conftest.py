"""Small real graphs for the optimisation tests, built with onnx.helper."""

from __future__ import annotations

import numpy as np
import pytest


def make_ir(nodes, inputs, outputs, inits=(), *, opset: int = 17, seed: int = 0, feeds=None):
    """An IRModel whose references are onnxruntime's outputs on seeded random inputs."""
    from onnx import helper, numpy_helper

    from modelport.ir import IRModel, Reference, specs_from_onnx
    from modelport.runtimes.onnxruntime import OnnxRuntimeRunner

    rng = np.random.default_rng(seed)
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info(n, 1, s) for n, s in inputs],
        [helper.make_tensor_value_info(n, 1, s) for n, s in outputs],
        [numpy_helper.from_array(v if getattr(v, "dtype", None) == np.int64 else np.asarray(v, np.float32), k)
         for k, v in dict(inits).items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    feeds = feeds or {n: rng.standard_normal(s).astype(np.float32) for n, s in inputs}
    ref = Reference(feeds, OnnxRuntimeRunner(model).run(feeds))
    return IRModel(model, specs_from_onnx(model.graph.input), specs_from_onnx(model.graph.output), reference=ref)


def ops(ir) -> list[str]:
    return [n.op_type for n in ir.model.graph.node]


def assert_same_outputs(a, b, atol=1e-5):
    from modelport.runtimes.onnxruntime import OnnxRuntimeRunner

    feeds = a.reference.inputs
    ra, rb = OnnxRuntimeRunner(a.model).run(feeds), OnnxRuntimeRunner(b.model).run(feeds)
    for k in ra:
        np.testing.assert_allclose(ra[k], rb[k], atol=atol, rtol=1e-4)


@pytest.fixture(scope="session")
def bert_ir():
    """The zoo's tiny BERT as an IR (torch.onnx dynamo export, 11 s: shared by the modules a worker
    runs; read-only, as every pass's input is)."""
    from modelport.orchestration.options import ConvertOptions
    from modelport.orchestration.source import resolve_source
    from modelport.parsers import parse

    src, spec, _ = resolve_source("zoo:bert_tiny", ConvertOptions())
    return parse(src, spec)


@pytest.fixture(scope="module")
def cnn_ir():
    from modelport.orchestration.options import ConvertOptions
    from modelport.orchestration.source import resolve_source
    from modelport.parsers import parse

    src, spec, _ = resolve_source("zoo:cnn_small", ConvertOptions())
    return parse(src, spec)
