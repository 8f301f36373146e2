"""The process torch's agent starts for each worker when a zygote serves them.

Run by path with the standard library only (``python -I -S zygote/client.py
SOCKET ZYGOTE_PID MODULE ARG...``), so it starts in milliseconds: it never imports torch
or this package. It asks the zygote (:mod:`elastic_train.agent.zygote.server`) to
fork a worker that runs ``MODULE.main(ARGS)`` with this process's
environment, working directory and standard streams, then stands in for that
worker towards the agent:

- signals the agent sends it (SIGTERM: a preemption notice; SIGUSR1: a
  stack dump; SIGINT, SIGHUP, SIGQUIT, SIGUSR2) are passed on to the worker;
- it notes the worker's pid for the agent, which stops and waits for the
  worker itself (see :mod:`elastic_train.agent.forked_workers`);
- it exits as the worker did: with its exit code, or killed by its signal;
- when it is SIGKILLed itself (the agent stopping a group), its connection
  closes and the zygote SIGKILLs the worker.

A zygote that died before it listened (it failed to start: its traceback is
beside its socket) does not fail the worker: the stand-in warns and becomes the
worker itself, a fresh interpreter (``python -m MODULE ARG...``, as without the
zygote). A zygote that dies later fails its workers, with its traceback in
their error.
"""

import ctypes
import json
import os
import signal
import socket
import sys
import time

FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1,
             signal.SIGUSR2)
CONNECT_TIMEOUT_S = 300.0  # the zygote binds its socket after importing torch
_PR_SET_PDEATHSIG = 1


PIDS_DIR = "ELASTIC_TRAIN_WORKER_PIDS_DIR"  # elastic_train._internal.env_vars.WORKER_PIDS_DIR
MAX_ERROR_LINES = 40
STOPS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)


def _stat(pid: int) -> list[str] | None:
    """The fields of /proc/PID/stat after the command name, or None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return fields if fields[0] not in ("Z", "X") else None


def _running(pid: int) -> bool:
    return _stat(pid) is not None


def note_worker(pid: int) -> None:
    """Tells the agent which process this one stands in for: its pid and start time
    (see elastic_train/agent/forked_workers.py), so the agent can stop it itself."""
    directory, fields = os.environ.get(PIDS_DIR), _stat(pid)
    if not directory or fields is None:
        return
    path = os.path.join(directory, str(os.getpid()))
    try:
        with open(f"{path}.tmp", "w") as f:
            f.write(f"{pid} {fields[19]}")
        os.replace(f"{path}.tmp", path)
    except OSError:
        pass  # the agent has moved on to another group


def connect(path: str, zygote_pid: int) -> socket.socket | None:
    """A connection to the zygote, once it listens; None if it exited first."""
    deadline = time.monotonic() + CONNECT_TIMEOUT_S
    while True:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            sock.connect(path)
            return sock
        except (FileNotFoundError, ConnectionRefusedError):
            sock.close()
            if not _running(zygote_pid) or time.monotonic() > deadline:
                return None
            time.sleep(0.02)


def zygote_error(path: str) -> str:
    """The end of the traceback the zygote died of (see elastic_train/agent/zygote/server.py,
    error_path) after a colon, to end a message with; '' when it left none."""
    try:
        with open(os.path.join(os.path.dirname(path), "error"), errors="replace") as f:
            lines = f.read().strip().splitlines()
    except OSError:
        return ""
    return ":\n" + "\n".join(lines[-MAX_ERROR_LINES:]) if lines else ""


def fail(message: str) -> int:
    """Reports ``message`` as this worker's error (torch.distributed.elastic's error
    file, which the driver shows) and on stderr; returns the exit code."""
    print(f"elastic-train: {message}", file=sys.stderr)
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if path:
        error = {"message": {"message": f"WorkerStartError: {message}", "extraInfo": {
            "py_callstack": "", "timestamp": str(int(time.time()))}}}
        with open(f"{path}.tmp", "w") as f:
            json.dump(error, f)
        os.replace(f"{path}.tmp", path)
    return 1


def start_alone(path: str, zygote_pid: str, module: str, args: list[str],
                pending: list[int]) -> None:
    """The zygote failed to start: this process becomes the worker, a fresh interpreter
    (same pid, environment, directory and streams). Does not return."""
    for signum in pending:  # the agent stopped this worker already
        if signum in STOPS:
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
    why = zygote_error(path) or " (it left no error: a signal ended it)"
    print(f"elastic-train: warning: the worker zygote (pid {zygote_pid}) failed to start; "
          f"this worker starts as a new interpreter instead. The zygote's error{why}",
          file=sys.stderr, flush=True)
    os.execv(sys.executable, [sys.executable, "-m", module, *args])


def main(argv: list[str]) -> int:
    ctypes.CDLL(None).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)  # dies with the agent
    path, zygote_pid, module, *args = argv
    child = 0
    pending: list[int] = []

    def forward(signum: int, _frame: object) -> None:
        if child:
            os.kill(child, signum)
        else:
            pending.append(signum)

    for sig in FORWARDED:
        signal.signal(sig, forward)
    sock = connect(path, int(zygote_pid))
    if sock is None and not os.path.exists(path) and not _running(int(zygote_pid)):
        start_alone(path, zygote_pid, module, args, pending)
    if sock is None:
        error = zygote_error(path) or (" (it left no error: a signal, such as the "
                                       "out-of-memory killer's, ended it)")
        return fail(f"the worker zygote (pid {zygote_pid}) is not running{error}\nSet "
                    "ELASTIC_TRAIN_ZYGOTE=0 to start workers without it.")
    request = {"module": module, "argv": args, "cwd": os.getcwd(), "env": dict(os.environ)}
    socket.send_fds(sock, [json.dumps(request).encode()], [0, 1, 2])
    status = None
    while status is None:
        message = sock.recv(256).decode()
        if not message:
            return fail(f"the worker zygote (pid {zygote_pid}) died, taking this worker "
                        f"with it{zygote_error(path) or '.'}")
        kind, value = message.split()
        if kind == "pid":
            child = int(value)
            note_worker(child)
            for signum in pending:
                os.kill(child, signum)
        else:
            status = int(value)
    if status < 0:  # killed by a signal: die of the same one
        if -status in FORWARDED:
            signal.signal(-status, signal.SIG_DFL)
        os.kill(os.getpid(), -status)
        return 128 - status
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
