"""Which settings hold secrets, and the one rule that keeps them out of what is stored or shown.

An option whose *name* contains one of :data:`SECRET_WORDS` holds a secret: s3fs's
``key``/``secret``/``token``, botocore's ``aws_*_key``, an etcd ``password``, a
``client_key``, a ``session`` object... So does the user-info of a URL
(``https://user:password@host``). Everything the project writes to a run directory,
prints or logs goes through here first:

* :func:`public_options` drops secret options (also nested, e.g. ``client_kwargs``):
  what a filesystem or a rendezvous config is rebuilt from without credentials;
* :func:`redacted_options`, :func:`redact_conf` and :func:`redact_argv` keep the
  names and replace the values with :data:`REDACTED`: what a run records of its
  settings and command line (``--rdzv-conf``, ``PET_RDZV_CONF``,
  ``--storage-option``), so that a restore can say which secrets to give again.

Example::

    redact_argv(["--rdzv-conf", "timeout=60,password=hunter2", "train.py"])
    # ['--rdzv-conf', 'timeout=60,password=***', 'train.py']
"""

from __future__ import annotations

import re
from typing import Any

SECRET_WORDS = ("key", "secret", "token", "password", "passwd", "credential", "session")
REDACTED = "***"
# The flags whose value is a list of options: key=value[,key=value] (one per flag for
# --storage-option).
OPTION_FLAGS = ("--rdzv-conf", "--rdzv_conf", "--storage-option", "--storage_option")
_URL_USERINFO = re.compile(r"(?P<scheme>[a-zA-Z][\w+.-]*://)(?P<user>[^/@:\s]*):[^/@\s]*@")


def is_secret(name: str) -> bool:
    """Whether an option called ``name`` holds a secret."""
    return any(word in name.lower() for word in SECRET_WORDS)


def public_options(options: dict[str, Any]) -> dict[str, Any]:
    """``options`` without its secret entries, also inside nested dicts."""
    return {name: public_options(value) if isinstance(value, dict) else value
            for name, value in options.items() if not is_secret(name)}


def redacted_options(options: dict[str, Any]) -> dict[str, Any]:
    """``options`` with every secret value replaced by :data:`REDACTED`."""
    return {name: REDACTED if is_secret(name) else
            redacted_options(value) if isinstance(value, dict) else redact_url(value)
            for name, value in options.items()}


def redact_url(value: Any) -> Any:
    """A string with the password of any ``scheme://user:password@`` replaced."""
    if not isinstance(value, str):
        return value
    return _URL_USERINFO.sub(lambda m: f"{m['scheme']}{m['user']}:{REDACTED}@", value)


def redact_conf(text: str) -> str:
    """``k=v,password=x`` (``--rdzv-conf``, ``PET_RDZV_CONF``, ``--storage-option``) with
    the secret values replaced."""
    items = []
    for item in text.split(","):
        name, sep, value = item.partition("=")
        items.append(f"{name}={REDACTED}" if sep and is_secret(name) else redact_url(item))
    return ",".join(items)


def redact_argv(argv: list[str]) -> list[str]:
    """A command line with the secret values of its option flags (:data:`OPTION_FLAGS`,
    as ``--flag VALUE`` or ``--flag=VALUE``) and the passwords of URLs replaced."""
    out: list[str] = []
    redact_next = False
    for arg in argv:
        flag, sep, value = arg.partition("=")
        if redact_next:
            out.append(redact_conf(arg))
        elif sep and flag in OPTION_FLAGS:
            out.append(f"{flag}={redact_conf(value)}")
        else:
            out.append(redact_url(arg))
        redact_next = arg in OPTION_FLAGS
    return out
