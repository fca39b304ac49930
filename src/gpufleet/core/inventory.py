"""The host inventory and its credentials, as the API and the CLI see them.

A host is one physical (or cloud) machine and how to reach its management path; a
credential is a secret the server keeps encrypted and hands only to a driver. Nothing
here ever holds a secret: ``StoredCredential`` is the metadata, the secret goes in through
``PutCredentialRequest`` (server/schemas) and never comes back out.
"""

from __future__ import annotations

import datetime as dt
from enum import StrEnum
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, StringConstraints


class CredentialKind(StrEnum):
    BMC_PASSWORD = "bmc_password"  # noqa: S105 - a kind's name, not a password
    SSH_KEY = "ssh_key"
    AWS_KEY = "aws_key"  # "<access key id>:<secret access key>" as the secret
    KUBECONFIG = "kubeconfig"  # a kubernetes cluster's kubeconfig file, its text the secret


class BmcType(StrEnum):
    IPMI = "ipmi"
    REDFISH = "redfish"
    SSH = "ssh"
    AWS = "aws"


class HostRole(StrEnum):
    MEMBER = "member"  # runs a node of its cluster
    SPARE = "spare"  # waits in its cluster's pool for a failover


class HostState(StrEnum):
    IN_SERVICE = "in_service"  # a node of the cluster runs on it (or may)
    SPARE = "spare"  # in the pool, free to be claimed
    CLAIMED = "claimed"  # taken from the pool by a failover (its claim token)
    OUT_OF_SERVICE = "out_of_service"  # removed or replaced: flagged for hardware service


class _Domain(BaseModel):
    model_config = ConfigDict(frozen=True, from_attributes=True, defer_build=True)


# Credential names: like other names, DNS-label-ish, so they read well in files and URLs.
CredentialName = Annotated[
    str,
    StringConstraints(min_length=1, max_length=63, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$"),
]
Hostname = Annotated[
    str,
    StringConstraints(
        min_length=1, max_length=253, pattern=r"^[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?$"
    ),
]
Label = Annotated[str, StringConstraints(min_length=1, max_length=63)]


class StoredCredential(_Domain):
    """A credential's metadata. The secret is write-only: no answer carries it."""

    id: str
    project_id: str
    name: str
    kind: CredentialKind
    username: str | None
    key_id: str  # which key of the server's keyring encrypted it
    created_by: str
    created_at: dt.datetime
    rotated_at: dt.datetime | None  # last re-encrypted (rotation) or replaced
    hosts: int = 0  # hosts that use it (a credential in use cannot be deleted)


class HostSpec(BaseModel):
    """One row of an inventory file (YAML list or CSV). ``cluster`` and ``credential`` are
    names (or ids) in the importing project. Re-importing a hostname updates its row."""

    model_config = ConfigDict(extra="forbid", str_strip_whitespace=True, defer_build=True)

    hostname: Hostname
    bmc_type: BmcType
    bmc_address: Annotated[str, StringConstraints(min_length=1, max_length=255)]
    port: Annotated[int, Field(ge=1, le=65535)] | None = None
    serial: Annotated[str, StringConstraints(max_length=120)] | None = None
    system_id: Annotated[str, StringConstraints(max_length=255)] | None = None
    host_key: Annotated[str, StringConstraints(max_length=4096)] | None = None
    credential: CredentialName | None = None
    rack: Label | None = None
    leaf_switch: Label | None = None
    pdu: Label | None = None
    cluster: Annotated[str, StringConstraints(min_length=1, max_length=63)] | None = None
    role: HostRole = HostRole.MEMBER


class Host(_Domain):
    """One inventory host as the API returns it (its credential by name, never its secret)."""

    id: str
    project_id: str
    hostname: str
    serial: str | None
    bmc_type: BmcType
    bmc_address: str
    port: int | None
    system_id: str | None
    host_key: str | None
    credential: str | None  # the credential's name
    rack: str | None
    leaf_switch: str | None
    pdu: str | None
    cluster_id: str | None
    role: HostRole
    state: HostState
    node_id: str | None  # the node running on it
    claim_token: str | None  # the failover that claimed it
    created_at: dt.datetime
    updated_at: dt.datetime


class HostImportResult(_Domain):
    """What an import did: every row written (all or nothing)."""

    created: list[str]  # hostnames
    updated: list[str]
    unchanged: list[str]


class KeyRotationResult(_Domain):
    key_id: str  # the current key every credential is now under
    reencrypted: int
