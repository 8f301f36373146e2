"""Workers forked from a process that has imported torch once: the *zygote*.

Starting a worker the plain way costs a fresh interpreter plus ``import torch``
(about 4 s of CPU here), per worker and again at every restart. The agent
therefore starts one zygote per process (``python -m elastic_train.agent.zygote.server
SOCKET``) that imports torch and the worker modules, then forks a worker per
request. Restarts and later ``fit()`` calls in the same process fork from the
same zygote. The zygote is single-threaded and never touches CUDA, so the
forked workers start clean. It also imports what a first training step
imports lazily, and later the modules the workers reported
(:mod:`.preload`); ``fit()`` and ``launch`` fork it from the driver itself
when that is safe (:mod:`.fork`) instead of starting an interpreter.

torch's agent still starts, watches and stops ordinary processes: each is a
:mod:`~elastic_train.agent.zygote.client` (standard library only, a few ms to
start), which hands the zygote its environment, working directory and
standard streams, relays signals to the forked worker and exits as it did.

Lifetimes: the zygote exits when its parent closes its stdin (or dies), and
SIGKILLs its workers then; it ignores SIGTERM and SIGINT, which are for the
workers (a worker holds those its client passes on from its fork until it is the
worker, see :func:`_fork_held`); a worker dies with the zygote
(``PR_SET_PDEATHSIG``); a worker whose client is killed is SIGKILLed by the zygote.

Only this package's own worker modules use it (the ``fit()`` worker and the
``launch`` script runner, each with a ``main(argv)``); set
``ELASTIC_TRAIN_ZYGOTE=0`` to start every worker as a fresh interpreter.
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import importlib
import json
import logging
import os
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
from dataclasses import dataclass

from elastic_train._internal import env_vars, scratch
from elastic_train._internal.forked_call import hold_stops, release_stops
from elastic_train.agent.zygote import fork as zygote_fork
from elastic_train.agent.zygote import standby as standbys
from elastic_train.agent.zygote.preload import FIRST_STEP, ask_to_preload, preload_here
from elastic_train.agent.zygote.standby import Standby, Warmth

logger = logging.getLogger(__name__)

WORKER_MODULES = ("elastic_train.worker.fit_worker", "elastic_train.worker.script_worker")
# torch, what a first training step imports lazily (see .preload), our worker modules.
PRELOAD = ("torch", "torch.distributed", *FIRST_STEP, *WORKER_MODULES)
CLIENT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "client.py")


def enabled() -> bool:
    return sys.platform.startswith("linux") and env_vars.Switches.from_environ().zygote


# --- the zygote process ---------------------------------------------------------------------

@dataclass
class Request:
    """What a client asks for: ``module.main(argv)`` in its cwd, environment and streams."""

    module: str
    argv: list[str]
    cwd: str
    env: dict[str, str]
    fds: list[int]


@dataclass
class Preload:
    """The agent's request (see :mod:`.preload`): modules to import, and whether the
    workers use CUDA (then the standby warms it, see :mod:`.standby`)."""

    modules: list[str]
    cuda: bool


def _recv_request(conn: socket.socket) -> tuple[Request | Preload, bytes] | None:
    """A worker request or a preload request, with the message as received; None when
    the client hung up."""
    message, fds, _, _ = socket.recv_fds(conn, 1 << 22, 3)
    if not message:
        return None
    data = json.loads(message)
    if "preload" in data:
        return Preload(list(data["preload"]), bool(data.get("cuda"))), message
    return Request(**data, fds=fds), message


def _kill(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


class _Server:
    """The zygote's state: its listening socket, the clients, and the forked workers."""

    def __init__(self, path: str):
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.listener.bind(path)
        self.listener.listen(128)
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_w, False)
        signal.set_wakeup_fd(self.wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        self.selector = selectors.DefaultSelector()
        for source in (self.listener, sys.stdin, self.wake_r):
            self.selector.register(source, selectors.EVENT_READ)
        self.workers: dict[int, socket.socket | None] = {}  # pid -> its client's connection
        self.clients: dict[socket.socket, int | None] = {}  # connection -> its worker's pid
        self.standby: Standby | None = None  # see .standby
        self.standby_file = standby_path(path)
        self.warmth = Warmth()  # what the next standby prepares
        self.served = False  # a worker was asked for: from now on a standby waits
        self.lost_standbys = 0
        self.standby_off = False  # a request said ELASTIC_TRAIN_STANDBY=0: none from then on

    def drop(self, conn: socket.socket) -> None:
        self.selector.unregister(conn)
        conn.close()
        pid = self.clients.pop(conn)
        if pid is not None and self.workers.get(pid) is conn:
            self.workers[pid] = None
            _kill(pid)  # the client was killed: so is its worker

    def reap(self, block: bool = False) -> None:
        """Tells the clients of exited workers how they ended."""
        while True:
            try:
                pid, status = os.waitpid(-1, 0 if block else os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if self.standby is not None and pid == self.standby.pid:  # died unasked
                self.standby.sock.close()
                self._set_standby(None)
                self.lost_standbys += 1
            conn = self.workers.pop(pid, None)
            if conn is not None:
                self.clients[conn] = None
                with contextlib.suppress(OSError):  # the client may be gone already
                    conn.send(f"exit {os.waitstatus_to_exitcode(status)}".encode())
                self.drop(conn)

    def parent_gone(self) -> bool:
        """Whether the parent closed our stdin; then every worker is killed and reaped."""
        if os.read(sys.stdin.fileno(), 4096):
            return False
        if self.standby is not None:
            self.standby.retire()
        for pid in self.workers:
            _kill(pid)
        self.reap(block=True)
        return True

    def _set_standby(self, standby: Standby | None) -> None:
        self.standby = standby
        standbys.note(self.standby_file, None if standby is None else standby.pid)

    def wants_standby(self) -> bool:
        return (self.standby is None and self.served and not self.standby_off
                and self.lost_standbys < standbys.MAX_LOST)

    def fork_standby(self) -> Request | None:
        """Forks a new standby (retiring the one there was): in the standby, once a
        request is handed over, that request; None here (and in a standby retired unasked,
        which exits)."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        pid = _fork_held()
        if pid == 0:
            from elastic_train.worker.lifecycle import die_with_parent

            ours.close()
            self.close_in_child()
            die_with_parent()
            standbys.warm(self.warmth)
            handed = standbys.wait_for_request(theirs)
            theirs.close()
            if handed is None:
                os._exit(0)
            data, fds = handed
            return Request(**data, fds=fds)
        theirs.close()
        if self.standby is not None:
            self.standby.retire()
        self._set_standby(Standby(pid, ours, self.warmth))
        return None

    def _take_standby(self, request: Request, message: bytes) -> int | None:
        """Hands ``request`` to the standby if it may serve it; its pid, or None."""
        standby = self.standby
        self._set_standby(None)
        if standby is None:
            return None
        if standby.warmth.serves(request.env) and standby.hand_over(message, request.fds):
            standby.sock.close()
            return standby.pid
        standby.retire()
        return None

    def fork_for(self, conn: socket.socket) -> Request | None:
        """Serves one request of ``conn``: the request in the forked child (or the
        standby), None here."""
        received = _recv_request(conn)
        if received is None:
            self.drop(conn)
            return None
        request, message = received
        if isinstance(request, Preload):  # preloading, between forks: this process stays
            # Workers that end meanwhile are reported at once (their deaths are what the
            # agent attributes a failure to), not once the probing is over.
            previous = signal.signal(signal.SIGCHLD, lambda *_: self.reap())
            try:
                answer = preload_here(request.modules)
            finally:
                signal.signal(signal.SIGCHLD, previous)
            changed = bool(answer["preloaded"]) or request.cuda != self.warmth.cuda
            self.warmth = Warmth(cuda=request.cuda, env=self.warmth.env)
            # The standby there was lacks what was just imported: a new one, at once.
            if (changed and self.standby is not None
                    and (standby := self.fork_standby()) is not None):
                return standby
            conn.send(json.dumps(answer).encode())
            return None
        self.served = True
        if env_vars.Switches.from_environ(request.env).standby:
            self.warmth = Warmth(self.warmth.cuda,
                                 tuple(sorted(standbys.device_env(request.env).items())))
        else:
            self.standby_off = True
            if self.standby is not None:
                self.standby.retire()
                self._set_standby(None)
        pid = self._take_standby(request, message)
        if pid is None:
            pid = _fork_held()
            if pid == 0:
                self.close_in_child()
                return request
        for fd in request.fds:
            os.close(fd)
        self.clients[conn] = pid
        self.workers[pid] = conn
        with contextlib.suppress(OSError):  # a client killed meanwhile: dropped at its EOF
            conn.send(f"pid {pid}".encode())
        return None

    def close_in_child(self) -> None:
        """A forked worker keeps none of the zygote's sockets, pipes or handlers."""
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        self.selector.close()
        for sock in (self.listener, *self.clients):
            sock.close()
        if self.standby is not None:
            self.standby.sock.close()
            self.standby = None
        os.close(self.wake_r)
        os.close(self.wake_w)


def _fork_held() -> int:
    """``os.fork()`` for a worker or a standby, with SIGINT and SIGTERM held in the child
    until it is the worker (:func:`_become_worker`): the client passes the agent's stop
    on as soon as it has the pid, and the zygote's ``SIG_IGN`` would drop it (the agent
    then waits out the whole grace before its SIGKILL)."""
    sys.stdout.flush()
    sys.stderr.flush()
    mask = hold_stops()
    pid = os.fork()
    if pid:
        release_stops(mask)
    return pid


def serve(path: str) -> Request | None:
    """The zygote's loop. Returns in a forked child (the request it is to run), or
    None in the zygote itself once its parent has gone."""
    from elastic_train.worker.lifecycle import die_with_parent

    die_with_parent()
    server = _Server(path)
    while True:
        events = server.selector.select(standbys.IDLE_S if server.wants_standby() else None)
        if not events and (request := server.fork_standby()) is not None:
            return request
        for key, _ in events:
            if key.fileobj is server.listener:
                conn, _ = server.listener.accept()
                server.clients[conn] = None
                server.selector.register(conn, selectors.EVENT_READ)
            elif key.fileobj is sys.stdin:
                if server.parent_gone():
                    return None
            elif key.fileobj == server.wake_r:
                os.read(server.wake_r, 4096)
                server.reap()
            elif (request := server.fork_for(key.fileobj)) is not None:
                return request


def _become_worker(request: Request) -> None:
    """In the forked child: take on the client's streams, directory and environment,
    then run the worker as a fresh interpreter would."""
    os.setsid()  # its own process group, as torch gives its workers
    for target, fd in zip((0, 1, 2), request.fds, strict=True):
        os.dup2(fd, target)
        os.close(fd)
    os.chdir(request.cwd)
    os.environ.clear()
    os.environ.update(request.env)
    # The process whose death must end this worker is the zygote (see process.py).
    os.environ[env_vars.AGENT_PID] = str(os.getppid())
    sys.path[0] = request.cwd  # as for `python -m` started there
    for entry in reversed(request.env.get("PYTHONPATH", "").split(os.pathsep)):
        if entry and entry not in sys.path:
            sys.path.insert(1, entry)
    sys.argv = [request.module, *request.argv]
    _fresh_process_state()
    # A stop passed on since the fork ends the worker now, as it ends a new interpreter.
    release_stops(disposition=signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    importlib.import_module(request.module).main(request.argv)


def _fresh_process_state() -> None:
    """What differs between a forked child and a new interpreter, made equal:
    the thread count (libgomp read OMP_NUM_THREADS when the zygote imported torch)
    and the global random states of torch and numpy (seeded once, in the zygote;
    a new process seeds both at random, torch since 2.9 at least). Python's
    ``random`` reseeds itself after a fork."""
    import torch

    threads = os.environ.get("OMP_NUM_THREADS", "")
    if threads.isdigit() and int(threads) > 0:
        torch.set_num_threads(int(threads))
    torch.seed()
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed()


def _main(path: str) -> None:
    # The agent decides when workers stop, and the zygote lives as long as its agent: a
    # scheduler's SIGTERM to every process of the node (Slurm, systemd) is the workers'
    # preemption notice, and the zygote's death would take them along at once.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    zygote_pid = os.getpid()
    try:
        for module in PRELOAD:
            importlib.import_module(module)
        # Out of the collector's sight: a worker's first collections would otherwise walk
        # (and so copy, page by page) everything the zygote imported.
        gc.freeze()
        request = serve(path)
    except BaseException:
        if os.getpid() == zygote_pid:  # not a worker it forked, failing in its set-up
            note_error(path)
        raise
    if request is not None:
        _become_worker(request)


def standby_path(path: str) -> str:
    """Where the zygote whose socket is ``path`` notes its standby's pid (see
    :func:`.standby.note`)."""
    return os.path.join(os.path.dirname(path), "standby")


def error_path(path: str) -> str:
    """Where the zygote whose socket is ``path`` leaves the traceback it died of (the
    agent and the stand-ins read it: the zygote's stderr is the driver's)."""
    return os.path.join(os.path.dirname(path), "error")


def note_error(path: str) -> None:
    """In the zygote: records the exception being handled beside its socket ``path``."""
    text = traceback.format_exc()
    with contextlib.suppress(OSError):
        with open(f"{error_path(path)}.tmp", "w") as f:
            f.write(text)
        os.replace(f"{error_path(path)}.tmp", error_path(path))


def read_error(path: str) -> str | None:
    """The traceback the zygote whose socket is ``path`` died of, if it left one."""
    try:
        with open(error_path(path), errors="replace") as f:
            return f.read().strip() or None
    except OSError:
        return None


# --- the agent's side -----------------------------------------------------------------------

@dataclass(frozen=True)
class StartError:
    """A zygote that failed to start: when, how it was started, and why (its traceback,
    or how it ended)."""

    time: float
    forked: bool
    error: str

    def to_json(self) -> dict:
        return {"time": self.time, "forked": self.forked, "error": self.error}


class Zygote:
    """This process's zygote, started on first use and kept for later groups and runs.

    A zygote that fails to start is reported (a warning with its traceback, and
    :meth:`take_start_errors` for ``run.json``); the workers that asked for it
    meanwhile start as fresh interpreters (see :mod:`.client`). After a
    forked zygote failed, the next one starts as a new interpreter; after such a
    one failed too, workers start without a zygote in this process.
    """

    FORK_READY_TIMEOUT_S = 10.0

    def __init__(self) -> None:
        self._proc: subprocess.Popen[bytes] | None = None
        self._dir: str | None = None
        self._lock = threading.Lock()
        self._forked = False
        self._no_fork = False  # a forked zygote failed to start here
        self._given_up = False  # a zygote started as a new interpreter failed too
        self._start_errors: list[StartError] = []

    def command(self, module: str, args: tuple[str, ...]) -> tuple[str, tuple[str, ...]] | None:
        """The entrypoint and arguments that have the zygote run ``module.main(args)``;
        None when workers start without one (every zygote failed to start here)."""
        started = self._started()
        if started is None:
            return None
        path, pid = started
        return sys.executable, ("-I", "-S", CLIENT, path, str(pid), module, *args)

    def _started(self) -> tuple[str, int] | None:
        """The zygote's socket path and pid (it binds the socket once torch is imported)."""
        with self._lock:
            if self._proc is not None and self._proc.poll() is not None:
                self._note_end()
            if self._given_up:
                return None
            if self._proc is None:
                path = self._fresh_dir()
                self._proc = subprocess.Popen(
                    [sys.executable, "-m", "elastic_train.agent.zygote.server", path],
                    stdin=subprocess.PIPE, start_new_session=True)
                self._forked = False
            assert self._dir is not None
            return os.path.join(self._dir, "socket"), self._proc.pid

    def prestart(self, user_roots: tuple[str, ...] = ()) -> None:
        """Starts the zygote now by forking this process, when that is safe (see
        :mod:`.fork`): it then shares the driver's imports instead of importing
        torch again. Otherwise the zygote starts later, as a new interpreter.
        ``user_roots``: the directories of the user's own code, whose modules the
        forked zygote drops (see :mod:`elastic_train.worker.user_code`)."""
        with self._lock:
            if self._proc is not None and self._proc.poll() is None:
                return
            if self._no_fork or self._given_up:
                return
            if (why := zygote_fork.reason_not_to_fork()) is not None:
                logger.debug("The worker zygote will start as a new interpreter: %s.", why)
                return
            path = self._fresh_dir()
            proc = zygote_fork.fork(_main, path, user_roots)
            self._proc, self._forked = proc, True  # type: ignore[assignment]
            if not proc.wait_ready(self.FORK_READY_TIMEOUT_S):
                proc.wait()
                self._note_end()

    def _note_end(self) -> None:
        """The zygote has exited: a failure to start (it left its traceback) is reported
        and kept for :meth:`take_start_errors`; either way a new one starts next time."""
        assert self._proc is not None and self._dir is not None
        path = os.path.join(self._dir, "socket")
        error = read_error(path)
        if error is not None:
            then = ("a zygote started as a new interpreter replaces it" if self._forked else
                    "later workers of this process start without a zygote too "
                    "(as with ELASTIC_TRAIN_ZYGOTE=0)")
            logger.warning("The worker zygote (pid %d, %s) failed to start; workers that "
                           "asked for it started as new interpreters, and %s. Its error:\n%s",
                           self._proc.pid, "forked from this process" if self._forked
                           else "a new interpreter", then, error)
            self._start_errors.append(StartError(time.time(), self._forked, error))
            if self._forked:
                self._no_fork = True
            else:
                self._given_up = True
        self._stop()

    def take_start_errors(self) -> list[StartError]:
        """The start failures noted since the last call."""
        with self._lock:
            if self._proc is not None and self._proc.poll() is not None:
                self._note_end()
            errors, self._start_errors = self._start_errors, []
        return errors

    def _fresh_dir(self) -> str:
        """A new private directory for the zygote's socket; returns the socket's path."""
        self._stop()
        self._dir = scratch.make(scratch.ZYGOTE_PREFIX)  # mode 0700: ours only
        return os.path.join(self._dir, "socket")

    def preload(self, modules: list[str], cuda: bool = False) -> dict | None:
        """Asks the running zygote to import ``modules`` (those safe to, see
        :mod:`.preload`), and, with ``cuda``, to warm CUDA in its standby; returns what
        it preloaded and skipped, or None when no zygote runs or it did not answer."""
        if self.pid is None or self._dir is None:
            return None
        return ask_to_preload(os.path.join(self._dir, "socket"), modules, cuda)

    @property
    def pid(self) -> int | None:
        """The running zygote's pid, if there is one."""
        proc = self._proc
        return proc.pid if proc is not None and proc.poll() is None else None

    @property
    def standby_pid(self) -> int | None:
        """The pid of the running zygote's standby (see :mod:`.standby`), if one waits."""
        if self.pid is None or self._dir is None:
            return None
        return standbys.noted(standby_path(os.path.join(self._dir, "socket")))

    @property
    def forked(self) -> bool:
        """Whether the running zygote was forked from this process."""
        return self.pid is not None and self._forked

    def close(self) -> None:
        with self._lock:
            self._stop()

    def _stop(self) -> None:
        if self._proc is not None:
            assert self._proc.stdin is not None
            self._proc.stdin.close()  # the zygote kills its workers and exits
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
            self._proc = None
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None


_zygote = Zygote()
atexit.register(_zygote.close)


def running_pid() -> int | None:
    """The pid of this process's zygote, if one is running."""
    return _zygote.pid


def prestart(user_roots: tuple[str, ...] = ()) -> None:
    """Starts this process's zygote now, forked from it if it is safe (see
    :meth:`Zygote.prestart`); called by ``fit()`` and ``launch`` before anything else
    starts threads. Does nothing with ``ELASTIC_TRAIN_ZYGOTE=0``."""
    if enabled():
        _zygote.prestart(user_roots)


def running_standby_pid() -> int | None:
    """The pid of this process's zygote's standby, if one waits."""
    return _zygote.standby_pid


def take_start_errors() -> list[StartError]:
    """See :meth:`Zygote.take_start_errors`."""
    return _zygote.take_start_errors()


def preload(modules: list[str], cuda: bool = False) -> dict | None:
    """See :meth:`Zygote.preload`."""
    return _zygote.preload(modules, cuda)


def worker_command(entrypoint: str, args: tuple[str, ...]) -> tuple[str, tuple[str, ...]]:
    """``python -m MODULE ARGS`` for one of :data:`WORKER_MODULES` -> the zygote's
    client command; anything else (``--no-python``, other flags) is left as it is."""
    if not (enabled() and entrypoint == sys.executable and len(args) >= 2
            and args[0] == "-m" and args[1] in WORKER_MODULES):
        return entrypoint, args
    return _zygote.command(args[1], args[2:]) or (entrypoint, args)


if __name__ == "__main__":
    _main(sys.argv[1])
