"""A STAND-IN for Grafana's HTTP API, not Grafana: no Grafana server can be installed
here (test-infra §5), so ``gpufleet grafana sync`` is tested against this.

It implements only the legacy ``/api`` calls sync makes (orgs, folders, data sources,
org users, user lookup and creation, dashboards), with the request and response shapes
of Grafana's HTTP API documentation, and it REJECTS what a real Grafana would refuse or
what the docs do not describe: a wrong basic-auth credential (401), an unknown route
(404), a body with a missing or unknown field or a wrong type (400), an org-scoped call
without ``X-Grafana-Org-Id`` or naming no org (400/401), a role that is not Viewer,
Editor, Admin or None (400), a duplicate (409/412). It keeps everything in memory and
records every request (``requests``; ``writes`` are the non-GET ones) so tests can count.

Use it as an httpx transport: ``GrafanaClient(url, ..., transport=standin.transport())``.
"""

from __future__ import annotations

import base64
import json
import re
from dataclasses import dataclass, field
from typing import Any

import httpx

Json = dict[str, Any]
ROLES = frozenset({"Viewer", "Editor", "Admin", "None"})


class _Reject(Exception):
    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code  # the HTTP status Grafana answers
        self.message = message


@dataclass
class _Org:
    id: int
    name: str
    folders: dict[str, Json] = field(default_factory=dict)
    datasources: dict[str, Json] = field(default_factory=dict)
    members: dict[int, str] = field(default_factory=dict)  # user id → role
    dashboards: dict[str, Json] = field(default_factory=dict)  # uid → {dashboard, folderUid}


def _check_body(body: Any, *, required: dict[str, type], optional: dict[str, type]) -> Json:
    if not isinstance(body, dict):
        raise _Reject(400, "bad request data: body is not a JSON object")
    for name in required:
        if name not in body:
            raise _Reject(400, f"bad request data: {name} is required")
    for name, value in body.items():
        kind = required.get(name) or optional.get(name)
        if kind is None:
            raise _Reject(400, f"bad request data: unknown field {name!r}")
        if value is not None and not isinstance(value, kind):
            raise _Reject(400, f"bad request data: {name} must be {kind.__name__}")
    return body


class GrafanaStandIn:
    def __init__(self, *, admin_user: str = "admin", admin_password: str = "admin") -> None:  # noqa: S107 - a stand-in
        self._auth = "Basic " + base64.b64encode(f"{admin_user}:{admin_password}".encode()).decode()
        self.users: dict[int, Json] = {
            1: {"id": 1, "login": admin_user, "email": "admin@localhost", "name": admin_user}
        }
        self.orgs: dict[int, _Org] = {1: _Org(1, "Main Org.", members={1: "Admin"})}
        self.requests: list[tuple[str, str]] = []
        self._next = 100

    # -- for tests ---------------------------------------------------------------------
    def transport(self) -> httpx.MockTransport:
        return httpx.MockTransport(self.handle)

    @property
    def writes(self) -> list[tuple[str, str]]:
        return [(m, p) for m, p in self.requests if m != "GET"]

    def org_named(self, name: str) -> _Org:
        return next(o for o in self.orgs.values() if o.name == name)

    def login_of(self, user_id: int) -> str:
        return str(self.users[user_id]["login"])

    def _id(self) -> int:
        self._next += 1
        return self._next

    # -- the API -------------------------------------------------------------------------
    def handle(self, request: httpx.Request) -> httpx.Response:
        self.requests.append((request.method, request.url.path))
        try:
            if request.headers.get("authorization") != self._auth:
                raise _Reject(401, "invalid username or password")
            status, body = self._route(request)
        except _Reject as rejected:
            return httpx.Response(rejected.code, json={"message": rejected.message})
        return httpx.Response(status, json=body)

    def _body(self, request: httpx.Request) -> Any:
        if "application/json" not in request.headers.get("content-type", ""):
            raise _Reject(400, "bad request data: expected application/json")
        try:
            return json.loads(request.content)
        except ValueError as exc:
            raise _Reject(400, "bad request data: not JSON") from exc

    def _org_header(self, request: httpx.Request) -> _Org:
        raw = request.headers.get("x-grafana-org-id")
        if raw is None or not raw.isdigit():
            raise _Reject(
                400, "X-Grafana-Org-Id is missing (this stand-in wants every org call scoped)"
            )
        org = self.orgs.get(int(raw))
        if org is None:
            raise _Reject(401, "user is not a member of the organization")
        return org

    def _route(self, request: httpx.Request) -> tuple[int, Any]:
        method, path = request.method, request.url.path
        if method == "GET" and (m := re.fullmatch(r"/api/orgs/name/([^/]+)", path)):
            org = next((o for o in self.orgs.values() if o.name == m.group(1)), None)
            if org is None:
                raise _Reject(404, "Organization not found")
            return 200, {"id": org.id, "name": org.name, "address": {}}
        if method == "POST" and path == "/api/orgs":
            body = _check_body(self._body(request), required={"name": str}, optional={})
            if any(o.name == body["name"] for o in self.orgs.values()):
                raise _Reject(409, "Organization name taken")
            org = _Org(self._id(), body["name"], members={1: "Admin"})  # the creator is Admin
            self.orgs[org.id] = org
            return 200, {"orgId": org.id, "message": "Organization created"}
        if m := re.fullmatch(r"/api/orgs/(\d+)/users(?:/(\d+))?", path):
            return self._org_users(request, int(m.group(1)), m.group(2))
        if method == "GET" and path == "/api/users/lookup":
            who = request.url.params.get("loginOrEmail", "")
            user = next((u for u in self.users.values() if who in (u["login"], u["email"])), None)
            if user is None:
                raise _Reject(404, "user not found")
            return 200, {**user, "isGrafanaAdmin": user["id"] == 1}
        if method == "POST" and path == "/api/admin/users":
            body = _check_body(
                self._body(request),
                required={"login": str, "password": str},
                optional={"name": str, "email": str, "OrgId": int},
            )
            if any(
                body["login"] == u["login"] or body.get("email") == u["email"]
                for u in self.users.values()
            ):
                raise _Reject(412, "user already exists")
            uid = self._id()
            self.users[uid] = {
                "id": uid,
                "login": body["login"],
                "email": body.get("email", ""),
                "name": body.get("name", ""),
            }
            return 200, {"id": uid, "message": "User created"}
        org = self._org_header(request)
        if m := re.fullmatch(r"/api/folders(?:/([^/]+))?", path):
            return self._folders(request, org, m.group(1))
        if m := re.fullmatch(r"/api/datasources(?:/uid/([^/]+))?", path):
            return self._datasources(request, org, m.group(1))
        if method == "GET" and (m := re.fullmatch(r"/api/dashboards/uid/([^/]+)", path)):
            stored = org.dashboards.get(m.group(1))
            if stored is None:
                raise _Reject(404, "Dashboard not found")
            return 200, {
                "dashboard": stored["dashboard"],
                "meta": {"folderUid": stored["folderUid"], "slug": ""},
            }
        if method == "POST" and path == "/api/dashboards/db":
            body = _check_body(
                self._body(request),
                required={"dashboard": dict},
                optional={"folderUid": str, "overwrite": bool, "message": str, "folderId": int},
            )
            dash = body["dashboard"]
            if not dash.get("uid") or not dash.get("title"):
                raise _Reject(400, "Dashboard title cannot be empty / uid required by gpufleet")
            if body.get("folderUid") and body["folderUid"] not in org.folders:
                raise _Reject(400, "folder not found")
            old = org.dashboards.get(dash["uid"])
            if old is not None and not body.get("overwrite"):
                raise _Reject(412, "A dashboard with the same uid already exists")
            version = (old["dashboard"]["version"] + 1) if old else 1
            stored_id = old["dashboard"]["id"] if old else self._id()
            org.dashboards[dash["uid"]] = {
                "dashboard": {**dash, "id": stored_id, "version": version},
                "folderUid": body.get("folderUid", ""),
            }
            return 200, {
                "id": stored_id,
                "uid": dash["uid"],
                "status": "success",
                "version": version,
                "url": f"/d/{dash['uid']}",
                "slug": "",
            }
        raise _Reject(404, "Not found")

    def _org_users(
        self, request: httpx.Request, org_id: int, user_id: str | None
    ) -> tuple[int, Any]:
        org = self.orgs.get(org_id)
        if org is None:
            raise _Reject(404, "Organization not found")
        if request.method == "GET" and user_id is None:
            return 200, [
                {
                    "orgId": org.id,
                    "userId": uid,
                    "login": self.users[uid]["login"],
                    "email": self.users[uid]["email"],
                    "name": self.users[uid]["name"],
                    "role": role,
                }
                for uid, role in sorted(org.members.items())
            ]
        if request.method == "POST" and user_id is None:
            body = _check_body(
                self._body(request), required={"loginOrEmail": str, "role": str}, optional={}
            )
            if body["role"] not in ROLES:
                raise _Reject(400, f"invalid role {body['role']!r}")
            user = next(
                (
                    u
                    for u in self.users.values()
                    if body["loginOrEmail"] in (u["login"], u["email"])
                ),
                None,
            )
            if user is None:
                raise _Reject(404, "User not found")
            if user["id"] in org.members:
                raise _Reject(409, "User is already member of this organization")
            org.members[user["id"]] = body["role"]
            return 200, {"message": "User added to organization", "userId": user["id"]}
        if user_id is None or int(user_id) not in org.members:
            raise _Reject(404, "user not found")
        if request.method == "PATCH":
            body = _check_body(self._body(request), required={"role": str}, optional={})
            if body["role"] not in ROLES:
                raise _Reject(400, f"invalid role {body['role']!r}")
            org.members[int(user_id)] = body["role"]
            return 200, {"message": "Organization user updated"}
        if request.method == "DELETE":
            del org.members[int(user_id)]
            return 200, {"message": "User removed from organization"}
        raise _Reject(405, "method not allowed")

    def _folders(self, request: httpx.Request, org: _Org, uid: str | None) -> tuple[int, Any]:
        if request.method == "GET" and uid is not None:
            folder = org.folders.get(uid)
            if folder is None:
                raise _Reject(404, "folder not found")
            return 200, folder
        if request.method == "POST" and uid is None:
            body = _check_body(
                self._body(request),
                required={"title": str},
                optional={"uid": str, "parentUid": str, "description": str},
            )
            new_uid = body.get("uid") or f"f{self._id()}"
            if len(new_uid) > 40:
                raise _Reject(400, "uid too long, max 40 characters")
            if new_uid in org.folders:
                raise _Reject(409, "a folder with the same uid already exists")
            folder = {
                "id": self._id(),
                "uid": new_uid,
                "title": body["title"],
                "url": f"/dashboards/f/{new_uid}/",
                "version": 1,
            }
            org.folders[new_uid] = folder
            return 200, folder
        if request.method == "PUT" and uid is not None:
            body = _check_body(
                self._body(request),
                required={"title": str},
                optional={"version": int, "overwrite": bool, "description": str},
            )
            folder = org.folders.get(uid)
            if folder is None:
                raise _Reject(404, "folder not found")
            if not body.get("overwrite") and body.get("version") != folder["version"]:
                raise _Reject(412, "the folder has been changed by someone else")
            folder.update(title=body["title"], version=folder["version"] + 1)
            return 200, folder
        raise _Reject(404, "Not found")

    _DS_FIELDS: dict[str, type] = {
        "name": str, "uid": str, "type": str, "access": str, "url": str, "isDefault": bool,
        "jsonData": dict, "secureJsonData": dict, "basicAuth": bool, "user": str, "database": str,
        "withCredentials": bool, "version": int,
    }  # fmt: skip

    def _datasources(self, request: httpx.Request, org: _Org, uid: str | None) -> tuple[int, Any]:
        if request.method == "GET" and uid is not None:
            ds = org.datasources.get(uid)
            if ds is None:
                raise _Reject(404, "Data source not found")
            shown = {k: v for k, v in ds.items() if k != "secureJsonData"}
            shown["secureJsonFields"] = {k: True for k in ds.get("secureJsonData", {})}
            return 200, shown
        if request.method in ("POST", "PUT"):
            optional = {
                k: v for k, v in self._DS_FIELDS.items() if k not in ("name", "type", "access")
            }
            body = _check_body(
                self._body(request),
                required={"name": str, "type": str, "access": str},
                optional=optional,
            )
            if body["access"] not in ("proxy", "direct"):
                raise _Reject(400, "access must be proxy or direct")
            for key, value in body.get("secureJsonData", {}).items():
                if not isinstance(value, str):
                    raise _Reject(400, f"secureJsonData.{key} must be a string")
            if request.method == "POST" and uid is None:
                if body.get("uid") in org.datasources or any(
                    d["name"] == body["name"] for d in org.datasources.values()
                ):
                    raise _Reject(409, "data source with the same name already exists")
                ds_uid = body.get("uid") or f"d{self._id()}"
                org.datasources[ds_uid] = {**body, "uid": ds_uid, "id": self._id(), "orgId": org.id}
                return 200, {
                    "id": org.datasources[ds_uid]["id"],
                    "message": "Datasource added",
                    "name": body["name"],
                }
            if request.method == "PUT" and uid is not None:
                old = org.datasources.get(uid)
                if old is None:
                    raise _Reject(404, "Data source not found")
                secure = body.get("secureJsonData") or old.get("secureJsonData", {})
                org.datasources[uid] = {
                    **body,
                    "uid": uid,
                    "id": old["id"],
                    "orgId": org.id,
                    "secureJsonData": secure,
                }
                return 200, {"id": old["id"], "message": "Datasource updated", "name": body["name"]}
        raise _Reject(404, "Not found")
