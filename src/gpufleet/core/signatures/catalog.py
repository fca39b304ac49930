"""Load the packaged signature catalog once, validated, and look entries up."""

from __future__ import annotations

import tomllib
from functools import cache
from importlib import resources

from pydantic import ValidationError

from gpufleet.core.signatures.models import Catalog, Signature

CATALOG_RESOURCE = "catalog.toml"


class CatalogError(ValueError):
    """The catalog data is malformed; the message names the entry and the field."""


def load_catalog(text: str, *, origin: str = "<string>") -> Catalog:
    """Parse and validate catalog TOML. Raises :class:`CatalogError`."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise CatalogError(f"{origin}: not valid TOML: {exc}") from exc
    try:
        return Catalog.model_validate(data)
    except ValidationError as exc:
        raise CatalogError(f"{origin}: invalid catalog:\n{_describe(exc, data)}") from None


def _describe(exc: ValidationError, data: dict[str, object]) -> str:
    """Name the signature by id, not by list index, so the fix is easy to find."""
    signatures = data.get("signatures")
    lines = []
    for err in exc.errors():
        loc = list(err["loc"])
        where = ".".join(str(p) for p in loc)
        if len(loc) >= 2 and loc[0] == "signatures" and isinstance(loc[1], int):
            entry = signatures[loc[1]] if isinstance(signatures, list) else None
            sig_id = entry.get("id", "?") if isinstance(entry, dict) else "?"
            where = f"signature {sig_id!r} (#{loc[1]})" + "".join(f".{p}" for p in loc[2:])
        lines.append(f"  {where}: {err['msg']}")
    return "\n".join(lines)


@cache
def get_catalog() -> Catalog:
    """The catalog shipped in the package, parsed and validated on first use."""
    ref = resources.files("gpufleet.core.signatures").joinpath(CATALOG_RESOURCE)
    return load_catalog(ref.read_text(encoding="utf-8"), origin=CATALOG_RESOURCE)


def get_signature(signature_id: str) -> Signature | None:
    return get_catalog().get(signature_id)


def get_signature_for_xid(xid: int) -> Signature | None:
    """The catalog entry for a GPU Xid number (``None`` for an Xid newer than it)."""
    return get_catalog().for_xid(xid)
