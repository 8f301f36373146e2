"""Whether this process hosts the job's rendezvous store (``c10d``: a TCP store that the
first agent to bind ``--rdzv-endpoint`` serves, in its own process).

That node must not leave a running job on its own accord: its store goes with it, and
the others cannot meet again (``RendezvousLostError``). A straggler is therefore
replaced only when it is not the host (see :mod:`elastic_train.agent.leave_for_spare`);
with ``etcd`` any node can be.

torch's store does not say whether it serves or only connects, so this asks the
kernel: whether one of this process's sockets (``/proc/self/fd``) listens on the
endpoint's port (``/proc/net/tcp``, ``tcp6``). Elsewhere than Linux: not known, False.

Example::

    hosts_store(RendezvousConfig(backend="c10d", endpoint="host0:29400", run_id="j"))
"""

from __future__ import annotations

import os

from elastic_train._internal.rendezvous_backends import lookup
from elastic_train.rendezvous_config import RendezvousConfig

_LISTEN = "0A"  # a socket's state in /proc/net/tcp


def hosts_store(rdzv: RendezvousConfig) -> bool:
    """Whether the job's rendezvous store is a node's (c10d) and this process serves it."""
    if not lookup(rdzv.backend, "RendezvousConfig.backend").endpoint_is_node_store:
        return False
    _, _, port = rdzv.endpoint.rpartition(":")
    return port.isdigit() and listens_on(int(port))


def listens_on(port: int) -> bool:
    """Whether a socket of this process listens on TCP ``port``."""
    try:
        mine = {link[len("socket:["):-1] for fd in os.listdir("/proc/self/fd")
                if (link := _link(f"/proc/self/fd/{fd}")).startswith("socket:[")}
    except OSError:
        return False
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if state == _LISTEN and int(local.rsplit(":", 1)[1], 16) == port and inode in mine:
                return True
    return False


def _link(path: str) -> str:
    try:
        return os.readlink(path)
    except OSError:  # closed meanwhile
        return ""
