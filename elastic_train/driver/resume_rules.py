"""Whether a stored run may be continued by a new launch, and what to say when not.

A run continues from its latest checkpoint whenever it is started again under
the same name (Ray Train v2's contract), restored (``TorchTrainer.restore``,
``elastic-train restore``) or relaunched. :func:`spec_changes` compares the
spec stored in ``run.json`` with the new one:

* **Refused** (``breaks=True``), because the stored checkpoints were written by
  another program and loading them would be a guess: another train function
  (module or qualified name), another signature of it (the stored
  ``train_loop_config`` would be passed differently, or not at all), or for
  ``elastic-train launch`` another script, module or arguments. Edits to the
  body of the same function are not detected: they are how bugs get fixed.
  ``elastic-train verify-resume`` tells whether a script resumes exactly.
* **Warned about** (``breaks=False``), because resuming is still correct: another
  number of workers (``num_workers``, ``--nproc-per-node``, ``--nnodes``). The
  checkpoint's files are handed over as they are, and dataset shards and
  prepared data loaders, whose positions say which samples of the epoch are
  done, split the rest of the checkpoint's epoch over the new ranks, each sample
  once (elastic launches change size this way by design; see
  :mod:`elastic_train.worker.data_position`). Only the result stops being
  bit-identical to a run of fixed size (another global batch, another sum order).
  Whether the model state fits the new size depends on how it was saved, which no
  driver can check:

  - one file written by one rank (``torch.save`` of a whole model, DDP): loads
    on any number of workers;
  - ``torch.distributed.checkpoint`` (DCP) shards, each rank saving its own
    (FSDP2, tensor parallel): ``.metadata`` maps every tensor to byte ranges of
    the ranks' files, and ``dcp.load`` reshards them to the new world size --
    with :class:`elastic_train.torch.CheckpointReader`, each rank fetching only
    the ranges it loads. Before the resume every file is checked by one rank,
    its writer's rank modulo the new world size;
  - one ``torch.save`` file per rank of a sharded model: the files come back as
    they are, and the train function must reshard them itself (or save with DCP).

  Also warned about: another ``checkpoint_score_attribute`` or
  ``checkpoint_score_order``. Retention ranks the stored checkpoints anew by it;
  those whose metrics lack the new attribute rank below every other, so they are
  the first it deletes (never the latest) -- see :mod:`elastic_train.storage.retention`.

``train_loop_config`` is not compared: changing it (more epochs, another learning
rate) is a legitimate way to continue a run, as in Ray.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from typing import Any

from elastic_train.storage.run_state import RUN_FILE, TRAINABLE_FILE, RunState


@dataclass(frozen=True)
class SpecChange:
    """One difference between the stored spec and the new one."""

    what: str
    stored: Any
    new: Any
    breaks: bool
    # what continuing despite the change means (changes that do not break)
    note: str = field(default="", compare=False)

    def describe(self) -> str:
        return f"{self.what}: {_show(self.stored)} -> {_show(self.new)}"


def _show(value: Any) -> str:
    if isinstance(value, list):
        return shlex.join(map(str, value))
    return str(value)


_RESIZED = ("it continues, but not bit-identically to a run of fixed size (the samples of "
            "the checkpoint's epoch not trained on yet are split over the new workers)")
_RERANKED = ("the stored checkpoints are ranked anew; those whose metrics lack the score "
             "attribute rank below every other and are the first retention deletes (never "
             "the latest)")

# (what, how to read it from a spec, whether a change breaks resume, what it means if not)
_RULES: list[tuple[str, tuple[str, ...], bool, str]] = [
    ("train function", ("train_function",), True, ""),
    ("train function signature", ("train_signature",), True, ""),
    ("script and arguments", ("identity",), True, ""),
    ("number of workers", ("scaling_config", "num_workers"), False, _RESIZED),
    ("--nproc-per-node", ("launch", "nproc_per_node"), False, _RESIZED),
    ("--nnodes", ("launch", "nnodes"), False, _RESIZED),
    ("checkpoint_score_attribute", ("checkpoint_config", "checkpoint_score_attribute"), False,
     _RERANKED),
    ("checkpoint_score_order", ("checkpoint_config", "checkpoint_score_order"), False,
     _RERANKED),
]

TRAIN_FUNCTION_CHANGES = frozenset({"train function", "train function signature"})


def _get(spec: dict[str, Any], keys: tuple[str, ...]) -> Any:
    for key in keys:
        if not isinstance(spec, dict):
            return None
        spec = spec.get(key)
    return spec


def spec_changes(stored: dict[str, Any], new: dict[str, Any],
                 accepted: frozenset[str] = frozenset()) -> list[SpecChange]:
    """The differences that matter for resuming, refused ones first.

    Fields missing on either side (a run.json of an older version) are not
    compared; ``accepted`` names changes the caller asked for (e.g. a train
    function passed to ``restore()``).

    Example::

        spec_changes({"train_function": "m.train"}, {"train_function": "m.train_v2"})
        # [SpecChange("train function", "m.train", "m.train_v2", breaks=True)]
    """
    changes = []
    for what, keys, breaks, note in _RULES:
        before, after = _get(stored, keys), _get(new, keys)
        if what not in accepted and None not in (before, after) and before != after:
            changes.append(SpecChange(what, before, after, breaks, note))
    return sorted(changes, key=lambda c: not c.breaks)


def is_launch(spec: dict[str, Any]) -> bool:
    """Whether the spec is of an ``elastic-train launch`` run (else of ``fit()``)."""
    return "command" in spec


def why_not_restorable(state: RunState | None, has_trainable: bool, path: str) -> str | None:
    """Why the run stored at ``path`` cannot be continued through its stored train function
    (``TorchTrainer.restore``, ``elastic-train restore`` of a ``fit()`` run); None if it
    can. ``state``: its run.json (None: there is none); ``has_trainable``: whether its
    trainable.pkl is there."""
    if state is None:
        return (f"Cannot restore {path!r}: it is not a run directory (no {RUN_FILE}). Pass "
                "the directory of one run, <storage_path>/<name>, as `elastic-train ls` "
                "lists them.")
    if has_trainable:
        return None
    if is_launch(state.spec):
        return (f"Cannot restore {path!r} with restore(): it is a run of `elastic-train "
                "launch`; continue it with `elastic-train restore PATH`.")
    return (f"Cannot restore {path!r}: its stored train function ({TRAINABLE_FILE}) is "
            f"missing, though {RUN_FILE} is there. Run the script that called fit() again "
            "with the same RunConfig(name=..., storage_path=...): it continues from the "
            f"latest checkpoint and stores {TRAINABLE_FILE} again.")


def start_over_hint(spec: dict[str, Any], display_path: str) -> str:
    """How to start a fresh run under the same name, for the API the spec came from."""
    flag = "--start-over" if is_launch(spec) else "RunConfig(start_over=True)"
    return (f"pass {flag} to move the stored run aside to {display_path}.<status>-<UTC time> "
            "(nothing is deleted) and start a fresh run under this name")


def refusal(display_path: str, state: RunState, new_spec: dict[str, Any],
            changes: list[SpecChange]) -> str | None:
    """Why the stored run cannot be continued by ``new_spec``; None if it can."""
    if state.is_finished:
        continue_hint = ("start a run of another --name whose script loads its last "
                         "checkpoint" if is_launch(new_spec) else
                         "pass resume_from_checkpoint=Result.from_path(path).checkpoint to a "
                         "run of another name")
        return (f"The run {display_path} has already finished; it is not trained again "
                f"silently. To train again, {start_over_hint(new_spec, display_path)}; or "
                f"use another run name. To continue from its final weights, {continue_hint}.")
    broken = [c for c in changes if c.breaks]
    if not broken:
        return None
    restore = ("elastic-train restore PATH" if is_launch(new_spec) else
               "TorchTrainer.restore(path), or TorchTrainer.restore(path, "
               "train_loop_per_worker=...) to continue it with a new function on purpose")
    return (f"The run {display_path} was started with another spec, so its checkpoints may "
            f"not fit: {'; '.join(c.describe() for c in broken)}. Use another run name for a "
            f"new run, or {start_over_hint(new_spec, display_path)}, or continue it as it "
            f"was with {restore}.")
