"""One exception hierarchy; each class carries the exit code the CLI returns for it.

Exit codes (stable, documented in the README):
    0 success, 1 anything unexpected, 2 usage or bad input, 3 input refused as unsafe,
    4 validation (parity) failed, 5 missing dependency or hardware.
"""

from __future__ import annotations

from pathlib import Path

EXIT_OK = 0
EXIT_UNEXPECTED = 1
EXIT_BAD_INPUT = 2
EXIT_UNSAFE = 3
EXIT_VALIDATION = 4
EXIT_MISSING_DEPENDENCY = 5


class ModelportError(Exception):
    """A user-facing error: one line, naming the file (when there is one) and the reason."""

    exit_code = EXIT_UNEXPECTED

    def __init__(self, reason: str, *, path: str | Path | None = None, hint: str | None = None):
        self.reason = reason
        self.path = str(path) if path is not None else None
        self.hint = hint
        super().__init__(self.message)

    @property
    def message(self) -> str:
        text = f"{self.path}: {self.reason}" if self.path else self.reason
        if self.hint:
            text += f" ({self.hint})"
        return text

    def to_dict(self) -> dict:
        return {
            "type": type(self).__name__,
            "exit_code": self.exit_code,
            "message": self.message,
            "path": self.path,
        }


class BadInputError(ModelportError):
    """Usage errors and malformed, truncated or inconsistent inputs."""

    exit_code = EXIT_BAD_INPUT


class UnsafeInputError(ModelportError):
    """An input refused because loading it would run code or escape its folder."""

    exit_code = EXIT_UNSAFE


class ValidationError(ModelportError):
    """A produced model does not reproduce the reference outputs within tolerance."""

    exit_code = EXIT_VALIDATION

    def __init__(self, reason: str, *, path=None, hint=None, parity: dict | None = None):
        super().__init__(reason, path=path, hint=hint)
        self.parity = parity


class MissingDependencyError(ModelportError):
    """An optional framework or hardware the requested work needs is absent."""

    exit_code = EXIT_MISSING_DEPENDENCY


class UnsupportedError(BadInputError):
    """The model holds something the chosen route cannot represent (ops listed in the reason)."""


class StageError(ModelportError):
    """An unexpected failure inside a pipeline stage, naming the stage and those before it."""

    exit_code = EXIT_UNEXPECTED

    def __init__(self, stage: str, before: list[str], cause: BaseException):
        ran = ", ".join(before) if before else "nothing"
        super().__init__(f"stage '{stage}' failed after [{ran}]: {type(cause).__name__}: {cause}")
        self.stage = stage
