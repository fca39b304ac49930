"""Request bodies of the host inventory and its credentials."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, SecretStr, StringConstraints

from gpufleet.core.inventory import CredentialKind, HostSpec, HostState
from gpufleet.schedulers.kubernetes.config import MAX_KUBECONFIG_BYTES
from gpufleet.server.schemas.common import Request

MAX_IMPORT_ROWS = 5000


class PutCredentialRequest(Request):
    """Create or replace a credential by name (the name is the path's). The secret is
    write-only: no answer ever carries it back."""

    kind: CredentialKind
    username: Annotated[str, StringConstraints(max_length=255)] | None = None
    # SecretStr: a validation error or a repr of this body never shows it. Up to a
    # kubeconfig's bound here; the service holds the other kinds to MAX_SECRET_CHARS.
    secret: Annotated[SecretStr, Field(min_length=1, max_length=MAX_KUBECONFIG_BYTES)]


class ImportHostsRequest(Request):
    hosts: Annotated[list[HostSpec], Field(min_length=1, max_length=MAX_IMPORT_ROWS)]


class BindHostRequest(Request):
    node_id: Annotated[str, StringConstraints(min_length=1, max_length=36)]


class SetHostStateRequest(Request):
    state: HostState
    reason: Annotated[str, StringConstraints(max_length=1000)] = ""
