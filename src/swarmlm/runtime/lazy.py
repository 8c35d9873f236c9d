"""Names a package exports from its modules on first use (PEP 562), so that importing the package (as the command
line's configs do) does not import what those modules need (torch, transformers, reasoning-gym)."""

from __future__ import annotations

import importlib
import sys
from typing import Any, Callable


def lazy_exports(package: str, home: dict[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` for ``package`` that imports ``name`` from ``package.home[name]`` on first use and
    keeps it in the package's namespace."""

    def __getattr__(name: str) -> Any:
        if name not in home:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{home[name]}"), name)
        setattr(sys.modules[package], name, value)
        return value

    return __getattr__
