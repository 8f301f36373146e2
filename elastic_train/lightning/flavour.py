"""Which Lightning our classes build on: ``lightning.pytorch`` or ``pytorch_lightning``.

Both packages are often installed together (``lightning`` depends on
``pytorch-lightning``) and their classes do not mix: a ``pytorch_lightning.Trainer``
rejects a strategy derived from ``lightning.pytorch``'s. So our classes are not
bound to one package when this module is imported. Each public class
(``RayDDPStrategy``, ...) derives from :class:`LightningBound`; creating an
instance builds, once per package, a subclass that also derives from that
package's class (``DDPStrategy``, ``Callback``, ...) and makes the instance of
it. ``isinstance(x, RayDDPStrategy)`` holds for either, and a user's subclass
of a public class works the same way.

The package is the one the script imported (it is in ``sys.modules`` by the
time a Trainer is built); when it imported both, or neither yet,
``lightning.pytorch`` if it is installed (Ray's order), else ``pytorch_lightning``.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from types import ModuleType
from typing import Any

from elastic_train.integrations.extras import missing

PACKAGES = ("lightning.pytorch", "pytorch_lightning")


def _installed(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:  # "lightning.pytorch" when "lightning" is absent
        return False


def lightning_package() -> ModuleType:
    """The Lightning package the script uses (see the module docstring)."""
    imported = [name for name in PACKAGES if name in sys.modules]
    for name in imported or [name for name in PACKAGES if _installed(name)]:
        return importlib.import_module(name)
    raise missing("pytorch-lightning", "lightning", "elastic_train.lightning")


_bound: dict[tuple[type, str], type] = {}


def bind(cls: type, pl: ModuleType) -> type:
    """``cls`` made a subclass of its Lightning base class from package ``pl``."""
    if cls.__dict__.get("_bound_to") == pl.__name__:
        return cls
    key = (cls, pl.__name__)
    if key not in _bound:
        _bound[key] = type(cls.__name__, (cls, cls._lightning_base(pl)), {
            "__module__": cls.__module__, "__qualname__": cls.__qualname__,
            "__doc__": cls.__doc__, "_bound_to": pl.__name__})
    return _bound[key]


class LightningBound:
    """Base of our Lightning classes: instances are of ``bind(cls, package)``."""

    @staticmethod
    def _lightning_base(pl: ModuleType) -> type:
        raise NotImplementedError

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        bound = bind(cls, lightning_package())
        # An instance of the bound class (a subclass of cls, so Python then runs its
        # __init__ with the arguments as usual).
        return super().__new__(bound)
