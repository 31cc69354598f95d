"""The forward pipeline: models run once per input (classification, detection, embeddings, …),
every hop judged by parity on the sample sets.

    preflight  the source resolved (a path, `zoo:NAME` or an object), a Hugging Face folder's peak
               memory estimated (exit 2 before any work when it cannot fit)
    parse      the source's parser: the IR (ONNX), its contract, the source's reference outputs
    validate:ir  the IR in onnxruntime against those references (a failure stops the run, unless
               every target can be had from the source alone)
    optimise   orchestration/optimize_stage.py: the IR per precision the targets need
    emit, validate  per target (orchestration/jobs.py), each artifact run by its runtime in a
               clean child process (validation/artifact.py)

A source exported as several models (an encoder and a decoder) is converted part by part into
OUT/<part>/.
"""

from __future__ import annotations

from pathlib import Path

from modelport.dims import declared
from modelport.emitters.routes import kind_of, native_for, refusal, source_kind
from modelport.errors import BadInputError, ValidationError
from modelport.ir import IRModel, SourceRef
from modelport.onnxfile.onnx_io import EXTERNAL_DATA_THRESHOLD
from modelport.optimize.pipeline import check_parity
from modelport.optimize.weight_store import forget_onnxscript_matches
from modelport.orchestration.jobs import Context, Job, Parsed, Planned, StageResult, gathering, plan_jobs
from modelport.orchestration.optimize_stage import runs
from modelport.orchestration.source import describe_source, parse_noting_attempts, resolve_source
from modelport.packaging.reference_file import write_reference
from modelport.parsers import huggingface, parse
from modelport.resolve.precisions import FP32, Resolved
from modelport.run import memory
from modelport.run.memory import give_back
from modelport.targets import get
from modelport.validation import Tolerance, check_override_names, tolerance_for
from modelport.validation.artifact import ArtifactCheck, Judging, validate_artifact
from modelport.validation.report import ContractEntry, Findings

# The forward pipeline's peak resident memory (process tree) for a Hugging Face folder, estimated
# before any work from the fp32 size W of its safetensors' parameters: LIBRARIES + copies x W.
# Measured on random-init BERT-shaped folders, `--task feature-extraction --to onnx`: W = 1.0 GB
# peaked at 3.69 GB (validation's child reads, parses and copies the one-file artifact: about 3 W),
# W = 2.9 GB at 3.78 GB (external data from 1 GiB: 1.1 W); `--optimize all` on the 1.0 GB one at
# 5.64 GB (onnxruntime's transformer optimizer, about 4.9 W). Rounded up.
MEMORY_LIBRARIES = 1.0e9
MEMORY_COPIES = {"one file": 3.3, "external data": 1.4, "optimize": 5.2}


class ForwardRun:
    """One conversion in the forward pipeline (the pipeline's task protocol: orchestration/convert.py)."""

    def __init__(self, ctx: Context):
        self.ctx = ctx
        self.src = self.spec = self.zoo_tol = None
        self.source_ref: SourceRef | None = None
        self.framework = "source"
        self.source_precision: str | None = None  # what the source computes at where not fp32 (the parser says)
        self.companions: list[str] = []  # the source's tokenizer/preprocessor files, copied beside the artifacts (`finish`)
        self.reference = None  # the reference's sample sets, written beside the artifacts (`finish`)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> bool:
        return False

    # --- the stages, in the order the pipeline calls them --------------------------------------

    def preflight(self) -> None:

        request = self.ctx.request
        self.src, self.spec, self.zoo_tol = resolve_source(request.source, request.options)
        check_memory(self.src, self.ctx)

    def parse(self) -> Parsed:
        """{part: IR} ("" for a source converted as one model), with the source and each part's contract."""
        result = Parsed()
        with gathering(result) as found:
            result.parts = self._parse(found)
        return result

    def _parse(self, found: Findings) -> dict[str, IRModel]:
        import tempfile

        ctx, spec = self.ctx, self.spec
        with ctx.step("parse") as parsed, tempfile.TemporaryDirectory(prefix="modelport-export-") as exported:
            # an exporter writes the weights to files here and the IR comes back as its graph: the
            # weights are read in below, once the source model is gone, not held beside it
            spec.weights_dir = Path(exported)
            ir = parse_noting_attempts(parse, self.src, spec, parsed, found)
            spec.weights_dir = None
            forget_onnxscript_matches()  # the export's graph, whose tensors are the torch model's parameters
            give_back()  # what the source framework and its exporter freed: not kept beside the IR
            ir.attach_stored()
            parts = ir.parts or {"": ir}  # a model exported as several (an encoder and a decoder) goes to OUT/<part>/
            parsed.note(nodes=sum(len(p.model.graph.node) for p in parts.values()), exporter=ir.provenance.get("exporter"))
        self.source_ref = SourceRef(kind_of(ir.provenance), self.src, spec)  # for the native routes
        self.framework = ir.provenance.get("framework", "source")
        self.source_precision = ir.provenance.get("source_precision")
        self.companions = ir.provenance.get("companion_files") or []
        self.reference = None if ir.parts else ir.reference  # written beside the artifacts (`finish`)

        declared(ctx.request.options.dim_bounds, [s for p in parts.values() for s in p.inputs], path=spec.path)
        for pir in parts.values():
            pir.source = self.source_ref
            symbolic = {d for s in pir.inputs for d in s.shape if isinstance(d, str)}
            pir.dim_bounds = {d: b for d, b in ctx.request.options.dim_bounds.items() if d in symbolic}
        found.source = describe_source(self.src, ir)
        found.contracts = [ContractEntry(pir.contract(), pir.provenance.get("reference_varies"), tuple(spec.given), part)
                           for part, pir in parts.items()]
        if ir.parts and ctx.request.packages:
            raise BadInputError(f"--package takes one model; this source gives {len(parts)} ({', '.join(parts)})", path=spec.path)
        check_override_names(tol := self.tolerance(None), [o.name for p in parts.values() for o in p.outputs], path=spec.path)
        if tol.basis:  # the references carry the error of the source's own precision
            found.warn(f"the IR and every artifact are judged against the source's outputs with {tol.basis} "
                       f"(min cosine {tol.min_cosine:g}, atol {tol.atol:g}, rtol {tol.rtol:g})")
        return parts

    def prepare(self, part: str, ir: IRModel) -> Planned:
        """The part's IR checked against the source, optimised, and its jobs planned."""
        result = Planned()
        with gathering(result) as found:
            result.jobs = self._prepare(part, ir, found)
        return result

    def _prepare(self, part: str, ir: IRModel, found: Findings) -> list[Job]:
        from modelport.orchestration.optimize_stage import optimise

        ctx, options = self.ctx, self.ctx.request.options
        label, suffix = (f"{part}: ", f":{part}") if part else ("", "")
        check_reference_varies(ir, found, strict=options.strict, path=self.spec.path)
        with ctx.step(f"validate:ir{suffix}"):  # a large model is loaded from a file its weights wait in
            export_parity = check_parity(ir, self.tolerance(None), f"{label}{self.framework}→onnx (IR)")
        found.parity.append(export_parity.to_dict())
        drift = None  # the IR is not the source: only routes that read the source alone may go on
        if not export_parity.ok and from_source_alone(ir, ctx):
            drift = f"the ONNX IR fails parity with the source ({export_parity.summary()})"
            found.warn(f"{label}{drift}; every target is emitted from the source itself")
        else:
            export_parity.raise_if_failed(path=self.spec.path)
        with ctx.bounded("optimize"):  # the passes write their own rows
            prepared = optimise(ir, ctx, self.zoo_tol, found)
        if all(variant.model is not ir.model for variant in prepared.irs.values()):
            ir.model = None  # the IR before the passes: every target is emitted from what came out of them
            give_back()
        for variant in prepared.irs.values():
            variant.source = self.source_ref
        return plan_jobs(ctx, part, prepared, lambda r: self.tolerance(r, prepared.budget), drift=drift)

    def validate(self, job: Job, artifact, route) -> ArtifactCheck:
        """The artifact run by its runtime on the references, judged by its precision's tolerance."""

        if not (artifact.runner or artifact.not_validated):
            return ArtifactCheck()
        label = f"{job.part}: " if job.part else ""
        hop = f"{label}{self.framework}→{job.target} ({'native, ' if route.name == 'native' else ''}end to end)"
        out = self.ctx.request.out
        judging = Judging(job.tolerance, hop, check_io=bool(get(job.target).native), strict=self.ctx.request.options.strict,
                          out=out, root=self.ctx.stage)
        with self.ctx.step(f"validate:{job.target}{job.suffix}") as row:
            check = validate_artifact(artifact, job.ir, judging)
            if check.entry.get("validated") is False:
                row.note(ran=False)
        return check

    def finish(self, stage: Path) -> StageResult:
        """The source's tokenizer/preprocessor files next to the artifacts, and the reference's first
        sample set (`reference.npz`: what `modelport serve` checks the artifact's answers against)."""
        import shutil

        names = []
        for f in self.companions:
            shutil.copyfile(f, stage / Path(f).name)
            names.append(Path(f).name)
        return StageResult(Findings(files=names or None, reference=write_reference(self.reference, stage) or None))

    def tolerance(self, resolved: Resolved | None, budget: Tolerance | None = None) -> Tolerance:
        """The tolerance an artifact of `resolved`'s precision is judged with: its precision's defaults,
        the zoo entry's, the user's flags; the accuracy budget instead of the user's flags for a
        precision the optimisation stage applied. A source that computes below fp32 (the IR's
        `source_precision`) widens the defaults to its own precision's: every hop is judged against its outputs."""
        options = self.ctx.request.options
        source = self.source_precision
        if resolved is None or resolved.precision == FP32 or budget is None or resolved.stage != "optimize":
            return options.tolerance(resolved.judged_as if resolved else FP32, self.zoo_tol, source=source)
        return tolerance_for(resolved.judged_as, zoo=self.zoo_tol,
                             user={"atol": budget.atol, "rtol": budget.rtol, "min_cosine": budget.min_cosine},
                             overrides=options.output_tolerances, scaled=budget.scaled, source=source)


def check_memory(src, ctx: Context) -> None:
    """Refuse (exit 2, before any work) a Hugging Face folder whose conversion is estimated to need more
    memory than is available, rather than be killed part way; the `preflight:memory` row records the
    figures. MODELPORT_AVAILABLE_MEMORY overrides the memory counted as available. Other sources:
    nothing to read the size from before loading them; no row."""

    if not isinstance(src, (str, Path)) or not Path(src).is_dir() or not huggingface.sniff(Path(src)):
        return
    files = huggingface.weight_files(Path(src))[0]
    if not files:
        return
    with ctx.step("preflight:memory") as row:
        parameters = huggingface.parameter_count(files)
        weights = 4 * parameters
        case = "optimize" if runs(ctx.request) and ctx.request.options.level != "none" else \
            "external data" if weights >= EXTERNAL_DATA_THRESHOLD else "one file"
        need, free = int(MEMORY_LIBRARIES + MEMORY_COPIES[case] * weights), memory.available()
        row.note(parameters=parameters, estimated_peak_rss=need, available_memory=free, estimate=case)
    memory.refuse_if_short(need, free, why=f"{parameters / 1e6:,.0f} M parameters, {memory.fmt_bytes(weights)} in fp32, {case}",
                           path=src)


def check_reference_varies(ir: IRModel, found: Findings, *, strict: bool, path=None) -> None:
    """Warn about the source outputs that did not change between two sample sets (the contract
    records `reference_varies` per output), and fail under `strict`: parity against them proves nothing."""
    varies = ir.provenance.get("reference_varies") or {}
    fixed = [n for n, v in varies.items() if v is False]
    if not fixed:
        return
    text = (f"reference output(s) {fixed} do not change between two distinct sample inputs (or are all NaN/Inf): "
            "parity against them proves nothing about the conversion")
    if strict:
        raise ValidationError(text + " (--strict)", path=path)
    found.warn(text)


def from_source_alone(ir: IRModel, ctx: Context) -> bool:
    """Whether every target can be had from the source itself, the ONNX IR unused: each has a
    native route from this source that reads only the source file (`SOURCE_ONLY`, the TFLite
    re-emission) and takes the run's options, and `--route onnx` was not asked."""

    request = ctx.request
    if request.options.route == "onnx" or not request.targets:
        return False
    for t, r in request.precisions.items():
        native = native_for(source_kind(ir), t)
        eopts = request.emit_options(t, r.precision)
        if native is None or not native.SOURCE_ONLY or refusal(native, ir, eopts):
            return False
    return True

