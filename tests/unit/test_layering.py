"""The layering the docs state, checked on the imports themselves (parsed, not run).

- ``worker/`` (what runs in each rank) and ``storage/`` never import ``agent/``,
  ``driver/`` or ``cli/``; ``storage/`` imports no ``worker/`` either;
- ``agent/`` never imports ``driver/`` or ``cli/``; nothing but ``cli/`` imports ``cli/``;
- ``_internal/`` (the helpers every layer shares) and ``goodput/`` (pure figures) are the
  bottom: they import no layer,
  only the public top-level modules;
- only ``storage/`` opens a store (imports fsspec or a store's package), but for the
  modules listed in ``OPENS_A_STORE``, each with the reason.

A new exception is added here on purpose, with its reason, or the import moves.
"""

from __future__ import annotations

import ast
import os

import pytest

from tests.support.paths import REPO

PACKAGE = os.path.join(REPO, "elastic_train")
STORE_PACKAGES = ("fsspec", "s3fs", "gcsfs", "adlfs")

# module (path under elastic_train/) -> why it may import fsspec itself
OPENS_A_STORE = {
    "checkpoint.py": "Checkpoint's public API hands users the filesystem (Ray's)",
    "result.py": "Result.filesystem is public (Ray's)",
    "cli/browse.py": "`ls` lists run directories under any URL",
    "worker/report_args.py": "type: checks a report's checkpoint path on the run's filesystem",
    "worker/upload_fn.py": "type: a checkpoint_upload_fn's result is checked on the run's fs",
}

FORBIDDEN = {
    "_internal": ("agent", "driver", "cli", "worker", "storage", "torch", "lightning",
                  "huggingface", "integrations"),
    "goodput": ("agent", "driver", "cli", "worker", "storage", "torch", "lightning",
                "huggingface", "integrations"),
    "worker": ("agent", "driver", "cli"),
    "storage": ("agent", "driver", "cli", "worker"),
    "agent": ("driver", "cli"),
    "driver": ("cli",),
    "torch": ("cli",),
    "integrations": ("cli",),
}


def _modules() -> list[str]:
    found = []
    for root, _, files in os.walk(PACKAGE):
        found += [os.path.relpath(os.path.join(root, f), PACKAGE) for f in files
                  if f.endswith(".py")]
    return sorted(found)


def _imports(module: str) -> set[str]:
    with open(os.path.join(PACKAGE, module)) as f:
        tree = ast.parse(f.read())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
    return names


def _layer(module: str) -> str:
    return module.split(os.sep)[0] if os.sep in module else ""


@pytest.mark.parametrize("module", _modules())
def test_a_layer_imports_only_the_layers_below_it(module):
    forbidden = FORBIDDEN.get(_layer(module), ())
    bad = sorted(name for name in _imports(module)
                 if any(name == f"elastic_train.{layer}" or
                        name.startswith(f"elastic_train.{layer}.") for layer in forbidden))
    assert not bad, f"elastic_train/{module} imports {bad}, a layer it must not know"


@pytest.mark.parametrize("module", _modules())
def test_only_storage_opens_a_store(module):
    if _layer(module) == "storage" or module in OPENS_A_STORE:
        return
    opened = sorted(name for name in _imports(module)
                    if name.split(".")[0] in STORE_PACKAGES)
    assert not opened, (f"elastic_train/{module} imports {opened}: go through "
                        "elastic_train.storage, or add it to OPENS_A_STORE with the reason")


def test_nothing_outside_the_cli_imports_it():
    users = sorted(m for m in _modules() if _layer(m) != "cli"
                   and any(n.startswith("elastic_train.cli") for n in _imports(m)))
    assert not users, users


def test_the_allowlist_names_only_modules_that_still_need_it():
    stale = sorted(m for m in OPENS_A_STORE
                   if not any(n.split(".")[0] in STORE_PACKAGES for n in _imports(m)))
    assert not stale, f"no longer open a store: remove them from OPENS_A_STORE: {stale}"
