"""The client and the CLI use the API's types from ``gpufleet.core``; they never define a
second copy of an answer (a model) or of a value set (an enum) the server defines."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from collections.abc import Iterator
from enum import Enum
from types import ModuleType

from pydantic import BaseModel

import gpufleet.cli
import gpufleet.client
import gpufleet.client.api
import gpufleet.core
import gpufleet.core.models


def _modules(package: ModuleType) -> Iterator[ModuleType]:
    yield package
    for info in pkgutil.walk_packages(package.__path__, prefix=f"{package.__name__}."):
        yield importlib.import_module(info.name)


def _own_classes(package: ModuleType) -> Iterator[type]:
    """Classes defined in the package's modules (not those they import)."""
    for module in _modules(package):
        for _, obj in inspect.getmembers(module, inspect.isclass):
            if obj.__module__ == module.__name__:
                yield obj


def _core_enum_values() -> dict[frozenset[str], str]:
    return {
        frozenset(str(m.value) for m in cls): f"{cls.__module__}.{cls.__name__}"
        for cls in _own_classes(gpufleet.core)
        if issubclass(cls, Enum)
    }


def test_the_client_defines_no_model_or_enum() -> None:
    own = [
        f"{cls.__module__}.{cls.__name__}"
        for cls in _own_classes(gpufleet.client)
        if issubclass(cls, BaseModel | Enum)
    ]
    assert own == [], "the API's types live in gpufleet.core (core/models.py)"


def test_the_cli_copies_no_core_model_or_enum() -> None:
    core_names = {cls.__name__ for cls in _own_classes(gpufleet.core)}
    core_values = _core_enum_values()
    copies = []
    for cls in _own_classes(gpufleet.cli):
        if issubclass(cls, BaseModel) and cls.__name__ in core_names:
            copies.append(f"{cls.__name__}: a model core defines")
        if issubclass(cls, Enum):
            twin = core_values.get(frozenset(str(m.value) for m in cls))
            if twin is not None:
                copies.append(f"{cls.__name__}: the values of {twin}")
    assert copies == []


def test_the_names_the_client_exports_are_core_classes() -> None:
    shared = [n for n in gpufleet.client.api.__all__ if hasattr(gpufleet.core.models, n)]
    assert {"Me", "AuthConfig", "ClusterStatusReport", "NodeAction", "NodeActionResult"} <= set(
        shared
    )
    for name in shared:
        assert getattr(gpufleet.client.api, name) is getattr(gpufleet.core.models, name), name
