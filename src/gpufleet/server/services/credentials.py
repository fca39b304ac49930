"""Credentials: BMC passwords, SSH private keys, cloud keys and kubeconfigs, sealed at
rest.

Write-only: a secret goes in (create or replace by name) and never comes back out of the
API. Only the drivers' builders open one, for a driver's call: ``services/host_directory.py``
(a host's BMC/SSH credential, or an aws cluster's key) and ``services/kube_schedulers.py``
(a kubernetes cluster's kubeconfig, stored at the cluster's creation). Events, audit
rows, log lines and error messages name the credential and the key id, never the secret.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable

from sqlalchemy import ColumnElement, func, or_, select
from sqlalchemy.ext.asyncio import AsyncSession

from gpufleet.core.enums import ClusterStatus, ProviderKind, SchedulerKind
from gpufleet.core.errors import Conflict, InvalidInput, NotFound
from gpufleet.core.ids import is_id, new_id
from gpufleet.core.inventory import CredentialKind, KeyRotationResult, StoredCredential
from gpufleet.core.rbac import Permission
from gpufleet.schedulers.kubernetes.config import MAX_KUBECONFIG_BYTES, load_kubeconfig
from gpufleet.server.db.tables import ClusterRow, CredentialRow, HostRow, ProjectRow
from gpufleet.server.services.audit import record_audit
from gpufleet.server.services.auth import Caller
from gpufleet.server.services.keyring import NO_KEY_MESSAGE, Keyring, credential_aad
from gpufleet.server.services.projects import get_project_row_for

MAX_SECRET_CHARS = 16_384  # an RSA-4096 PEM key is ~3.3 kB


def credential_row_to_model(row: CredentialRow, *, hosts: int = 0) -> StoredCredential:
    return StoredCredential(
        id=row.id,
        project_id=row.project_id,
        name=row.name,
        kind=CredentialKind(row.kind),
        username=row.username,
        key_id=row.key_id,
        created_by=row.created_by,
        created_at=row.created_at,
        rotated_at=row.rotated_at,
        hosts=hosts,
    )


async def find_credential_row(
    session: AsyncSession, *, project_id: str, ref: str
) -> CredentialRow | None:
    match = (
        or_(CredentialRow.id == ref, CredentialRow.name == ref)
        if is_id(ref)
        else CredentialRow.name == ref
    )
    return await session.scalar(
        select(CredentialRow).where(CredentialRow.project_id == project_id, match)
    )


async def _credential_or_error(
    session: AsyncSession, *, project: ProjectRow, ref: str
) -> CredentialRow:
    row = await find_credential_row(session, project_id=project.id, ref=ref)
    if row is None:
        raise NotFound(
            f"credential {ref!r} not found in project {project.name}", field="credential"
        )
    return row


async def _host_counts(session: AsyncSession, ids: list[str]) -> dict[str, int]:
    if not ids:
        return {}
    rows = await session.execute(
        select(HostRow.credential_id, func.count(HostRow.id))
        .where(HostRow.credential_id.in_(ids))
        .group_by(HostRow.credential_id)
    )
    return {str(cid): int(n) for cid, n in rows}


async def list_credentials(
    session: AsyncSession, *, caller: Caller, project_ref: str
) -> list[StoredCredential]:
    project = await get_project_row_for(
        session, caller=caller, ref=project_ref, permission=Permission.CREDENTIAL_MANAGE
    )
    rows = (
        await session.scalars(
            select(CredentialRow)
            .where(CredentialRow.project_id == project.id)
            .order_by(CredentialRow.name)
        )
    ).all()
    counts = await _host_counts(session, [r.id for r in rows])
    return [credential_row_to_model(r, hosts=counts.get(r.id, 0)) for r in rows]


async def get_credential(
    session: AsyncSession, *, caller: Caller, project_ref: str, credential_ref: str
) -> StoredCredential:
    project = await get_project_row_for(
        session, caller=caller, ref=project_ref, permission=Permission.CREDENTIAL_MANAGE
    )
    row = await _credential_or_error(session, project=project, ref=credential_ref)
    counts = await _host_counts(session, [row.id])
    return credential_row_to_model(row, hosts=counts.get(row.id, 0))


async def put_credential(
    session: AsyncSession,
    *,
    caller: Caller,
    keyring: Keyring,
    project_ref: str,
    name: str,
    kind: CredentialKind,
    username: str | None,
    secret: str,
    now: dt.datetime,
) -> tuple[StoredCredential, bool]:
    """Store a credential, or replace the one of that name. ``(credential, created)``.

    Refused (409, nothing written) when the server has no key configured.
    """
    project = await get_project_row_for(
        session, caller=caller, ref=project_ref, permission=Permission.CREDENTIAL_MANAGE
    )
    if not keyring.configured:
        raise Conflict(NO_KEY_MESSAGE, field="secret")
    if not secret.strip():
        raise InvalidInput("secret: empty; give the password or key", field="secret")
    limit = MAX_KUBECONFIG_BYTES if kind is CredentialKind.KUBECONFIG else MAX_SECRET_CHARS
    if len(secret) > limit:
        raise InvalidInput(f"secret: longer than {limit} characters", field="secret")
    if kind is CredentialKind.KUBECONFIG:
        try:
            load_kubeconfig(secret)  # says what is wrong, never quotes the file
        except ValueError as exc:
            raise InvalidInput(f"secret: {exc}", field="secret") from None
    row = await find_credential_row(session, project_id=project.id, ref=name)
    created = row is None
    if row is None:
        row = CredentialRow(
            id=new_id(),
            project_id=project.id,
            name=name,
            kind=kind.value,
            username=username,
            created_by=caller.actor,
            created_at=now,
            rotated_at=None,
        )
    else:
        row.kind = kind.value
        row.username = username
        row.rotated_at = now
    row.key_id, row.ciphertext = keyring.seal(secret, aad=credential_aad(row.id))
    session.add(row)
    record_audit(
        session,
        actor=caller.actor,
        action="credential.create" if created else "credential.replace",
        object_type="credential",
        object_id=row.id,
        project_id=project.id,
        detail={"name": row.name, "kind": row.kind, "username": username, "key_id": row.key_id},
        ts=now,
    )
    counts = await _host_counts(session, [row.id])
    return credential_row_to_model(row, hosts=counts.get(row.id, 0)), created


async def delete_credential(
    session: AsyncSession, *, caller: Caller, project_ref: str, credential_ref: str
) -> StoredCredential:
    """Delete a credential no host, no aws cluster and no kubernetes cluster uses (409
    naming them otherwise)."""
    project = await get_project_row_for(
        session, caller=caller, ref=project_ref, permission=Permission.CREDENTIAL_MANAGE
    )
    row = await _credential_or_error(session, project=project, ref=credential_ref)
    users = list(
        await session.scalars(
            select(HostRow.hostname)
            .where(HostRow.credential_id == row.id)
            .order_by(HostRow.hostname)
            .limit(6)
        )
    )
    if users:
        shown = ", ".join(users[:5]) + (", ..." if len(users) > 5 else "")
        raise Conflict(
            f"credential {row.name} is used by host(s) {shown}; point them at another "
            "credential (re-import) first",
            field="credential",
        )
    # A cluster being deleted still needs its key: its machines are given back with it.
    clusters = await _clusters_using(
        session,
        project_id=project.id,
        kind=ClusterRow.provider == ProviderKind.AWS.value,
        uses=lambda c: (c.provider_config or {}).get("credential") == row.name,
    )
    if clusters:
        raise Conflict(
            f"credential {row.name} is used by aws cluster(s) {', '.join(clusters)}; point "
            "them at another credential (`gpufleet clusters provider-config set`) first",
            field="credential",
        )
    kube_clusters = await _clusters_using(
        session,
        project_id=project.id,
        kind=ClusterRow.scheduler == SchedulerKind.KUBERNETES.value,
        uses=lambda c: (c.scheduler_config or {}).get("credential_id") == row.id,
    )
    if kube_clusters:
        raise Conflict(
            f"credential {row.name} is the kubeconfig of kubernetes cluster(s) "
            f"{', '.join(kube_clusters)}; delete them first (replacing it with `gpufleet "
            "credentials set` keeps them working)",
            field="credential",
        )
    model = credential_row_to_model(row)
    await session.delete(row)
    record_audit(
        session,
        actor=caller.actor,
        action="credential.delete",
        object_type="credential",
        object_id=row.id,
        project_id=project.id,
        detail={"name": row.name, "kind": row.kind},
    )
    return model


async def _clusters_using(
    session: AsyncSession,
    *,
    project_id: str,
    kind: ColumnElement[bool],
    uses: Callable[[ClusterRow], bool],
) -> list[str]:
    """The names of the project's clusters of ``kind``, not deleted, that ``uses`` the
    credential (by name)."""
    rows = await session.scalars(
        select(ClusterRow)
        .where(
            ClusterRow.project_id == project_id,
            kind,
            ClusterRow.status != ClusterStatus.DELETED.value,
        )
        .order_by(ClusterRow.name)
    )
    return [c.name for c in rows if uses(c)]


def open_credential(keyring: Keyring, row: CredentialRow) -> str:
    """The secret of ``row`` (only ``services/host_directory.py`` and
    ``services/kube_schedulers.py`` call this, for a driver)."""
    return keyring.open(
        key_id=row.key_id,
        blob=row.ciphertext,
        aad=credential_aad(row.id),
        what=f"credential {row.name} ({row.id})",
    )


async def rotate_credentials(
    session: AsyncSession, *, keyring: Keyring, actor: str, now: dt.datetime
) -> KeyRotationResult:
    """Re-seal every credential under the current key, in the caller's one transaction.

    A credential that does not open (its key missing, or wrong) raises
    ``SecretUnavailable`` naming it and the key id; the transaction then writes nothing.
    """
    if keyring.current_id is None:
        raise Conflict(NO_KEY_MESSAGE, field="secret")
    rows = (
        await session.scalars(select(CredentialRow).order_by(CredentialRow.id).with_for_update())
    ).all()
    for row in rows:
        old_key = row.key_id
        secret = open_credential(keyring, row)
        row.key_id, row.ciphertext = keyring.seal(secret, aad=credential_aad(row.id))
        row.rotated_at = now
        record_audit(
            session,
            actor=actor,
            action="credential.rotate",
            object_type="credential",
            object_id=row.id,
            project_id=row.project_id,
            detail={"name": row.name, "from_key_id": old_key, "to_key_id": row.key_id},
            ts=now,
        )
    return KeyRotationResult(key_id=keyring.current_id, reencrypted=len(rows))
