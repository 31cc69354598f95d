"""A SavedModel folder loaded with TensorFlow (`tf.saved_model.load`), for the savedmodel parser and
the native routes that start from a SavedModel."""

from __future__ import annotations

from pathlib import Path

from modelport.errors import BadInputError
from modelport.frameworks.tensorflow import import_tf, stdout_to_stderr, tf_reason


def folder_of(path: Path) -> Path:
    """A SavedModel folder given as the folder or as its saved_model.pb."""
    return path.parent if path.is_file() and path.name == "saved_model.pb" else path


def load(folder: Path):
    tf = import_tf()
    try:
        with stdout_to_stderr():
            return tf.saved_model.load(str(folder))
    except Exception as e:
        raise BadInputError(f"cannot load the SavedModel: {tf_reason(e)}", path=folder) from None
