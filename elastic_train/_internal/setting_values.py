"""How a setting's text becomes its value: one parser per kind, shared by every entry.

The ``ELASTIC_TRAIN_*`` variables (:mod:`.env_vars`), the ``--rdzv-conf`` keys
(:mod:`.rendezvous_backends`) and public arguments such as ``should_checkpoint(prior_mtbf_s=...)``
take switches, seconds and counts; each kind is parsed here, once, so that a value is
accepted or refused alike wherever it enters. A value given as text (from the
environment, a command line, YAML) is accepted where it is unambiguous (``"20"`` is 20
seconds) and refused otherwise, by a ConfigError that names the setting, the value and
the fix: ``"30s"`` says "seconds, e.g. 30".

Each parser is ``parse(value, setting) -> value``: ``setting`` is how the message names
where the value came from (``"ELASTIC_TRAIN_LEASE_TTL_S"``, ``"--rdzv-conf timeout"``).
A value already parsed (a bool, a number) passes as it is, so a parser may run twice.

Example::

    switch("off", "ELASTIC_TRAIN_ZYGOTE")            # False
    seconds("4h", "prior_mtbf_s")                    # ConfigError: ... e.g. 14400
"""

from __future__ import annotations

import re
from typing import Any

from elastic_train.errors import ConfigError

TRUE_WORDS = ("1", "true", "yes", "on")
FALSE_WORDS = ("0", "false", "no", "off")
_UNITS = {"s": 1, "sec": 1, "m": 60, "min": 60, "h": 3600, "d": 86400}
_WITH_UNIT = re.compile(r"\s*([0-9]*\.?[0-9]+)\s*([a-z]+)\s*", re.IGNORECASE)


def _refused(setting: str, value: Any, use: str) -> ConfigError:
    return ConfigError(f"{setting}={value!r} is invalid: use {use}.", field=setting)


def switch(value: Any, setting: str) -> bool:
    """``0/1/false/true/no/yes/off/on`` in any case (or a bool) -> bool."""
    if isinstance(value, bool):
        return value
    word = str(value).strip().lower()
    if word in TRUE_WORDS or word in FALSE_WORDS:
        return word in TRUE_WORDS
    raise _refused(setting, value, f"one of {'/'.join(FALSE_WORDS)} (off) or "
                                   f"{'/'.join(TRUE_WORDS)} (on), in any case")


def _number(value: Any) -> float | None:
    """``value`` as a number (an int, a float, or text that is one), else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    try:
        return float(str(value))
    except ValueError:
        return None


def _example(value: Any, default: str) -> str:
    """The seconds a value with a unit meant (``"4h"`` -> ``"14400"``), else ``default``."""
    unit = _WITH_UNIT.fullmatch(str(value))
    if unit and unit[2].lower() in _UNITS:
        return f"{float(unit[1]) * _UNITS[unit[2].lower()]:g}"
    return default


def seconds(value: Any, setting: str, *, zero: bool = False, example: str = "30") -> float:
    """A duration as a number of seconds, > 0 (>= 0 with ``zero``); ``"30s"`` or ``"4h"``
    is refused with the number it means (the unit is always seconds)."""
    number = _number(value)
    if number is not None and (number > 0 or (zero and number == 0)):
        return number
    bound = ">= 0" if zero else "> 0"
    raise _refused(setting, value, f"a number of seconds {bound} (no unit), e.g. "
                                   f"{_example(value, example)}")


def whole_seconds(value: Any, setting: str, *, example: str = "30") -> int:
    """A duration in whole seconds >= 1 (torch reads these with ``int()``)."""
    number = _number(value)
    if number is not None and number >= 1 and number == int(number):
        return int(number)
    raise _refused(setting, value, f"a whole number of seconds >= 1 (no unit), e.g. "
                                   f"{_example(value, example)}")


def count(value: Any, setting: str, *, minimum: int = 1) -> int:
    """A whole number >= ``minimum``."""
    number = _number(value)
    if number is not None and number >= minimum and number == int(number):
        return int(number)
    raise _refused(setting, value, f"a whole number >= {minimum}")
