"""The chaos suite: random faults at random times against the deterministic job.

Each trial asserts that the job finishes within its budgets, that its final
weights are bit-identical to the uninterrupted run's, that no partial
checkpoint was ever visible, that retention kept what it should, and that no
process was left behind. The table of all trials is printed at the end.

    python -m pytest tests/chaos                      # short profile (CI): 3 kinds, drawn
                                                      # (node care's and etcd watches'
                                                      # kinds: long and all only)
    CHAOS_PROFILE=all python -m pytest tests/chaos    # each kind once
    CHAOS_PROFILE=all CHAOS_ROUNDS=20 ...             # each kind 20 times (round by round)
    CHAOS_PROFILE=long CHAOS_TRIALS=40 python -m pytest tests/chaos   # by hand
    CHAOS_KINDS=agent_sigkill,corrupt_rdzv_state ...  # draw from these kinds only
    CHAOS_SEED=1234 CHAOS_ONLY=#2 ...                 # replay trial #2 of seed 1234's draw

The draw is a function of the seed and of ``CHAOS_PROFILE``, ``CHAOS_KINDS``,
``CHAOS_TRIALS`` and ``CHAOS_ROUNDS``; ``CHAOS_ONLY`` keeps one trial of it. A
failed trial's message and the summary at the end print the command that replays
it (``CHAOS_SEED=... CHAOS_ONLY=#N`` with the other variables as they were).
"""

from __future__ import annotations

import os
import random
import signal
import time

import pytest

from tests.chaos.conftest import RESULTS, SEED, save
from tests.chaos.faults import (
    KINDS,
    LAUNCH_KINDS,
    LONG_ONLY_KINDS,
    Trial,
    run_trial,
)
from tests.chaos.ledger_check import ledger_figures
from tests.conftest import (
    StorageUnderTest,
    child_pids,
    make_storage,
    pid_alive,
    wait_until,
)
from tests.support.etcd_server import etcd_binary
from tests.support.servers import SERVER_PIDS, TcpProxy, s3_options

SHAPING = ("CHAOS_PROFILE", "CHAOS_KINDS", "CHAOS_TRIALS", "CHAOS_ROUNDS")  # shape the draw


def _kinds() -> tuple[str, ...]:
    """``CHAOS_KINDS`` (comma-separated), else every kind."""
    asked = [k.strip() for k in os.environ.get("CHAOS_KINDS", "").split(",") if k.strip()]
    unknown = [k for k in asked if k not in KINDS]
    if unknown:
        raise pytest.UsageError(f"CHAOS_KINDS: unknown kind(s) {unknown}; kinds: {KINDS}")
    return tuple(asked) or KINDS


def _draw() -> list[Trial]:
    """The trials of the profile. The short one (CI) draws 3 different kinds each run,
    so successive runs cover them all; each kind also has its own end-to-end test."""
    rng = random.Random(SEED)
    profile = os.environ.get("CHAOS_PROFILE", "short")
    kinds = _kinds()
    if profile == "long":
        kinds = [rng.choice(kinds) for _ in range(int(os.environ.get("CHAOS_TRIALS", "28")))]
    elif profile == "all":
        kinds = list(kinds) * int(os.environ.get("CHAOS_ROUNDS", "1"))
    else:  # node care's and etcd watches' kinds only when asked for by name: CI's cost
        asked = bool(os.environ.get("CHAOS_KINDS", "").strip())  # stays as it was
        kinds = [k for k in kinds if asked or k not in LONG_ONLY_KINDS]
        kinds = rng.sample(kinds, min(3, len(kinds)))
    return [Trial.draw(n, kind, rng) for n, kind in enumerate(kinds)]


def replay_command(trial: Trial) -> str:
    """The command that runs ``trial`` again, alone: same seed and draw, ``CHAOS_ONLY``."""
    env = [f"{name}={os.environ[name]}" for name in SHAPING if os.environ.get(name)]
    return " ".join([f"CHAOS_SEED={SEED}", *env, f"CHAOS_ONLY=#{trial.number}",
                     "python -m pytest -q tests/chaos/test_chaos.py"])


def _selected() -> list[Trial]:
    """The draw, or only its trial ``CHAOS_ONLY`` (``#N`` or ``N``)."""
    trials = _draw()
    only = os.environ.get("CHAOS_ONLY", "").strip().lstrip("#")
    if not only:
        return trials
    picked = [t for t in trials if str(t.number) == only]
    if not picked:
        raise pytest.UsageError(f"CHAOS_ONLY=#{only}: seed {SEED}'s draw has trials "
                                f"#0 to #{len(trials) - 1}")
    return picked


@pytest.mark.e2e
@pytest.mark.timeout(300)
@pytest.mark.parametrize("trial", _selected(), ids=str)
def test_trial(trial: Trial, tmp_path, baseline, request):
    replay = replay_command(trial)
    print(f"chaos seed {SEED}: {trial}\nreplay: {replay}")
    if "etcd" in trial.kind and etcd_binary() is None:
        pytest.skip("the etcd binary is not installed (apt-get install etcd-server)")
    before = set(child_pids(os.getpid()))
    storage, through, proxy = make_storage("local", tmp_path, None), None, None
    if trial.kind == "storage_outage" or trial.detail("store") == "s3":
        endpoint = request.getfixturevalue("s3_endpoint")
        storage = make_storage("s3", tmp_path, endpoint)
    if trial.kind == "storage_outage":
        proxy = TcpProxy(int(endpoint.rsplit(":", 1)[1]))
        through = StorageUnderTest(storage.url, s3_options(f"http://127.0.0.1:{proxy.port}"),
                                   storage.fs)
    row = {"kind": trial.kind, "recovered": 0, "data_lost": 0, "leaked": 0,
           "recovery_s": None, "trial": f"seed {SEED}: {trial}", "passed": False,
           "replay": replay}
    RESULTS.append(row)
    started = time.monotonic()
    try:
        _check(trial, row, storage, tmp_path, through, proxy, before, request)
        row["passed"] = True
    except BaseException as failure:  # pytest's Failed too; the note names the replay
        failure.add_note(f"chaos seed {SEED}, trial {trial}; replay: {replay}")
        raise
    finally:
        row["trial_s"] = round(time.monotonic() - started, 1)
        try:  # reported in the table, not a check of the job (see ledger_check.py)
            row.update(ledger_figures(storage, time.monotonic() - started))
        except Exception as unread:  # noqa: BLE001 - the row says why
            row["ledger_problems"] = {"(unread)": [repr(unread)]}
        save(row)


def _check(trial: Trial, row: dict, storage: StorageUnderTest, tmp_path,
           through: StorageUnderTest | None, proxy: TcpProxy | None, before: set[int],
           request) -> None:
    """Runs the trial and fills ``row`` as its checks go; asserts them."""
    try:
        outcome = run_trial(trial, storage, tmp_path, through, proxy)
    finally:
        if proxy is not None:
            proxy.cut()
        row["leaked"] = _reap(before)
    row["recovered"] = 1
    row["recovery_s"] = outcome.recovery_s
    if outcome.note:
        row["note"] = outcome.note
        print(outcome.note)
    expected = request.getfixturevalue("launch_baseline") if trial.kind in LAUNCH_KINDS \
        else request.getfixturevalue("baseline").return_value["digest"]
    identical = outcome.digest == expected
    row["leaked"] += sum(pid_alive(p) for p in outcome.orphans)
    history = outcome.iterations == list(range(1, len(outcome.iterations) + 1))
    row["data_lost"] = int(not identical or not history or bool(outcome.partial_seen)
                           or bool(outcome.lost_commits))
    assert identical, "final weights differ from the uninterrupted run"
    assert not outcome.lost_commits, f"committed checkpoints lost: {outcome.lost_commits}"
    assert outcome.second_refused in (None, True), \
        "a second driver was not refused as a live run's: " + "; ".join(outcome.kind_failures)
    assert not outcome.kind_failures, "; ".join(outcome.kind_failures)
    assert history, f"metrics history has gaps or repeats: {outcome.iterations}"
    assert not outcome.partial_seen, f"partial checkpoint visible: {outcome.partial_seen}"
    assert outcome.retained and outcome.retained[-1] == outcome.latest, \
        f"retention dropped the latest checkpoint: {outcome.retained}"
    assert outcome.num_to_keep is None or len(outcome.retained) <= outcome.num_to_keep, \
        f"retention kept more than {outcome.num_to_keep}: {outcome.retained}"
    assert row["leaked"] == 0, "processes left behind"
    assert trial.kind in ("storage_outage", "etcd_restart", "second_driver", "straggler") \
        or outcome.recovery_s is not None, "the fault did not happen"


def _reap(before: set[int]) -> int:
    """Children this trial left behind (waited for briefly, then killed): their count."""
    new = [p for p in child_pids(os.getpid()) if p not in before | SERVER_PIDS]
    if wait_until(lambda: not [p for p in new if pid_alive(p)], 10):
        return 0
    left = [p for p in new if pid_alive(p)]
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    return len(left)
