"""The optimisation stage of a decoder LM (the text-generation pipeline): the IR fused, quantised or
chosen among variants, each kept only when it still generates what transformers generates.

    fused       --optimize all: onnxruntime's decoder fusions (optimize/decoder_fusion.py), or a
                written graph written again in its fused form; rolled back when generation changes
    quantized   MatMulNBits for --precision int4/int8 (optimize/weight_only.py); fp16 writes the graph
                again in float16 from the folder
    auto_variant  --optimize auto instead of the two above (optimize/decoder_auto.py): variants at the
                precisions asked, judged by generation and timed; the fastest that passes

Each takes the run (orchestration/text_generation.py: its config, reference generation, prompts,
the export's file, scratch folder, options) and gives the IR at its precision, its weights in
files where it can, so no second copy of the model is held.
"""

from __future__ import annotations

from pathlib import Path

from modelport.errors import ValidationError
from modelport.onnxfile.external_data_files import attach_external
from modelport.onnxfile.onnx_io import save_onnx
from modelport.optimize import decoder_auto
from modelport.optimize.decoder_fusion import fuse_decoder
from modelport.optimize.weight_only import BITS, WeightOnlyOptions, quantize_stored, quantize_weight_only
from modelport.parsers import hf_decoder_graph
from modelport.validation import generation
from modelport.validation.report import Findings

AUTO = "auto"
# --precision auto (with --optimize auto): the precisions of AUTO_PRECISIONS compete, timed in onnxruntime
# on the CPU. fp16 is not among them: it is meant for GPUs, and on a CPU onnxruntime computes its
# MatMuls in float32 behind inserted casts (0.5 B: 9.2 decode tokens/s, the builder's fp32 folder 9.1,
# int4 44), so timing it here would say nothing of where it runs.
AUTO_PRECISIONS = ("fp32", "int8", "int4")


def fused(ir, run, found: Findings):
    """(IR, the folder of its weights' data file): the IR with onnxruntime's decoder fusions, kept only when it still generates the reference's
    tokens with logits within the fp32 tolerance (else the unfused IR, and the row says why;
    under --strict the run fails). A written graph (parsers/hf_decoder_graph.py) is written again
    in its fused form, from the folder; an exported one goes through the fusion passes, which read
    its weights from `export`'s data file, so the fused model is the only one in memory. Either is
    written to a file of its own and not held while onnxruntime generates with it (`validate:fused`)."""
    import onnx


    cfg, export, tol = run.cfg, run.export, run.tolerance()
    path = export.parent / "fused.onnx"  # beside the export: a written graph's fused form shares its data file
    with run.ctx.step("optimize:decoder-fusion") as row:
        details = fused_model(ir, cfg, path, export)
        row.note(**details)
    if run.streamed:  # a prefill of each prompt against the streamed reference, when the fp32 graph fits in memory
        result = run.check_fp32(path, "validate:fused", "fused")
        if result is None:  # the writer's fused form, checked with the artifacts it becomes
            row.note(kept=True, checked="with the artifacts (the fp32 graph does not fit in memory)")
            return ir.clone(onnx.load(str(path), load_external_data=False)), path.parent
        if not result.ok:  # the export itself, checked only now: a wrong export is exit 4, a breaking fusion rolled back
            run.check_ir()
    else:
        with run.ctx.step("validate:fused"):
            result, _ = generation.judge_onnx(path, run.ref, run.prompts, run.tg.new_tokens, cfg.safe_pad, hop="fused", atol=tol.atol,
                                              rtol=tol.rtol)
    row.note(kept=result.ok, token_agreement=round(result.tokens, 6), max_abs=result.max_abs)
    if not result.ok:
        row.note(reason=result.reason)
        if run.options.strict:
            raise ValidationError(f"decoder fusion breaks generation: {result.reason} (--strict)")
        found.warn(f"decoder fusion rolled back: {result.reason}")
        return ir, export.parent
    return ir.clone(onnx.load(str(path), load_external_data=False)), path.parent


def fused_model(ir, cfg, path: Path, export: Path) -> dict:
    """Write the fused form of `ir` to `path` (with its weights in a data file beside it); returns the
    fusion's details. A written graph is written again from the folder; an exported one is fused by
    the passes, its weights read from `export`'s data file where `ir`'s model does not hold them."""

    before = len(ir.model.graph.node)
    if ir.provenance.get("exporter") == hf_decoder_graph.EXPORTER:  # the fused graph over the export's own weights
        reuse = ir.model if path.parent == export.parent else None
        _, details = hf_decoder_graph.write_decoder(ir.provenance["path"], cfg, path, fused=True, reuse=reuse,
                                                    opset=ir.provenance.get("opset"))
        return {"nodes_before": before, **details}

    model, details = fuse_decoder(ir.model, context_length=cfg.context_length, base_dir=export.parent)
    save_onnx(model, path, external=True)  # onnxruntime reads the weights from the file, not from a serialised copy
    return details


def auto_variant(ir, run):
    """`--optimize auto`: (the chosen variant's ModelProto, its precision, its name). One
    `optimize:auto` stage row holds the table every variant competed in; none passing is exit 4."""

    tg, cfg, tol = run.tg, run.cfg, run.tolerance()
    precisions = AUTO_PRECISIONS if run.precision == AUTO else (run.precision,)

    def quantize(model, precision):
        return quantize_weight_only(model, WeightOnlyOptions(bits=BITS[precision], block_size=tg.block_size,
                                                             symmetric=tg.symmetric), tied=cfg.tied_embeddings)

    def judge(name, precision, path, session):
        budget = None if precision == "fp32" else run.budget(precision)  # fp32: identical tokens and logits
        return generation.judge_onnx(path, run.ref, run.prompts, tg.new_tokens, cfg.safe_pad, hop=f"auto:{name}", precision=precision,
                                     budget=budget, atol=tol.atol, rtol=tol.rtol, session=session)[0]

    with run.ctx.step("optimize:auto", precisions=list(precisions)) as row:
        variants, fusion = decoder_auto.build_variants(
            ir.model, precisions, quantize, fuse=lambda m: fuse(ir, cfg, run.export), on_stage=run.ctx.on_stage)
        selection = decoder_auto.select(variants, judge, pad=cfg.safe_pad, vocab_size=cfg.vocab_size,
                                        context_length=cfg.context_length, options=tg.auto, on_stage=run.ctx.on_stage)
        row.note(**selection, fusion=fusion)
        if selection["chosen"] is None:
            why = "; ".join(f"{r['variant']}: {r['reason']}" for r in selection["variants"])
            raise ValidationError(f"--optimize auto: no variant passes its generation check ({why})")
    chosen = next(v for v in variants if v.name == selection["chosen"])
    return chosen.model, chosen.precision, chosen.name


def fuse(ir, cfg, export: Path):
    """(the fused ModelProto with its weights in memory, details) for `--optimize auto`."""
    import onnx


    path = export.parent / "auto-fused.onnx"
    details = fused_model(ir, cfg, path, export)
    model = onnx.load(str(path), load_external_data=False)
    attach_external(model, path.parent)
    return model, details


def quantized(ir, weights: Path | None, run, found: Findings):
    """(the IR at the requested precision, the folder of its weights' data file or None when the model
    holds them, precision). `weights`: the folder of `ir`'s data file (None: the model holds its
    weights). From files, each weight is read, quantised and written before the next
    (`quantize_stored`); in memory the model is quantised in place and `ir` is not to be used after.
    fp16: the graph written again from the folder in float16, in the same form (fused or plain)."""

    cfg, scratch, precision = run.cfg, run.scratch, run.precision
    if precision == "fp32":
        return ir, weights, "fp32"
    if precision == "fp16":

        fused = any(n.domain == hf_decoder_graph.MS for n in ir.model.graph.node)
        with run.ctx.step("precision:fp16") as row:
            path = scratch / "fp16" / "model.onnx"
            path.parent.mkdir()
            model, details = hf_decoder_graph.write_decoder(ir.provenance["path"], cfg, path, fused=fused, dtype="float16",
                                                            opset=ir.provenance.get("opset"))
            row.note(nodes_before=len(ir.model.graph.node), nodes=len(model.graph.node), form="fused" if fused else "plain",
                     **{k: details[k] for k in ("dtype", "clamped") if k in details})
            if details.get("clamped"):
                found.warn(f"{sum(details['clamped'].values())} weight values beyond float16's range clamped to ±65504 "
                           f"({', '.join(list(details['clamped'])[:3])})")
        ir.model = None
        return ir.clone(model), path.parent, "fp16"
    tg = run.tg
    wo = WeightOnlyOptions(bits=BITS[precision], block_size=tg.block_size, symmetric=tg.symmetric)
    with run.ctx.step(f"quantize:{precision}") as row:
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
    return ir.clone(model), weights, precision
