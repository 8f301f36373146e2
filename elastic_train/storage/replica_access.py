"""Who may use a node's replica port, and how: the node's secret key, request
signatures and, where the job is given certificates, TLS (see :mod:`.replica_server`,
:mod:`.peer_replicas` and docs/SECURITY.md).

The key is made by the node run as it starts (:func:`new_key`), handed to its replica
server on a pipe and to its workers in the worker plan (mode 0600), and shared with
the other nodes' ranks in the all-gather that tells them the server's URL (the job's
process group, formed through the rendezvous). It is never written elsewhere: not in
the run directory, a log or ``run.json``.

A request carries ``X-Replica-Auth``: the HMAC-SHA256, under the key, of its method,
its path as sent, and for a ``PUT`` the body's size and SHA-256
(:func:`signature`). The key itself never travels with a request, and a signature
taken off the wire authorizes only the same request again (the same file, the
same bytes). The server compares with :func:`hmac.compare_digest`.

TLS: ``--rdzv-conf replica_cert=...,replica_key=...,replica_ca_cert=...`` (the way the
etcd client takes its ``cert``/``key``/``ca_cert``): every node serves with its
certificate and presents it when it fetches or sends (mutual TLS), and each side
checks the other's against the CA, the server's name included.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import ssl
from dataclasses import dataclass
from typing import Any

from elastic_train.errors import ConfigError

AUTH_HEADER = "X-Replica-Auth"
SHA256_HEADER = "X-Sha256"
TLS_CONF_KEYS = ("replica_cert", "replica_key", "replica_ca_cert")


def new_key() -> str:
    """A fresh secret key for one node's replica server (256 bits, hex)."""
    return secrets.token_hex(32)


def signature(key: str, method: str, path: str, size: int | None = None,
              sha256: str = "") -> str:
    """The ``X-Replica-Auth`` value of a request (see the module docstring)."""
    message = f"{method}\n{path}\n{'' if size is None else size}\n{sha256}".encode()
    return hmac.new(bytes.fromhex(key), message, hashlib.sha256).hexdigest()


def is_signed(key: str, given: str, method: str, path: str, size: int | None = None,
              sha256: str = "") -> bool:
    """Whether ``given`` is the request's signature under ``key`` (in constant time)."""
    return hmac.compare_digest(given.encode(), signature(key, method, path, size,
                                                         sha256).encode())


@dataclass(frozen=True)
class ReplicaTLS:
    """The certificate a node serves and fetches with, and the CA its peers' are checked
    against (PEM files).

    Attributes:
        cert: This node's certificate; it must name the address the node serves on
            (``launch --local-addr``, else its host name).
        key: Its private key.
        ca: The CA that signed every node's certificate.
    """

    cert: str
    key: str
    ca: str

    @classmethod
    def from_conf(cls, conf: dict[str, Any] | None) -> ReplicaTLS | None:
        """The files the rendezvous conf names (None without any); a ConfigError when
        only some are given."""
        given = [str((conf or {}).get(name) or "") for name in TLS_CONF_KEYS]
        if not any(given):
            return None
        if not all(given):
            raise ConfigError(
                f"--rdzv-conf {', '.join(TLS_CONF_KEYS)}: give all three for TLS on the "
                f"replica port, or none; got {dict(zip(TLS_CONF_KEYS, given, strict=True))}, e.g. "
                "replica_cert=node.crt,replica_key=node.key,replica_ca_cert=ca.crt.",
                field="RendezvousConfig.conf")
        return cls(*given)

    def server_context(self) -> ssl.SSLContext:
        """What the replica server wraps its connections with: asks for a peer's
        certificate signed by the CA."""
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=self.ca)
        context.load_cert_chain(self.cert, self.key)
        context.verify_mode = ssl.CERT_REQUIRED
        return context

    def client_context(self) -> ssl.SSLContext:
        """What a peer connects with: checks the server against the CA and its name."""
        context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=self.ca)
        context.load_cert_chain(self.cert, self.key)
        return context


@dataclass(frozen=True)
class NodeReplica:
    """This node's replica server as its workers know it (from the worker plan).

    Attributes:
        url: Where it serves ("": it did not start; the node still fetches from peers).
        key: Its key (:func:`new_key`).
        tls: The node's certificate, when the job has them.
    """

    url: str
    key: str
    tls: ReplicaTLS | None = None

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> NodeReplica:
        """The inverse of :func:`dataclasses.asdict` (the worker plan's JSON)."""
        tls = data.get("tls")
        return cls(data["url"], data["key"], ReplicaTLS(**tls) if tls else None)
