"""Names a package imports on first use (PEP 562): one implementation for ``cramkit``, ``cramkit.model``,
``cramkit.infer``, ``cramkit.embeddings`` and ``cramkit.distillation``, so that ``import cramkit`` and ``cramkit
--help`` load no torch and no engine until a name is used."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any


def lazy_names(package: str, where: Mapping[str, str]) -> Callable[[str], Any]:
    """The module ``__getattr__`` of ``package``: each name of ``where`` is imported on first use from the module
    it maps to (``"cramkit.x.y"``, or ``"cramkit.x.y:other"`` where the name there differs), then kept in the
    package, so that later uses are plain attribute reads."""

    def __getattr__(name: str) -> Any:
        if name not in where:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module, _, attr = where[name].partition(":")
        value = getattr(importlib.import_module(module), attr or name)
        setattr(sys.modules[package], name, value)
        return value

    return __getattr__
