"""Ray Train v1's mixed-precision helpers, which Ray Train v2 removed: calling one
raises ``DeprecationWarning`` (as Ray v2 does) with what to use instead, rather than
leaving a ported script at an ``AttributeError``."""

from __future__ import annotations

from typing import Any

_INSTEAD = ("use torch's own mixed precision in the train function (torch.autocast and "
            "torch.amp.GradScaler), or a library that does it for you, such as Lightning "
            "(elastic_train.lightning) or Hugging Face Transformers/Accelerate")


def _removed(name: str) -> DeprecationWarning:
    return DeprecationWarning(
        f"ray.train.torch.{name}() was removed in Ray Train v2 and elastic-train does not "
        f"offer it: {_INSTEAD}.")


def accelerate(amp: bool = False) -> None:
    """Removed in Ray Train v2; raises with what to use instead."""
    raise _removed("accelerate")


def prepare_optimizer(optimizer: Any) -> Any:
    """Removed in Ray Train v2; raises with what to use instead."""
    raise _removed("prepare_optimizer")


def backward(tensor: Any) -> None:
    """Removed in Ray Train v2; raises with what to use instead."""
    raise _removed("backward")
