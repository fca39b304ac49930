"""``DbHostDirectory``: the host inventory as bare-metal drivers see it
(``providers.base.HostDirectory``). The one place a credential is opened: the secret lives
in the ``HostAccess`` handed to one driver call, whose ``Credential`` repr hides it, or,
for an aws cluster, in the ``Credential`` its ``AwsProvider`` is built with
(``aws_credential``, called by ``services/aws_providers.py``).

``claim_spare`` is idempotent by its token and safe under concurrency. Claims of one
cluster's pool run one at a time: on PostgreSQL a transaction-scoped advisory lock on the
cluster (claims are rare, a failover each), on SQLite the write lock every transaction
takes at its start (``BEGIN IMMEDIATE``). So two claims take two hosts, a repeated token
finds the host the first one took, and "the pool is empty" is never said while another
claim holds a spare it may still give back. The token's unique index settles one token
raced across two clusters.
"""

from __future__ import annotations

from sqlalchemy import select, text
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession

from gpufleet.core.clock import Clock
from gpufleet.core.errors import InvalidInput, NotFound
from gpufleet.core.ids import is_id
from gpufleet.core.inventory import CredentialKind, HostState
from gpufleet.providers.base import Credential, HostAccess
from gpufleet.server.db.engine import Database
from gpufleet.server.db.tables import CredentialRow, HostRow
from gpufleet.server.services.credentials import open_credential
from gpufleet.server.services.hosts import switch_host_state, take_out_of_service
from gpufleet.server.services.keyring import Keyring

ACTOR = "system:host-directory"


async def host_access(session: AsyncSession, keyring: Keyring, row: HostRow) -> HostAccess:
    credential: Credential | None = None
    if row.credential_id is not None:
        stored = await session.get(CredentialRow, row.credential_id)
        if stored is not None:
            credential = Credential(
                username=stored.username, secret=open_credential(keyring, stored)
            )
    return HostAccess(
        host_id=row.id,
        hostname=row.hostname,
        address=row.bmc_address,
        port=row.port,
        credential=credential,
        host_key=row.host_key,
        system_id=row.system_id,
        cluster_id=row.cluster_id,
        serial=row.serial,
        rack=row.rack,
        leaf_switch=row.leaf_switch,
        pdu=row.pdu,
    )


def aws_credential(keyring: Keyring, row: CredentialRow) -> Credential:
    """An ``aws_key`` credential as the AWS driver takes it: the access key id as the
    username, the secret access key as the secret. Stored either way: the access key id
    as the credential's username and the secret key alone, or no username and
    ``<access key id>:<secret access key>`` as the secret.

    Raises:
        SecretUnavailable: the credential does not open (its key id is named).
        InvalidInput: it is not an access key pair (named, never shown).
    """
    what = f"credential {row.name} ({row.id})"
    if row.kind != CredentialKind.AWS_KEY.value:
        raise InvalidInput(f"{what} is a {row.kind}, not an aws_key", field="credential")
    secret = open_credential(keyring, row)
    if row.username:
        return Credential(username=row.username, secret=secret)
    key_id, sep, key = secret.partition(":")
    if not sep or not key_id.strip() or not key.strip():
        raise InvalidInput(
            f"{what}: not an access key pair; store it as <access key id>:<secret access "
            "key>, or with the access key id as its username",
            field="credential",
        )
    return Credential(username=key_id.strip(), secret=key.strip())


class DbHostDirectory:
    """``HostDirectory`` over the store. Each call is its own transaction."""

    def __init__(self, *, db: Database, keyring: Keyring, clock: Clock) -> None:
        self._db = db
        self._keyring = keyring
        self._clock = clock

    async def host(self, host_id: str) -> HostAccess | None:
        if not is_id(host_id):
            return None
        async with self._db.session() as session:
            row = await session.get(HostRow, host_id)
            return None if row is None else await host_access(session, self._keyring, row)

    async def hosts(self, cluster_id: str) -> list[HostAccess]:
        async with self._db.session() as session:
            rows = (
                await session.scalars(
                    select(HostRow)
                    .where(HostRow.cluster_id == cluster_id)
                    .order_by(HostRow.hostname)
                )
            ).all()
            return [await host_access(session, self._keyring, r) for r in rows]

    async def claim_spare(self, cluster_id: str, client_token: str) -> HostAccess | None:
        for _attempt in range(3):
            try:
                async with self._db.transaction() as session:
                    return await self._claim(session, cluster_id, client_token)
            except IntegrityError:
                continue  # the same token won elsewhere a moment ago: read its host
        async with self._db.transaction() as session:
            return await self._claim(session, cluster_id, client_token)

    async def _claim(
        self, session: AsyncSession, cluster_id: str, client_token: str
    ) -> HostAccess | None:
        if session.get_bind().dialect.name == "postgresql":
            await session.execute(
                text("SELECT pg_advisory_xact_lock(hashtextextended(:key, 0))"),
                {"key": f"claim-spare {cluster_id}"},
            )
        mine = await session.scalar(select(HostRow).where(HostRow.claim_token == client_token))
        if mine is not None:
            return await host_access(session, self._keyring, mine)
        # A member host no node runs on yet (a new bare-metal cluster's machines) first,
        # then the spare pool: a spare stays for a failover while a member is free.
        row = await session.scalar(
            select(HostRow)
            .where(
                HostRow.cluster_id == cluster_id,
                HostRow.state == HostState.IN_SERVICE.value,
                HostRow.node_id.is_(None),
                HostRow.claim_token.is_(None),
            )
            .order_by(HostRow.hostname)
            .limit(1)
            .with_for_update()  # an import or a bind of that row waits, or is waited for
        )
        if row is not None:
            row.claim_token = client_token
            row.updated_at = self._clock.now()
            await session.flush()
            return await host_access(session, self._keyring, row)
        row = await session.scalar(
            select(HostRow)
            .where(HostRow.cluster_id == cluster_id, HostRow.state == HostState.SPARE.value)
            .order_by(HostRow.hostname)
            .limit(1)
            .with_for_update()  # an import or a bind of that row waits, or is waited for
        )
        if row is None:
            return None
        row.claim_token = client_token
        switch_host_state(
            session, host=row, target=HostState.CLAIMED, actor=ACTOR,
            reason=f"claimed from the spare pool (claim {client_token})", now=self._clock.now(),
            data={"claim_token": client_token},
        )  # fmt: skip
        await session.flush()  # a token claimed twice fails here, on its unique index
        return await host_access(session, self._keyring, row)

    async def release(self, host_id: str) -> None:
        async with self._db.transaction() as session:
            row = await session.get(HostRow, host_id) if is_id(host_id) else None
            if row is None:
                raise NotFound(f"host {host_id!r} not found", field="host_id")
            take_out_of_service(
                session, host=row, actor=ACTOR, now=self._clock.now(),
                reason="released: flagged for hardware service",
            )  # fmt: skip
