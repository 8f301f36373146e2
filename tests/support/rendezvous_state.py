"""Writing over a running job's rendezvous state, as a stray client would.

With c10d, torch's handler keeps the whole state in one key of the TCP store on
the first node; our etcd handler keeps a round pointer (``run/round``) under the
run's prefix in etcd. Both are overwritten with bytes no handler writes.
"""

from __future__ import annotations

from datetime import timedelta

from tests.support.etcd_server import client

GARBAGE = b"%%% not a rendezvous state %%%"


def corrupt_c10d_state(endpoint: str, run_id: str) -> None:
    """Overwrites torch's rendezvous state in the c10d store at ``endpoint``."""
    import torch.distributed as dist

    host, port = endpoint.rsplit(":", 1)
    store = dist.TCPStore(host, int(port), is_master=False, timeout=timedelta(seconds=10),
                          wait_for_workers=False)
    store.set(f"torch.rendezvous.{run_id}", GARBAGE)


def corrupt_etcd_round(endpoint: str, run_id: str) -> None:
    """Overwrites the etcd handler's round pointer (with no lease: it stays)."""
    from elastic_train.agent.rendezvous.etcd_v3 import run_prefix

    client(endpoint).put(f"{run_prefix(run_id)}native/run/round", GARBAGE.decode())


def delete_run_keys(endpoint: str, run_id: str) -> None:
    """What the error tells the user to do: ``etcdctl del --prefix <the run's prefix>``."""
    from elastic_train.agent.rendezvous.etcd_v3 import run_prefix

    client(endpoint).delete_prefix(run_prefix(run_id))


def c10d_store(endpoint: str):  # noqa: ANN201 -- torch's TCPStore
    """A client of the c10d store at ``endpoint``: keep one for repeated reads."""
    import torch.distributed as dist

    host, port = endpoint.rsplit(":", 1)
    return dist.TCPStore(host, int(port), is_master=False, timeout=timedelta(seconds=10),
                         wait_for_workers=False)


def c10d_spare_parked(store, run_id: str) -> bool:  # noqa: ANN001 -- c10d_store's client
    """Whether a node waits in the redundancy list of torch's rendezvous state (a spare)."""
    import base64
    import pickle

    state = pickle.loads(base64.b64decode(store.get(f"torch.rendezvous.{run_id}")))
    return bool(state.redundancy_list)
