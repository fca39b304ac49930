"""Enrollment: how a bare-metal machine's agent gets its node token.

A cloud hands a new machine its node token in user data; a BMC or an SSH login cannot.
Instead a project admin makes the cluster an **enroll token** (``gpufleet clusters
enroll-token``, shown once, 24 h by default) and the install (PXE kickstart, an image, an
Ansible run) puts it on every machine of the cluster. On first start the agent sends it
with its hostname (``POST /api/v1/agent/enroll``) and gets back the token of the node that
waits for that host, which it keeps in its token file from then on.

What an enroll token can do, and no more:
- enroll as a node of its own cluster only, and only as the node bound to the inventory
  host of the hostname sent;
- only while that node waits for an agent (``enroll_open_at``): set when provisioning
  claims the host, when a reprovision reinstalls it and when a failover moves the node to
  a spare; cleared by the enrollment. A node whose agent already enrolled cannot be taken
  over by another machine holding the same enroll token;
- never after it expired, after a newer one replaced it, or once the cluster is deleted.

A node token never expires, so like ``gpufleet nodes token`` only a credential that does
not expire may make an enroll token (issue 20: no credential creates one that outlives
it), and only a project admin (``host.manage``).
"""

from __future__ import annotations

import datetime as dt

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from gpufleet.core.agent_protocol import EnrollAck, EnrollRequest
from gpufleet.core.clock import as_utc
from gpufleet.core.enums import BARE_METAL_PROVIDERS, ClusterStatus, EventKind, ProviderKind
from gpufleet.core.errors import Conflict, InvalidInput, NotFound, Unauthorized
from gpufleet.core.models import EnrollTokenRequest, IssuedEnrollToken
from gpufleet.server.db.engine import Database
from gpufleet.server.db.tables import ClusterRow, HostRow, NodeRow
from gpufleet.server.services.audit import record_audit
from gpufleet.server.services.auth import NODE_TOKEN_PREFIX, Caller, generate_token, hash_token
from gpufleet.server.services.clusters import get_cluster_row_or_error
from gpufleet.server.services.events import record_event
from gpufleet.server.services.hosts import bind_node_to_host
from gpufleet.server.services.node_callers import REFUSED_NODE_STATES
from gpufleet.server.services.node_tokens import require_node_token_minter

ENROLL_TOKEN_PREFIX = "gpfe_"  # noqa: S105 - a prefix, not a secret
REFUSED = "unknown, replaced or expired enroll token"
_CLOSED = (ClusterStatus.DELETING.value, ClusterStatus.DELETED.value)


def takes_no_user_data(provider: str) -> bool:
    """True for providers whose machines cannot be handed a token at boot (a BMC or an
    SSH login carries no user data): their agents enroll instead."""
    try:
        return ProviderKind(provider) in BARE_METAL_PROVIDERS
    except ValueError:
        return False


async def issue_enroll_token(
    db: Database,
    *,
    caller: Caller,
    cluster_id: str,
    request: EnrollTokenRequest,
    now: dt.datetime,
) -> IssuedEnrollToken:
    """A new enroll token for the cluster, shown this once; the previous one stops working.

    Raises:
        NotFound: no such cluster, or one the caller cannot see.
        Forbidden: the caller is not the project's admin, or its credential expires or is
            scoped to another project (the node tokens it leads to never expire).
        Conflict: the cluster is being deleted.
        InvalidInput: the cluster's machines get their token in user data (sim, cloud).
    """
    async with db.transaction() as session:
        cluster = await get_cluster_row_or_error(session, caller=caller, cluster_id=cluster_id)
        require_node_token_minter(caller, cluster.project_id, what="making an enroll token")
        if cluster.status in _CLOSED:
            raise Conflict(f"cluster {cluster.name} is {cluster.status}", field="cluster_id")
        if not takes_no_user_data(cluster.provider):
            raise InvalidInput(
                f"cluster {cluster.name} runs on provider {cluster.provider!r}, which hands "
                "each machine its node token at boot: its agents do not enroll",
                field="cluster_id",
            )
        token = generate_token(ENROLL_TOKEN_PREFIX)
        expires_at = now + dt.timedelta(seconds=request.ttl_s)
        cluster.enroll_token_hash = hash_token(token)
        cluster.enroll_token_expires_at = expires_at
        cluster.updated_at = now
        record_event(
            session,
            kind=EventKind.CLUSTER_ENROLL_TOKEN,
            message=f"cluster {cluster.name}: a new enroll token, until "
            f"{expires_at.isoformat()}; the previous one is refused",
            project_id=cluster.project_id,
            cluster_id=cluster.id,
            actor=caller.actor,
            ts=now,
        )
        record_audit(
            session,
            actor=caller.actor,
            action="cluster.enroll_token",
            object_type="cluster",
            object_id=cluster.id,
            project_id=cluster.project_id,
            source_ip=caller.source_ip,
            detail={"cluster": cluster.name, "expires_at": expires_at.isoformat()},
            ts=now,
        )
        return IssuedEnrollToken(
            cluster_id=cluster.id, cluster_name=cluster.name, token=token, expires_at=expires_at
        )


def enroll_token_hash(token: str) -> str:
    """The stored form of an enroll token; ``Unauthorized`` for any other kind."""
    if not token.startswith(ENROLL_TOKEN_PREFIX):
        raise Unauthorized("enrollment takes a cluster's enroll token (gpfe_...)")
    return hash_token(token)


async def check_enroll_token(db: Database, *, token_hash: str, now: dt.datetime) -> None:
    """``Unauthorized`` unless the enroll token opens a cluster now: checked before the
    request's body is read, so a forged token learns nothing of what a body should be."""
    async with db.session() as session:
        await _cluster_of_token(session, token_hash=token_hash, now=now)


async def _cluster_of_token(
    session: AsyncSession, *, token_hash: str, now: dt.datetime
) -> ClusterRow:
    cluster = await session.scalar(
        select(ClusterRow).where(ClusterRow.enroll_token_hash == token_hash)
    )
    if (
        cluster is None
        or cluster.status in _CLOSED
        or cluster.enroll_token_expires_at is None
        or as_utc(cluster.enroll_token_expires_at) <= now
    ):
        raise Unauthorized(REFUSED)
    return cluster


async def enroll(
    db: Database,
    *,
    token_hash: str,
    request: EnrollRequest,
    source_ip: str | None,
    now: dt.datetime,
) -> EnrollAck:
    """Trade the enroll token and a hostname for the token of the node waiting for that
    host. The node's previous token (if any) is refused from now on.

    Raises:
        Unauthorized: the enroll token is unknown, replaced, expired or its cluster deleted.
        NotFound: the hostname is no host of the token's cluster in the inventory.
        Conflict: no node waits for that host's agent (not claimed yet: the agent retries;
            or its agent already enrolled: a reinstall by hand needs ``gpufleet nodes
            token``).
    """
    async with db.transaction() as session:
        cluster = await _cluster_of_token(session, token_hash=token_hash, now=now)
        host = await session.scalar(
            select(HostRow).where(
                HostRow.hostname == request.hostname, HostRow.cluster_id == cluster.id
            )
        )
        if host is None:
            raise NotFound(
                f"no host named {request.hostname!r} in cluster {cluster.name}'s inventory: "
                "import it (gpufleet hosts import) or fix the machine's hostname",
                field="hostname",
            )
        node = await session.scalar(
            select(NodeRow)
            .where(
                NodeRow.cluster_id == cluster.id,
                NodeRow.provider_instance_id == host.id,
                NodeRow.state.not_in(REFUSED_NODE_STATES),
            )
            .with_for_update()
        )
        if node is None:
            raise Conflict(
                f"host {host.hostname} runs no node of cluster {cluster.name} yet (it is "
                f"{host.state}); the agent tries again until provisioning claims it",
                field="hostname",
            )
        again = _answer_lost(node, request, now=now)
        if node.enroll_open_at is None and not again:
            raise Conflict(
                f"node {node.name} on host {host.hostname} already enrolled and its agent "
                "holds its token; for an agent reinstalled by hand, issue a new one "
                "(gpufleet nodes token)",
                field="hostname",
            )
        token = generate_token(NODE_TOKEN_PREFIX)
        node.token_hash = hash_token(token)
        node.enroll_open_at = None
        node.enrolled_at, node.enrolled_boot_id = now, request.boot_id
        node.updated_at = now
        if not again:
            await bind_node_to_host(
                session, host=host, node=node, actor=f"enroll:{cluster.name}",
                reason=f"agent on {host.hostname} enrolled as node {node.name}", now=now,
            )  # fmt: skip
        record_event(
            session,
            kind=EventKind.NODE_ENROLLED,
            message=f"node {node.name}: the agent on host {host.hostname} enrolled"
            + (f" (boot id {request.boot_id})" if request.boot_id else "")
            + ("; again: the answer to its first enrollment was lost" if again else ""),
            project_id=cluster.project_id,
            cluster_id=cluster.id,
            node_id=node.id,
            actor=f"enroll:{cluster.name}",
            ts=now,
            data={"host_id": host.id, "hostname": host.hostname},
        )
        record_audit(
            session,
            actor=f"enroll:{cluster.name}",
            action="node.enroll",
            object_type="node",
            object_id=node.id,
            project_id=cluster.project_id,
            source_ip=source_ip,
            detail={"node": node.name, "host": host.hostname},
            ts=now,
        )
        return EnrollAck(
            node_id=node.id, node_name=node.name, cluster_id=cluster.id, node_token=token
        )


# How long after an enrollment the same machine may ask again, its answer lost (the
# replica died after committing it, the connection dropped): minutes, not days.
ENROLL_RETRY_S = 600.0


def _answer_lost(node: NodeRow, request: EnrollRequest, *, now: dt.datetime) -> bool:
    """The node's agent enrolled, but the same machine (same kernel boot id) asks again,
    soon, and no report came with the token it was given: that answer never reached it.
    The token is issued again (the first one is refused from then on). A machine that
    booted since, or an agent that reported, is an already enrolled node (409)."""
    enrolled = node.enrolled_at
    if enrolled is None or request.boot_id is None or request.boot_id != node.enrolled_boot_id:
        return False
    if node.last_report_at is not None and node.last_report_at >= enrolled:
        return False
    return (now - enrolled).total_seconds() <= ENROLL_RETRY_S


def open_enrollment(node: NodeRow, *, now: dt.datetime) -> None:
    """The node waits for a (re)installed machine's agent: its token is void until then.
    The caller holds the node's row lock."""
    node.token_hash = None
    node.enroll_open_at = now
    node.updated_at = now
