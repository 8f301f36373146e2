"""Several node drivers of one job (``tests.e2e.scripts.node_driver``) on this machine."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator

from tests.support.paths import REPO
from tests.support.servers import stop_process


@contextlib.contextmanager
def node_drivers(settings: dict, tmp_path, envs: list[dict[str, str]] | None = None
                 ) -> Iterator[list[subprocess.Popen]]:
    """One ``tests.e2e.scripts.node_driver`` per entry of ``envs`` (extra environment; default two
    nodes), each in a session of its own and logging to ``tmp_path/node<i>.log``; all
    stopped when the block ends."""
    envs = envs if envs is not None else [{}, {}]
    logs = [open(tmp_path / f"node{i}.log", "w") for i in range(len(envs))]  # noqa: SIM115
    procs = [subprocess.Popen(
        [sys.executable, "-m", "tests.e2e.scripts.node_driver", json.dumps(settings)], cwd=REPO,
        env={**os.environ, **env}, stdout=log, stderr=subprocess.STDOUT, text=True,
        start_new_session=True) for env, log in zip(envs, logs, strict=True)]
    try:
        yield procs
    finally:
        for proc in procs:
            stop_process(proc)
        for log in logs:
            log.close()


def node_log(tmp_path, index: int) -> str:
    return (tmp_path / f"node{index}.log").read_text()
