"""`package()`: artifacts → one bundle per serving system, staged and renamed into place.

With one system the bundle is OUT_DIR itself; with several, each gets OUT_DIR/<system>/. An
existing OUT_DIR is refused unless `force` (replace it) or `add_version` (keep it and add a
version of the model to its Triton / TF Serving repositories). Either way the new tree is built
in a staging folder and swapped in at the end, so a failure leaves the old bundle (or nothing).

OUT_DIR may be `s3://bucket/prefix` (a str): the tree is built in a temporary local folder and
uploaded atomically (`serving.s3_repository.upload`, docs/serving_s3.md); the returned report then
holds `upload` ({uri, objects, bytes, manifest, manifest_sha256}) and an `upload` stage row, and a
KServe bundle's storageUri defaults to its server bundle's folder there. Any other `scheme://`
output is refused (exit 2), never taken for a local folder.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import tempfile
from pathlib import Path

from modelport.errors import BadInputError
from modelport.packaging import Bundle, PackageOptions, get_packager, kserve, parse_systems, s3_repository
from modelport.packaging.bundle import Artifacts, from_report, load_artifacts
from modelport.run.staging import staged_dir
from modelport.validation.report import ContractEntry, Findings, Report, Run, run_stage

# files above this size are hard-linked (not copied) when an existing repository is carried over
_LINK_ABOVE = 1 << 20


def _carry_over(src: Path, dst: Path) -> None:
    """Copy an existing bundle into the staging folder; large model files are hard-linked.

    Small files (configs, READMEs, report.json) are real copies because the packagers rewrite
    them, and writing through a hard link would change the live bundle before the swap.
    """
    def copy(s: str, d: str) -> None:
        if os.path.getsize(s) > _LINK_ABOVE:
            try:
                os.link(s, d)
                return
            except OSError:
                pass
        shutil.copy2(s, d)

    shutil.copytree(src, dst, symlinks=False, copy_function=copy, dirs_exist_ok=True)


def write_bundles(artifacts: Artifacts, dest: Path, systems: list[str], options: PackageOptions, *,
                  subfolders: bool, report: Report | None = None, on_stage=None) -> list[Bundle]:
    """Run each system's packager into `dest` (or `dest/<system>/`); returns the bundles."""
    bundles = []
    for system in systems:
        if on_stage:
            on_stage(f"package:{system}")
        folder = dest / system if subfolders else dest
        folder.mkdir(parents=True, exist_ok=True)
        packager = get_packager(system)
        if report is None:
            bundles.append(packager.package(artifacts, folder, options))
            continue
        with run_stage(report, f"package:{system}") as entry:
            bundle = packager.package(artifacts, folder, options)
            entry.note(files=len(bundle.files), model_name=bundle.details.get("model_name"))
        bundles.append(bundle)
    return bundles


def remote_output(output_dir: str | Path) -> str | None:
    """The s3:// URI `output_dir` names (None for a local folder); any other `scheme://` is exit 2."""
    text = output_dir if isinstance(output_dir, str) else None
    scheme = s3_repository.uri_scheme(text)
    if scheme is None:
        if text is None and s3_repository.uri_scheme(str(output_dir).replace(":/", "://", 1)):
            raise BadInputError(f"'{s3_repository.shown(str(output_dir))}' looks like a URI made into a path",
                                hint="pass an output URI as a str, not a Path")
        return None
    if scheme != "s3":
        raise BadInputError(f"unsupported output URI scheme '{scheme}://' in '{s3_repository.shown(text)}'",
                            hint="-o takes a local folder or s3://bucket/prefix")
    bucket, prefix = s3_repository.parse_uri(text)
    return f"s3://{bucket}/{prefix}"


def _package_remote(artifacts: Artifacts, uri: str, names: list[str], options: PackageOptions, report: Report,
                    on_stage=None) -> dict:
    """Build the bundles in a temporary folder and upload it to `uri`; returns the report with `upload`."""
    if options.add_version:
        raise BadInputError("--add-version needs a local output folder (an S3 repository is replaced whole, with --force)")
    if kserve.NAME in names and options.storage_uri is None:
        base = f"{uri}/{kserve.NAME}" if len(names) > 1 else uri
        options = dataclasses.replace(options, storage_uri=kserve.storage_uri_under(base, options))
    with tempfile.TemporaryDirectory(prefix="modelport-package-") as tmp:
        stage = Path(tmp) / "bundle"
        stage.mkdir()
        bundles = write_bundles(artifacts, stage, names, options, subfolders=len(names) > 1, report=report,
                                on_stage=on_stage)
        report.record(Findings(bundles=[b.to_dict(stage) for b in bundles]))
        report.write(stage)  # report.json travels with the bundle; the upload row is in the returned report only
        if on_stage:
            on_stage("upload")
        with report.stage("upload") as entry:
            info = s3_repository.upload(stage, uri, force=options.force)
            entry.note(**info)
    return {**report.to_dict(), "upload": info}


def package(source, output_dir: str | Path, systems: str | list[str], options: PackageOptions | None = None,
            *, on_stage=None, **kwargs) -> dict:
    """Package `source` (a convert output folder or an .onnx file) for `systems`; returns the report.

    `output_dir` is a local folder or an `s3://bucket/prefix` URI (module docstring)."""

    options = options or PackageOptions(**kwargs)
    with Run("package") as report:
        names = parse_systems(systems)
        remote = remote_output(output_dir)
        out = Path(output_dir)
        if on_stage:
            on_stage("load")
        with report.stage("load") as entry:
            artifacts = load_artifacts(source)
            entry.note(artifacts=sorted(artifacts.files))
        report.record(Findings(source=artifacts.source_info(), contracts=[ContractEntry(artifacts.contract())]))
        if remote:
            return _package_remote(artifacts, remote, names, options, report, on_stage)
        adding = options.add_version and out.exists()
        if options.add_version and options.force:
            raise BadInputError("--add-version keeps the existing bundle and --force replaces it: pick one")
        if adding and not out.is_dir():
            raise BadInputError("output exists and is not a folder", path=out)
        with staged_dir(out, [artifacts.source], force=options.force or adding) as stage:
            if adding:
                _carry_over(out, stage)
            bundles = write_bundles(artifacts, stage, names, options, subfolders=len(names) > 1, report=report,
                                    on_stage=on_stage)
            report.record(Findings(bundles=[b.to_dict(stage) for b in bundles]))
            report.write(stage)
    return report.to_dict()


def package_converted(stage: Path, report: Report, systems: list[str], options: PackageOptions | None = None, *,
                      on_stage=None) -> Findings:
    """The convert pipeline's last step: bundles for `systems` in `stage/packages/<system>/`.

    The artifacts are the ones this run just wrote and validated, with the contract it recorded;
    its own PyTorch code may be imported to trace it (trust), as the run itself just did.
    """

    artifacts = from_report(stage, report.data)  # read-only view
    opts = options or PackageOptions(trust=True)
    bundles = write_bundles(artifacts, stage / "packages", systems, opts, subfolders=True, report=report,
                            on_stage=on_stage)
    return Findings(bundles=[b.to_dict(stage) for b in bundles])
