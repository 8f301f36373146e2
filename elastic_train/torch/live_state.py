"""``LiveState``: training state the product keeps across faults, so that a fault costs
at most the step in progress, not the work since the last checkpoint.

Hand it the objects a step changes -- model, optimizer, LR scheduler, GradScaler (any
object with ``state_dict()``/``load_state_dict()``: torch.distributed.checkpoint's
``Stateful``) and plain values such as an epoch counter -- and mark each completed step.
After a fault the survivors of an in-process restart still hold the last completed step
in memory; a replaced rank and a node that joins receive it from a survivor over the
process group, and the data positions of ``prepare_data_loader`` and
``get_dataset_shard`` and the report count go on from the same step. Storage is read
only when no process holds the state (a fresh start, a restore, the whole job lost):
then :meth:`LiveState.restore` loads the latest checkpoint written by
:meth:`LiveState.checkpoint`.

A step costs no copy of the parameters or the optimizer's state: they are read from the
objects when an attempt ends, and another rank's failure is held back from the
optimizer's step to ``step_done()``, so the objects are at a completed step then. What
changes outside the optimizer's step (a model's buffers, the learning rate, a
scheduler, plain values) is copied at each ``step_done()`` (see
:mod:`elastic_train.worker.live.held`).

The state is the data-parallel state (DDP): every rank's copy is the whole state, so
the group goes on from one rank's copy. A sharded model (FSDP) is not kept live: use
checkpoints (docs/live-recovery.md says what is kept and what is not).

Example::

    from elastic_train.torch import LiveState, prepare_data_loader, prepare_model

    def train_func(config):
        model = prepare_model(Net())
        optimizer = torch.optim.AdamW(model.parameters())
        loader = prepare_data_loader(DataLoader(dataset, batch_size=32, shuffle=True))
        live = LiveState(model=model, optimizer=optimizer, epoch=0)
        live.restore()                       # a survivor's memory, else the checkpoint
        for epoch in range(live["epoch"], config["epochs"]):
            live["epoch"] = epoch
            for x, y in loader:
                loss = loss_fn(model(x), y)
                optimizer.zero_grad(); loss.backward(); optimizer.step()
                live.step_done()             # a fault rolls back to here, no further
            live["epoch"] = epoch + 1            # where a checkpoint after the epoch resumes
            with live.checkpoint() as checkpoint:
                elastic_train.report({"loss": loss.item()}, checkpoint=checkpoint)
"""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile
import time
from collections.abc import Iterator
from typing import Any

import torch
from torch.nn.parallel import DistributedDataParallel

from elastic_train.checkpoint import Checkpoint
from elastic_train.errors import ConfigError
from elastic_train.worker.inprocess.loop import hold_aborts, release_aborts
from elastic_train.worker.live import held, transfer
from elastic_train.worker.live.held import Held, Keeper, copy_tree
from elastic_train.worker.session import get_checkpoint, get_session

logger = logging.getLogger(__name__)

LIVE_STATE_FILE = "live_state.pt"  # what checkpoint() writes and restore() reads
_PLAIN = (int, float, bool, str, bytes, type(None), torch.Tensor)


def _is_stateful(value: Any) -> bool:
    return callable(getattr(value, "state_dict", None)) and callable(
        getattr(value, "load_state_dict", None))


def _is_plain(value: Any) -> bool:
    if isinstance(value, dict):
        return all(isinstance(k, str) and _is_plain(v) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return all(_is_plain(v) for v in value)
    return isinstance(value, _PLAIN)


def _checked(key: str, value: Any) -> Any:
    """``value`` as LiveState keeps it: a DDP model by its module (whose keys do not
    change with the world size), else as given; anything it cannot keep is refused."""
    if isinstance(value, DistributedDataParallel):
        return value.module
    if _is_stateful(value) or _is_plain(value):
        return value
    raise ConfigError(
        f"LiveState({key}=<{type(value).__name__}>): keep objects with state_dict() and "
        "load_state_dict() (a model, optimizer, LR scheduler, GradScaler) or plain values "
        f"(numbers, strings, tensors, and lists or dicts of them), e.g. LiveState(model="
        f"model, optimizer=optimizer, epoch=0); save a {type(value).__name__} yourself.")


class _ModuleKeeper:
    """A model: its parameters read at the end (the optimizer's step changes them), its
    buffers (batch norm's statistics change in the forward pass) copied each step."""

    def __init__(self, module: torch.nn.Module):
        self.module = module
        saved = module.state_dict(keep_vars=True)
        self._buffers = {name: tensor for name, tensor in saved.items()
                         if not isinstance(tensor, torch.nn.Parameter)}
        self._copies: dict[str, torch.Tensor] = {}

    def copy(self) -> None:
        self._copies = copy_tree(self._buffers, self._copies)

    def full_state(self) -> Any:
        return {**self.module.state_dict(), **self._copies}


class _OptimizerKeeper:
    """An optimizer: its state read at the end (its step changes it), its settings (a
    scheduler changes the learning rate between steps) copied each step."""

    def __init__(self, optimizer: torch.optim.Optimizer):
        self.optimizer = optimizer
        self._settings: list[dict[str, Any]] = []

    def copy(self) -> None:
        self._settings = copy_tree(
            [{k: v for k, v in group.items() if k != "params"}
             for group in self.optimizer.param_groups], self._settings)

    def full_state(self) -> Any:
        state = self.optimizer.state_dict()
        for group, settings in zip(state["param_groups"], self._settings, strict=True):
            group.update(settings)
        return state


class _CopyKeeper:
    """Any other object (a scheduler, a GradScaler, the user's own) and plain values:
    copied each step."""

    def __init__(self, read: Any):
        self._read = read
        self._copy: Any = None

    def copy(self) -> None:
        self._copy = copy_tree(self._read(), self._copy)

    def full_state(self) -> Any:
        return self._copy


class LiveState:
    """The state a fault rolls back to, kept in memory across faults (see the module's
    docstring for what it keeps and how).

    Args:
        name: Tells several LiveStates of one train function apart (default: one).
        **state: The objects to keep, by name: ``Stateful`` objects (models, optimizers,
            schedulers, ...) and plain values (read and set as ``live["epoch"]``).

    Attributes:
        steps: Steps done in the whole run (calls of :meth:`step_done`; restored too).
    """

    def __init__(self, name: str = "default", **state: Any):
        if not isinstance(name, str) or not name:
            raise ConfigError(f"LiveState(name={name!r}): pass a non-empty string, e.g. "
                              "LiveState(name='model', model=model).")
        if not state:
            raise ConfigError("LiveState() keeps nothing: pass the objects a step changes, "
                              "e.g. LiveState(model=model, optimizer=optimizer).")
        self.name = name
        self._state = {key: _checked(key, value) for key, value in state.items()}
        self.steps = 0
        self._session = get_session()
        self._held = Held(keepers={key: self._keeper(key) for key in self._state})
        self._stepped: set[int] = set()  # the optimizers that stepped since step_done()
        for value in self._state.values():
            if isinstance(value, torch.optim.Optimizer):
                value.register_step_pre_hook(self._optimizer_steps)

    def _keeper(self, key: str) -> Keeper:
        value = self._state[key]
        if isinstance(value, torch.nn.Module):
            return _ModuleKeeper(value)
        if isinstance(value, torch.optim.Optimizer):
            return _OptimizerKeeper(value)
        if _is_stateful(value):
            return _CopyKeeper(value.state_dict)
        return _CopyKeeper(lambda: self._state[key])

    def __getitem__(self, key: str) -> Any:
        return self._state[key]

    def __setitem__(self, key: str, value: Any) -> None:
        if key not in self._state or _is_stateful(self._state[key]):
            raise ConfigError(
                f"LiveState[{key!r}] = ...: only the plain values given to LiveState can be "
                f"set (here: {sorted(k for k, v in self._state.items() if not _is_stateful(v))}).")
        self._state[key] = _checked(key, value)

    def state_dict(self) -> dict[str, Any]:
        """The kept state now: each object's ``state_dict()``, plain values as they are."""
        return {key: value.state_dict() if _is_stateful(value) else value
                for key, value in self._state.items()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Loads ``state`` (as :meth:`state_dict` gives it) into the kept objects."""
        for key, value in state.items():
            if key not in self._state:
                raise ConfigError(f"LiveState.load_state_dict: the state has {key!r}, which "
                                  f"this LiveState does not keep ({sorted(self._state)}).")
            if _is_stateful(self._state[key]):
                self._state[key].load_state_dict(value)
            else:
                self._state[key] = value

    def restore(self) -> int:
        """Loads the newest state the job holds and returns the steps done (0: a fresh
        start). Collective: every rank calls it, once, before its first step.

        The newest completed step a survivor holds comes from that survivor's memory
        (the data positions and the report count with it); when no process holds one, the
        latest checkpoint written by :meth:`checkpoint`; else nothing is loaded.
        """
        session = self._session
        group = session.join().group
        source = transfer.agree(group, held.get(self.name))
        if source is None:
            self.steps = self._restore_checkpoint()
        else:
            got = transfer.receive(group, source, held.get(self.name))
            self.load_state_dict(copy_tree(got.frozen))  # no object aliases a held tensor
            self.steps = got.step
            session.resume_live(got.positions, got.iteration, got.step, source.rank,
                                got.taken_at)
            if session.env.rank == 0:
                holders = [r for r, step in enumerate(source.held) if step == source.step]
                logger.warning("Live recovery: step %d from rank %d's memory (held by "
                               "rank(s) %s of %d); nothing read from storage.", got.step,
                               source.rank, holders, len(source.held))
        self._take()  # this rank holds the restored step: it can be the next source
        held.keep(self.name, self._held)
        return self.steps

    def _restore_checkpoint(self) -> int:
        checkpoint = get_checkpoint()
        if checkpoint is None:
            return 0
        with checkpoint.as_directory() as directory:
            path = os.path.join(directory, LIVE_STATE_FILE)
            if not os.path.exists(path):
                return 0  # a checkpoint of the user's own format: theirs to load
            saved = torch.load(path, map_location=self._session.resources.devices[0],
                               weights_only=False)
        self.load_state_dict(saved["state"])
        return int(saved["steps"])

    def _optimizer_steps(self, optimizer: torch.optim.Optimizer, *_: Any) -> None:
        """An optimizer of this state is about to step: the state is in a step until
        :meth:`step_done` (aborts held back, and a failure of this rank's own drops its
        copy)."""
        if id(optimizer) in self._stepped:
            raise ConfigError(
                "LiveState: the optimizer stepped twice without step_done() between: call "
                "live.step_done() after each optimizer step.")
        self._stepped.add(id(optimizer))
        hold_aborts()
        self._held.open = True

    def _take(self) -> None:
        """Copies what changes outside the optimizer's step and notes the step's facts."""
        entry, session = self._held, self._session
        entry.open = True  # until the copies are whole
        for keeper in entry.keepers.values():
            keeper.copy()
        entry.positions, entry.iteration = session.live_positions()
        entry.step, entry.world = self.steps, session.env.world_size
        entry.taken_at = time.time()
        entry.open = False

    def step_done(self) -> None:
        """Marks a completed step (call it after the optimizer's step): a fault from here on
        rolls back to this step. Copies only what changes outside the optimizer's step; an
        abort held back since the optimizer's step is raised here."""
        hold_aborts()
        self.steps += 1
        self._take()
        self._stepped.clear()
        release_aborts()

    @contextlib.contextmanager
    def checkpoint(self) -> Iterator[Checkpoint | None]:
        """A checkpoint of the kept state for ``report()`` (rank 0's: every rank holds the
        same state), in the format :meth:`restore` reads when no process holds it::

            with live.checkpoint() as checkpoint:
                elastic_train.report(metrics, checkpoint=checkpoint)
        """
        if self._session.env.rank != 0:
            yield None
            return
        with tempfile.TemporaryDirectory(prefix="live-state-") as directory:
            torch.save({"steps": self.steps, "state": self.state_dict()},
                       os.path.join(directory, LIVE_STATE_FILE))
            yield Checkpoint.from_directory(directory)
