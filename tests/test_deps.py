"""Missing optional frameworks: every command that needs one exits 5 naming the extra, in one line.

Each case runs the real CLI in a child process whose `sitecustomize` hides the framework
(`sys.modules[name] = None`, which is how a failed import looks); the processes modelport starts
(the isolated TFLite loader) inherit the hiding through PYTHONPATH.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from modelport.deps import missing_dependency, require
from modelport.errors import BadInputError, MissingDependencyError

REPO = Path(__file__).resolve().parents[1]
TFLITE = "tensorflow,ai_edge_litert,tflite_runtime"  # no TFLite interpreter at all


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> Path:
    """Source files of every kind, and a convert output (ONNX + PyTorch code) to package."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    import modelport
    from modelport.zoo_builders import save_source
    from tests.tflite_models import write_two_input_tflite

    root = tmp_path_factory.mktemp("deps")
    save_source("mlp", root / "mlp")
    save_source("keras_cnn", root / "keras")
    rng = np.random.default_rng(0)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])],
        initializer=[numpy_helper.from_array(rng.standard_normal((8, 4)).astype(np.float32), "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    (root / "onnx").mkdir()
    onnx.save(model, str(root / "onnx" / "m.onnx"))
    (root / "tflite").mkdir()
    write_two_input_tflite(root / "tflite" / "m.tflite")
    modelport.convert(root / "onnx" / "m.onnx", root / "conv", targets="onnx,pytorch")
    site = root / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(
        "import os, sys\nfor n in os.environ.get('MODELPORT_TEST_HIDE', '').split(','):\n    if n:\n        sys.modules[n] = None\n")
    return root


# (modules to hide, command line with {root} for the fixture folder, extra the message must name)
CASES = [
    ("torch", "convert {root}/mlp/model.pt2 --input input:batch,32 -o {out}", "torch"),
    ("safetensors", "convert {root}/mlp/model.safetensors --arch zoo:mlp -o {out}", "torch"),
    ("transformers", "convert zoo:bert_tiny -o {out}", "torch"),
    ("torch", "convert {root}/onnx/m.onnx --to pytorch -o {out}", "torch"),
    ("safetensors", "emit {root}/onnx/m.onnx --to pytorch -o {out}", "torch"),
    ("keras", "convert {root}/keras/model.keras -o {out}", "tf"),
    ("tensorflow", "convert {root}/keras/model.keras -o {out}", "tf"),
    ("tf2onnx", "convert {root}/keras/model.keras -o {out}", "tf"),
    (TFLITE, "convert {root}/tflite/m.tflite -o {out}", "tf"),
    ("onnx2tf", "convert {root}/onnx/m.onnx --to tflite -o {out}", "tf"),
    ("onnx2tf", "emit {root}/onnx/m.onnx --to tflite -o {out}", "tf"),
    ("tensorrt", "emit {root}/onnx/m.onnx --to tensorrt -o {out}", "tensorrt"),
    ("onnxscript", "convert {root}/onnx/m.onnx --optimize all -o {out}", "optimize"),
    ("onnxscript", "optimize {root}/onnx/m.onnx --level all -o {out}", "optimize"),
    ("onnxsim", "optimize {root}/onnx/m.onnx --passes simplify -o {out}", "optimize"),
    ("onnx_ir", "optimize {root}/onnx/m.onnx --level basic -o {out}", "optimize"),
    (TFLITE, "validate {root}/tflite/m.tflite {root}/tflite/m.tflite", "tf"),
    ("tritonclient", "package {root}/conv --for triton -o {out}", "serve"),
    ("onnx2tf", "package {root}/conv --for tfserving -o {out}", "tf"),
    ("torch", "package {root}/conv --for triton --backend torchscript --trust -o {out}", "torch"),
    ("torch", "zoo build mlp -o {out}", "torch"),
    ("keras", "zoo build keras_cnn -o {out}", "tf"),
    ("torch", "inspect {root}/mlp/model.pt2", "torch"),
    (TFLITE, "inspect {root}/tflite/m.tflite", "tf"),
    ("openvino", "convert {root}/onnx/m.onnx --to openvino -o {out}", "openvino"),
    ("openvino", "emit {root}/onnx/m.onnx --to openvino --precision bf16 -o {out}", "openvino"),
    ("nncf", "convert {root}/onnx/m.onnx --to openvino --precision int8 -o {out}", "openvino"),
    ("openvino", "convert {root}/onnx/m.onnx --optimize auto --runtimes onnxruntime,openvino -o {out}", "openvino"),
    ("executorch", "convert {root}/onnx/m.onnx --to executorch -o {out}", "executorch"),
    ("executorch", "convert {root}/mlp/model.pt2 --to executorch -o {out}", "executorch"),
]


@pytest.mark.parametrize(("hide", "command", "extra"), CASES, ids=[f"{h.split(',')[0]}-{c.split()[0]}-{i}" for i, (h, c, _) in enumerate(CASES)])
def test_missing_framework_is_exit_5_naming_the_extra(models, tmp_path, hide, command, extra):
    out = tmp_path / "out"
    args = command.format(root=models, out=out).split()
    env = {**os.environ, "MODELPORT_TEST_HIDE": hide,
           "PYTHONPATH": os.pathsep.join([str(models / "site"), str(REPO / "src"), os.environ.get("PYTHONPATH", "")])}
    p = subprocess.run([sys.executable, "-m", "modelport", *args, "-q"], capture_output=True, text=True, env=env, timeout=600)
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 5, p.stderr[-3000:]
    assert len(lines) == 1 and f'pip install "modelport[{extra}]"' in lines[0], p.stderr[-3000:]
    assert not out.exists()


def test_missing_dependency_follows_the_cause_chain_and_names_the_absent_module():
    """A wrapper raised `from` a failed framework import is a missing dependency; other imports are not."""
    wrapped = BadInputError("truncated or not a PyTorch file")
    wrapped.__cause__ = ModuleNotFoundError("No module named 'safetensors.torch'", name="safetensors.torch")
    missing = missing_dependency(wrapped)
    assert isinstance(missing, MissingDependencyError) and 'pip install "modelport[torch]"' in missing.message
    assert missing_dependency(ModuleNotFoundError("No module named 'mypkg'", name="mypkg")) is None
    assert missing_dependency(BadInputError("bad file")) is None
    with pytest.raises(MissingDependencyError, match=r"'onnxscript' is not installed.*modelport\[optimize\]"):
        require("onnxscript.no_such_module")


def test_executorch_imports_without_the_cpu_machine_chatter():
    """executorch imports torchao, which logs every CUDA kernel library a CPU machine lacks (and
    the missing triton) at WARNING level: a converter's stderr shows none of it unless
    MODELPORT_DEBUG is set."""
    code = "from modelport.deps import require; require('executorch.exir')"
    env = {k: v for k, v in os.environ.items() if k != "MODELPORT_DEBUG"}
    quiet = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert quiet.returncode == 0, quiet.stderr[-2000:]
    assert "torchao" not in quiet.stderr and "triton" not in quiet.stderr.lower(), quiet.stderr[-2000:]
