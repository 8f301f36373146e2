"""The Python API's words in an error, told in ``elastic-train launch``'s flags.

The configs check every value and name the field at fault in API terms
(``CheckpointConfig.num_to_keep=0 is invalid: use an integer >= 1, or None to keep
every checkpoint``); a ``launch`` user gave a flag, not a field, and cannot pass
None. :data:`FIELD_SETTINGS` is the one table from a config field to the launch
setting that feeds it; :func:`in_flag_terms` rewrites a message with it: the field
becomes the flag (or the variable the value came from), ``XConfig(field=...)``
the flag, and ``None`` "omit the flag".
"""

from __future__ import annotations

import re
from collections.abc import Mapping

# Config field -> the launch setting (its flag: --name-with-dashes) that feeds it.
FIELD_SETTINGS = {
    "ScalingConfig.num_workers_per_node": "nproc_per_node",
    "ScalingConfig.spare_nodes": "spares",
    "FailureConfig.max_failures": "max_restarts",
    "FailureConfig.hang_timeout_s": "hang_timeout",
    "FailureConfig.max_preemption_failures": "max_preemption_failures",
    "FailureConfig.unwind_timeout_s": "unwind_timeout",
    "FailureConfig.max_restarts_without_progress": "max_restarts_without_progress",
    "StragglerConfig.score_threshold": "straggler_threshold",
    "StragglerConfig.window": "straggler_window",
    "StragglerConfig.min_excess_s": "straggler_min_excess",
    "StragglerConfig.replace": "replace_stragglers",
    "StragglerConfig.cool_off_s": "straggler_cool_off",
    "CheckpointConfig.num_to_keep": "num_to_keep",
    "CheckpointConfig.checkpoint_score_attribute": "checkpoint_score_attribute",
    "CheckpointConfig.checkpoint_score_order": "checkpoint_score_order",
    "CheckpointConfig.peer_replicas": "peer_replicas",
    "RunConfig.name": "name",
    "RunConfig.storage_path": "storage_path",
    "RendezvousConfig.backend": "rdzv_backend",
}

_FIELD = re.compile(r"\b([A-Z]\w*Config)\.(\w+)")  # FailureConfig.max_failures
_CALL = re.compile(r"\b([A-Z]\w*Config)\(([^()]*)\)")  # RunConfig(name=..., ...)
_ARGUMENT = re.compile(r"(\w+)=('[^']*'|[^,]*)")


def flag_name(setting: str) -> str:
    """A launch setting's flag: ``num_to_keep`` -> ``--num-to-keep``."""
    return "--" + setting.replace("_", "-")


def in_flag_terms(message: str, flags: Mapping[str, str] | None = None,
                  field: str | None = None) -> str:
    """``message`` with the config fields named by their flags: ``flags`` maps a field
    to its flag, or to the variable its value came from (default: :data:`FIELD_SETTINGS`'
    flags). A call such as ``RunConfig(storage_path=...)`` becomes its flags
    (``--storage-path``), one with a value an example (``--name resnet``); ``field``'s
    "None" becomes "omit <flag>". Fields without a flag are left as they are."""
    if flags is None:
        flags = {f: flag_name(setting) for f, setting in FIELD_SETTINGS.items()}
    classes = {key.split(".")[0] for key in flags}

    def field_sub(match: re.Match[str]) -> str:
        return flags.get(f"{match[1]}.{match[2]}", match[0])

    def call_sub(match: re.Match[str]) -> str:
        owner = match[1]
        if owner not in classes:
            return match[0]
        said = []
        for name, value in _ARGUMENT.findall(match[2]):
            name_flag = flags.get(f"{owner}.{name}")
            if name_flag is None:
                return match[0]
            said.append(name_flag if value.strip() in ("...", "") else
                        f"{name_flag} {value.strip().strip(chr(39))}")
        return "/".join(said) if all(" " not in s for s in said) else " ".join(said)

    message = _CALL.sub(call_sub, message)
    message = _FIELD.sub(field_sub, message)
    if field in flags:
        message = re.sub(r"\bNone\b", f"omit {flags[field]}", message)
    # What the message said for launch users apart, now said twice: once.
    message = re.sub(r"(--[\w-]+(?: [^\s,]+)?) or launch \1", r"\1", message)
    return re.sub(r" \(launch: ([^)]*)\)",
                  lambda m: "" if m[1] in message.replace(m[0], "") else m[0], message)
