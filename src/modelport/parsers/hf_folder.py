"""A Hugging Face model folder read as data, before transformers sees it: config.json, the weight
files, the companion files, and the safety checks on them.

Every file read must be a regular file of the folder, or a link into it (or into the Hugging Face
cache's repository, for a snapshot folder); a link leading elsewhere is refused (exit 3). A config
asking for code from the folder (`auto_map`) or weights only in pickles is refused unless trusted;
each safetensors file's header is checked before any load.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from modelport.errors import BadInputError, UnsafeInputError, one_line
from modelport.parsers.pytorch_files import check_safetensors_header

# Files copied next to the artifacts: what a tokenizer, processor or generation loop reads back.
COMPANION_FILES = (
    "config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
    "added_tokens.json", "vocab.txt", "vocab.json", "merges.txt", "spiece.model", "sentencepiece.bpe.model",
    "tokenizer.model", "source.spm", "target.spm", "normalizer.json", "preprocessor_config.json", "processor_config.json",
    "feature_extractor_config.json", "image_processor_config.json", "chat_template.jinja", "chat_template.json",
)
PICKLED_WEIGHTS = ("pytorch_model.bin", "pytorch_model.bin.index.json")


def read_config(folder: Path) -> dict:
    path = folder / "config.json"
    confined(path, folder)
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise BadInputError(f"cannot read config.json: {one_line(e)}", path=folder) from None
    if not isinstance(config, dict) or not isinstance(config.get("model_type"), str):
        raise BadInputError("config.json has no model_type (not a transformers model folder)", path=folder)
    return config


def confined(path: Path, folder: Path) -> bool:
    """True for a regular file of the folder; a symlink must resolve inside the folder or, in the
    Hugging Face cache's layout (`models--org--name/snapshots/REV/file -> ../../blobs/SHA`), inside
    the cached repository; one that leads elsewhere is refused (exit 3)."""
    if not path.is_symlink():
        return path.is_file()
    target = path.resolve()
    roots = [folder.resolve()]
    if folder.resolve().parent.name == "snapshots":
        roots.append(folder.resolve().parent.parent)
    if not any(target.is_relative_to(r) for r in roots):
        raise UnsafeInputError(f"{path.name} links outside the model folder", path=folder)
    return target.is_file()


def weight_files(folder: Path) -> tuple[list[Path], list[Path]]:
    """(safetensors files, pickled weight files) of the folder."""
    safe = sorted(p for p in folder.glob("*.safetensors") if confined(p, folder))
    pickled = sorted(p for p in folder.iterdir() if (p.name in PICKLED_WEIGHTS or re.fullmatch(r"pytorch_model-\d+-of-\d+\.bin", p.name))
                     and confined(p, folder))
    return safe, pickled


def check_safety(folder: Path, config: dict, *, trust: bool) -> bool:
    """Refuse (exit 3) what would run code from the folder, unless trusted; True: load safetensors."""
    if config.get("auto_map") and not trust:
        raise UnsafeInputError("config.json has auto_map: loading runs Python code from the folder (trust_remote_code)",
                               path=folder, hint="pass --trust if you trust it")
    safe, pickled = weight_files(folder)
    if safe:

        for f in safe:
            check_safetensors_header(f)
        return True
    if pickled:
        if not trust:
            raise UnsafeInputError(f"only pickled weights ({pickled[0].name}), no *.safetensors: unpickling can run code",
                                   path=folder, hint="pass --trust if you trust the file, or save the model with safetensors")
        return False
    raise BadInputError("no weights: the folder holds no *.safetensors", path=folder)


def companion_files(folder: Path) -> list[Path]:
    return [folder / n for n in COMPANION_FILES if confined(folder / n, folder)]


def parameter_count(files: list[Path]) -> int:
    """The number of parameters in safetensors `files`, read from their headers (nothing is loaded)."""

    params = 0
    for f in files:
        for key, t in check_safetensors_header(f).items():
            if key != "__metadata__":
                n = 1
                for d in t.get("shape", []):
                    n *= int(d)
                params += n
    return params
