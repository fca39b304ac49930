"""A project's admins as a Slurm cluster's sudo and Slurm-admin configuration (pure).

The server renders it from the memberships (``render_access``); the agent on each node
writes the sudoers fragment, and the agent on the controller sets each user's Slurm
``AdminLevel``. Only users with a valid Unix name can be rendered.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable
from enum import StrEnum

from pydantic import BaseModel, ConfigDict

# What useradd accepts by default on Debian (NAME_REGEX), and safe in sudoers unquoted.
UNIX_NAME_PATTERN = r"^[a-z_][a-z0-9_-]{0,31}$"
_UNIX_NAME = re.compile(UNIX_NAME_PATTERN)
_NOT_UNIX = re.compile(r"[^a-z0-9_-]+")


class AdminLevel(StrEnum):
    """Slurm's AdminLevel of a user (``sacctmgr modify user ... set adminlevel=``)."""

    ADMINISTRATOR = "Administrator"
    NONE = "None"


def is_unix_name(name: str) -> bool:
    return _UNIX_NAME.fullmatch(name) is not None


def unix_name_from(preferred_username: str | None, email: str | None = None) -> str | None:
    """A Unix name made from an IdP's ``preferred_username`` (else the e-mail's local part):
    lower case, other characters as ``_``, a leading digit or dash prefixed with ``_``,
    at most 32 characters. None when nothing usable is left."""
    base = preferred_username or (email.split("@", 1)[0] if email else "")
    base = base.split("@", 1)[0].lower()
    name = _NOT_UNIX.sub("_", base).strip("_-")
    if not name:
        return None
    if not re.match(r"[a-z_]", name):
        name = "_" + name
    name = name[:32]
    return name if is_unix_name(name) else None


class AccessConfig(BaseModel):
    """``GET /api/v1/agent/access``: what a node applies for its cluster's project."""

    model_config = ConfigDict(frozen=True, defer_build=True)

    cluster_id: str
    cluster_name: str
    project_id: str
    sudoers: str
    # Unix name → AdminLevel, for every member with a Unix name (Slurm clusters only).
    admin_levels: dict[str, AdminLevel]
    # Admins left out for want of a valid Unix name (the owner can set one).
    skipped: list[str]
    content_hash: str


def render_sudoers(*, cluster_name: str, project_name: str, admins: Iterable[str]) -> str:
    """The sudoers fragment: one line per admin, sorted, so it is stable byte for byte.

    NOPASSWD: gpufleet users sign in through the IdP and have no Unix password a sudo
    prompt could check.
    """
    names = sorted(set(admins))
    for name in names:
        if not is_unix_name(name):
            raise ValueError(f"not a Unix user name: {name!r}")
    lines = [
        f"# gpufleet: sudo for the admins of project {_comment(project_name)}",
        f"# on cluster {_comment(cluster_name)}. Written by the gpufleet agent; edits are lost.",
        *(f"{name} ALL=(ALL:ALL) NOPASSWD: ALL" for name in names),
    ]
    return "\n".join(lines) + "\n"


def _comment(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", text)


def render_access(
    *,
    cluster_id: str,
    cluster_name: str,
    project_id: str,
    project_name: str,
    slurm: bool,
    admins: Iterable[tuple[str, str | None]],
    members: Iterable[tuple[str, str | None]],
) -> AccessConfig:
    """``admins``/``members``: (user name, Unix name or None) of the project's members."""
    admin_list = list(admins)
    skipped = sorted(user for user, unix in admin_list if unix is None or not is_unix_name(unix))
    admin_names = sorted({unix for _, unix in admin_list if unix and is_unix_name(unix)})
    levels: dict[str, AdminLevel] = {}
    if slurm:
        for _, unix in members:
            if unix and is_unix_name(unix):
                levels[unix] = AdminLevel.NONE
        for name in admin_names:
            levels[name] = AdminLevel.ADMINISTRATOR
    sudoers = render_sudoers(
        cluster_name=cluster_name, project_name=project_name, admins=admin_names
    )
    levels = dict(sorted(levels.items()))
    digest = hashlib.sha256(
        json.dumps({"sudoers": sudoers, "admin_levels": levels}, sort_keys=True).encode()
    ).hexdigest()
    return AccessConfig(
        cluster_id=cluster_id,
        cluster_name=cluster_name,
        project_id=project_id,
        sudoers=sudoers,
        admin_levels=levels,
        skipped=skipped,
        content_hash=digest,
    )
