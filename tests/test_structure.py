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


# a name that holds an error's text (err, error, stderr, exc, reason, message, failure)
ERROR_TEXT = re.compile(r"err|exc|reason|message|failure", re.IGNORECASE)
# inline first-line cuts of text that is not an error's, as "path: the text cut": none today. A file's
# or a tool's data (not its error) may be cut here; an error's text goes through errors.one_line.
FIRST_LINE_CUTS_ALLOWED: set[str] = set()


def _cut_text(node: ast.AST) -> ast.AST | None:
    """The text `node` takes the first line of by hand: `x.splitlines()[0]`, `(x.splitlines() or [...])[0]`,
    `x.split("\\n")[0]`, `x.partition("\\n")[0]`; None for anything else."""
    if not (isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) and node.slice.value == 0):
        return None
    call = node.value
    if isinstance(call, ast.BoolOp) and isinstance(call.op, ast.Or):
        call = call.values[0]
    if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)):
        return None
    newline = bool(call.args) and isinstance(call.args[0], ast.Constant) and call.args[0].value == "\n"
    if call.func.attr == "splitlines" or (call.func.attr in ("split", "partition") and newline):
        return call.func.value
    return None


def error_first_line_cuts_in(path: Path) -> list[str]:
    """'line: text' for each first-line cut written out by hand on an error's text in `path`: text that
    reads a name an `except … as` binds or a parameter typed as an exception (`str(e)`), or a name
    assigned from one (`text = str(e).strip()`), or a name that says it holds an error (`error`,
    `proc.stderr`, `reason`)."""
    tree = ast.parse(path.read_text())
    caught = {h.name for h in ast.walk(tree) if isinstance(h, ast.ExceptHandler) and h.name}
    caught |= {a.arg for a in ast.walk(tree) if isinstance(a, ast.arg) and a.annotation is not None
               and re.search(r"Exception|Error", ast.unparse(a.annotation))}
    assigned = [a for a in ast.walk(tree) if isinstance(a, ast.Assign)]
    for _ in range(2):  # `text = str(e).strip()`, then `line = text…`
        caught |= {t.id for a in assigned if {n.id for n in ast.walk(a.value) if isinstance(n, ast.Name)} & caught
                   for t in a.targets if isinstance(t, ast.Name)}
    found = []
    for node in ast.walk(tree):
        text = _cut_text(node)
        if text is None:
            continue
        names = {n.id for n in ast.walk(text) if isinstance(n, ast.Name)}
        names |= {n.attr for n in ast.walk(text) if isinstance(n, ast.Attribute)}
        if names & caught or any(ERROR_TEXT.search(n) for n in names):
            found.append((node.lineno, f"{node.lineno}: {ast.unparse(text)}"))
    return [cut for _, cut in sorted(found)]


def test_an_error_s_first_line_is_cut_by_errors_one_line_alone():
    """One helper takes "the first line of an error's text" (errors.one_line: first non-empty line,
    folded, cut with …, the class name for an empty message): no second helper, no cut by hand."""
    helpers = [f"{p.relative_to(SRC)}: {node.name}" for p in sorted(SRC.rglob("*.py"))
               for node in ast.walk(ast.parse(p.read_text()))
               if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
               and ("first_line" in node.name or "one_line" in node.name)]
    assert helpers == ["errors.py: one_line"]
    cuts = [f"{p.relative_to(SRC)}:{cut}" for p in sorted(SRC.rglob("*.py")) for cut in error_first_line_cuts_in(p)
            if f"{p.relative_to(SRC)}: {cut.split(': ', 1)[1]}" not in FIRST_LINE_CUTS_ALLOWED]
    assert cuts == []


def test_the_cut_check_finds_a_cut_where_there_is_one(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text("try:\n    pass\nexcept ValueError as e:\n    why = str(e).strip().splitlines()[0][:200]\n"
                     "def f(err: Exception, proc, path):\n    a = (str(err).splitlines() or [''])[0]\n"
                     "    b = proc.stderr.split('\\n')[0]\n    c = path.read_text().splitlines()[0]\n"
                     "    text = str(err).strip()\n    d = text.partition('\\n')[0]\n")
    assert error_first_line_cuts_in(probe) == ["4: str(e).strip()", "6: str(err)", "7: proc.stderr", "10: text"]


# The convert pipeline's modules, and the refusals (exit 2) they may make outside `request.decide`:
# each one needs the source or the model, so it cannot be made before any work. A new refusal that
# needs neither belongs in `decide`.
CONVERT_PIPELINE = ("orchestration/options.py", "orchestration/request.py", "orchestration/source.py",
                    "orchestration/convert.py", "orchestration/forward.py", "orchestration/jobs.py",
                    "orchestration/optimize_stage.py", "orchestration/text_generation.py",
                    "orchestration/text_generation_options.py", "orchestration/decoder_variants.py")
DECIDED = {"orchestration/request.py": None,  # decide() and its helpers
           # refusals: called by decide() alone; __post_init__: the options class checks its own fields'
           # values when it is built, before decide, as every stage's options class does
           "orchestration/text_generation_options.py": {"refusals", "__post_init__"}}
NEEDS_THE_MODEL = {
    ("orchestration/source.py", "resolve_source"): "--task on a source that is no Hugging Face folder: reads the folder",
    ("orchestration/forward.py", "_parse"): "--package on a source whose parse gave several models (known only from the parse)",
    ("orchestration/text_generation.py", "check_fp16"): "a folder the fp16 writer does not cover: reads config.json",
    ("orchestration/text_generation.py", "check_memory"): "--reference streamed on a folder it cannot read",
    ("orchestration/text_generation.py", "check_disk"): "the disk a folder's conversion needs",
    ("orchestration/text_generation.py", "export_and_reference"): "--new-tokens past the model's positions with the tokenized prompts",
}


def refusals_outside_decide(root: Path = SRC) -> dict[tuple[str, str], int]:
    """(file, function) -> the exit-2 raises (BadInputError) in it, for the convert pipeline's
    functions outside `request.decide` and the functions only it calls."""
    found: dict[tuple[str, str], int] = {}
    for rel in CONVERT_PIPELINE:
        tree = ast.parse((root / rel).read_text())
        allowed = DECIDED.get(rel, set())
        for fn in ast.walk(tree):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) or rel in DECIDED and (allowed is None or fn.name in allowed):
                continue
            n = sum(1 for node in ast.walk(fn) if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call)
                    and getattr(node.exc.func, "id", "") == "BadInputError")
            if n:
                found[(rel, fn.name)] = found.get((rel, fn.name), 0) + n
    return found


def test_every_refusal_that_needs_no_model_is_made_by_decide():
    """Refusals outside decide() are only those that read the source or the model (NEEDS_THE_MODEL,
    each with its reason); options.py and the optimisation stage make none."""
    outside = refusals_outside_decide()
    assert set(outside) <= set(NEEDS_THE_MODEL), f"refusals outside request.decide: {sorted(set(outside) - set(NEEDS_THE_MODEL))}"
    assert not [k for k in outside if k[0] in ("orchestration/options.py", "orchestration/optimize_stage.py", "orchestration/jobs.py")]


def test_the_refusal_check_finds_one_outside_decide(tmp_path):
    (tmp_path / "orchestration").mkdir()
    for rel in CONVERT_PIPELINE:
        (tmp_path / rel).write_text((SRC / rel).read_text())
    with open(tmp_path / "orchestration/optimize_stage.py", "a") as f:
        f.write("\n\ndef late(x):\n    if x:\n        raise BadInputError('too late')\n")
    assert refusals_outside_decide(tmp_path)[("orchestration/optimize_stage.py", "late")] == 1


# The plan's types: what decide() and the planners hand the emit chain
PLAN_TYPES = {"orchestration/request.py": ("Request",),
              "orchestration/jobs.py": ("Job", "Prepared", "Context", "JobResult", "Fallback", "StageResult", "Parsed", "Planned"),
              "validation/report.py": ("Findings", "ContractEntry", "Sides"),
              "emitters/__init__.py": ("EmitOptions",)}


def untyped_plan_fields() -> list[str]:
    """'file: Class.field' for each field of a plan type annotated Any or object (or not at all)."""
    found = []
    for rel, classes in PLAN_TYPES.items():
        for node in ast.walk(ast.parse((SRC / rel).read_text())):
            if isinstance(node, ast.ClassDef) and node.name in classes:
                for item in node.body:
                    if isinstance(item, ast.AnnAssign) and re.search(r"\b(Any|object)\b", ast.unparse(item.annotation)):
                        found.append(f"{rel}: {node.name}.{ast.unparse(item.target)}")
    return found


def test_the_plan_types_have_no_untyped_field():
    assert untyped_plan_fields() == []


def _calls(name: str) -> list[str]:
    return [f"{p.relative_to(SRC)}:{node.lineno}" for p in sorted(SRC.rglob("*.py"))
            for node in ast.walk(ast.parse(p.read_text()))
            if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) == name]


def test_emit_options_are_put_together_in_one_place():
    """Request.emit_options builds what every emitter reads; the rest derive from it (dataclasses.replace)."""
    assert [c.split(":")[0] for c in _calls("EmitOptions")] == ["orchestration/request.py"]


def test_route_plans_are_changed_by_one_planner():
    """A job's routes are set and pruned in jobs.plan_routes alone (drift, preflight), not by the pipelines."""
    changed = []
    for p in sorted((SRC / "orchestration").rglob("*.py")):
        tree = ast.parse(p.read_text())
        for fn in ast.walk(tree):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(fn):
                target = None
                if isinstance(node, ast.Assign):
                    target = next((ast.unparse(t) for t in node.targets if ast.unparse(t).endswith(("plan", ".routes", ".notes"))), None)
                elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in ("pop", "append", "remove", "insert") \
                        and ast.unparse(node.func.value).endswith((".routes", "plan.notes")):
                    target = ast.unparse(node.func)
                if target:
                    changed.append(f"{p.relative_to(SRC)}:{fn.name}")
    assert set(changed) == {"orchestration/jobs.py:plan_routes"}, sorted(set(changed))


# The report is written from what the stages return: `Report.record(Findings)` (and the pipeline's
# `recorded(report, StageResult)`), and the optimisation passes' own stage rows; nothing else
# writes into it, and no stage writes into it while it runs.
REPORT_WRITE_SITES = 15
REPORT_METHODS = {"data", "finished", "stage", "stage_names", "add_stage_rows", "record", "finish", "to_dict", "to_json",
                  "write", "write_failed"}


def report_write_sites(root: Path = SRC) -> list[str]:
    """'file:line' of each call that writes into a report: a Report method (`x.record(...)`,
    `x.add_stage_rows(...)`) or the pipeline's `recorded(...)`, outside validation/report.py."""
    sites = []
    for p in sorted(root.rglob("*.py")):
        rel = str(p.relative_to(root))
        if rel == "validation/report.py":
            continue
        for node in ast.walk(ast.parse(p.read_text())):
            if not isinstance(node, ast.Call):
                continue
            f = node.func
            if isinstance(f, ast.Attribute) and f.attr in ("record", "add_stage_rows") or isinstance(f, ast.Name) and f.id == "recorded":
                sites.append(f"{rel}:{node.lineno}")
    return sites


def test_the_report_is_written_from_what_the_stages_return():
    sites = report_write_sites()
    assert len(sites) <= REPORT_WRITE_SITES, sites
    from modelport.validation.report import Report

    assert {m for m in vars(Report) if not m.startswith("_")} == REPORT_METHODS  # no section setter comes back


def test_the_write_site_count_finds_a_write(tmp_path):
    (tmp_path / "w.py").write_text("def f(report, found, record):\n    report.record(found)\n    record(1, 2)\n"
                                   "    recorded(report, found)\n    report.add_stage_rows([])\n")
    assert report_write_sites(tmp_path) == ["w.py:2", "w.py:4", "w.py:5"]


def test_no_attempt_is_taken_back_from_the_report():
    """A route or a precision given up leaves nothing to take back: each job returns its result and the
    run records the one it keeps (orchestration/jobs.py), so the report has no discard or settle."""
    from modelport.validation.report import Report

    assert not [m for m in vars(Report) if "attempt" in m]
    assert _calls("discard_attempt") == [] and _calls("settle_attempt") == []


# The frameworks a module imports inside the function that needs them, so that importing modelport
# (and each runtime's clean child) loads none it does not use. Every other import stands at the top of
# its file, where a reader sees it, except in the modules the command line imports to start (cli/,
# the descriptors), which import a command's work in its body so that `modelport --help` stays instant.
LAZY_FRAMEWORKS = {
    "torch", "torchvision", "tensorflow", "keras", "tf_keras", "tf2onnx", "onnx2tf", "tensorflowjs", "transformers", "safetensors",
    "onnx", "onnxruntime", "onnxruntime_genai", "onnxscript", "onnx_ir", "onnxsim", "onnxconverter_common", "numpy", "ml_dtypes",
    "coremltools", "openvino", "nncf", "executorch", "litert_torch", "ai_edge_quantizer", "ai_edge_litert", "tflite_runtime",
    "tensorrt", "paddle", "paddle2onnx", "cv2", "PIL", "ray", "kserve", "tritonclient", "grpc", "google", "uvicorn", "orjson",
    "boto3", "botocore", "yaml", "jsonschema", "psutil", "flatbuffers", "rich", "typer", "huggingface_hub", "tokenizers",
}
LOCAL_IMPORTS_PER_KLOC = 15


def local_imports() -> tuple[int, int, list[str]]:
    """(lines of code, function-local imports that are not a LAZY_FRAMEWORKS one, those imports as
    'file:line: module')."""
    lines, found = 0, []
    for p in sorted(SRC.rglob("*.py")):
        text = p.read_text()
        lines += text.count("\n")
        for fn in ast.walk(ast.parse(text)):
            if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for node in ast.walk(fn):
                    if isinstance(node, (ast.Import, ast.ImportFrom)):
                        name = node.names[0].name if isinstance(node, ast.Import) else (node.module or ".")
                        if name.split(".")[0] not in LAZY_FRAMEWORKS:
                            found.append(f"{p.relative_to(SRC)}:{node.lineno}: {name}")
    return lines, len(found), found


def test_imports_stand_at_the_top_of_the_file_apart_from_the_named_frameworks():
    lines, n, found = local_imports()
    assert n * 1000 / lines <= LOCAL_IMPORTS_PER_KLOC, f"{n} function-local imports in {lines} lines; e.g. {found[:10]}"


TASKS = {"orchestration/forward.py": "ForwardRun", "orchestration/text_generation.py": "TextGenerationRun"}


def attributes_set_mid_run(root: Path = SRC) -> list[str]:
    """'Class.attr' for each attribute a pipeline task's method sets that its __init__ does not
    declare: a task's state is declared when it is made, not gained part way through a run."""
    found = []
    for rel, name in TASKS.items():
        cls = next(n for n in ast.walk(ast.parse((root / rel).read_text())) if isinstance(n, ast.ClassDef) and n.name == name)
        declared, later = set(), set()
        for fn in cls.body:
            if not isinstance(fn, ast.FunctionDef):
                continue
            for node in ast.walk(fn):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
                for t in targets:
                    for e in ast.walk(t):
                        if isinstance(e, ast.Attribute) and isinstance(e.value, ast.Name) and e.value.id == "self":
                            (declared if fn.name == "__init__" else later).add(e.attr)
        found += [f"{name}.{a}" for a in sorted(later - declared)]
    return found


def test_a_pipeline_task_declares_its_state_when_it_is_made():
    assert attributes_set_mid_run() == []


def test_the_mid_run_attribute_check_finds_one(tmp_path):
    (tmp_path / "orchestration").mkdir()
    for rel in TASKS:
        (tmp_path / rel).write_text((SRC / rel).read_text().replace("    def __exit__(self, *exc) -> bool:\n",
                                                                     "    def __exit__(self, *exc) -> bool:\n        self.late = 1\n", 1))
    assert attributes_set_mid_run(tmp_path) == ["ForwardRun.late", "TextGenerationRun.late"]
