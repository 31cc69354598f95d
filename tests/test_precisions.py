"""The one precision resolver (`modelport.resolve.precisions`): its rule, its table in the docs, and the
pipeline delivering exactly what it answers, for every (target set x --precision) pair.

The rule: each target keeps its own default unless --precision is given; a given precision applies
to every target, and one a target does not take is exit 2 before any work.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from modelport.errors import BadInputError
from modelport.resolve import precisions
from modelport.targets import TARGETS, emitting

DOC = Path(__file__).resolve().parents[1] / "docs" / "precisions.md"
TARGET_NAMES = [t.name for t in emitting()]
ASKED = [None, *precisions.all_precisions()]
# the targets whose conversions of a small model run here in seconds: converted end to end below
CHEAP = ("onnx", "ort", "pytorch", "openvino", "coreml")


def test_each_target_keeps_its_own_default_unless_a_precision_is_given():
    mixed = precisions.resolve(["coreml", "onnx"])
    assert (mixed["coreml"].precision, mixed["onnx"].precision) == ("fp16", "fp32")
    assert not mixed["coreml"].asked and mixed["coreml"].stage == "emit" and mixed["onnx"].stage == "none"
    both = precisions.resolve(["coreml", "onnx"], "fp16")
    assert {r.precision for r in both.values()} == {"fp16"} and all(r.asked for r in both.values())
    assert both["onnx"].stage == "optimize" and both["coreml"].stage == "emit"
    assert precisions.resolve(["tensorrt"], "best")["tensorrt"].judged_as == "fp16"
    assert precisions.resolve(["ort-genai"], task="text-generation")["ort-genai"].precision == "fp32"


@pytest.mark.parametrize("targets,precision,task,message", [
    (["savedmodel"], "fp16", None, "the savedmodel target is fp32 only, not fp16"),
    (["coreml", "onnx"], "int8", None, "the coreml target takes --precision fp16, fp32, not int8"),
    (["pytorch"], "fp16", None, "the pytorch target is fp32 only, not fp16"),  # was an fp32 artifact, silently
    (["onnx"], "int4", None, "--precision int4 is for --task text-generation"),
    (["onnx"], "auto", None, "--precision auto is for --task text-generation --optimize auto"),
    (["ort-genai"], None, None, "the ort-genai target writes models of --task text-generation only"),
    (["tflite"], None, "text-generation", "--task text-generation writes onnx, ort-genai; not tflite"),
    (["onnx"], "uint8", "text-generation", "--task text-generation takes --precision fp32, fp16, int8, int4 or auto; not uint8"),
])
def test_what_a_target_does_not_take_is_refused_naming_it(targets, precision, task, message):
    with pytest.raises(BadInputError, match=message.replace("+", r"\+")) as e:
        precisions.resolve(targets, precision, task)
    assert e.value.exit_code == 2


def test_the_docs_table_is_the_resolvers():
    """docs/precisions.md is generated from the descriptors: `python -m modelport.resolve.precisions` rewrites it."""
    assert DOC.read_text() == precisions.markdown()
    for t in emitting():
        for task in (None, *t.tasks):
            if precisions.takes(t, task):
                assert f"| {t.name} | {task or '(any other)'} | {', '.join(precisions.takes(t, task))} |" in DOC.read_text()


def _expected(targets: tuple[str, ...], precision: str | None):
    """The resolver's answer, or None when it refuses the pair."""
    try:
        return precisions.resolve(targets, precision)
    except BadInputError:
        return None


def test_every_target_set_and_precision_is_decided_once_before_any_work(tiny_onnx, tmp_path):
    """For every set of one or two targets and every --precision (none included), the run's request
    (orchestration/request.py, the one decision every stage reads) carries the resolver's answer for
    each target, or the run is exit 2 before anything is written."""
    from modelport.orchestration import ConvertOptions
    from modelport.orchestration.request import decide

    pairs = [(combo, p) for n in (1, 2) for combo in itertools.combinations(TARGET_NAMES, n) for p in ASKED]
    refused = 0
    for combo, precision in pairs:
        want = _expected(combo, precision)
        options = ConvertOptions(targets=list(combo), precision=precision)
        if want is None:
            refused += 1
            with pytest.raises(BadInputError) as e:
                decide(tiny_onnx, tmp_path / "out", options)
            assert e.value.exit_code == 2, (combo, precision)
        else:
            assert decide(tiny_onnx, tmp_path / "out", options).precisions == want, (combo, precision)
    assert not (tmp_path / "out").exists() and 0 < refused < len(pairs)


@pytest.fixture(scope="module")
def mlp_onnx(tmp_path_factory) -> Path:
    """A three-layer MLP (32 -> 64 -> 64 -> 8, ReLU) with a dynamic batch: large enough for INT8 and FP16 to hold."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    sizes, nodes, inits, x = [32, 64, 64, 8], [], [], "x"
    for i, (a, b) in enumerate(itertools.pairwise(sizes)):
        inits += [numpy_helper.from_array((rng.standard_normal((a, b)) / np.sqrt(a)).astype(np.float32), f"w{i}"),
                  numpy_helper.from_array(rng.standard_normal(b).astype(np.float32) * 0.1, f"b{i}")]
        nodes += [helper.make_node("MatMul", [x, f"w{i}"], [f"m{i}"]), helper.make_node("Add", [f"m{i}", f"b{i}"], [f"a{i}"])]
        x = f"a{i}"
        if i < len(sizes) - 2:
            nodes.append(helper.make_node("Relu", [x], [f"r{i}"]))
            x = f"r{i}"
    nodes.append(helper.make_node("Identity", [x], ["y"]))
    graph = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 32])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 8])], initializer=inits)
    path = tmp_path_factory.mktemp("mlp") / "mlp.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


# every precision of each target that converts a small model here in seconds, and the mixed sets that show the rule
CONVERTED = [(combo, p) for combo in [(t,) for t in CHEAP] for p in (None, "fp32", "fp16", "int8") if _expected(combo, p)] + [
    (("coreml", "onnx"), None), (("coreml", "onnx"), "fp16"), (("onnx", "ort"), "int8"), (("ort", "openvino"), "fp16"),
    (("onnx", "pytorch"), None), (("openvino", "coreml"), None)]


@pytest.mark.slow
@pytest.mark.parametrize("combo,precision", CONVERTED, ids=lambda v: ",".join(v) if isinstance(v, tuple) else str(v))
def test_the_report_s_precision_of_each_artifact_is_the_resolver_s(combo, precision, mlp_onnx, tmp_path):
    """End to end: each artifact's `precision` and `requested_precision` are the resolver's answer
    (`--to coreml,onnx` keeps Core ML's fp16), and a precision the optimisation stage applies shows
    as its stage row, once (`--precision fp16 --to ort` included, which used to skip the stage)."""
    from modelport.orchestration import ConvertOptions, convert

    want = precisions.resolve(combo, precision)
    report = convert(mlp_onnx, tmp_path / "out", ConvertOptions(targets=list(combo), precision=precision))
    got = {a["target"]: (a["precision"], a["requested_precision"]) for a in report["artifacts"]}
    assert got == {t: (r.precision, r.precision) for t, r in want.items()}
    staged = sorted(f"optimize:{'int8-dynamic' if r.precision == 'int8' else r.precision}" for r in
                    {r.precision: r for r in want.values() if r.stage == "optimize"}.values())
    assert sorted(s["name"] for s in report["stages"] if s["name"] in ("optimize:fp16", "optimize:int8-dynamic")) == staged


def test_the_emitters_take_the_precision_they_are_given():
    """No emitter decides a precision of its own: none holds a default or a list of its own (the
    resolver's table is the one place), so `--to coreml,onnx` cannot lose Core ML's fp16 again."""
    import re

    src = Path(__file__).resolve().parents[1] / "src" / "modelport" / "emitters"
    for path in src.rglob("*.py"):
        text = path.read_text()
        assert not re.search(r"options\.precision or \"", text), path
        assert "check_precision" not in text, path
    assert all(t.precisions or t.tasks for t in TARGETS.values() if t.is_target)
