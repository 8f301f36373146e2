"""Python installations where torch is not under the interpreter's own prefix, as on
clusters and in containers, built cheaply from the torch these tests run on.

Each :class:`Layout` is an interpreter and an environment in which ``import torch``
finds this environment's torch (``TORCH_SITE``) some other way than through the
interpreter's own site-packages, and ``import elastic_train`` finds this checkout
(``PYTHONPATH=REPO``, as a user running from a source tree would):

- ``pythonpath``: a bare venv, ``PYTHONPATH=REPO:TORCH_SITE`` (Lmod's ``module load
  pytorch``, a container's ``ENV PYTHONPATH``);
- ``target``: a bare venv, ``PYTHONPATH=REPO:LIBS`` where ``LIBS`` is what ``pip install
  --target LIBS`` leaves: the packages and their ``*.dist-info``, in a directory not
  named site-packages (hard links to ``TORCH_SITE``'s files, so that not even the
  resolved paths say site-packages; skipped where hard links cannot be made);
- ``pth``: a bare venv whose site-packages holds a ``.pth`` file naming ``TORCH_SITE``
  (another environment's packages);
- ``system_site``: a venv made with ``--system-site-packages``, torch in the user's site
  (``pip install --user torch``: ``PYTHONUSERBASE``), which such a venv sees.

In all of them torch lies outside ``sys.prefix`` and ``sys.base_prefix``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass

import torch

from tests.support.paths import REPO

TORCH_SITE = os.path.dirname(os.path.dirname(os.path.abspath(torch.__file__)))
NAMES = ("pythonpath", "target", "pth", "system_site")
PY = f"python{sys.version_info.major}.{sys.version_info.minor}"


@dataclass(frozen=True)
class Layout:
    name: str
    python: str
    env: dict[str, str]

    def environ(self, **extra: str) -> dict[str, str]:
        """This environment's variables with the layout's; no venv or user site of ours."""
        base = {k: v for k, v in os.environ.items()
                if k not in ("PYTHONPATH", "PYTHONUSERBASE", "VIRTUAL_ENV", "PYTHONHOME")}
        return {**base, **self.env, **extra}


def _venv(path: str, system_site: bool = False) -> str:
    """A venv without packages (of the interpreter this one was made from); its python."""
    flags = ["--system-site-packages"] if system_site else []
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", *flags, path], check=True)
    return os.path.join(path, "bin", "python")


def _site(venv_python: str) -> str:
    return os.path.join(os.path.dirname(os.path.dirname(venv_python)), "lib", PY,
                        "site-packages")


def _linked_copy(dest: str) -> bool:
    """``TORCH_SITE``'s packages in ``dest`` as hard links, without this checkout's
    editable install and the ``.pth`` files (a ``--target`` directory's are inert); False
    where hard links cannot be made (another file system)."""
    if subprocess.run(["cp", "-al", TORCH_SITE, dest], capture_output=True).returncode:
        shutil.rmtree(dest, ignore_errors=True)
        return False
    for name in os.listdir(dest):
        if (name.endswith(".pth") or name.startswith("__editable__")
                or name.startswith("elastic_train")):
            path = os.path.join(dest, name)
            shutil.rmtree(path) if os.path.isdir(path) else os.remove(path)
    return True


def build(root: str) -> dict[str, Layout | str]:
    """Every layout under ``root``: name -> Layout, or why it could not be built."""
    layouts: dict[str, Layout | str] = {}
    bare = _venv(os.path.join(root, "bare"))
    layouts["pythonpath"] = Layout("pythonpath", bare,
                                   {"PYTHONPATH": os.pathsep.join([REPO, TORCH_SITE])})
    libs = os.path.join(root, "libs")
    if _linked_copy(libs):
        layouts["target"] = Layout("target", bare, {"PYTHONPATH": os.pathsep.join([REPO, libs])})
        userbase = os.path.join(root, "userbase")
        os.makedirs(os.path.join(userbase, "lib", PY))
        os.symlink(libs, os.path.join(userbase, "lib", PY, "site-packages"))
        layouts["system_site"] = Layout(
            "system_site", _venv(os.path.join(root, "system-site"), system_site=True),
            {"PYTHONPATH": REPO, "PYTHONUSERBASE": userbase})
    else:
        layouts["target"] = layouts["system_site"] = \
            f"cannot hard-link {TORCH_SITE} into {root} (another file system)"
    pth = _venv(os.path.join(root, "pth"))
    with open(os.path.join(_site(pth), "other-env.pth"), "w") as f:
        f.write(TORCH_SITE + "\n")
    layouts["pth"] = Layout("pth", pth, {"PYTHONPATH": REPO})
    return layouts
