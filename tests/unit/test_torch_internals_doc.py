"""Every private part of torch that elastic_train (or bench/) uses is listed in
docs/TORCH_INTERNALS.md, so that a torch upgrade is checked in one place.

The code is read with ``ast``, never run. A use is:

(a) ``X._name`` or ``getattr(X, "_name")`` where ``X`` is torch: a module imported from
    torch (``dist``, also ``sys.modules.get("torch")``) or a name imported from it
    (``handler_registry``, ``LocalElasticAgent``);
(b) ``from torch... import _name``, and any import of a private torch module
    (``torch.distributed._shard._utils``);
(c) in a class derived from a torch class (or a mixin of one): a method overriding a
    private method of the torch class, or ``self._name``/``super()._name`` where the torch
    class defines ``_name``. What the torch class defines is read from the imported class
    (its ``__dict__`` along its MRO, and the ``self._name`` its source mentions), so our
    own private names (``self._retry``) never count;
(d) ``obj._name`` on any other object that is not a module (a process context or a
    handler passed around untyped), where ``_name`` is private to a class of a torch
    module we import and none of our own code defines it;
(e) a string that is a private torch module's name (``"torch._dynamo"``, imported by name).

The document must mention the name (``_name``; for a module, its path from the first
private part on: ``_shard._utils``). (c) and (d) are read from the installed torch, so
the ``compat`` runs check the document against the older releases too. Assigning a
public method (``pcontext.close = ...``) is not seen: the document lists those by hand.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import pathlib
import re
import sys
from dataclasses import dataclass, field
from functools import cache
from types import ModuleType
from typing import Any

import pytest

pytestmark = pytest.mark.compat

ROOT = pathlib.Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "TORCH_INTERNALS.md"
SOURCES = ("elastic_train", "bench")
_ACCESSORS = ("getattr", "hasattr", "setattr", "delattr")
_TORCH_PATH = re.compile(r"torch(\.\w+)+")


def _private(name: str) -> bool:
    """``_name``: not ``__dunder__``, ``__mangled``, ``_sunder_`` (enum) or ``_``."""
    return (name.startswith("_") and not name.startswith("__") and not name.endswith("_")
            and name != "_abc_impl")


def _is_torch(dotted: str) -> bool:
    return dotted == "torch" or dotted.startswith("torch.")


def _is_self(expr: ast.expr) -> bool:
    return (isinstance(expr, ast.Name) and expr.id in ("self", "cls")) or (
        isinstance(expr, ast.Call) and isinstance(expr.func, ast.Name)
        and expr.func.id == "super")


def _root(expr: ast.expr) -> ast.expr:
    """What an expression's attribute chain starts from: ``dist`` in
    ``dist.distributed_c10d._x()``, ``torch`` in ``getattr(torch, kind)._x``."""
    while True:
        if isinstance(expr, (ast.Attribute, ast.Subscript)):
            expr = expr.value
        elif isinstance(expr, ast.Call) and not _is_self(expr):
            getter = isinstance(expr.func, ast.Name) and expr.func.id == "getattr"
            expr = expr.args[0] if getter and expr.args else expr.func
        else:
            return expr


def _module_named(value: ast.expr) -> str | None:
    """The module's name in ``sys.modules.get("x")``, ``sys.modules["x"]`` and
    ``importlib.import_module("x")``."""
    if isinstance(value, ast.Subscript) and ast.unparse(value.value) == "sys.modules":
        arg: ast.expr = value.slice
    elif isinstance(value, ast.Call) and value.args and ast.unparse(value.func) in (
            "sys.modules.get", "importlib.import_module"):
        arg = value.args[0]
    else:
        return None
    return arg.value if isinstance(arg, ast.Constant) and isinstance(arg.value, str) else None


@dataclass
class _Module:
    """One of our files, read in one walk."""

    path: pathlib.Path
    name: str  # elastic_train.agent.local_agent
    torch_names: dict[str, str] = field(default_factory=dict)  # local name -> torch's path
    our_names: dict[str, str] = field(default_factory=dict)  # local name -> our path
    module_names: set[str] = field(default_factory=set)  # local names of other modules
    private_imports: list[tuple[str, int]] = field(default_factory=list)  # (b)
    accesses: list[tuple[ast.expr, str, int]] = field(default_factory=list)  # obj._name
    classes: list[ast.ClassDef] = field(default_factory=list)
    defined: set[str] = field(default_factory=set)  # private names this file assigns

    def where(self, line: int) -> str:
        return f"{self.path.relative_to(ROOT)}:{line}"


def _read(path: pathlib.Path) -> _Module:
    module = _Module(path, ".".join(path.relative_to(ROOT).with_suffix("").parts)
                     .removesuffix(".__init__"))
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                local = alias.asname or alias.name.split(".")[0]
                if _is_torch(alias.name):
                    module.torch_names[local] = alias.name if alias.asname else local
                    module.private_imports += [(p, node.lineno) for p in _private_path(alias.name)]
                else:
                    module.module_names.add(local)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                local, target = alias.asname or alias.name, f"{node.module}.{alias.name}"
                if _is_torch(node.module):
                    module.torch_names[local] = target
                    if _private(alias.name):
                        module.private_imports.append((alias.name, node.lineno))
                elif node.module.split(".")[0] in SOURCES:
                    module.our_names[local] = target
            if _is_torch(node.module):
                module.private_imports += [(p, node.lineno) for p in _private_path(node.module)]
        elif isinstance(node, ast.Assign) and (named := _module_named(node.value)):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    if _is_torch(named):
                        module.torch_names[target.id] = named
                    else:
                        module.module_names.add(target.id)
        elif isinstance(node, ast.ClassDef):
            module.classes.append(node)
        elif (isinstance(node, ast.Constant) and isinstance(node.value, str)
              and _TORCH_PATH.fullmatch(node.value)):
            module.private_imports += [(p, node.lineno) for p in _private_path(node.value)]
        elif isinstance(node, ast.Attribute) and _private(node.attr):
            module.accesses.append((node.value, node.attr, node.lineno))
            if isinstance(node.ctx, ast.Store) and _is_self(node.value):
                module.defined.add(node.attr)
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
              and node.func.id in _ACCESSORS and len(node.args) >= 2
              and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str)
              and _private(node.args[1].value)):
            module.accesses.append((node.args[0], node.args[1].value, node.lineno))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            if _private(node.name):
                module.defined.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store) and _private(node.id):
            module.defined.add(node.id)
    return module


def _private_path(dotted: str) -> list[str]:
    """``torch.distributed._shard._utils`` -> ``["_shard._utils"]``; ``[]`` when public."""
    parts = dotted.split(".")
    first = next((i for i, part in enumerate(parts) if _private(part)), None)
    return [] if first is None else [".".join(parts[first:])]


def _resolve(dotted: str) -> Any:
    """The torch object ``dotted`` names (a module, a class, ...), or None."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            found: Any = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for part in parts[cut:]:
            found = getattr(found, part, None)
        return found
    return None


_CLASS_START = r"^class {}\b"
_CLASS_END = re.compile(r"^[^\s#)\]}'\"]", re.M)  # the next top-level statement


@cache
def _text(path: str) -> str:
    return pathlib.Path(path).read_text()


@cache
def _torch_privates(cls: type) -> frozenset[str]:
    """The private names torch's class ``cls`` defines along its torch MRO: its
    ``__dict__``, and ``self._name`` in its source (a top-level class's lines, found by
    text: parsing torch's large files would take seconds)."""
    names: set[str] = set()
    for klass in cls.__mro__:
        if not _is_torch(getattr(klass, "__module__", None) or ""):
            continue
        names |= {name for name in vars(klass) if _private(name)}
        try:
            text = _text(inspect.getsourcefile(klass) or "")
        except (TypeError, OSError):  # a C++ class (torch._C)
            continue
        if start := re.search(_CLASS_START.format(re.escape(klass.__name__)), text, re.M):
            end = _CLASS_END.search(text, start.end())
            body = text[start.start():end.start() if end else len(text)]
            names |= {name for name in re.findall(r"\bself\.(_\w+)", body) if _private(name)}
    return frozenset(names)


@dataclass
class _Class:
    module: _Module
    node: ast.ClassDef
    torch_bases: set[type] = field(default_factory=set)
    our_bases: list[str] = field(default_factory=list)


def _classes(modules: list[_Module]) -> dict[str, _Class]:
    """Our classes by ``module.Class``, each with the torch classes it derives from:
    itself, through our bases, or as a mixin of a class that does."""
    classes = {f"{m.name}.{node.name}": _Class(m, node) for m in modules for node in m.classes}
    for cls in classes.values():
        for base in cls.node.bases:
            root, dotted = _root(base), ast.unparse(base)
            if not isinstance(root, ast.Name):
                continue
            if root.id in cls.module.torch_names:
                found = _resolve(cls.module.torch_names[root.id] + dotted[len(root.id):])
                if isinstance(found, type):
                    cls.torch_bases.add(found)
            elif f"{cls.module.name}.{dotted}" in classes:
                cls.our_bases.append(f"{cls.module.name}.{dotted}")
            elif cls.module.our_names.get(dotted) in classes:
                cls.our_bases.append(cls.module.our_names[dotted])
    changed = True
    while changed:  # from bases to subclasses and from subclasses to mixins
        changed = False
        for cls in classes.values():
            for base in map(classes.__getitem__, cls.our_bases):
                for a, b in ((cls, base), (base, cls)):
                    if not b.torch_bases <= a.torch_bases:
                        a.torch_bases |= b.torch_bases
                        changed = True
    return classes


def _known(modules: list[_Module]) -> set[str]:
    """The private names of the classes of the torch modules we import (the modules
    named, and those the names we import come from), torch's top level aside."""
    owners: set[ModuleType] = set()
    for module in modules:
        for dotted in module.torch_names.values():
            found = _resolve(dotted)
            owner = found if isinstance(found, ModuleType) else sys.modules.get(
                getattr(found, "__module__", None) or "")
            if owner is not None and owner.__name__ != "torch" and _is_torch(owner.__name__):
                owners.add(owner)
    known: set[str] = set()
    for owner in owners:
        for value in list(vars(owner).values()):
            # (type(value), not isinstance: a deprecated alias warns when asked its class)
            if issubclass(type(value), type) and value.__module__ == owner.__name__:
                known |= _torch_privates(value)
    return known


@dataclass(frozen=True)
class _Use:
    name: str  # what the document must mention
    where: str
    how: str


def _uses() -> list[_Use]:
    modules = [_read(path) for source in SOURCES for path in sorted((ROOT / source).rglob("*.py"))]
    classes = _classes(modules)
    uses: list[_Use] = []
    ours = set().union(*(m.defined for m in modules))
    torch_derived: dict[tuple[str, int], frozenset[str]] = {}  # (file, line) -> torch's names
    for cls in classes.values():
        if not cls.torch_bases:
            continue
        names = frozenset().union(*map(_torch_privates, cls.torch_bases))
        ours -= names
        for line in range(cls.node.lineno, (cls.node.end_lineno or cls.node.lineno) + 1):
            torch_derived[(cls.module.name, line)] = names
        for node in cls.node.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name in names:
                uses.append(_Use(node.name, cls.module.where(node.lineno), "overridden"))
    known = _known(modules)
    for module in modules:
        uses += [_Use(name, module.where(line), "imported")
                 for name, line in module.private_imports]
        for obj, name, line in module.accesses:
            root = _root(obj)
            if isinstance(root, ast.Name) and root.id in module.torch_names:
                uses.append(_Use(name, module.where(line), f"on torch's {root.id}"))
            elif _is_self(root):
                if _is_self(obj) and name in torch_derived.get((module.name, line), ()):
                    uses.append(_Use(name, module.where(line), "torch's, on self"))
            elif isinstance(root, ast.Name) and root.id in module.module_names:
                continue  # another module's (threading._shutdown)
            elif name in known and name not in ours:
                uses.append(_Use(name, module.where(line), "a torch class's"))
    return uses


@pytest.fixture(scope="module")
def uses() -> list[_Use]:
    return _uses()


def _listed(name: str, doc: str) -> bool:
    return re.search(rf"(?<!\w){re.escape(name)}(?!\w)", doc) is not None


def test_every_private_torch_name_the_code_uses_is_in_the_document(uses):
    doc = DOC.read_text()
    missing = sorted({f"{u.name} ({u.where}, {u.how})" for u in uses if not _listed(u.name, doc)})
    assert missing == [], "add to docs/TORCH_INTERNALS.md: " + "; ".join(missing)


def test_the_scan_finds_each_kind_of_use_and_not_our_own_names(uses):
    found = {(u.name, u.where.split(":")[0]) for u in uses}
    for expected in [
        ("_abort_process_group", "elastic_train/worker/inprocess/loop.py"),  # (a) dist.
        ("_get_default_store", "elastic_train/worker/lifecycle.py"),  # (a) sys.modules
        ("_is_in_bad_fork", "elastic_train/agent/zygote/fork.py"),  # (a) getattr
        ("_registry", "elastic_train/agent/rendezvous/registry.py"),  # (a) imported name
        ("_shard._utils", "elastic_train/storage/dcp.py"),  # (b)
        ("_monitor_workers", "elastic_train/agent/local_agent.py"),  # (c) overridden
        ("_remaining_restarts", "elastic_train/agent/local_agent.py"),  # (c) self.
        ("_pcontext", "elastic_train/agent/local_agent.py"),  # (c) self.
        ("_popen", "elastic_train/agent/worker_slots.py"),  # (c) the handler
        ("_running_local_ranks", "elastic_train/agent/worker_slots.py"),  # (d)
        ("_keep_alive_timer", "elastic_train/agent/torch_compat.py"),  # (d)
        ("_dynamo", "elastic_train/agent/zygote/preload.py"),  # (e)
    ]:
        assert expected in found, expected
    ours = {"_retry", "_hang_watch", "_decide", "_kv", "_lease", "_stop_timeout", "_in_process"}
    assert not {name for name, _ in found} & ours
