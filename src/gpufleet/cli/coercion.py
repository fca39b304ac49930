"""Typer's value coercion without pydantic for the values that need none.

Typer (0.29) coerces every parameter's value, the defaults included, through a pydantic
``TypeAdapter`` built for the parameter when the command runs: importing its adapters
module and building a dozen adapters is a tenth of a second of every ``gpufleet``
command, more than the request of ``gpufleet nodes list``. Most values need nothing: a
string for a ``str`` option, an ``int`` default inside its bounds, a member of an
option's enum, a word that names one. :func:`lighten` gives each parameter of a command
a :class:`LightParam` that returns those values as typer would and hands every other
value (a number to parse, a path to check, anything out of bounds or invalid) to
typer's own coercion, built when first needed, so its answers and error messages are
typer's. ``tests/cli/test_light_coercion.py`` checks, for every parameter of every
command, that both give the same result wherever the light one answers.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from enum import Enum
from functools import cached_property
from typing import Any, get_args, get_origin

from typer._coercion import RuntimeParam, TypeDescriptor, build_runtime_param
from typer._param_types import choice_coercion_annotation as choice_coercion_annotation
from typer._param_types import coerce_cli_choice
from typer.core import _TyperParameter

MISS: Any = object()  # the light path does not answer: typer's coercion does
# Digits a plain int() parses exactly as pydantic's lax mode does (no sign, spaces,
# underscores or leading "+"; far below Python's digit limit).
_MAX_DIGITS = 18


def _number(value: Any, kind: type, info: Any) -> Any:
    if kind is int and type(value) is str and value.isascii() and value.isdigit():
        if len(value) > _MAX_DIGITS:
            return MISS
        value = int(value)
    if type(value) is not kind or info.clamp:
        return MISS
    if (info.min is not None and value < info.min) or (info.max is not None and value > info.max):
        return MISS  # typer's adapter words the error
    return value


def _choice(value: Any, choices: tuple[Any, ...], case_sensitive: bool, ctx: Any) -> Any:
    if isinstance(value, Enum):
        return value if any(value is c for c in choices) else MISS
    if type(value) is not str:
        return MISS
    try:
        return coerce_cli_choice(value, choices=choices, case_sensitive=case_sensitive, ctx=ctx)
    except ValueError:
        return MISS


def fast_value(annotation: Any, info: Any, value: Any, ctx: Any = None) -> Any:
    """``value`` coerced as typer coerces it for ``annotation``, or :data:`MISS`."""
    if info.parser is not None:
        return MISS
    if annotation is str:
        return value if type(value) is str else MISS
    if annotation is bool:
        return value if type(value) is bool else MISS
    if annotation is int or annotation is float:
        return _number(value, annotation, info)
    choice = choice_coercion_annotation(annotation, info)
    if choice is not None:
        return _choice(value, choice[0], choice[1], ctx)
    if get_origin(annotation) is list and isinstance(value, list | tuple):
        [item_type] = get_args(annotation)
        items = [fast_value(item_type, info, item, ctx) for item in value]
        return MISS if any(i is MISS for i in items) else items
    return MISS


@dataclass(frozen=True)
class LightParam(RuntimeParam):
    """A parameter's coercion: :func:`fast_value`, else typer's own."""

    descriptor: TypeDescriptor = field(compare=False, kw_only=True)

    @cached_property
    def _typers(self) -> RuntimeParam:
        """typer's own coercion, built (pydantic imported) the first time it is needed."""
        return build_runtime_param(self.descriptor)

    def _coerce_value(self, value: Any, param: Any, ctx: Any) -> Any:
        found = fast_value(self.annotation, self.parameter_info, value, ctx)
        if found is not MISS:
            return found
        return self._typers._coerce_value(value, param=param, ctx=ctx)


def _params(command: Any) -> Iterator[_TyperParameter]:
    # ``--help`` is made when first asked for (and kept); made here, with the default
    # names (gpufleet sets no ``help_option_names``), so that it is lightened too.
    help_option = command.get_help_option(command.context_class(command))
    for p in [*command.params, help_option]:
        if isinstance(p, _TyperParameter):
            yield p
    for sub in (getattr(command, "commands", None) or {}).values():
        yield from _params(sub)


def lighten(command: Any) -> Any:
    """Give every typer parameter of ``command`` (and its subcommands) a
    :class:`LightParam`, unless it has its coercion already; returns ``command``."""
    for p in _params(command):
        if p._runtime_param is None and p.type_descriptor.file_annotation is None:
            d = p.type_descriptor
            p._runtime_param = LightParam(
                parameter_info=d.parameter_info, annotation=d.annotation, descriptor=d
            )
    return command
