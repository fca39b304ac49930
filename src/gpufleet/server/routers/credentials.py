"""A project's credentials (BMC passwords, SSH keys, cloud keys): write-only secrets.

Every route needs ``credential.manage`` (project admins): even the metadata says which
machines can be reached with what, and members never need it.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path

import gpufleet.server.services.credentials as credentials_services
from gpufleet.core.inventory import StoredCredential
from gpufleet.core.rbac import Permission
from gpufleet.server.deps import Allow, CtxDep
from gpufleet.server.schemas.inventory import PutCredentialRequest
from gpufleet.server.services.auth import Caller

router = APIRouter(prefix="/projects/{project_ref}/credentials", tags=["credentials"])

Manager = Annotated[Caller, Allow(Permission.CREDENTIAL_MANAGE)]
NamePath = Annotated[
    str, Path(min_length=1, max_length=63, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
]


@router.get("")
async def list_credentials(
    project_ref: str, caller: Manager, ctx: CtxDep
) -> list[StoredCredential]:
    async with ctx.db.reader() as session:
        return await credentials_services.list_credentials(
            session, caller=caller, project_ref=project_ref
        )


@router.get("/{credential_ref}")
async def get_credential(
    project_ref: str, credential_ref: str, caller: Manager, ctx: CtxDep
) -> StoredCredential:
    async with ctx.db.reader() as session:
        return await credentials_services.get_credential(
            session, caller=caller, project_ref=project_ref, credential_ref=credential_ref
        )


@router.put("/{credential_ref}")
async def put_credential(
    project_ref: str,
    credential_ref: NamePath,
    body: PutCredentialRequest,
    caller: Manager,
    ctx: CtxDep,
) -> StoredCredential:
    """Create or replace (by name). The secret goes in and never comes back out."""
    async with ctx.db.transaction() as session:
        stored, _created = await credentials_services.put_credential(
            session,
            caller=caller,
            keyring=ctx.keyring,
            project_ref=project_ref,
            name=credential_ref,
            kind=body.kind,
            username=body.username,
            secret=body.secret.get_secret_value(),
            now=ctx.clock.now(),
        )
        return stored


@router.delete("/{credential_ref}")
async def delete_credential(
    project_ref: str, credential_ref: str, caller: Manager, ctx: CtxDep
) -> StoredCredential:
    """Refused (409) while a host uses it."""
    async with ctx.db.transaction() as session:
        return await credentials_services.delete_credential(
            session, caller=caller, project_ref=project_ref, credential_ref=credential_ref
        )
