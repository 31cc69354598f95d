"""Frozen GraphDefs (.pb): conversion with --inputs/--outputs tensor names, the hint when they
are missing, the op screen, corrupt files and `inspect`."""

from __future__ import annotations

import numpy as np
import pytest

from modelport.parsers import SourceSpec, detect, parse
from modelport.resolve.specs import parse_input_spec
from modelport.runtimes.onnxruntime import OnnxRuntimeRunner
from modelport.zoo_builders import keras as builders


def _freeze(fn, path, *, lower: bool = False):
    from tensorflow.python.framework.convert_to_constants import convert_variables_to_constants_v2

    frozen = convert_variables_to_constants_v2(fn.get_concrete_function(), lower_control_flow=lower)
    path.write_bytes(frozen.graph.as_graph_def().SerializeToString())
    return [t.name for t in frozen.outputs]


@pytest.fixture(scope="module")
def graphs(tmp_path_factory):
    import tensorflow as tf

    d = tmp_path_factory.mktemp("graphdef")
    cnn = builders.keras_cnn()
    serve = tf.function(lambda x: cnn(x, training=False), input_signature=[tf.TensorSpec([None, 32, 32, 3], tf.float32, name="image")])
    outs = _freeze(serve, d / "cnn.pb")
    rnn = builders.keras_rnn()
    serve_rnn = tf.function(lambda x: rnn(x, training=False), input_signature=[tf.TensorSpec([None, None, 6], tf.float32, name="seq")])
    rnn_outs = _freeze(serve_rnn, d / "rnn.pb")
    _freeze(serve_rnn, d / "rnn_lowered.pb", lower=True)
    marker = d / "marker.txt"

    @tf.function(input_signature=[tf.TensorSpec([None, 2], tf.float32, name="x")])
    def writer(x):
        tf.io.write_file(str(marker), "pwned")
        return x * 2.0

    _freeze(writer, d / "writer.pb")
    return d, cnn, outs[0], rnn_outs[0], marker


def test_sniff(graphs):
    d = graphs[0]
    assert detect(d / "cnn.pb") == "graphdef"


def test_convert_with_tensor_names(cli, graphs, tmp_path):
    d, cnn, out_name, _, _ = graphs
    r = cli("convert", d / "cnn.pb", "--inputs", "image:0", "--outputs", out_name, "-o", tmp_path / "out", "--json")
    assert r.exit_code == 0, r
    report = r.json()
    (spec,) = report["contract"]["inputs"]
    assert spec["name"] == "image" and spec["layout"] == "NHWC" and spec["shape"] == ["batch", 32, 32, 3]
    assert report["contract"]["outputs"][0]["name"] == out_name.split(":")[0]
    assert all(p["ok"] for p in report["parity"])


def test_references_match_keras(graphs):
    d, cnn, out_name, _, _ = graphs
    ir = parse(d / "cnn.pb", SourceSpec(path=d / "cnn.pb", inputs=[parse_input_spec("image")], output_names=[out_name]))
    x = ir.reference.inputs["image"]
    np.testing.assert_allclose(ir.reference.outputs[ir.outputs[0].name], cnn.predict(x, verbose=0), atol=1e-5)
    assert ir.provenance["reference_varies"] == {ir.outputs[0].name: True}
    got = OnnxRuntimeRunner(ir.model).run({"image": np.ones((3, 32, 32, 3), np.float32)})
    assert next(iter(got.values())).shape == (3, 10)


def test_rnn_graph_with_user_shape(graphs):
    d, _, _, rnn_out, _ = graphs
    ir = parse(d / "rnn.pb", SourceSpec(path=d / "rnn.pb", inputs=[parse_input_spec("seq:0:batch,time,6")],
                                        output_names=[rnn_out], sample_dims={"time": 5}))
    assert ir.inputs[0].shape == ["batch", "time", 6]
    assert ir.reference.inputs["seq"].shape == (2, 5, 6)


def test_lowered_control_flow_names_the_unconvertible_ops(cli, graphs, tmp_path):
    d, _, _, rnn_out, _ = graphs
    r = cli("convert", d / "rnn_lowered.pb", "--inputs", "seq:0", "--outputs", rnn_out, "-o", tmp_path / "out")
    assert r.exit_code == 2, r
    assert "TensorListReserve" in r.stderr and not (tmp_path / "out").exists()


def test_names_required_with_a_hint(cli, graphs, tmp_path):
    d = graphs[0]
    r = cli("convert", d / "cnn.pb", "-o", tmp_path / "out")
    assert r.exit_code == 2, r
    assert "--inputs" in r.stderr and "image" in r.stderr
    r = cli("convert", d / "cnn.pb", "--inputs", "nope:0", "--outputs", "Identity:0", "-o", tmp_path / "out")
    assert r.exit_code == 2 and "nope" in r.stderr


def test_file_ops_refused(cli, graphs, tmp_path):
    d, *_, marker = graphs
    r = cli("convert", d / "writer.pb", "--inputs", "x:0", "--outputs", "Identity:0", "-o", tmp_path / "out")
    assert r.exit_code == 3, r
    assert "WriteFile" in r.stderr and not marker.exists()


@pytest.mark.parametrize("cut", [0.5, 0.9])
def test_truncated_pb_exit_2(cli, graphs, tmp_path, cut):
    d = graphs[0]
    raw = (d / "cnn.pb").read_bytes()
    bad = tmp_path / "bad.pb"
    bad.write_bytes(raw[: int(len(raw) * cut)])
    r = cli("convert", bad, "--inputs", "image:0", "--outputs", "Identity:0", "-o", tmp_path / "out")
    assert r.exit_code == 2, r
    assert "bad.pb" in r.stderr and not (tmp_path / "out").exists()


def test_lfs_pointer_exit_2(cli, tmp_path):
    bad = tmp_path / "model.pb"
    bad.write_text("version https://git-lfs.github.com/spec/v1\noid sha256:abc\nsize 12\n")
    r = cli("convert", bad, "--inputs", "x:0", "--outputs", "y:0", "-o", tmp_path / "out")
    assert r.exit_code == 2 and "LFS" in r.stderr


def test_inspect(cli, graphs):
    d = graphs[0]
    r = cli("inspect", d / "cnn.pb", "--json")
    assert r.exit_code == 0, r
    info = r.json()
    assert info["inputs"][0]["name"] == "image:0" and info["inputs"][0]["shape"] == ["?", 32, 32, 3]
    assert "Conv2D" in info["ops"]
