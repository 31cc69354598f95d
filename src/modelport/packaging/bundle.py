"""What packaging reads: a convert output folder (report.json + artifacts) or a bare model file.

The I/O contract (names, dtypes, dynamic dims, layout, preprocessing) comes from the folder's
`report.json`, from the `modelport.contract` metadata of a modelport-written ONNX file, or from the
ONNX graph itself; a SavedModel folder gives it through its serving signature. Every config,
handler and manifest a packager writes takes its names and shapes from `Artifacts.inputs/outputs`.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from modelport.errors import BadInputError, UnsafeInputError
from modelport.ir import TensorSpec, contract_from_onnx
from modelport.onnxfile.onnx_io import load_onnx, model_files
from modelport.reference.samples import make_inputs
from modelport.run.file_checks import check_model_file, sha256_of
from modelport.run.names import check_path_name
from modelport.runtimes.onnxruntime import OnnxRuntimeRunner
from modelport.runtimes.savedmodel import signature_specs
from modelport.targets import TARGETS


def target_kinds() -> dict[str, str]:
    """A report artifact's `target` (a name or alias of modelport.targets) -> the artifact kind packagers ask for."""

    out = {t.name: t.name for t in TARGETS.values()}
    for t in TARGETS.values():
        out.update({a: t.name for a in t.aliases if a not in out})
    return out


def conventional() -> dict[str, str]:
    """Artifact kind -> its conventional path in a convert output folder (the descriptors' `file`),
    for folders whose report lists fewer artifacts."""

    return {t.name: t.file for t in TARGETS.values() if t.file}


def load_schema(name: str) -> dict:
    """A JSON Schema shipped in `modelport/packaging/schemas/`."""
    import importlib.resources

    return json.loads(importlib.resources.files("modelport.packaging").joinpath(name).read_text())


def check_schema(doc: dict, name: str, what: str) -> None:
    """Validate `doc` against the shipped schema `name` (needs jsonschema; skipped when absent);
    the first error is exit 2 naming `what` and where in the document."""
    try:
        import jsonschema
    except ImportError:
        return
    errors = sorted(jsonschema.Draft202012Validator(load_schema(name)).iter_errors(doc), key=lambda e: list(e.path))
    if errors:
        e = errors[0]
        where = "/".join(map(str, e.path)) or "(root)"
        raise BadInputError(f"{what} invalid at {where}: {e.message}")


def place_openvino_ir(artifacts: Artifacts, version_dir: Path, server: str) -> list[Path]:
    """The OpenVINO IR (model.xml + model.bin) copied into a server's version folder."""
    import shutil

    xml = artifacts.get("openvino", server)
    out = []
    for src in (xml, xml.with_suffix(".bin")):
        dst = version_dir / ("model" + src.suffix)
        shutil.copyfile(src, dst)
        out.append(dst)
    return out


def safe_name(text: str) -> str:
    """A model name every server accepts: letters, digits, '_' and '-', starting with a letter."""
    name = re.sub(r"[^A-Za-z0-9_-]+", "_", text).strip("_-") or "model"
    return name if name[0].isalpha() else f"m_{name}"


@dataclass
class Artifacts:
    """Converted artifacts plus the one I/O contract every packager takes its names and shapes from."""

    source: Path
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    name: str
    files: dict[str, Path] = field(default_factory=dict)  # kind -> main file or folder
    sample_dims: dict[str, int] = field(default_factory=dict)
    precision: str = "fp32"
    framework: str | None = None  # the framework the artifacts came from (a convert folder's source framework)
    format: str | None = None  # what `source` is: "convert output folder", "onnx", "saved_model"
    entries: dict[str, dict] = field(default_factory=dict)  # kind -> its report.json artifact entry (precision, details)

    def precision_of(self, kind: str) -> str:
        """The precision of the `kind` artifact as its report entry gives it (the ONNX one's for ONNX)."""
        return str(self.entries.get(kind, {}).get("precision") or (self.precision if kind == "onnx" else "fp32"))

    def source_info(self) -> dict[str, Any]:
        """The report's `source` entry: path, framework, format, and for a file its size and sha256."""
        info: dict[str, Any] = {"path": str(self.source), "framework": self.framework, "format": self.format,
                                "artifacts": sorted(self.files)}
        if self.source.is_file():

            info.update(size=self.source.stat().st_size, sha256=sha256_of(self.source))
        return info

    def contract(self) -> dict[str, Any]:
        return {"inputs": [s.to_dict() for s in self.inputs], "outputs": [s.to_dict() for s in self.outputs],
                "sample_dims": dict(self.sample_dims)}

    def has(self, kind: str) -> bool:
        return kind in self.files

    def get(self, kind: str, purpose: str) -> Path:
        if kind not in self.files:
            have = ", ".join(sorted(self.files)) or "none"
            raise BadInputError(f"no {kind} artifact for {purpose} (artifacts here: {have})", path=self.source,
                                hint=f"convert with --to {kind} first")
        return self.files[kind]

    def onnx_files(self) -> list[Path]:
        """model.onnx and its external-data files (checked to stay inside the folder)."""

        return model_files(self.get("onnx", "this bundle"))

    def batch_axis(self) -> str | None:
        """The symbolic name shared by dim 0 of every input and output, i.e. a batch axis a server may batch on."""
        specs = self.inputs + self.outputs
        if not specs or any(not s.shape for s in specs):
            return None
        first = {s.shape[0] for s in specs}
        if len(first) == 1:
            (dim,) = first
            return dim if isinstance(dim, str) else None
        return None

    def sample_inputs(self, batch: int = 1, seed: int = 0) -> dict[str, np.ndarray]:
        """Deterministic inputs with the batch axis at `batch` (for README requests and checks)."""

        dims = dict(self.sample_dims)
        axis = self.batch_axis()
        if axis:
            dims[axis] = batch
        return make_inputs(self.inputs, dims, seed=seed)

    def reference_outputs(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The ONNX artifact's outputs on `feeds` (onnxruntime, CPU)."""

        return OnnxRuntimeRunner(self.get("onnx", "reference outputs")).run(feeds)


def versions(model_dir: Path) -> list[int]:
    """The version folders of a model in a repository (Triton's and OVMS's layout), in order."""
    return sorted(int(p.name) for p in model_dir.iterdir() if p.is_dir() and p.name.isdigit()) if model_dir.is_dir() else []


def new_version(model_dir: Path, name: str, asked: int | None) -> tuple[int, list[int]]:
    """(the version a bundle adds to `model_dir`: `asked`, else one past the last; the versions already
    there); exit 2 when it exists."""
    existing = versions(model_dir)
    version = asked or ((existing[-1] + 1) if existing else 1)
    if (model_dir / str(version)).exists():
        raise BadInputError(f"version {version} of '{name}' already exists in the repository", path=model_dir / str(version),
                            hint="pick another --version, or --force without --add-version to replace the repository")
    return version, existing


def served_name(artifacts: Artifacts, options) -> str:
    """The model's name in the server (`--name`, else the artifacts' own): a folder and file name, so checked as one."""

    return check_path_name(options.model_name or artifacts.name, "--name")


def artifact_words(kind: str) -> str:
    """What an artifact kind is, in words (its descriptor's `artifact`; docs/serving.md has the full matrix)."""

    t = TARGETS.get(kind)
    return (t.artifact if t and t.artifact and kind != "onnx" else None) or kind


def unservable(artifacts: Artifacts, system: str, accepts: str) -> BadInputError:
    """The exit-2 error for artifacts `system` cannot serve, naming what it holds and what it accepts."""
    held = [artifact_words(k) for k in sorted(artifacts.files)] or ["no artifact"]
    return BadInputError(f"{system} cannot serve what this folder holds ({'; '.join(held)}); {system} takes {accepts}",
                         path=artifacts.source, hint="convert with --to onnx as well: every system here serves ONNX")


def _inside(path: Path, root: Path) -> bool:
    return os.path.commonpath([str(path.resolve()), str(root.resolve())]) == str(root.resolve())


def report_path(root: Path, rel: str) -> Path:
    """A path named in report.json, refused when it leaves the folder."""
    if os.path.isabs(rel) or ".." in Path(rel).parts:
        raise UnsafeInputError(f"report.json names '{rel}', a path outside the folder", path=root)
    p = root / rel
    if p.is_symlink() or not _inside(p, root):
        raise UnsafeInputError(f"report.json names '{rel}', which resolves outside the folder", path=root)
    return p


def _load_out_dir(root: Path) -> Artifacts:
    report_file = root / "report.json"
    try:
        report = json.loads(report_file.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise BadInputError(f"unreadable report.json ({type(e).__name__})", path=report_file) from None
    if not isinstance(report, dict):
        raise BadInputError("report.json is not a modelport report", path=report_file)
    return from_report(root, report)


def from_report(root: Path, report: dict) -> Artifacts:
    """Artifacts of a convert output folder, from its report (read from disk or still in memory)."""
    report_file = root / "report.json"
    if report.get("status") not in (None, "ok", "running"):
        raise BadInputError(f"the conversion did not succeed (status {report.get('status')!r})", path=report_file)
    contract = report.get("contract") or {}
    if not contract.get("inputs") or not contract.get("outputs"):
        raise BadInputError("report.json holds no I/O contract", path=report_file)
    files: dict[str, Path] = {}
    entries: dict[str, dict] = {}
    precision = "fp32"
    kinds = target_kinds()
    for a in report.get("artifacts", []):
        kind = kinds.get(str(a.get("target", "")).lower(), str(a.get("target", "")).lower())
        if a.get("path"):
            p = report_path(root, a["path"])
            if p.exists():
                files.setdefault(kind, p)
                entries.setdefault(kind, dict(a))
                if kind == "onnx":
                    precision = a.get("precision", precision)
    for kind, rel in conventional().items():
        p = root / rel
        if kind not in files and p.exists() and not p.is_symlink():
            files[kind] = p
    src = (report.get("source") or {}).get("path")
    name = Path(src).stem if src and not str(src).startswith("zoo:") else root.name
    if src and str(src).startswith("zoo:"):
        name = str(src)[4:]
    return Artifacts(
        source=root, inputs=[TensorSpec.from_dict(d) for d in contract["inputs"]],
        outputs=[TensorSpec.from_dict(d) for d in contract["outputs"]], name=safe_name(name), files=files,
        sample_dims=dict(contract.get("sample_dims") or {}), precision=precision,
        framework=(report.get("source") or {}).get("framework"), format="convert output folder", entries=entries,
    )


def _load_onnx_file(path: Path) -> Artifacts:

    # a modelport-written file carries layouts, preprocessing and value ranges the graph cannot
    inputs, outputs, sample_dims = contract_from_onnx(load_onnx(path, weights=False))
    return Artifacts(source=path, inputs=inputs, outputs=outputs, name=safe_name(path.stem), files={"onnx": path},
                     sample_dims=sample_dims, framework="onnx", format="onnx")


def _load_saved_model(path: Path) -> Artifacts:

    inputs, outputs = signature_specs(path)
    return Artifacts(source=path, inputs=inputs, outputs=outputs, name=safe_name(path.name), files={"savedmodel": path},
                     framework="tensorflow", format="saved_model")


def load_artifacts(source: str | Path) -> Artifacts:
    """Artifacts from a convert output folder, a bare .onnx file or a SavedModel folder."""

    path = check_model_file(source)
    if path.is_dir():
        if (path / "FAILED.json").is_file():
            raise BadInputError("this folder holds a failed run kept by --keep-failed (FAILED.json): its files did not "
                                "pass validation", path=path, hint="fix the conversion and package its real output")
        if (path / "report.json").is_file():
            return _load_out_dir(path)
        if (path / "saved_model.pb").is_file():
            return _load_saved_model(path)
        raise BadInputError("neither a convert output folder (no report.json) nor a SavedModel", path=path,
                            hint="package the folder 'modelport convert ... -o OUT' wrote")
    if path.suffix.lower() == ".onnx":
        return _load_onnx_file(path)
    raise BadInputError(f"cannot package a bare '{path.suffix}' file: it carries no I/O contract", path=path,
                        hint="package the folder 'modelport convert ... -o OUT' wrote, or an .onnx file")
