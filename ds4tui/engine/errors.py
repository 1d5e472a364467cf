"""Every exception class of the engine layer, each defined once.

Two families, and three errors of their own:

* :class:`ModelFileError` — a model file cannot be used (:mod:`ds4tui.engine.gguf_model`); ``path``
  is the file and the message names the key or tensor with the expected and found values.
* :class:`EngineError` — an engine call failed (:mod:`ds4tui.engine.session` on the native and the
  reference backends, :mod:`ds4tui.engine.reference`); the message names the problem, from the C
  engine where it came from (:func:`native_error` maps its return codes).
* :class:`NonFiniteError` belongs to both: NaN/Inf in a model file's tensor, or in the logits a
  forward pass produced.
* :class:`TokenizerError` and :class:`SchedulerPricesError` (``ValueError`` s),
  :class:`ConversionError` and :class:`TelemetryUnavailable` (a ``RuntimeError``).

The modules that raise them re-export the names they always had (``session.EngineError``,
``gguf_model.ModelFileError``, ``reference.TokenRangeError``, ...): the same class objects.
Nothing here imports another ds4tui module.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover - annotations only
    from ds4tui.engine.gguf_model import Problem

__all__ = [
    "ArchitectureError",
    "BackendUnavailableError",
    "NativeNotBuiltError",
    "CancelledError",
    "ContextOverflowError",
    "ConversionError",
    "DeviceError",
    "DeviceFaultError",
    "DeviceMemoryError",
    "EngineError",
    "GGUFFormatError",
    "KeyTypeError",
    "KeyValueError",
    "MetadataError",
    "MissingKeyError",
    "MissingTensorError",
    "ModelFileError",
    "NonFiniteError",
    "SchedulerPricesError",
    "StateError",
    "SupportInvalidError",
    "TelemetryUnavailable",
    "TensorError",
    "TensorShapeError",
    "TensorTypeError",
    "TokenRangeError",
    "TokenizerError",
    "TruncatedFileError",
    "native_error",
]


# ---- engine calls --------------------------------------------------------------------------------

class EngineError(Exception):
    """An engine call failed; the message names the problem (from the C engine where it came from)."""


class BackendUnavailableError(EngineError):
    """The requested backend cannot run here (not built, no device)."""


class OptionUnavailableError(BackendUnavailableError):
    """An engine option asked for ``on`` cannot run on this machine (the amx option on a CPU without
    AMX-INT8, or a kernel that refuses the tile state): the message names the option first."""


class NativeNotBuiltError(BackendUnavailableError):
    """The native engine (``ds4tui._native``) does not import: no backend but the reference can run,
    whichever was asked for; the message says what is missing and the command that builds it."""


class DeviceError(EngineError):
    """The GPU backend failed during a call (a runtime call or kernel launch; the message names it)."""


class DeviceMemoryError(BackendUnavailableError):
    """The model does not fit the GPU memory this machine gives it: refused before any upload.

    ``need`` and ``budget`` are bytes, ``source`` says where the budget came from (amdgpu's GTT
    and VRAM pools in sysfs, or the GPU runtime), ``advice`` what to change (on AMD the
    ``ttm.pages_limit`` kernel parameter, with the number), or "" when nothing can be changed."""

    def __init__(self, message: str, *, need: int, budget: int, source: str, advice: str = ""):
        super().__init__(message)
        self.need, self.budget, self.source, self.advice = need, budget, source, advice


class DeviceFaultError(BackendUnavailableError):
    """The GPU failed the first device pass that runs, on AMD, in a child process before the model
    loads (a ROCm GPU memory fault aborts the process that hits it; the child takes that hit).
    ``returncode`` is the child's exit status (negative: the signal that ended it) and ``output``
    the end of what it printed."""

    def __init__(self, message: str, *, returncode: int | None, output: str = ""):
        super().__init__(message)
        self.returncode, self.output = returncode, output


class ContextOverflowError(EngineError):
    """The tokens do not fit in the session's context size."""


class TokenRangeError(EngineError):
    """A token id outside the vocabulary."""


class CancelledError(EngineError):
    """``Session.cancel`` stopped a prefill or step.  ``kept`` = tokens left in the cache."""

    def __init__(self, message: str, kept: int = 0):
        super().__init__(message)
        self.kept = kept


class StateError(EngineError):
    """The call does not fit the session's state (e.g. a step before any prompt)."""


class DraftVocabError(EngineError, ValueError):
    """A draft vocabulary that cannot be used (spec dspark.md §2.6): the message names the option or
    file, what was expected and what was found.  ``detail`` is the message without the option's
    name (for a command line that names its flag instead)."""

    def __init__(self, detail: str, option: str = "draft_vocab"):
        super().__init__(f"{option}: {detail}")
        self.detail = detail


# ---- model files ---------------------------------------------------------------------------------

class ModelFileError(Exception):
    """A model file cannot be used. ``path`` is the file; the message says what and where."""

    def __init__(self, path: str | os.PathLike, message: str):
        self.path = str(path)
        self.detail = message
        super().__init__(f"{self.path}: {message}")


class GGUFFormatError(ModelFileError):
    """Not a readable GGUF v3 file (wrong magic, unsupported version, corrupt header)."""


class TruncatedFileError(GGUFFormatError):
    """The file ends before the header or a tensor's data does."""


class ArchitectureError(ModelFileError):
    """``general.architecture`` is not the one expected."""


class MetadataError(ModelFileError):
    """A metadata key is missing, has the wrong GGUF type or an invalid value."""

    def __init__(self, path, key: str, message: str):
        self.key = key
        super().__init__(path, f"metadata key '{key}': {message}")


class MissingKeyError(MetadataError):
    pass


class KeyTypeError(MetadataError):
    pass


class KeyValueError(MetadataError):
    pass


class TensorError(ModelFileError):
    """A tensor is missing, has the wrong dims or the wrong GGML type."""

    def __init__(self, path, tensor: str, message: str):
        self.tensor = tensor
        super().__init__(path, f"tensor '{tensor}': {message}")


class MissingTensorError(TensorError):
    pass


class TensorShapeError(TensorError):
    pass


class TensorTypeError(TensorError):
    pass


class NonFiniteError(TensorError, EngineError):
    """NaN or Inf where only finite values may be.

    ``NonFiniteError(path, tensor, message)``: a float tensor of a model file holds them (a
    :class:`TensorError`: ``path``, ``tensor`` and ``detail`` are set).  ``NonFiniteError(message)``:
    the logits of a forward pass hold them (the C engine's ``DS4_E_NONFINITE``: bad weights or an
    overflow); ``path`` and ``tensor`` are then None.  Both are :class:`EngineError` s."""

    def __init__(self, path, tensor: str | None = None, message: str | None = None):
        if tensor is None and message is None:
            self.path = self.tensor = None
            self.detail = str(path)
            EngineError.__init__(self, str(path))
        else:
            super().__init__(path, tensor, message if message is not None else "non-finite values")


class SupportInvalidError(ModelFileError):
    """A DSpark support file failed validation; ``problems`` lists every reason."""

    def __init__(self, path, problems: list["Problem"]):
        self.problems = problems
        lines = "; ".join(p.message for p in problems[:8])
        more = f" (and {len(problems) - 8} more)" if len(problems) > 8 else ""
        super().__init__(path, f"DSpark support model refused: {lines}{more}")


# ---- the others ----------------------------------------------------------------------------------

class TokenizerError(ValueError):
    """Bad or unsupported tokenizer data (file, GGUF key, token id or chat message)."""


class ConversionError(Exception):
    """The checkpoint cannot be converted; the message names the file/tensor and what is wrong."""


class TelemetryUnavailable(RuntimeError):
    """An explicitly requested telemetry backend cannot run here; ``str(e)`` is the one-line reason."""


class SchedulerPricesError(ValueError):
    """A saved scheduler prices file (spec dspark.md §7.4) that cannot be used: unreadable, not the
    format, a field out of range, or measured for another model, support file or options (stale).
    The message names the file and what is wrong; the engine ignores the file and starts fresh."""


# ---- the C engine's return codes -----------------------------------------------------------------

#: ds4_engine.h's DS4_E_* codes that have a class of their own (the others are EngineError).
_NATIVE = {-4: ContextOverflowError, -5: CancelledError, -6: TokenRangeError, -7: NonFiniteError, -8: StateError,
           -9: DeviceError}


def native_error(rc: int, message: str) -> EngineError:
    """The exception for a native return code ``rc`` (< 0) with the engine's ``message``."""
    return _NATIVE.get(rc, EngineError)(message or f"native error {rc}")
