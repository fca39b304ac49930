"""FastAPI dependencies: the app context, the authenticated caller, ``Allow``, the
one permission check every user route declares, and ``NodeCallerDep``, the node an agent
route's request comes from.

``caller: Annotated[Caller, Allow(Permission.CLUSTER_DELETE)]`` resolves the caller,
finds every object the request names (path ``cluster_id``, query ``?cluster=``, body
``"project"``...), and checks ``core.rbac`` in each object's project:

- no valid credentials: 401 (before anything is looked up);
- an object that does not exist, or lives in a project the caller is not in: 404, with
  the same message either way, so existence does not leak;
- a project the caller is in, with a role that lacks the permission: 403;
- a request that names no object (a listing): the caller must hold the permission in
  at least one project; the service then shows only those projects.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Annotated, Any, Generic, TypeVar

from fastapi import Depends, Request
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ValidationError
from sqlalchemy import bindparam, or_, select
from sqlalchemy.ext.asyncio import AsyncSession

from gpufleet.core.errors import Forbidden, NotFound, Unauthorized
from gpufleet.core.ids import is_id
from gpufleet.core.rbac import OWNER_ONLY, Permission
from gpufleet.server.context import AppContext
from gpufleet.server.db.tables import (
    AcceptanceRunRow,
    ApiTokenRow,
    CheckRunRow,
    ClusterRow,
    NodeCommandRow,
    NodeRow,
    ProjectRow,
    RepairRow,
    RolloutRow,
)
from gpufleet.server.services.audit import AuditTarget, current_request
from gpufleet.server.services.auth import Caller, resolve_caller
from gpufleet.server.services.enrollment import enroll_token_hash
from gpufleet.server.services.node_callers import (
    NodeCaller,
    node_token_hash,
    resolve_node_caller,
)
from gpufleet.server.services.sessions import (
    CSRF_HEADER,
    SAFE_METHODS,
    SESSION_COOKIE,
    check_csrf,
    resolve_session_caller,
)


async def get_ctx(request: Request) -> AppContext:  # async: no threadpool hop per request
    ctx: AppContext = request.app.state.ctx
    return ctx


CtxDep = Annotated[AppContext, Depends(get_ctx)]


def bearer_token(request: Request) -> str:  # called directly, not as a dependency
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise Unauthorized("missing bearer token (Authorization: Bearer <token>)")
    return token.strip()


def client_ip(request: Request) -> str | None:
    return request.client.host if request.client else None


async def _resolve_caller(request: Request, ctx: AppContext, session: AsyncSession) -> Caller:
    source_ip = client_ip(request)
    secret = request.cookies.get(SESSION_COOKIE)
    if "authorization" in request.headers or not secret:
        return await resolve_caller(session, token=bearer_token(request), source_ip=source_ip)
    if request.method not in SAFE_METHODS:
        check_csrf(secret=secret, header=request.headers.get(CSRF_HEADER))
    return await resolve_session_caller(
        session, secret=secret, now=ctx.clock.now(), source_ip=source_ip
    )


async def get_caller(request: Request, ctx: CtxDep) -> Caller:
    """The caller by bearer token, else by console session cookie (with CSRF rules).

    A bearer token wins when both come: API clients are never subject to the cookie's
    CSRF check, and a browser cannot be made to send an Authorization header cross-site.
    """
    if "authorization" in request.headers or not request.cookies.get(SESSION_COOKIE):
        bearer_token(request)  # 401 before the store is touched
    async with ctx.db.reader() as session:
        caller = await _resolve_caller(request, ctx, session)
        await session.commit()  # a token's last use, a console session's renewal
    return caller


CallerDep = Annotated[Caller, Depends(get_caller)]


# -- node callers (agent routes) --------------------------------------------------------


async def node_token(request: Request) -> str:
    """The node token's hash, from the header alone: a caller without one is refused
    before the body is read, and learns nothing of it."""
    return node_token_hash(bearer_token(request))


NodeToken = Annotated[str, Depends(node_token)]


async def enroll_token(request: Request) -> str:
    """The enroll token's hash, from the header alone: a caller without one is refused
    before the body is read, and learns nothing of it."""
    return enroll_token_hash(bearer_token(request))


EnrollToken = Annotated[str, Depends(enroll_token)]


async def get_node_caller(token_hash: NodeToken, ctx: CtxDep) -> NodeCaller:
    """The node whose agent calls: 401 for an unknown token or a node being removed."""
    async with ctx.db.reader() as session:
        return await resolve_node_caller(session, token_hash=token_hash)


# Every agent route takes this. The one exception is ``POST /agent/reports``, which takes
# ``NodeToken`` and leaves the lookup to the ingest's group commit: one query for every
# batch in the group (``services.agent_reports``), with the same refused states.
NodeCallerDep = Annotated[NodeCaller, Depends(get_node_caller)]

# The dependencies that authenticate an agent, and those that authenticate a person
# (besides ``Guard``, behind ``Allow``): the OpenAPI document lists 401 for their routes.
AGENT_AUTH = frozenset({node_token, get_node_caller, enroll_token})


M = TypeVar("M", bound=BaseModel)


class JsonBody(Generic[M]):
    """A JSON body, parsed by a dependency rather than by FastAPI: declared after the
    route's credential (``body: Annotated[M, Depends(JsonBody(M))]``), it is read only
    once the caller is known, so a forged token is a 401 whatever the body. FastAPI
    parses a declared body before any dependency runs. The route declares the schema
    with ``openapi_extra=body_schema(M)``."""

    def __init__(self, model: type[M]) -> None:
        self.model = model

    async def __call__(self, request: Request) -> M:
        return parse_json_body(self.model, await request.body())


def parse_json_body(model: type[M], raw: bytes) -> M:
    """``model`` from a body's bytes; the same 400/422 answers as a FastAPI body."""
    try:
        return model.model_validate_json(raw)
    except ValidationError as exc:
        raise RequestValidationError(
            [{**e, "loc": ("body", *e["loc"])} for e in exc.errors(include_url=False)]
        ) from None


def body_schema(model: type[BaseModel]) -> dict[str, Any]:
    """OpenAPI for a body the route parses itself (``JsonBody``, ``post_reports``)."""
    return {
        "requestBody": {
            "required": True,
            "content": {
                "application/json": {
                    "schema": model.model_json_schema(ref_template="#/components/schemas/{model}")
                }
            },
        }
    }


# -- what a request is about ------------------------------------------------------------


@dataclass(frozen=True)
class Scope:
    """An object's project, and the user it belongs to (tokens), if any."""

    project_id: str | None
    user_id: str | None = None


Resolver = Callable[[AsyncSession, str], Awaitable[Scope | None]]


async def _project(session: AsyncSession, ref: str) -> Scope | None:
    match = or_(ProjectRow.id == ref, ProjectRow.name == ref) if is_id(ref) else None
    query = select(ProjectRow.id).where(match if match is not None else ProjectRow.name == ref)
    found = await session.scalar(query)
    return None if found is None else Scope(found)


# The resolvers' statements are built once (an object's project is looked up on most
# requests, and building a statement and its cache key cost more than running it).
_CLUSTER_PROJECT = select(ClusterRow.project_id).where(ClusterRow.id == bindparam("ref"))
_NODE_PROJECT = (
    select(ClusterRow.project_id)
    .join(NodeRow, NodeRow.cluster_id == ClusterRow.id)
    .where(NodeRow.id == bindparam("ref"))
)


async def _cluster(session: AsyncSession, ref: str) -> Scope | None:
    if not is_id(ref):
        return None
    found = await session.scalar(_CLUSTER_PROJECT, {"ref": ref})
    return None if found is None else Scope(found)


async def _node(session: AsyncSession, ref: str) -> Scope | None:
    if not is_id(ref):
        return None
    found = await session.scalar(_NODE_PROJECT, {"ref": ref})
    return None if found is None else Scope(found)


def _in_cluster(row: Any) -> Resolver:
    """For objects that belong to one cluster (repairs, check runs, commands...)."""
    query = (
        select(ClusterRow.project_id)
        .join(row, row.cluster_id == ClusterRow.id)
        .where(row.id == bindparam("ref"))
    )

    async def resolve(session: AsyncSession, ref: str) -> Scope | None:
        if not is_id(ref):
            return None
        found = await session.scalar(query, {"ref": ref})
        return None if found is None else Scope(found)

    return resolve


async def _token(session: AsyncSession, ref: str) -> Scope | None:
    if not is_id(ref):
        return None
    found = (
        await session.execute(
            select(ApiTokenRow.project_id, ApiTokenRow.user_id).where(ApiTokenRow.id == ref)
        )
    ).first()
    return None if found is None else Scope(found[0], user_id=found[1])


# Object kinds a request can name, and where it names them. A route whose path has a
# parameter that is neither here nor in UNSCOPED_PATH_PARAMS fails the route matrix test.
RESOLVERS: dict[str, Resolver] = {
    "project": _project,
    "cluster": _cluster,
    "node": _node,
    "repair": _in_cluster(RepairRow),
    "check run": _in_cluster(CheckRunRow),
    "command": _in_cluster(NodeCommandRow),
    "acceptance run": _in_cluster(AcceptanceRunRow),
    "rollout": _in_cluster(RolloutRow),
    "token": _token,
}
PATH_PARAMS = {
    "project_ref": "project",
    "cluster_id": "cluster",
    "node_id": "node",
    "repair_id": "repair",
    "check_id": "check run",
    "run_id": "check run",
    "command_id": "command",
    "acceptance_id": "acceptance run",
    "rollout_id": "rollout",
    "token_id": "token",
}
QUERY_PARAMS = {"project": "project", "cluster": "cluster", "node": "node"}
BODY_FIELDS = {"project": "project", "cluster": "cluster", "cluster_id": "cluster"}
# Path parameters looked up inside a project the path already names (or not objects).
UNSCOPED_PATH_PARAMS = frozenset(
    {
        "user_ref",
        "volume_ref",
        "signature",
        "credential_ref",
        "host_ref",
        "label_name",
        "stack_name",  # a stack is the platform's, in no project
    }
)


@dataclass(frozen=True)
class _Ref:
    kind: str
    value: str
    field: str


async def _json_body(request: Request) -> dict[str, Any]:
    if request.method in SAFE_METHODS:
        return {}
    if "json" not in request.headers.get("content-type", ""):
        return {}
    raw = await request.body()  # FastAPI read it already; Starlette keeps it
    try:
        body = json.loads(raw) if raw else {}
    except ValueError:
        return {}  # the route's own parsing answers 400
    return body if isinstance(body, dict) else {}


# The error's field for an object that is not there, as the services name it.
_FIELDS = {"project": "project", "cluster": "cluster_id", "node": "node_id"}


def _ref(kind: str, value: object, name: str) -> _Ref | None:
    """A reference worth looking up. One that cannot name any object (not an id; a name
    longer than any project's) is left to the route, which answers 404 or 422 itself:
    skipping it leaks nothing."""
    if not isinstance(value, str) or not value:
        return None
    if (kind == "project" and len(value) > 63) or (kind != "project" and not is_id(value)):
        return None
    return _Ref(kind, value, _FIELDS.get(kind, name))


async def _refs(request: Request) -> list[_Ref]:
    found = [
        _ref(PATH_PARAMS[name], value, name)
        for name, value in request.path_params.items()
        if name in PATH_PARAMS
    ]
    found += [
        _ref(kind, request.query_params.get(name), name) for name, kind in QUERY_PARAMS.items()
    ]
    body = await _json_body(request)
    found += [_ref(kind, body.get(name), name) for name, kind in BODY_FIELDS.items()]
    return [r for r in found if r is not None]


class Guard:
    """The dependency behind ``Allow``; ``permission`` None: any signed-in caller."""

    def __init__(self, permission: Permission | None, *, own: bool = False) -> None:
        self.permission = permission
        # own: the object's user (a token's) may act on it whatever their role.
        self.own = own

    def __repr__(self) -> str:
        return f"Allow({self.permission.value if self.permission else 'signed-in'})"

    async def __call__(self, request: Request, ctx: CtxDep) -> Caller:
        if "authorization" in request.headers or not request.cookies.get(SESSION_COOKIE):
            bearer_token(request)  # 401 before the store is touched
        refs = await _refs(request)
        scopes: list[tuple[_Ref, Scope | None]] = []
        # One session for the caller and the objects, with no transaction around these
        # reads on PostgreSQL (``Database.reader``): no BEGIN and COMMIT round trips.
        async with ctx.db.reader() as session:
            caller = await _resolve_caller(request, ctx, session)
            for ref in refs:
                scopes.append((ref, await RESOLVERS[ref.kind](session, ref.value)))
            await session.commit()  # a token's last use, a console session's renewal
        self._note_target(caller, scopes)
        permission = self.permission
        if permission is None:
            return caller
        if permission in OWNER_ONLY:
            if not caller.acts_as_owner:
                raise Forbidden(f"only the platform owner may do this ({permission.value})")
            return caller
        for ref, scope in scopes:
            self._check(caller, permission, ref, scope)
        if not scopes and not _holds_somewhere(caller, permission):
            raise Forbidden(f"your role in no project allows {permission.value}")
        return caller

    def _check(
        self, caller: Caller, permission: Permission, ref: _Ref, scope: Scope | None
    ) -> None:
        not_found = NotFound(f"{ref.kind} {ref.value!r} not found", field=ref.field)
        if scope is None:
            raise not_found
        if self.own and scope.user_id is not None and scope.user_id == caller.user_id:
            return
        if caller.acts_as_owner:
            return
        if scope.project_id is None or caller.role_in(scope.project_id) is None:
            raise not_found
        if not caller.can(permission, scope.project_id):
            raise Forbidden(f"your role in this project does not allow {permission.value}")

    def _note_target(self, caller: Caller, scopes: list[tuple[_Ref, Scope | None]]) -> None:
        """What the audit row of a refused mutation names."""
        info = current_request.get()
        if info is None:
            return
        # The first object that exists names the target; else the first one named.
        found = [(r, s) for r, s in scopes if s is not None] or scopes[:1]
        ref, scope = found[0] if found else (None, None)
        info.target = AuditTarget(
            actor=caller.actor,
            permission=self.permission.value if self.permission else "signed-in",
            project_id=scope.project_id if scope else None,
            object_type=ref.kind.replace(" ", "_") if ref else None,
            object_id=ref.value if ref and is_id(ref.value) else None,
        )


def _holds_somewhere(caller: Caller, permission: Permission) -> bool:
    visible = caller.visible_project_ids()
    if visible is None:
        return True
    return any(caller.can(permission, project_id) for project_id in visible)


def Allow(permission: Permission | None, *, own: bool = False) -> Any:
    """``caller: Annotated[Caller, Allow(Permission.X)]``: the route's one permission."""
    return Depends(Guard(permission, own=own))


SignedIn = Annotated[Caller, Allow(None)]
