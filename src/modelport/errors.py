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
    """A user-facing error: one line, naming the file (when there is one) and the reason.

    Its payload is declared and fixed at construction (`str(e) == e.message` always holds): a
    caller that learns more makes a new error with `with_reason()` / `with_report()` and raises it
    `from` the old one, instead of editing the one in flight.
    """

    exit_code = EXIT_UNEXPECTED

    def __init__(self, reason: str, *, path: str | Path | None = None, hint: str | None = None,
                 report: dict | None = None, exit_code: int | None = None, detail: str | None = None):
        self.reason = reason
        self.path = str(path) if path is not None else None
        self.hint = hint
        self.report = report  # the failed run's `modelport.report/1` document, once a run has ended
        self.detail = detail  # what a library said in full, for report.json (the message keeps one short line)
        if exit_code is not None:
            self.exit_code = exit_code
        super().__init__(self.message)
        self._frozen = True

    def __setattr__(self, name: str, value) -> None:
        if getattr(self, "_frozen", False) and not name.startswith("__"):
            raise AttributeError(f"{type(self).__name__}.{name} is fixed at construction (use with_reason/with_report)")
        super().__setattr__(name, value)

    @property
    def message(self) -> str:
        text = f"{self.path}: {self.reason}" if self.path else self.reason
        if self.hint:
            text += f" ({self.hint})"
        return text

    def to_dict(self) -> dict:
        out = {
            "type": type(self).__name__,
            "exit_code": self.exit_code,
            "message": self.message,
            "path": self.path,
        }
        if self.detail:
            out["detail"] = self.detail
        return out

    def _replace(self, **fields) -> ModelportError:
        """A copy of this error with `fields` changed (raise it `from` this one)."""
        return _restore(type(self), {**self.__dict__, **fields})

    def __reduce__(self):  # copy and pickle without calling __init__ again
        return _restore, (type(self), dict(self.__dict__))

    def with_reason(self, reason: str) -> ModelportError:
        return self._replace(reason=reason)

    def with_report(self, report: dict) -> ModelportError:
        return self._replace(report=report)

    def with_hint(self, hint: str) -> ModelportError:
        return self._replace(hint=hint)

    def shortened(self) -> ModelportError:
        """This error with its reason cut to one short line when it is a page of a library's internals
        (several lines, or one over LONG characters), the whole reason kept as `detail` for
        report.json; itself otherwise."""
        if "\n" not in self.reason.strip() and len(self.reason) <= LONG:
            return self
        return self._replace(reason=one_line(self.reason), detail=self.detail or self.reason)


def _restore(cls: type[ModelportError], state: dict) -> ModelportError:
    err = cls.__new__(cls)
    err.__dict__.update({"detail": None, **state})
    object.__setattr__(err, "args", (err.message,))
    return err


class BadInputError(ModelportError):
    """Usage errors and malformed, truncated or inconsistent inputs."""

    exit_code = EXIT_BAD_INPUT


class UnsafeInputError(ModelportError):
    """An input refused because loading it would run code or escape its folder."""

    exit_code = EXIT_UNSAFE


class ValidationError(ModelportError):
    """A produced model does not reproduce the reference outputs within tolerance.

    `parity` is the failed comparison (`ParityResult.to_dict()`); `rows` the optimisation rows up
    to the failing pass, when a pass pipeline failed.
    """

    exit_code = EXIT_VALIDATION

    def __init__(self, reason: str, *, path=None, hint=None, parity: dict | None = None, rows: list | None = None,
                 report: dict | None = None, detail: str | None = None):
        self.parity = parity
        self.rows = list(rows or [])
        super().__init__(reason, path=path, hint=hint, report=report, detail=detail)


class MissingDependencyError(ModelportError):
    """An optional framework or hardware the requested work needs is absent."""

    exit_code = EXIT_MISSING_DEPENDENCY


class UnsupportedError(BadInputError):
    """The model holds something the chosen route cannot represent (ops listed in the reason).

    `preflight` is the emitter's preflight finding (`Preflight.to_dict()`) when one produced it.
    """

    def __init__(self, reason: str, *, path=None, hint=None, preflight: dict | None = None, report: dict | None = None,
                 detail: str | None = None):
        self.preflight = preflight
        super().__init__(reason, path=path, hint=hint, report=report, detail=detail)


class StageError(ModelportError):
    """An unexpected failure inside a pipeline stage, naming the stage and those before it."""

    exit_code = EXIT_UNEXPECTED

    def __init__(self, stage: str, before: list[str], cause: BaseException, *, report: dict | None = None):
        ran = ", ".join(before) if before else "nothing"
        self.stage = stage
        self.before = list(before)
        self.cause = cause
        super().__init__(f"stage '{stage}' failed after [{ran}]: {type(cause).__name__}: {cause}", report=report)


class PassError(StageError):
    """A graph pass broke the pass contract (it mutated the model it was given): a bug in the pass,
    which the pipeline cannot roll back, so the run fails (exit 1) naming the pass."""

    def __init__(self, pass_name: str, before: list[str], problem: str, *, report: dict | None = None):
        self.pass_name = pass_name
        self.problem = problem
        self.stage = f"optimize:{pass_name}"
        self.before = list(before)
        self.cause = None
        ran = ", ".join(before) if before else "nothing"
        ModelportError.__init__(self, f"pass '{pass_name}' {problem} (passes before it: [{ran}])", report=report)


SHORT = 200  # characters of a library's message that an error's one line quotes
LONG = 400  # a reason longer than this is a library's page of internals, not a message (`shortened`)


def one_line(text: str | BaseException, limit: int = SHORT, *, typed: bool = False) -> str:
    """`text`'s first non-empty line, whitespace folded, cut at `limit` characters (… when cut).

    The one helper for "the first line of an error's text". Given an exception, the line is its
    message's, and its class name stands in when the message is empty; `typed=True` leads with the
    class name (`ValueError: bad shape`, or `ValueError` alone). `limit` cuts the message, not the name."""
    line = next((" ".join(ln.split()) for ln in str(text).splitlines() if ln.strip()), "")
    if len(line) > limit:
        line = line[: limit - 1] + "…"
    if not isinstance(text, BaseException):
        return line
    name = type(text).__name__
    if typed:
        return f"{name}: {line}" if line else name
    return line or name
