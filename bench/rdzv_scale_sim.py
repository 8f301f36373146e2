"""One case of figure 9: N simulated nodes as rendezvous handlers in threads of this process.

    python -m bench.rdzv_scale_sim BACKEND NODES ENDPOINT TIMEOUT_S

BACKEND is ``c10d`` (torch's DynamicRendezvousHandler over its TCPStore backend;
ENDPOINT is a free port this process hosts the store on), ``etcd-v3`` (torch's
DynamicRendezvousHandler over our etcd v3 backend) or ``etcd`` (our native
handler); for the etcd ones ENDPOINT is the etcd server. Every node uses
elastic-train's rendezvous settings (heartbeat 1 s, lost after 3, last call 2 s)
with ``--nnodes NODES-1:NODES``, as ``elastic-train launch`` would.

1. The NODES handlers are created (an agent's start; not timed), then all call
   ``next_rendezvous()`` at once: *form* is the time until the last one returned.
2. One node (never the c10d store's host) is lost: its heartbeats (or lease
   refreshes) stop and it never calls again. The others call
   ``next_rendezvous()`` again at once, as their agents would after their workers
   failed: *re-form* is the time from the loss until the last survivor returned.

Prints one JSON line: the times (null if not complete within TIMEOUT_S), the
ranks and world sizes seen, and -- for the etcd backends -- the requests and
bytes etcd served during each phase, from its own metrics.
"""

from __future__ import annotations

import json
import os
import re
import sys
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable

from torch.distributed.elastic.rendezvous import RendezvousHandler, RendezvousParameters
from torch.distributed.elastic.rendezvous.registry import get_rendezvous_handler

SETTINGS = {"keep_alive_interval": int(os.environ.get("SIM_KA", "1")), "keep_alive_max_attempt": 3, "last_call_timeout": 2,
            "close_timeout": 10}


def etcd_counters(endpoint: str) -> tuple[int, int]:
    """(gRPC calls started, bytes received + sent) so far, from etcd's /metrics; health
    checks excluded. A call through etcd's HTTP gateway is one gRPC call."""
    with urllib.request.urlopen(f"http://{endpoint}/metrics", timeout=10) as response:
        text = response.read().decode()
    calls = sum(float(m.group(2)) for m in re.finditer(
        r'^grpc_server_started_total\{grpc_method="(\w+)",grpc_service="etcdserverpb[^}]*\} (\S+)',
        text, re.M))
    size = sum(float(m.group(1)) for m in re.finditer(
        r"^etcd_network_client_grpc_(?:received|sent)_bytes_total (\S+)", text, re.M))
    return int(calls), int(size)


def make_handlers(backend: str, nodes: int, endpoint: str, timeout_s: float
                  ) -> list[RendezvousHandler]:
    from elastic_train.agent.rendezvous import register

    register()
    run_id = f"scale-{uuid.uuid4().hex[:8]}"
    params = [RendezvousParameters(backend, endpoint, run_id, nodes - 1, nodes,
                                   local_addr="127.0.0.1", join_timeout=int(timeout_s),
                                   **SETTINGS) for _ in range(nodes)]
    first = get_rendezvous_handler(params[0])  # with c10d: the store's host
    rest: list[RendezvousHandler | None] = [None] * (nodes - 1)

    def make(i: int) -> None:
        rest[i] = get_rendezvous_handler(params[i + 1])

    run_threads(make, nodes - 1)
    return [first, *[h for h in rest if h is not None]]


def run_threads(work: Callable[[int], None], count: int) -> None:
    threads = [threading.Thread(target=work, args=(i,), daemon=True) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def rendezvous(handlers: list[RendezvousHandler], started: float) -> dict[str, object]:
    """Every handler's next_rendezvous() at once: seconds from ``started`` until the last
    returned (None if any failed), the failures, and the (rank, world size) seen."""
    done: list[float] = []
    seen: list[tuple[int, int]] = []
    errors: list[str] = []

    def join(i: int) -> None:
        try:
            info = handlers[i].next_rendezvous()
            seen.append((info.rank, info.world_size))
            done.append(time.monotonic())
        except Exception as exc:  # reported in the result
            errors.append(f"{type(exc).__name__}: {exc}"[:200])

    cpu = time.process_time()
    run_threads(join, len(handlers))
    ok = not errors and sorted(r for r, _ in seen) == list(range(len(handlers)))
    return {"seconds": max(done) - started if ok else None, "errors": sorted(set(errors))[:3],
            "worlds": sorted({w for _, w in seen}), "cpu_s": time.process_time() - cpu}


def lose(handler: RendezvousHandler) -> None:
    """The node dies: whatever keeps it alive in the rendezvous stops, nothing is sent."""
    if hasattr(handler, "_stop_heartbeats"):  # torch's DynamicRendezvousHandler
        handler._stop_heartbeats()
    else:  # ours: its lease is no longer refreshed, its watches end
        handler._lease.stop(revoke=False)
        if handler._last is not None:
            handler._stop_waiting(handler._last)


def main(backend: str, nodes: int, endpoint: str, timeout_s: float) -> dict[str, object]:
    os.environ["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"  # as elastic-train launch sets
    etcd = backend != "c10d"
    began = time.monotonic()
    handlers = make_handlers(backend, nodes, endpoint, timeout_s)
    print(f"{nodes} handlers created in {time.monotonic() - began:.1f} s", file=sys.stderr,
          flush=True)
    result: dict[str, object] = {"backend": backend, "nodes": nodes}
    before = etcd_counters(endpoint) if etcd else (0, 0)
    result["form"] = rendezvous(handlers, time.monotonic())
    after = etcd_counters(endpoint) if etcd else (0, 0)
    if result["form"]["seconds"] is not None:  # type: ignore[index]
        lost = time.monotonic()
        lose(handlers[-1])
        result["reform"] = rendezvous(handlers[:-1], lost)
        end = etcd_counters(endpoint) if etcd else (0, 0)
        result["reform_cost"] = [(e - a) / (nodes - 1) for e, a in zip(end, after, strict=True)]
    result["form_cost"] = [(a - b) / nodes for a, b in zip(after, before, strict=True)]
    return result


if __name__ == "__main__":
    backend_, nodes_, endpoint_, timeout_ = sys.argv[1:5]
    print(json.dumps(main(backend_, int(nodes_), endpoint_, float(timeout_))), flush=True)
    os._exit(0)  # handlers of a failed case may still be blocked in their threads
