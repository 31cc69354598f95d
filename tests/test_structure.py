"""The one-pipeline design, read from the code: no target named where the pipeline, the command line
or the validation decides, a short emit chain, no runner ability probed, no long file.

Each measure reads the source (nothing is run); a failure names the file and line to open.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "modelport"
TARGET_NAMES = ("openvino", "tensorrt", "tflite", "executorch", "coreml", "tfjs", "savedmodel", "ort_genai", "ort-genai")
# the chain one artifact goes through: the pipeline, its jobs, the tasks' validation, artifact validation
EMIT_CHAIN = ("orchestration/convert.py", "orchestration/jobs.py", "orchestration/forward.py",
              "orchestration/text_generation.py", "validation/artifact.py")


def _docstrings(tree: ast.AST) -> set[int]:
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
                out.add(id(first.value))
    return out


def target_names_in(path: Path) -> list[str]:
    """'line: name' for each target name in `path`'s code: a string constant that is one, or an
    identifier that holds one (docstrings and comments do not count)."""
    tree = ast.parse(path.read_text())
    skip = _docstrings(tree)
    found = []
    for node in ast.walk(tree):
        word = None
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
            word = node.value if node.value.lower() in TARGET_NAMES else None
        elif isinstance(node, ast.Name) and any(t in node.id.lower() for t in TARGET_NAMES):
            word = node.id
        elif isinstance(node, ast.Attribute) and any(t in node.attr.lower() for t in TARGET_NAMES):
            word = node.attr
        if word:
            found.append(f"{node.lineno}: {word}")
    return found


def test_no_target_is_named_where_the_pipeline_the_cli_or_the_validation_decides():
    """Every target-specific fact lives in the target's descriptor and modules."""
    leaks = {str(p.relative_to(SRC)): target_names_in(p)
             for folder in ("orchestration", "cli", "validation") for p in sorted((SRC / folder).rglob("*.py"))}
    assert {k: v for k, v in leaks.items() if v} == {}


def test_the_check_finds_a_name_where_there_is_one(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text('"""Mentions tflite in prose."""\n\nif artifact.runner == "tensorrt":\n    use_openvino_plain = 1\n')
    assert target_names_in(probe) == ["3: tensorrt", "4: use_openvino_plain"]


def test_no_function_of_the_emit_chain_takes_more_than_six_parameters():
    """One job object carries what the chain reads; no function passes a dozen values down."""
    wide = []
    for rel in EMIT_CHAIN:
        for node in ast.walk(ast.parse((SRC / rel).read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                a = node.args
                count = len(a.posonlyargs) + len(a.args) + len(a.kwonlyargs) + bool(a.vararg) + bool(a.kwarg)
                count -= bool(a.args) and a.args[0].arg in ("self", "cls")
                if count > 6:
                    wide.append(f"{rel}:{node.lineno} {node.name} ({count})")
    assert wide == []


def test_no_runner_ability_is_probed():
    """A runner's optional abilities are declared (runtimes/base.py: capabilities, cannot_run), never
    looked for with getattr/hasattr where artifacts are validated or compared."""
    pattern = re.compile(r"\b(getattr|hasattr)\((runner|self\.runner|idle\.runner|artifact|native|loaded)\b")
    found = [f"{p.relative_to(SRC)}:{i}" for folder in ("orchestration", "validation")
             for p in sorted((SRC / folder).rglob("*.py")) for i, line in enumerate(p.read_text().splitlines(), 1)
             if pattern.search(line)]
    assert found == []


def test_no_source_file_is_longer_than_500_lines():
    long = {str(p.relative_to(SRC)): n for p in SRC.rglob("*.py") if (n := len(p.read_text().splitlines())) > 500}
    assert long == {}


def test_the_architecture_doc_names_every_target():
    from modelport.targets import TARGETS

    text = (SRC.parents[1] / "docs" / "architecture.md").read_text().lower()
    assert [t for t in TARGETS if t not in text] == []
