"""The connections of an attempt's process groups, and how to cut them when the attempt fails.

A failed rank must release the peers blocked in a collective with it at
once. Destroying its process group does not do that with gloo: the group's
connections close only when the last reference to it goes, and DDP's reducer
(and any user object holding the group) keeps one. ``ProcessGroupGloo.abort()``
and ``shutdown()`` do not close them either (torch 2.14). So the worker
records which sockets the process-group set-up opened (:func:`recording`)
and, when the attempt fails, shuts them down (:func:`cut`): each peer's
pending receive fails with "Connection closed by peer" within milliseconds,
exactly as if this process had died -- but it has not.

Listening sockets are left alone (gloo aborts the process when its listener
fails), and a descriptor is only touched while it is still the socket that
was recorded (same inode), never a later one that reuses its number.

A process forked from the worker -- a DataLoader's worker processes -- closes
its copies of these sockets at once. Otherwise it holds the connections open
after the worker dies, and the peers' collectives wait until it notices and
exits (a DataLoader worker looks for its parent every 5 s): measured here, a
SIGKILLed rank with a 2-worker DataLoader left its peers blocked for 4.5-5 s.
A fork *inside* the recording block (a launched script's main is one block:
its process groups are made wherever the script makes them) cannot know the
group's sockets yet, so the child closes every TCP socket the block opened so
far; the worker keeps its own, and :func:`cut` still touches only what the
block recorded.
"""

from __future__ import annotations

import contextlib
import os
import socket
import stat
from collections.abc import Iterator

_recorded: dict[int, int] = {}  # fd -> inode, of the current attempt
_open_block: dict[int, int] | None = None  # the sockets open when the block began
_for_child: list[int] = []  # what a child forked now closes
_fork_hook = False


def _sockets() -> dict[int, int]:
    """This process's open sockets: fd -> inode."""
    out = {}
    for name in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError, ValueError):
            info = os.fstat(int(name))
            if stat.S_ISSOCK(info.st_mode):
                out[int(name)] = info.st_ino
    return out


def _is_tcp(fd: int) -> bool:
    with contextlib.suppress(OSError):
        sock = socket.socket(fileno=fd)
        try:
            return sock.family in (socket.AF_INET, socket.AF_INET6) \
                and sock.type == socket.SOCK_STREAM
        finally:
            sock.detach()
    return False


def _before_fork() -> None:
    """In the worker, about to fork: what the child will close."""
    _for_child[:] = _still_recorded()
    if _open_block is not None:
        _for_child.extend(fd for fd, ino in _sockets().items()
                          if _open_block.get(fd) != ino and fd not in _recorded
                          and _is_tcp(fd))


def _still_recorded() -> list[int]:
    out = []
    for fd, inode in _recorded.items():
        with contextlib.suppress(OSError):
            if os.fstat(fd).st_ino == inode:
                out.append(fd)
    return out


def _close_in_child() -> None:
    """In a process just forked from the worker: drop its copies of the connections."""
    global _open_block
    for fd in _for_child:
        with contextlib.suppress(OSError):
            os.close(fd)
    _recorded.clear()
    _for_child.clear()
    _open_block = None


@contextlib.contextmanager
def recording() -> Iterator[None]:
    """Records the sockets opened inside the block as the current attempt's."""
    global _fork_hook, _open_block
    if not _fork_hook:
        os.register_at_fork(before=_before_fork, after_in_parent=_for_child.clear,
                           after_in_child=_close_in_child)
        _fork_hook = True
    before = _open_block = _sockets()
    try:
        yield
    finally:
        _open_block = None
        _recorded.update({fd: ino for fd, ino in _sockets().items() if before.get(fd) != ino})


def cut() -> int:
    """Shuts down the recorded connections that are still open; returns how many."""
    count = 0
    for fd in _still_recorded():
        with contextlib.suppress(OSError):
            sock = socket.socket(fileno=fd)
            try:
                if not sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
                    sock.shutdown(socket.SHUT_RDWR)
                    count += 1
            finally:
                sock.detach()  # the descriptor stays its owner's
    _recorded.clear()
    return count


def forget() -> None:
    """A new attempt starts: the previous one's sockets are no longer this worker's to cut."""
    _recorded.clear()
