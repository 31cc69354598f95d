"""`package()`: artifacts → one bundle per serving system, staged and renamed into place.

With one system the bundle is OUT_DIR itself; with several, each gets OUT_DIR/<system>/. An
existing OUT_DIR is refused unless `force` (replace it) or `add_version` (keep it and add a
version of the model to its Triton / TF Serving repositories). Either way the new tree is built
in a staging folder and swapped in at the end, so a failure leaves the old bundle (or nothing).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from modelport.errors import BadInputError
from modelport.serving import Bundle, PackageOptions, get_packager, parse_systems
from modelport.serving.bundle import Artifacts, load_artifacts
from modelport.validation.report import Report, Run, run_stage

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


def package(source, output_dir: str | Path, systems: str | list[str], options: PackageOptions | None = None,
            *, on_stage=None, **kwargs) -> dict:
    """Package `source` (a convert output folder or an .onnx file) for `systems`; returns the report."""
    from modelport.staging import staged_dir

    options = options or PackageOptions(**kwargs)
    with Run("package") as report:
        names = parse_systems(systems)
        out = Path(output_dir)
        if on_stage:
            on_stage("load")
        with report.stage("load") as entry:
            artifacts = load_artifacts(source)
            entry.note(artifacts=sorted(artifacts.files))
        report.set_source(artifacts.source_info())
        report.set_contract(artifacts.contract())
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
            report.set_bundles([b.to_dict(stage) for b in bundles])
            report.write(stage)
    return report.to_dict()


def package_converted(stage: Path, report: Report, systems: list[str], options: PackageOptions | None = None, *,
                      on_stage=None) -> list[Bundle]:
    """The convert pipeline's last step: bundles for `systems` in `stage/packages/<system>/`.

    The artifacts are the ones this run just wrote and validated, with the contract it recorded;
    its own PyTorch code may be imported to trace it (trust), as the run itself just did.
    """
    from modelport.serving.bundle import from_report

    artifacts = from_report(stage, report.data)  # read-only view
    opts = options or PackageOptions(trust=True)
    bundles = write_bundles(artifacts, stage / "packages", parse_systems(systems), opts, subfolders=True, report=report,
                            on_stage=on_stage)
    report.set_bundles([b.to_dict(stage) for b in bundles])
    return bundles
