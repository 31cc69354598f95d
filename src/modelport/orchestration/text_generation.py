"""`convert --task text-generation`: a decoder LM folder → KV-cache ONNX (fp32, fp16, int8 or int4
weight-only) and/or an onnxruntime-genai folder, each proven by generation.

    preflight  the peak memory estimated from the checkpoint's headers, against the memory available
               (exit 2 before any work when it does not fit; see `check_memory`)
    parse      export with a KV cache (parsers/hf_decoder.py), checked on one left-padded decode step
    reference  transformers `generate` (greedy) from fixed prompts on the same weights
    optimize   --optimize all: onnxruntime fusions (optimize/decoder_fusion.py), kept only when the
               fused model still generates the reference's tokens and logits
    quantize   MatMulNBits for --precision int4/int8 (optimize/weight_only.py); --precision fp16 writes
               the graph again in float16 from the folder (weights, activations, cache and logits; the
               families parsers/hf_decoder_graph.py writes, in the form --optimize chose)
    auto       --optimize auto instead of the two above (optimize/decoder_auto.py): {unfused, fused}
               variants at the --precision given (fp32 by default), or at fp32, int8 and int4 with
               --precision auto, each judged by generation as below (a failing one is discarded)
               and timed in onnxruntime (prefill ms, decode tokens/s); the fastest decode among those
               that pass is emitted, and none passing is exit 4
    emit       `onnx` → model.onnx; `ort-genai` → ort-genai/ (emitters/ort_genai.py)
    validate   our greedy loop over each model in onnxruntime, compared token by token and logit by
               logit; the ort-genai folder generates with onnxruntime-genai itself

FP32 must give identical tokens and logits within tolerance; fp16/int8/int4 are judged by token
agreement and worst logit error against `--accuracy-budget` (default `tokens>=0.9`). Everything
is written through a staging folder: a failed run leaves nothing.

Memory (the weights W in fp32; a model a few times the machine's memory must not need it many times
over): the transformers model is held only through export and reference and dropped before any
onnxruntime session; the exporter writes the weights from the torch tensors straight to a scratch
file, from which the IR check's session and the fusion read them; passes and the quantiser keep no
second copy of the model (optimize/weight_store.py); sessions load models from files with external
data; the artifacts are written and the model dropped before they are validated, one session at a
time. Peak about 2.6 W above the libraries (tests/orchestration/test_text_generation_memory.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from modelport.errors import BadInputError
from modelport.optimize.decoder_auto import DecoderAutoOptions
from modelport.optimize.weight_only import BITS, WeightOnlyOptions
from modelport.validation.generation import DEFAULT_NEW_TOKENS, GenerationBudget, parse_generation_budget

TASK = "text-generation"
TARGETS = ("onnx", "ort-genai")
PRECISIONS = ("fp32", "fp16", "int8", "int4")
# --precision auto (with --optimize auto): the precisions of AUTO_PRECISIONS compete, timed in onnxruntime
# on the CPU. fp16 is not among them: it is meant for GPUs, and on a CPU onnxruntime computes its
# MatMuls in float32 behind inserted casts (0.5 B: 9.2 decode tokens/s, the builder's fp32 folder 9.1,
# int4 44), so timing it here would say nothing of where it runs.
AUTO = "auto"
AUTO_PRECISIONS = ("fp32", "int8", "int4")
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
# Artifacts whose weights reach this size keep them in model.onnx.data (as the model builder's do):
# onnxruntime then reads each weight from that file, where a single file is held whole while the
# session is built (a 474 MB fp32 model: session peak 1.07 GB single, 0.78 GB with external data)
EXTERNAL_WEIGHTS = 256 << 20
DEFAULT_QUANT_BUDGET = GenerationBudget(min_tokens=0.9)


@dataclass(frozen=True)
class TextGenerationOptions:
    """Options of the text-generation route: tokens generated per prompt, the weight-only
    quantiser's block size and symmetry, the accuracy budget of quantised artifacts, and how
    `--optimize auto` times its variants."""

    new_tokens: int = DEFAULT_NEW_TOKENS
    block_size: int = 32
    symmetric: bool = True
    budget: str | None = None  # "tokens>=0.95,max_abs<=2"
    auto: DecoderAutoOptions = DecoderAutoOptions()

    def __post_init__(self):
        if self.new_tokens < 1:
            raise BadInputError(f"bad --new-tokens {self.new_tokens}: at least 1")
        WeightOnlyOptions(bits=4, block_size=self.block_size, symmetric=self.symmetric)
        parse_generation_budget(self.budget)

    def generation_budget(self, precision: str) -> GenerationBudget | None:
        """None for fp32 without a budget: identical tokens and logits within tolerance."""
        given = parse_generation_budget(self.budget)
        if given is not None:
            return given
        return None if precision == "fp32" else DEFAULT_QUANT_BUDGET


def is_text_generation(source, task: str | None) -> bool:
    """Whether `convert` takes the text-generation route: asked for with --task, or a Hugging Face
    folder whose config names a `...ForCausalLM` architecture when no task is given."""
    if task is not None:
        from modelport.parsers.huggingface import task_name

        return task_name(task) == TASK
    if not isinstance(source, (str, Path)) or str(source).startswith("zoo:"):
        return False
    from modelport.parsers import hf_decoder

    return hf_decoder.sniff(Path(source))


def check_request(options) -> None:
    """Targets and precision this route can deliver (exit 2 before any work otherwise)."""
    bad = [t for t in options.targets if t not in TARGETS]
    if bad:
        raise BadInputError(f"--task {TASK} writes {', '.join(TARGETS)}; not {', '.join(bad)}")
    if options.precision not in (*PRECISIONS, AUTO):
        raise BadInputError(f"--task {TASK} takes --precision {', '.join(PRECISIONS)} or {AUTO}; not {options.precision}")
    level = options.optimize.level if options.optimize is not None else None
    if level not in (None, "none", "all", "auto"):
        raise BadInputError(f"--task {TASK} takes --optimize none, all or auto; not {level}")
    if options.precision == AUTO and level != "auto":
        raise BadInputError(f"--task {TASK}: --precision auto lets --optimize auto pick among {', '.join(AUTO_PRECISIONS)}",
                            hint="add --optimize auto, or name one precision")
    if options.precision == "fp16" and level == "auto":
        raise BadInputError(f"--task {TASK}: --optimize auto times its variants on the CPU, where fp16 is not meant to run",
                            hint="--optimize all --precision fp16 writes the fused fp16 model")
    runtimes = options.optimize.runtimes if options.optimize is not None else None
    if runtimes and tuple(runtimes) != ("onnxruntime",):
        raise BadInputError(f"--task {TASK} --optimize auto times onnxruntime variants; not --runtimes {','.join(runtimes)}")


def estimate_peak(parameters: int, options, *, written: bool = False) -> int:
    """Bytes of memory the route is expected to need at its peak for a checkpoint of `parameters`
    (`written`: the graph is written by parsers/hf_decoder_graph.py, not exported)."""
    level = options.optimize.level if options.optimize is not None else None
    table = WRITTEN_COPIES if written else WEIGHT_COPIES
    copies = table[AUTO] if level == "auto" else table[options.precision]
    return int(LIBRARIES + copies * 4 * parameters)


def check_memory(folder: Path, options, report, *, on_stage=None) -> None:
    """Refuse (exit 2, before any work) a folder whose conversion is estimated to need more memory
    than is available, rather than be killed part way; the `preflight` row records both figures.
    MODELPORT_AVAILABLE_MEMORY overrides the memory counted as available (to run anyway)."""
    from modelport import memory
    from modelport.parsers import hf_decoder, hf_decoder_graph
    from modelport.parsers.huggingface import parameter_count, weight_files
    from modelport.validation.report import run_stage

    with run_stage(report, "preflight", on_stage=on_stage) as row:
        parameters = parameter_count(weight_files(folder)[0])
        written = hf_decoder_graph.unsupported(folder, hf_decoder.read_decoder_config(folder), options.opset) is None
        need, free = estimate_peak(parameters, options, written=written), memory.available()
        row.note(parameters=parameters, estimated_peak_rss=need, available_memory=free)
    memory.refuse_if_short(need, free, path=folder, why=f"{parameters / 1e6:,.0f} M parameters, held in fp32 by the "
                           f"transformers reference{'' if written else ' and the ONNX passes'}")


def export_and_reference(folder: Path, options, report, scratch: Path, *, on_stage=None):
    """(IR, decoder config, the reference generation, the prompts, the export's file).

    Memory: the transformers model (in fp32) is the largest thing held while it lives, so everything
    that needs it runs first and it is dropped before any onnxruntime session starts. The export is
    written by the exporter to `scratch/export/model.onnx` with its weights in a data file, straight
    from the torch tensors, so weights are never held both as torch tensors and as ONNX bytes; the
    IR's ModelProto comes back as the graph alone (its initializers refer to that file, see
    `attach_weights`)."""
    import gc

    from modelport.parsers import hf_decoder
    from modelport.runtimes.onnxruntime import OnnxRuntimeRunner
    from modelport.specs import SourceSpec
    from modelport.validation import check, generation
    from modelport.validation.report import run_stage

    tg = options.text_generation
    spec = SourceSpec(path=folder, opset=options.opset, seed=options.seed)
    export = scratch / "export" / "model.onnx"
    export.parent.mkdir(parents=True, exist_ok=True)
    from modelport.parsers import hf_decoder_graph

    with run_stage(report, "parse", on_stage=on_stage) as parsed:
        cfg = hf_decoder.read_decoder_config(folder)
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
    report.set_source({k: ir.provenance.get(k) for k in ("path", "framework", "format")})
    report.set_contract(ir.contract())
    if cfg.context_capped_from:
        report.warn(f"context limited to {cfg.context_length} of {cfg.context_capped_from} tokens: past "
                    f"{cfg.context_length} longrope switches to its long factors and transformers re-encodes the whole "
                    "cache, which a KV-cache graph cannot (the ort-genai folder stops there)")
    prompts = generation.fixed_prompts(cfg.vocab_size, seed=options.seed, avoid=(cfg.safe_pad,))
    longest = max(len(p) for p in prompts) + tg.new_tokens
    if longest > cfg.context_length:
        raise BadInputError(f"--new-tokens {tg.new_tokens} with a {longest - tg.new_tokens}-token prompt passes the model's "
                            f"context of {cfg.context_length} tokens", path=folder)
    with run_stage(report, "reference:generate", on_stage=on_stage, new_tokens=tg.new_tokens, prompts=len(prompts)):
        if model is None:  # the written graph's reference: transformers on the same weights, in fp32, in a child
            ir.reference, ref = hf_decoder.transformers_reference(folder, cfg, seed=spec.seed, prompts=prompts,
                                                                  new_tokens=tg.new_tokens, per_tensor=True)
        else:
            ref = generation.generate_transformers(model, prompts, tg.new_tokens, cfg.safe_pad)
    del model
    gc.collect()  # the transformers model: released before onnxruntime loads the export
    tol = options.tolerance("fp32")
    with run_stage(report, "validate:ir", on_stage=on_stage):
        parity = check(OnnxRuntimeRunner(export), ir.reference, tol, "transformers→onnx (IR, one decode step)")
    report.add_parity(parity)
    parity.raise_if_failed(path=folder)
    return ir, cfg, ref, prompts, export


def attach_weights(ir, path: Path):
    """The IR with its weights read into its ModelProto (in place) from the data file of `path`, the
    model file that ModelProto was read from."""
    from modelport.onnx_io import attach_external

    attach_external(ir.model, path.parent)
    return ir


def convert_text_generation(folder, output_dir, options, *, on_stage=None) -> dict:
    """The text-generation route of `convert` (see the module docstring); returns the report."""
    import tempfile

    from modelport.staging import check_output, staged_dir
    from modelport.validation.report import Run

    with Run(options.command) as report:
        check_request(options)
        if not isinstance(folder, (str, Path)) or str(folder).startswith("zoo:"):
            raise BadInputError(f"--task {TASK} converts a Hugging Face folder (config.json + safetensors), "
                                f"not {type(folder).__name__ if not isinstance(folder, str) else folder}")
        out, folder = Path(output_dir), Path(folder)
        check_output(out, [folder], force=options.force)
        from modelport.parsers import hf_decoder
        from modelport.parsers.huggingface import check_safety, companion_files, read_config, sniff

        cfg = hf_decoder.read_decoder_config(folder)  # an unsupported family is named first
        check_fp16(folder, cfg, options)
        if sniff(folder):  # the Hugging Face folder rules: remote code, pickled weights, links leading outside
            check_safety(folder, read_config(folder), trust=options.trust)
            companion_files(folder)
        check_memory(folder, options, report, on_stage=on_stage)
        with tempfile.TemporaryDirectory(prefix="modelport-text-generation-") as tmp:
            scratch = Path(tmp)
            ir, cfg, ref, prompts, export = export_and_reference(folder, options, report, scratch, on_stage=on_stage)
            level = options.optimize.level if options.optimize is not None else None
            variant = None
            if level == "auto":
                ir = attach_weights(ir, export)
                model, precision, variant = auto_variant(ir, cfg, ref, prompts, options, report, export, on_stage=on_stage)
                weights = None  # the chosen variant holds its weights in memory
            else:  # the model stays a graph whose weights are in files, read one tensor at a time from here on
                ir, weights = fused(ir, cfg, ref, prompts, options, report, export, on_stage=on_stage) if level == "all" \
                    else (ir, export.parent)
                ir, weights, precision = quantized(ir, weights, cfg, options, report, scratch, on_stage=on_stage)
                model = ir.model
            source, ir = ir.provenance.get("path"), None
            with staged_dir(out, [folder], force=options.force) as stage:
                paths = {target: emit(target, model, precision, cfg, source, stage, options, report, on_stage=on_stage,
                                      variant=variant, weights=weights) for target in options.targets}
                del model  # every artifact is written: onnxruntime validates each from its files, one at a time
                for target, path in paths.items():
                    generate_and_judge(target, path, precision, cfg, ref, prompts, options, report, out, on_stage=on_stage)
                report.write(stage)
    return report.to_dict()


def check_fp16(folder: Path, cfg, options) -> None:
    """--precision fp16 is written from the folder (parsers/hf_decoder_graph.py): a folder the writer
    does not cover is exit 2 before any work, naming why."""
    from modelport.parsers import hf_decoder_graph

    if options.precision != "fp16":
        return
    why = hf_decoder_graph.unsupported(folder, cfg, options.opset)
    if why is not None:
        raise BadInputError(f"--precision fp16 is written for {', '.join(hf_decoder_graph.FAMILIES)} decoders; this one "
                            f"has {why}", path=folder, hint="--precision fp32, int8 or int4 export it with dynamo")


def fused(ir, cfg, ref, prompts, options, report, export: Path, *, on_stage=None):
    """(IR, the folder of its weights' data file): the IR with onnxruntime's decoder fusions, kept only when it still generates the reference's
    tokens with logits within the fp32 tolerance (else the unfused IR, and the row says why;
    under --strict the run fails). A written graph (parsers/hf_decoder_graph.py) is written again
    in its fused form, from the folder; an exported one goes through the fusion passes, which read
    its weights from `export`'s data file, so the fused model is the only one in memory. Either is
    written to a file of its own and not held while onnxruntime generates with it (`validate:fused`)."""
    import onnx

    from modelport.errors import ValidationError
    from modelport.validation import generation
    from modelport.validation.report import run_stage

    tg = options.text_generation
    tol = options.tolerance("fp32")
    path = export.parent / "fused.onnx"  # beside the export: a written graph's fused form shares its data file
    with run_stage(report, "optimize:decoder-fusion", on_stage=on_stage) as row:
        details = fused_model(ir, cfg, path, export)
        row.note(**details)
    with run_stage(report, "validate:fused", on_stage=on_stage):
        result, _ = generation.judge_onnx(path, ref, prompts, tg.new_tokens, cfg.safe_pad, hop="fused", atol=tol.atol,
                                          rtol=tol.rtol)
    row.note(kept=result.ok, token_agreement=round(result.tokens, 6), max_abs=result.max_abs)
    if not result.ok:
        row.note(reason=result.reason)
        if options.strict:
            raise ValidationError(f"decoder fusion breaks generation: {result.reason} (--strict)")
        report.warn(f"decoder fusion rolled back: {result.reason}")
        return ir, export.parent
    return ir.clone(onnx.load(str(path), load_external_data=False)), path.parent


def fused_model(ir, cfg, path: Path, export: Path) -> dict:
    """Write the fused form of `ir` to `path` (with its weights in a data file beside it); returns the
    fusion's details. A written graph is written again from the folder; an exported one is fused by
    the passes, its weights read from `export`'s data file where `ir`'s model does not hold them."""
    from modelport.parsers import hf_decoder_graph

    before = len(ir.model.graph.node)
    if ir.provenance.get("exporter") == hf_decoder_graph.EXPORTER:  # the fused graph over the export's own weights
        reuse = ir.model if path.parent == export.parent else None
        _, details = hf_decoder_graph.write_decoder(ir.provenance["path"], cfg, path, fused=True, reuse=reuse,
                                                    opset=ir.provenance.get("opset"))
        return {"nodes_before": before, **details}
    from modelport.onnx_io import save_onnx
    from modelport.optimize.decoder_fusion import fuse_decoder

    model, details = fuse_decoder(ir.model, context_length=cfg.context_length, base_dir=export.parent)
    save_onnx(model, path, external=True)  # onnxruntime reads the weights from the file, not from a serialised copy
    return details


def auto_variant(ir, cfg, ref, prompts, options, report, export: Path, *, on_stage=None):
    """`--optimize auto`: (the chosen variant's ModelProto, its precision, its name). One
    `optimize:auto` stage row holds the table every variant competed in; none passing is exit 4."""
    from modelport.errors import ValidationError
    from modelport.optimize import decoder_auto
    from modelport.optimize.weight_only import quantize_weight_only
    from modelport.validation import generation
    from modelport.validation.report import run_stage

    tg = options.text_generation
    tol = options.tolerance("fp32")
    precisions = AUTO_PRECISIONS if options.precision == AUTO else (options.precision,)

    def quantize(model, precision):
        return quantize_weight_only(model, WeightOnlyOptions(bits=BITS[precision], block_size=tg.block_size,
                                                             symmetric=tg.symmetric), tied=cfg.tied_embeddings)

    def judge(name, precision, path, session):
        budget = None if precision == "fp32" else tg.generation_budget(precision)  # fp32: identical tokens and logits
        return generation.judge_onnx(path, ref, prompts, tg.new_tokens, cfg.safe_pad, hop=f"auto:{name}", precision=precision,
                                     budget=budget, atol=tol.atol, rtol=tol.rtol, session=session)[0]

    with run_stage(report, "optimize:auto", on_stage=on_stage, precisions=list(precisions)) as row:
        variants, fusion = decoder_auto.build_variants(
            ir.model, precisions, quantize, fuse=lambda m: fuse(ir, cfg, export), on_stage=on_stage)
        selection = decoder_auto.select(variants, judge, pad=cfg.safe_pad, vocab_size=cfg.vocab_size,
                                        context_length=cfg.context_length, options=tg.auto, on_stage=on_stage)
        row.note(**selection, fusion=fusion)
        if selection["chosen"] is None:
            why = "; ".join(f"{r['variant']}: {r['reason']}" for r in selection["variants"])
            raise ValidationError(f"--optimize auto: no variant passes its generation check ({why})")
    chosen = next(v for v in variants if v.name == selection["chosen"])
    return chosen.model, chosen.precision, chosen.name


def fuse(ir, cfg, export: Path):
    """(the fused ModelProto with its weights in memory, details) for `--optimize auto`."""
    import onnx

    from modelport.onnx_io import attach_external

    path = export.parent / "auto-fused.onnx"
    details = fused_model(ir, cfg, path, export)
    model = onnx.load(str(path), load_external_data=False)
    attach_external(model, path.parent)
    return model, details


def quantized(ir, weights: Path | None, cfg, options, report, scratch: Path, *, on_stage=None):
    """(the IR at the requested precision, the folder of its weights' data file or None when the model
    holds them, precision). `weights`: the folder of `ir`'s data file (None: the model holds its
    weights). From files, each weight is read, quantised and written before the next
    (`quantize_stored`); in memory the model is quantised in place and `ir` is not to be used after.
    fp16: the graph written again from the folder in float16, in the same form (fused or plain)."""
    from modelport.optimize.weight_only import quantize_stored, quantize_weight_only
    from modelport.validation.report import run_stage

    if options.precision == "fp32":
        return ir, weights, "fp32"
    if options.precision == "fp16":
        from modelport.parsers import hf_decoder_graph

        fused = any(n.domain == hf_decoder_graph.MS for n in ir.model.graph.node)
        with run_stage(report, "precision:fp16", on_stage=on_stage) as row:
            path = scratch / "fp16" / "model.onnx"
            path.parent.mkdir()
            model, details = hf_decoder_graph.write_decoder(ir.provenance["path"], cfg, path, fused=fused, dtype="float16",
                                                            opset=ir.provenance.get("opset"))
            row.note(nodes_before=len(ir.model.graph.node), nodes=len(model.graph.node), form="fused" if fused else "plain",
                     **{k: details[k] for k in ("dtype", "clamped") if k in details})
            if details.get("clamped"):
                report.warn(f"{sum(details['clamped'].values())} weight values beyond float16's range clamped to ±65504 "
                            f"({', '.join(list(details['clamped'])[:3])})")
        ir.model = None
        return ir.clone(model), path.parent, "fp16"
    tg = options.text_generation
    wo = WeightOnlyOptions(bits=BITS[options.precision], block_size=tg.block_size, symmetric=tg.symmetric)
    with run_stage(report, f"quantize:{options.precision}", on_stage=on_stage) as row:
        nodes_before = len(ir.model.graph.node)
        if weights is not None:
            path = scratch / "quantized" / "model.onnx"
            path.parent.mkdir()
            model, details = quantize_stored(ir.model, weights, path, wo, tied=cfg.tied_embeddings)
            weights = path.parent
        else:
            model, details = quantize_weight_only(ir.model, wo, in_place=True, tied=cfg.tied_embeddings)
        ir.model = None  # the float model: freed here
        row.note(nodes_before=nodes_before, nodes=len(model.graph.node), **details)
    return ir.clone(model), weights, options.precision


def emit(target, model, precision, cfg, source, stage: Path, options, report, *, on_stage=None,
         variant: str | None = None, weights: Path | None = None) -> Path:
    """Write one target's artifact into `stage` (its report entry added); returns its path.
    `weights`: the folder of `model`'s data file, from which its weights are copied tensor by tensor
    (None: `model` holds them)."""
    from modelport.emitters import ort_genai
    from modelport.onnx_io import attach_external, save_onnx, tensor_bytes
    from modelport.staging import describe_files
    from modelport.validation.report import run_stage

    external = tensor_bytes(model) >= EXTERNAL_WEIGHTS
    with run_stage(report, f"emit:{target}", on_stage=on_stage):
        if weights is not None and not external:  # small: the weights go inside model.onnx
            import onnx

            held = onnx.ModelProto()
            held.CopyFrom(model)
            attach_external(held, weights)
            model, weights = held, None
        if target == "onnx":
            path = stage / "model.onnx"
            files = save_onnx(model, path, external=external, base_dir=weights)
        else:
            path = stage / "ort-genai"
            files = ort_genai.write_folder(model, cfg.to_dict(), source, path, external=external, base_dir=weights)
    report.add_artifact({"target": target, "runtime": "onnxruntime" if target == "onnx" else ort_genai.RUNTIME,
                         "precision": precision, "requested_precision": options.precision,
                         **describe_files(path, files, stage), "nodes": len(model.graph.node),
                         **({"variant": variant} if variant else {})})
    return path


def generate_and_judge(target, path: Path, precision, cfg, ref, prompts, options, report, out, *, on_stage=None):
    """Validate one written artifact by generation, from its files (exit 4 when it fails)."""
    from modelport.validation import generation
    from modelport.validation.report import run_stage

    tg = options.text_generation
    budget = tg.generation_budget(precision)
    tol = options.tolerance("fp32")
    hop = f"transformers→{target} ({precision}, greedy {tg.new_tokens} tokens)"
    with run_stage(report, f"validate:{target}", on_stage=on_stage):
        model_file = path if target == "onnx" else path / "model.onnx"
        if precision == "fp32" and target == "ort-genai":
            got = generate_ort_genai(path, prompts, tg.new_tokens, cfg)
            result = generation.compare_generation(ref, got, hop=hop, precision=precision, budget=budget,
                                                   atol=tol.atol, rtol=tol.rtol)
        else:
            result, ours = generation.judge_onnx(model_file, ref, prompts, tg.new_tokens, cfg.safe_pad, hop=hop,
                                                 precision=precision, budget=budget, atol=tol.atol, rtol=tol.rtol)
            if target == "ort-genai":  # the runtime must generate what our loop generates on the same file
                # quantised: by the same budget (their int4/int8 kernels differ from onnxruntime's, so a near-tie
                # may break the other way; at fp32 the two must agree exactly)
                same = generation.compare_generation(ours, generate_ort_genai(path, prompts, tg.new_tokens, cfg),
                                                     hop=f"onnxruntime→{target} ({precision})", precision=precision,
                                                     budget=budget, atol=tol.atol, rtol=tol.rtol)
                result.details.update(runtime_agreement=round(same.tokens, 6))
                if result.ok and not same.ok:
                    result.ok, result.reason = False, f"onnxruntime-genai generates differently from onnxruntime: {same.reason}"
    report.add_generation(result)
    result.raise_if_failed(path=out)


def generate_ort_genai(folder: Path, prompts: list[list[int]], new_tokens: int, cfg):
    """Greedy generation by onnxruntime-genai's own search, one prompt at a time, with the logits
    it chose each token from. A row that stops early at an end-of-sequence token is marked -1
    after it (those positions are not compared)."""
    import numpy as np

    from modelport.deps import require
    from modelport.validation.generation import Generation

    og = require("onnxruntime_genai", purpose="--to ort-genai validation")
    model = og.Model(str(folder))
    tokens = np.full((len(prompts), new_tokens), -1, dtype=np.int64)
    logits = np.zeros((len(prompts), new_tokens, cfg.vocab_size), dtype=np.float32)
    for r, prompt in enumerate(prompts):
        params = og.GeneratorParams(model)
        params.set_search_options(max_length=len(prompt) + new_tokens, do_sample=False)
        gen = og.Generator(model, params)
        gen.append_tokens(np.array([prompt], dtype=np.int32))
        for step in range(new_tokens):
            if gen.is_done():
                break
            logits[r, step] = np.asarray(gen.get_logits(), dtype=np.float32).reshape(-1)[-cfg.vocab_size:]
            gen.generate_next_token()
            tokens[r, step] = int(gen.get_next_tokens()[0])
    return Generation(tokens=tokens, logits=logits, producer=f"onnxruntime-genai {og.__version__}")
