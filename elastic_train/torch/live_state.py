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
from collections.abc import Iterator
from typing import Any

import torch
from torch.nn.parallel import DistributedDataParallel

from elastic_train.checkpoint import Checkpoint
from elastic_train.errors import ConfigError
from elastic_train.worker.inprocess.loop import abort_deferred
from elastic_train.worker.live import held, transfer
from elastic_train.worker.live.held import Held, copy_tree
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
    change with the world size), else as given; anything it cannot copy is refused."""
    if isinstance(value, DistributedDataParallel):
        return value.module
    if _is_stateful(value) or _is_plain(value):
        return value
    raise ConfigError(
        f"LiveState({key}=<{type(value).__name__}>): keep objects with state_dict() and "
        "load_state_dict() (a model, optimizer, LR scheduler, GradScaler) or plain values "
        f"(numbers, strings, tensors, and lists or dicts of them), e.g. LiveState(model="
        f"model, optimizer=optimizer, epoch=0); save a {type(value).__name__} yourself.")


class LiveState:
    """The state a fault rolls back to, kept in memory across faults (see the module's
    docstring for what it keeps and how).

    Args:
        name: Tells several LiveStates of one train function apart (default: one).
        **state: The objects to keep, by name: ``Stateful`` objects (kept by reference,
            copied by their ``state_dict()`` at each :meth:`step_done`) and plain values
            (read and set as ``live["epoch"]``).

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
        mine = held.get(self.name)
        source = transfer.agree(group, mine)
        if source is None:
            return self._restore_checkpoint()
        got = transfer.receive(group, source, mine, session.resources.devices[0])
        self.load_state_dict(copy_tree(got.state))  # a copy: no object aliases the held one
        self.steps = got.step
        held.keep(self.name, got)
        session.resume_live(got.positions, got.iteration, got.step, source.rank, got.taken_at)
        if session.env.rank == 0:
            holders = [r for r, step in enumerate(source.held) if step == source.step]
            logger.warning("Live recovery: step %d from rank %d's memory (held by rank(s) %s "
                           "of %d); nothing read from storage.", got.step, source.rank,
                           holders, len(source.held))
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
        self.steps = int(saved["steps"])
        return self.steps

    def step_done(self) -> None:
        """Marks a completed step (call it after the optimizer's step): a fault from here on
        rolls back to this step. Copies the state into buffers kept for the purpose (no
        allocation after the first call), with another rank's failure held back until
        the copy is whole."""
        self.steps += 1
        session = self._session
        with abort_deferred():
            previous = held.drop(self.name)  # a copy cut short is never held
            positions, iteration = session.live_positions()
            held.keep(self.name, Held.take(self.steps, self.state_dict(), positions,
                                              iteration, session.env.world_size, previous))

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
