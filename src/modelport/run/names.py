"""User strings that become path components: model names, versions, zoo names and revisions.

One rule for all of them: `[A-Za-z0-9_.-]+`, and not `.` or `..`. Anything else (a `/`, a
backslash, an absolute path, a NUL, an empty string) is refused with exit 2 before anything is
written, so a name can never lead a write outside the folder it belongs in.
"""

from __future__ import annotations

import re

from modelport.errors import BadInputError

_NAME = re.compile(r"[A-Za-z0-9_.-]+")


def is_path_name(text: object) -> bool:
    return isinstance(text, str) and _NAME.fullmatch(text) is not None and text not in (".", "..")


def check_path_name(text: object, what: str) -> str:
    """`text` unchanged when it is a safe single path component, else BadInputError naming `what`."""
    if not is_path_name(text):
        raise BadInputError(f"bad {what} {text!r}: use letters, digits, '_', '.' and '-' only (one path component, not '.' or '..')")
    return text  # type: ignore[return-value]
