"""Node callers: which node an agent request comes from, decided in one place.

A node's agent signs its requests with the node's token (``gpfn_…``); the node row keeps
its hash (``NodeRow.token_hash``, set when the machine is provisioned or reinstalled,
cleared when it is released). This module is the only one that looks a node up by that
hash, and ``REFUSED_NODE_STATES`` is the one list of states whose token no longer works:
a node being removed must not come back to life by reporting.

* ``node_token_hash(token)``: the hash of a bearer token that is a node token, checked
  from the header alone (``server.deps.node_token``: 401 before the body is read).
* ``resolve_node_caller(session, token_hash=…)`` → ``NodeCaller``, what every agent route
  receives through ``server.deps.NodeCallerDep``.
* ``node_of_caller(session, caller, for_update=…)`` → the node row, read again in the
  service's own transaction: for a service that writes the node row (finding changes,
  under its row lock) or answers after a wait (the command long poll). The token and the
  refused states are checked again there.
* ``nodes_by_token_hash(session, token_hashes=…)``: many tokens in one query, for the
  report ingest's group commit (``services.agent_reports``), where a query per request
  would cost more than the write.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from gpufleet.core.enums import NodeState
from gpufleet.core.errors import Unauthorized
from gpufleet.server.db.tables import ClusterRow, NodeRow
from gpufleet.server.services.auth import NODE_TOKEN_PREFIX, hash_token

# A node in these states is on its way out: its token is refused everywhere. (A released
# machine's token is gone as well: its node row's hash is cleared, so no lookup finds it.)
REFUSED_NODE_STATES = frozenset({NodeState.REMOVING.value, NodeState.REMOVED.value})
REFUSED = "unknown or revoked node token"


@dataclass(frozen=True)
class NodeCaller:
    """The node an agent request comes from, as its token named it when it was resolved."""

    node_id: str
    name: str
    cluster_id: str
    project_id: str
    state: NodeState
    token_hash: str = field(repr=False)


def node_token_hash(token: str) -> str:
    """The stored form of a node token; ``Unauthorized`` for any other kind of token."""
    if not token.startswith(NODE_TOKEN_PREFIX):
        raise Unauthorized("agent endpoints take a node token")
    return hash_token(token)


def _accepts(node: NodeRow) -> bool:
    return node.token_hash is not None and node.state not in REFUSED_NODE_STATES


async def resolve_node_caller(session: AsyncSession, *, token_hash: str) -> NodeCaller:
    """The node holding this token; ``Unauthorized`` if none does or it is refused."""
    found = (
        await session.execute(
            select(NodeRow, ClusterRow.project_id)
            .join(ClusterRow, ClusterRow.id == NodeRow.cluster_id)
            .where(NodeRow.token_hash == token_hash)
        )
    ).first()
    if found is None or not _accepts(found[0]):
        raise Unauthorized(REFUSED)
    node, project_id = found
    return NodeCaller(
        node_id=node.id,
        name=node.name,
        cluster_id=node.cluster_id,
        project_id=project_id,
        state=NodeState(node.state),
        token_hash=token_hash,
    )


async def node_of_caller(
    session: AsyncSession, caller: NodeCaller, *, for_update: bool = False
) -> NodeRow:
    """The caller's node row in this transaction (locked with ``for_update``), if its token
    still is the caller's and the node is not refused since; else ``Unauthorized``."""
    query = select(NodeRow).where(
        NodeRow.id == caller.node_id, NodeRow.token_hash == caller.token_hash
    )
    node = await session.scalar(query.with_for_update() if for_update else query)
    if node is None or not _accepts(node):
        raise Unauthorized(REFUSED)
    return node


async def nodes_by_token_hash(
    session: AsyncSession, *, token_hashes: Collection[str]
) -> dict[str, tuple[NodeRow, str]]:
    """Token hash → (node row, project id) for each token that names a node not refused;
    tokens that name none are left out."""
    rows = (
        await session.execute(
            select(NodeRow, ClusterRow.project_id)
            .join(ClusterRow, ClusterRow.id == NodeRow.cluster_id)
            .where(NodeRow.token_hash.in_(list(token_hashes)))
        )
    ).all()
    return {
        node.token_hash: (node, project_id)
        for node, project_id in rows
        if node.token_hash is not None and _accepts(node)
    }


__all__ = [
    "REFUSED",
    "REFUSED_NODE_STATES",
    "NodeCaller",
    "node_of_caller",
    "node_token_hash",
    "nodes_by_token_hash",
    "resolve_node_caller",
]
