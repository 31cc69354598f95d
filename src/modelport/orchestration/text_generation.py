"""The text-generation pipeline: a decoder LM folder → KV-cache ONNX (fp32, fp16, int8 or int4
weight-only) and/or an onnxruntime-genai folder, each proven by generation.

    preflight:memory  the peak memory estimated from the checkpoint's headers, against the memory
               available (exit 2 before any work when it does not fit; see `check_memory`)
    parse      export with a KV cache (parsers/hf_decoder.py)
    reference  transformers `generate` (greedy) from fixed prompts on the same weights; or, with
               the streamed reference (`--reference streamed`, or chosen when the fp32 model does
               not fit in memory), nothing yet: each artifact is judged later against logits
               computed a layer at a time from the safetensors (validation/streamed_reference.py)
    validate:ir  the export on one left-padded decode step (streamed: on a prefill of each prompt,
               when the fp32 graph fits in memory, else skipped and said; with --optimize all the
               fused graph, which the artifacts are made from, is checked so first, and the export
               only when the fused graph misses, to tell a fusion that breaks from a wrong export)
    optimize   orchestration/decoder_variants.py: --optimize all (fusions, kept only when the fused
               model still generates the reference's tokens and logits), --precision int4/int8/fp16,
               or --optimize auto among variants
    emit       each target's emitter: `onnx` → model.onnx; `ort-genai` → ort-genai/
    validate   our greedy loop over each model in onnxruntime, compared token by token and logit by
               logit; a runtime that generates by itself (onnxruntime-genai) generates too, and must
               agree with our loop on the same file

FP32 must give identical tokens and logits within tolerance; fp16/int8/int4 are judged by token
agreement and worst logit error against `--accuracy-budget` (default `tokens>=0.9`). The jobs,
the staging folder and the report are the pipeline's (orchestration/convert.py, jobs.py).

Memory (the weights W in fp32; a model a few times the machine's memory must not need it many times
over): the transformers model is held only through export and reference and dropped before any
onnxruntime session; the exporter writes the weights from the torch tensors straight to a scratch
file, from which the IR check's session and the fusion read them; passes and the quantiser keep no
second copy of the model (optimize/weight_store.py); the IR handed to the emitters is a graph whose
weights wait in a file (`IRModel.stored`), copied tensor by tensor; sessions load models from files
with external data, one at a time. Peak about 2.6 W above the libraries
(tests/orchestration/test_text_generation_memory.py).

With the streamed reference nothing holds the fp32 model: the writer and the quantiser hold a tensor
at a time (the largest is the 152k-vocabulary embedding), the reference a layer at a time, and the
peak is the artifact's own onnxruntime session (`streamed_peak`): a 7 B decoder converts to int4
on a 24 GiB machine (bench/llm_scale.py --preset 7b).
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from modelport.errors import BadInputError
from modelport.orchestration import decoder_variants as variants
from modelport.orchestration.decoder_variants import AUTO
from modelport.orchestration.jobs import Context, Job, Parsed, Planned, Prepared, StageResult, gathering, plan_jobs
from modelport.orchestration.text_generation_options import TextGenerationOptions
from modelport.parsers import hf_decoder, hf_decoder_graph
from modelport.parsers.huggingface import check_safety, companion_files, parameter_count, read_config, sniff, weight_files
from modelport.resolve.specs import SourceSpec
from modelport.run import memory
from modelport.run.memory import fmt_bytes
from modelport.runtimes import runner_class
from modelport.runtimes.onnxruntime import OnnxRuntimeRunner
from modelport.validation import generation, streamed_reference
from modelport.validation.artifact import ArtifactCheck
from modelport.validation.generation import GenerationBudget
from modelport.validation.report import ContractEntry, Findings
from modelport.validation.streamed_reference import SUPPORTED, judge_streamed

# The route's peak resident memory (process tree), estimated before any work from the checkpoint's
# parameter count P: LIBRARIES + copies x 4P (the weights in fp32, as transformers holds them for
# the reference). Exported with dynamo (WEIGHT_COPIES), measured with bench/llm_scale.py on
# random-init Qwen2 folders: 494 M (Qwen2.5-0.5B) fp32 3.47 GB, int4 3.88 GB, i.e. about 1.27 GB +
# 1.1 (fp32) to 1.3 (int4) x 4P; rounded up. Written by parsers/hf_decoder_graph.py
# (WRITTEN_COPIES), the peak is the reference's child holding the fp32 model (the writer, the
# quantiser and emission hold one tensor at a time): 494 M fp32 2.64 GB, int4 2.6 GB, i.e. about
# 0.66 GB + 1.0 x 4P. --optimize auto, which builds and times several variants in memory, is not
# measured at that size: a wider margin.
LIBRARIES = 1.3e9
WEIGHT_COPIES = {"fp32": 1.5, "fp16": 1.5, "int8": 1.6, "int4": 1.6, AUTO: 2.5}
WRITTEN_COPIES = {"fp32": 1.15, "fp16": 1.15, "int8": 1.15, "int4": 1.15, AUTO: 2.5}
DEFAULT_QUANT_BUDGET = GenerationBudget(min_tokens=0.9)
# --reference auto streams from this many parameters on even when the fp32 model fits: the
# transformers reference (load, generate in fp32) then costs more than streaming a layer at a time
# (bench/llm_scale.py, int4 --optimize all: 1.54 B 163 s against 105 s streamed, the builder 54 s;
# 494 M 38.7 s against 36.7 s, even)
STREAM_FROM = 1_000_000_000
# The streamed route's peak (no fp32 model anywhere): LIBRARIES + the largest of
#   the artifact's onnxruntime session, SESSION_COPIES x its weights' bytes (`artifact_bytes`);
#   the writer and the quantiser, TENSOR_COPIES x the largest tensor in fp32 (the embedding);
#   the streamed reference, the embedding in fp32 plus one layer in fp32 (no session is held meanwhile).
SESSION_COPIES = 1.5
TENSOR_COPIES = 3.0
BYTES_PER_WEIGHT = {"fp32": 4.0, "fp16": 2.0, "int8": 1.0, "int4": 0.5}


class TextGenerationRun:
    """One conversion in the text-generation pipeline (the pipeline's task protocol:
    orchestration/convert.py). It owns the run's scratch folder (the export, fused and quantised
    models), removed when the run ends."""

    def __init__(self, ctx: Context):
        self.ctx = ctx
        self.options = ctx.request.options
        self.tg = self.options.text_generation or TextGenerationOptions()
        self.precision = next(iter(ctx.request.precisions.values())).precision  # a given one applies to all, defaults agree
        self.cfg = self.ref = self.prompts = self.export = None
        self.streamed = False  # the reference: streamed from the safetensors (True) or transformers in memory (check_memory decides)
        self.fp32_fits = True  # whether an fp32 graph of the model can run in onnxruntime here (the IR and fusion checks)
        self.streamed_cache: dict = {}  # the last streamed logits: the IR and the fused graph share the prompts' pass
        self.folder = Path(ctx.request.source)  # a folder: request.decide refused anything else
        self.scratch: Path | None = None  # the run's scratch folder, while the run is open
        self._scratch = None

    def __enter__(self):
        self._scratch = tempfile.TemporaryDirectory(prefix="modelport-text-generation-")
        self.scratch = Path(self._scratch.name)
        return self

    def __exit__(self, *exc) -> bool:
        self._scratch.cleanup()
        return False

    # --- the stages, in the order the pipeline calls them --------------------------------------

    def preflight(self) -> None:
        """Refusals that read the folder but do no work: an unsupported family, a folder --precision fp16
        does not cover, the folder's safety rules, not enough memory (the options were judged by
        `request.decide`)."""

        folder = self.folder
        self.cfg = cfg = hf_decoder.read_decoder_config(folder)  # read once for the run; an unsupported family is named first
        self.check_fp16(cfg)
        if sniff(folder):  # the Hugging Face folder rules: remote code, pickled weights, links leading outside
            check_safety(folder, read_config(folder), trust=self.options.trust)
            companion_files(folder)
        check_memory(folder, self)

    def check_fp16(self, cfg) -> None:
        """--precision fp16 is written from the folder (parsers/hf_decoder_graph.py): a folder the writer
        does not cover is exit 2 before any work, naming why."""

        if self.precision != "fp16":
            return
        why = hf_decoder_graph.unsupported(self.folder, cfg, self.options.opset)
        if why is not None:
            raise BadInputError(f"--precision fp16 is written for {', '.join(hf_decoder_graph.FAMILIES)} decoders; this one "
                                f"has {why}", path=self.folder, hint="--precision fp32, int8 or int4 export it with dynamo")

    def parse(self) -> Parsed:
        """The export with a KV cache and the reference generation (see `export_and_reference`)."""
        result = Parsed()
        with gathering(result) as found:
            result.parts = {"": export_and_reference(self, found)}
        return result

    def prepare(self, part: str, ir) -> Planned:
        """The export checked on one decode step, then fused, quantised or chosen (decoder_variants.py):
        the IR at its precision, its weights in a file; one job per target."""
        result = Planned()
        with gathering(result) as found:
            result.jobs = self._prepare(part, ir, found)
        return result

    def _prepare(self, part: str, ir, found: Findings) -> list[Job]:
        from modelport.validation import check

        ctx = self.ctx
        if self.streamed:
            if self.options.level != "all":  # else the fused graph is checked first, the IR only when it misses (decoder_variants.fused)
                self.check_ir()
        else:
            with ctx.step("validate:ir"):
                parity = check(OnnxRuntimeRunner(self.export), ir.reference, self.tolerance(), "transformers→onnx (IR, one decode step)")
            found.parity.append(parity.to_dict())
            parity.raise_if_failed(path=self.folder)
        variant = None
        if self.options.level == "auto":
            ir.attach_stored()
            model, precision, variant = variants.auto_variant(ir, self)
            ir = ir.clone(model)
            chosen = self.scratch / "chosen"  # its weights wait in a file while the artifacts are written and judged
            chosen.mkdir()
            ir.park(chosen, "model.onnx")
        else:  # the model stays a graph whose weights are in files, read one tensor at a time from here on
            ir, weights = variants.fused(ir, self, found) if self.options.level == "all" else (ir, self.export.parent)
            ir, weights, precision = variants.quantized(ir, weights, self, found)
            ir.stored = weights
        ir.provenance["precision"] = precision
        jobs = plan_jobs(ctx, part, Prepared({"fp32": ir, self.precision: ir}, ctx.request.precisions), lambda r: self.tolerance())
        for job in jobs if variant else ():
            job.extra["variant"] = variant
        return jobs

    def check_ir(self):
        """The streamed route's IR check: the export on a prefill of each prompt (see `check_fp32`)."""
        return self.check_fp32(self.export, "validate:ir", "streamed→onnx (IR, prefill)")

    def check_fp32(self, path: Path, step: str, hop: str):
        """An fp32 graph (the export, or its fused form) against the streamed reference on a prefill of
        each prompt (exit 4 when it misses the fp32 tolerance), when it fits in memory; else the row
        says it was skipped and why. Returns the GenerationResult, or None when skipped."""

        with self.ctx.step(step) as row:
            if not self.fp32_fits:
                row.note(skipped="the fp32 graph does not fit in memory; each artifact is checked against the streamed reference")
                return None
            tol = self.tolerance()
            result = streamed_reference.judge_prefill(path, self.folder, self.prompts, hop=hop, atol=tol.atol, rtol=tol.rtol,
                                                      cache=self.streamed_cache)
            row.note(ok=result.ok, token_agreement=round(result.tokens, 6), max_abs=result.max_abs, positions=result.details["positions"])
        if step == "validate:ir":
            result.raise_if_failed(path=self.folder)
        return result

    def validate(self, job: Job, artifact, route) -> ArtifactCheck:
        """The artifact generates what transformers generated, within the budget of its precision, from
        its files; a runtime that generates by itself must agree with our loop on the same file.
        Streamed: the artifact's own greedy tokens judged against the streamed reference's logits at
        the same context (validation/streamed_reference.py)."""

        tg, cfg, precision, tol = self.tg, self.cfg, artifact.precision, self.tolerance()
        budget = self.budget(precision)
        hop = f"{'streamed' if self.streamed else 'transformers'}→{job.target} ({precision}, greedy {tg.new_tokens} tokens)"
        generates = runner_class(artifact.runtime).capabilities.generates
        model_file = next(f for f in artifact.files if f.suffix == ".onnx")
        with self.ctx.step(f"validate:{job.target}"):
            if precision == "fp32" and generates and not self.streamed:
                got = generation.Generation(*runner_class(artifact.runtime)(artifact.path).generate(self.prompts, tg.new_tokens, cfg.vocab_size))
                result = generation.compare_generation(self.ref, got, hop=hop, precision=precision, budget=budget,
                                                       atol=tol.atol, rtol=tol.rtol)
            else:
                if self.streamed:

                    result, ours = judge_streamed(model_file, self.folder, self.prompts, tg.new_tokens, cfg.safe_pad, hop=hop,
                                                  precision=precision, budget=budget, atol=tol.atol, rtol=tol.rtol,
                                                  cache=self.streamed_cache)
                else:
                    result, ours = generation.judge_onnx(model_file, self.ref, self.prompts, tg.new_tokens, cfg.safe_pad, hop=hop,
                                                         precision=precision, budget=budget, atol=tol.atol, rtol=tol.rtol)
                if generates:  # the runtime must generate what our loop generates on the same file
                    # quantised: by the same budget (their int4/int8 kernels differ from onnxruntime's, so a near-tie
                    # may break the other way; at fp32 the two must agree exactly)
                    own = generation.Generation(*runner_class(artifact.runtime)(artifact.path).generate(self.prompts, tg.new_tokens, cfg.vocab_size))
                    same = generation.compare_generation(ours, own, hop=f"onnxruntime→{job.target} ({precision})",
                                                         precision=precision, budget=budget, atol=tol.atol, rtol=tol.rtol)
                    result.details.update(runtime_agreement=round(same.tokens, 6))
                    if result.ok and not same.ok:
                        result.ok, result.reason = False, f"{artifact.runtime} generates differently from onnxruntime: {same.reason}"
        check = ArtifactCheck(generation=result)
        try:
            result.raise_if_failed(path=self.ctx.request.out)
        except Exception as e:
            check.failure = e
        return check

    def finish(self, stage: Path) -> StageResult:
        """Nothing beside the artifacts: the ort-genai folder carries the tokenizer."""
        return StageResult()

    def tolerance(self, resolved=None):
        """Logits are compared at the fp32 tolerance; quantised artifacts by their generation budget."""
        return self.options.tolerance("fp32")

    def budget(self, precision: str) -> GenerationBudget | None:
        """The generation budget of `precision`: the user's, else DEFAULT_QUANT_BUDGET for a quantised
        one; None for fp32 without a budget (identical tokens, logits within tolerance)."""
        given = self.ctx.request.generation_budget  # parsed by request.decide
        if given is not None:
            return given
        return None if precision == "fp32" else DEFAULT_QUANT_BUDGET


def estimate_peak(parameters: int, run: TextGenerationRun, *, written: bool = False) -> int:
    """Bytes of memory the route is expected to need at its peak for a checkpoint of `parameters`
    (`written`: the graph is written by parsers/hf_decoder_graph.py, not exported)."""
    table = WRITTEN_COPIES if written else WEIGHT_COPIES
    copies = table[AUTO] if run.options.level == "auto" else table[run.precision]
    return int(LIBRARIES + copies * 4 * parameters)


def artifact_bytes(cfg, parameters: int, precision: str, block_size: int = 32, symmetric: bool = True) -> int:
    """Bytes of the weights of the artifact at `precision`: MatMulNBits weights with an fp32 scale (and,
    asymmetric, a zero point) per block; an untied embedding stays an fp32 table (a tied one is read
    from the quantised output projection)."""
    embedding = cfg.vocab_size * cfg.hidden_size
    per = BYTES_PER_WEIGHT[precision]
    if precision in ("int4", "int8"):
        per += 4 / block_size + (0 if symmetric else per / block_size)
    if cfg.tied_embeddings or precision in ("fp32", "fp16"):
        return int(per * parameters)
    return int(per * (parameters - embedding) + 4 * embedding)


def streamed_peak(cfg, parameters: int, run: TextGenerationRun) -> int:
    """The streamed route's peak (bytes): see SESSION_COPIES above."""
    embedding = 4 * cfg.vocab_size * cfg.hidden_size
    layer = 4 * max(0, parameters - cfg.vocab_size * cfg.hidden_size * (1 if cfg.tied_embeddings else 2)) / max(1, cfg.num_layers)
    session = SESSION_COPIES * artifact_bytes(cfg, parameters, run.precision, run.tg.block_size, run.tg.symmetric)
    return int(LIBRARIES + max(session, TENSOR_COPIES * embedding, embedding + layer))


def check_memory(folder: Path, run: TextGenerationRun) -> None:
    """Refuse (exit 2, before any work) a folder whose conversion is estimated to need more memory
    than is available, rather than be killed part way; the `preflight:memory` row records both
    figures. MODELPORT_AVAILABLE_MEMORY overrides the memory counted as available (to run anyway).

    It also settles the reference: `--reference auto` streams (a folder written from its safetensors)
    from STREAM_FROM parameters on or when the fp32 model does not fit, else takes transformers' (the
    fp32 model in memory); `run.fp32_fits` says whether an fp32 graph can be checked at all."""

    choice = run.tg.reference
    with run.ctx.step("preflight:memory") as row:
        parameters = parameter_count(weight_files(folder)[0])
        cfg = run.cfg
        written = hf_decoder_graph.unsupported(folder, cfg, run.options.opset) is None
        can_stream = written and cfg.architecture in SUPPORTED and run.options.level != "auto"
        full, free = estimate_peak(parameters, run, written=written), memory.available()
        streamed = streamed_peak(cfg, parameters, run) if can_stream else None
        run.fp32_fits = free is None or full <= free
        run.streamed = choice == "streamed" or (choice == "auto" and streamed is not None
                                                and (not run.fp32_fits or parameters >= STREAM_FROM))
        need = streamed if run.streamed else full
        row.note(parameters=parameters, estimated_peak_rss=need, available_memory=free,
                 reference="streamed" if run.streamed else "transformers",
                 **({"fp32_reference_peak_rss": full} if run.streamed else {}))
        if written:  # the dynamo export's scratch is its own business; the writer's is counted here
            check_disk(folder, run, cfg, parameters, row)
    if choice == "streamed" and not can_stream:
        why = ("--optimize auto" if run.options.level == "auto" else
               f"{cfg.architecture}" if cfg.architecture not in SUPPORTED else "a folder the decoder writer does not cover")
        raise BadInputError(f"--reference streamed reads {', '.join(SUPPORTED)} folders the decoder writer covers; not {why}",
                            path=folder, hint="--reference transformers")
    if run.streamed:
        memory.refuse_if_short(need, free, path=folder, why=f"{parameters / 1e6:,.0f} M parameters at {run.precision}: the "
                               "artifact's onnxruntime session, with the reference streamed a layer at a time; the fp32 "
                               f"reference would need {memory.fmt_bytes(full)}")
        return
    memory.refuse_if_short(need, free, path=folder, why=f"{parameters / 1e6:,.0f} M parameters, held in fp32 by the "
                           f"transformers reference{'' if written else ' and the ONNX passes'}"
                           f"{'; the streamed reference would need ' + memory.fmt_bytes(streamed) if streamed else ''}")


def disk_needed(cfg, parameters: int, run: TextGenerationRun) -> tuple[int, int]:
    """(bytes the scratch folder takes at its fullest, bytes the output takes): the written graph in
    fp32 (4 bytes a weight; fp16 written again beside it, int4/int8 quantised beside it), and one
    copy of the artifact's weights per target."""
    scratch = 4 * parameters
    if run.precision in ("fp16", "int8", "int4"):
        scratch += artifact_bytes(cfg, parameters, run.precision, run.tg.block_size, run.tg.symmetric)
    targets = len(run.ctx.request.precisions) or 1
    return scratch, targets * artifact_bytes(cfg, parameters, run.precision if run.precision in BYTES_PER_WEIGHT else "fp32",
                                             run.tg.block_size, run.tg.symmetric)


def check_disk(folder: Path, run: TextGenerationRun, cfg, parameters: int, row) -> None:
    """Refuse (exit 2, before any work) a run whose scratch folder and output would not fit on their
    disks (`disk_needed`), rather than fill the disk part way; the preflight row records the figures."""
    import shutil


    scratch_need, out_need = disk_needed(cfg, parameters, run)
    scratch_dir = Path(tempfile.gettempdir())
    out_dir = Path(run.ctx.request.out).absolute()
    while not out_dir.exists() and out_dir != out_dir.parent:
        out_dir = out_dir.parent
    same = scratch_dir.stat().st_dev == out_dir.stat().st_dev
    places = [(scratch_dir, scratch_need + (out_need if same else 0))] + ([] if same else [(out_dir, out_need)])
    checked = [(place, need, shutil.disk_usage(place).free) for place, need in places]
    row.note(disk=[{"path": str(place), "needed": need, "free": free} for place, need, free in checked])
    for place, need, free in checked:
        if need > free:
            raise BadInputError(f"converting needs about {fmt_bytes(need)} of disk in {place} (the {fmt_bytes(4 * parameters)} "
                                f"fp32 graph and the artifacts) and {fmt_bytes(free)} is free", path=folder,
                                hint="free disk space, or set TMPDIR (the scratch folder) and -o on a larger disk")


def export_and_reference(run: TextGenerationRun, found: Findings):
    """The IR, with the run's decoder config, reference generation, prompts and the export's file set.

    Memory: the transformers model (in fp32) is the largest thing held while it lives, so everything
    that needs it runs first and it is dropped before any onnxruntime session starts. The export is
    written by the exporter to `scratch/export/model.onnx` with its weights in a data file, straight
    from the torch tensors, so weights are never held both as torch tensors and as ONNX bytes; the
    IR's ModelProto comes back as the graph alone (its initializers refer to that file)."""
    import gc


    ctx, options, tg, folder = run.ctx, run.options, run.tg, run.folder
    spec = SourceSpec(path=folder, opset=options.opset, seed=options.seed)
    export = run.scratch / "export" / "model.onnx"
    export.parent.mkdir(parents=True, exist_ok=True)
    with ctx.step("parse") as parsed:
        cfg = run.cfg  # read by preflight
        why = hf_decoder_graph.unsupported(folder, cfg, options.opset)
        if why is None:  # written from the config and the safetensors: no model loaded, nothing traced
            graph, _ = hf_decoder_graph.write_decoder(folder, cfg, export, opset=options.opset)
            model = None
            ir = hf_decoder.ir_of(folder, spec, graph, cfg, None, exporter=hf_decoder_graph.EXPORTER)
        else:
            model = hf_decoder.load_model(folder)
            ir = hf_decoder.parse_loaded(folder, spec, model, cfg, save_to=export)
            parsed.note(writer_skipped=why)
        parsed.note(nodes=len(ir.model.graph.node), exporter=ir.provenance.get("exporter"), family=cfg.family)
    found.source = {k: ir.provenance.get(k) for k in ("path", "framework", "format")}
    found.contracts.append(ContractEntry(ir.contract()))
    if cfg.context_capped_from:
        found.warn(f"context limited to {cfg.context_length} of {cfg.context_capped_from} tokens: past "
                    f"{cfg.context_length} longrope switches to its long factors and transformers re-encodes the whole "
                    "cache, which a KV-cache graph cannot (the ort-genai folder stops there)")
    prompts = generation.fixed_prompts(cfg.vocab_size, seed=options.seed, avoid=(cfg.safe_pad,))
    longest = max(len(p) for p in prompts) + tg.new_tokens
    if longest > cfg.context_length:
        raise BadInputError(f"--new-tokens {tg.new_tokens} with a {longest - tg.new_tokens}-token prompt passes the model's "
                            f"context of {cfg.context_length} tokens", path=folder)
    ref = None  # streamed: each artifact is judged against logits streamed from the safetensors (TextGenerationRun.validate)
    if not run.streamed:
        with ctx.step("reference:generate", new_tokens=tg.new_tokens, prompts=len(prompts)):
            if model is None:  # the written graph's reference: transformers on the same weights, in fp32, in a child
                ir.reference, ref = hf_decoder.transformers_reference(folder, cfg, seed=spec.seed, prompts=prompts,
                                                                      new_tokens=tg.new_tokens, per_tensor=True)
            else:
                ref = generation.generate_transformers(model, prompts, tg.new_tokens, cfg.safe_pad)
    del model
    gc.collect()  # the transformers model: released before onnxruntime loads the export
    run.ref, run.prompts, run.export = ref, prompts, export
    ir.stored = export.parent  # the graph's weights are in the export's data file
    return ir
