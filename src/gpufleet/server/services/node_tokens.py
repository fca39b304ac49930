"""Re-issuing a node's token.

The provisioning loop hands a new machine its node token in user data. A machine that
cannot take user data (bare metal from the host inventory: a BMC carries none) or an
agent reinstalled by hand gets its token here instead, from a project admin: the node's
previous token stops working at once. A node token never expires, so only a credential
that does not expire either may create one (``core.credentials``: no credential creates
one that outlives it).
"""

from __future__ import annotations

import datetime as dt

from gpufleet.core.credentials import Limits, check_mint
from gpufleet.core.enums import EventKind
from gpufleet.core.errors import Conflict, Forbidden
from gpufleet.core.models import IssuedNodeToken
from gpufleet.core.rbac import Permission
from gpufleet.server.db.engine import Database
from gpufleet.server.services.audit import record_audit
from gpufleet.server.services.auth import NODE_TOKEN_PREFIX, Caller, generate_token, hash_token
from gpufleet.server.services.events import record_event
from gpufleet.server.services.node_callers import REFUSED_NODE_STATES
from gpufleet.server.services.nodes import get_node_row_or_error


def require_node_token_minter(caller: Caller, project_id: str, *, what: str) -> None:
    """``caller`` may make what leads to node tokens (a node token, an enroll token) in
    ``project_id``: its admin (``host.manage``), with a credential that does not expire
    and is not scoped elsewhere, since a node token never expires.

    Raises:
        Forbidden: naming what was asked and why not.
    """
    if not caller.can(Permission.HOST_MANAGE, project_id):
        raise Forbidden(
            f"{what} needs {Permission.HOST_MANAGE.value} in the project (its admin role)"
        )
    if caller.limits.expires_at is not None:
        raise Forbidden(
            f"{what}: a node token never expires, and this credential expires at "
            f"{caller.limits.expires_at.isoformat()}: no credential creates one that "
            "outlives it; use a token without an expiry or a console login"
        )
    check_mint(
        caller.limits, Limits(project_id=project_id, role=caller.limits.role, expires_at=None)
    )


async def issue_node_token(
    db: Database, *, caller: Caller, node_id: str, now: dt.datetime
) -> IssuedNodeToken:
    """A new token for the node; the old one is refused from now on.

    Raises:
        NotFound: no such node, or one the caller cannot see.
        Forbidden: the caller is not the project's admin, or its credential expires or is
            scoped to another project (a node token would outlive or outreach it).
        Conflict: the node is being removed or is removed.
    """
    async with db.transaction() as session:
        node, cluster = await get_node_row_or_error(session, caller=caller, node_id=node_id)
        require_node_token_minter(caller, cluster.project_id, what="issuing a node token")
        if node.state in REFUSED_NODE_STATES:
            raise Conflict(f"node {node.name} is {node.state}: it takes no token", field="node_id")
        token = generate_token(NODE_TOKEN_PREFIX)
        node.token_hash = hash_token(token)
        message = f"node {node.name}: a new node token was issued; the previous one is refused"
        record_event(
            session,
            kind=EventKind.NODE_TOKEN_ISSUED,
            message=message,
            project_id=cluster.project_id,
            cluster_id=cluster.id,
            node_id=node.id,
            actor=caller.actor,
            ts=now,
        )
        record_audit(
            session,
            actor=caller.actor,
            action="node.token_issue",
            object_type="node",
            object_id=node.id,
            project_id=cluster.project_id,
            source_ip=caller.source_ip,
            detail={"node": node.name, "cluster": cluster.name},
            ts=now,
        )
        return IssuedNodeToken(
            node_id=node.id, node_name=node.name, cluster_id=cluster.id, token=token
        )
