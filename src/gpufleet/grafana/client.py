"""The calls of Grafana's documented HTTP API (legacy ``/api``, still served by Grafana
12 and 13) that provisioning needs, as a server admin with basic auth: creating an
organisation needs exactly that (service-account tokens are org-scoped). Inside an
organisation every call carries ``X-Grafana-Org-Id``.
"""

from __future__ import annotations

from typing import Any

import httpx

from gpufleet.core.errors import Unavailable

Json = dict[str, Any]


class GrafanaError(Unavailable):
    """Grafana refused a call: names the method, the path and Grafana's message."""


class GrafanaClient:
    def __init__(
        self,
        base_url: str,
        *,
        user: str,
        password: str,
        timeout_s: float = 30.0,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.admin_login = user
        self._http = httpx.Client(
            base_url=base_url.rstrip("/"),
            auth=(user, password),
            timeout=timeout_s,
            transport=transport,
            headers={"Accept": "application/json"},
        )

    def close(self) -> None:
        self._http.close()

    def _call(
        self,
        method: str,
        path: str,
        *,
        org_id: int | None = None,
        json: Json | None = None,
        params: dict[str, str] | None = None,
        missing_ok: bool = False,
    ) -> Any:
        headers = {"X-Grafana-Org-Id": str(org_id)} if org_id is not None else {}
        try:
            response = self._http.request(method, path, json=json, params=params, headers=headers)
        except httpx.HTTPError as exc:
            raise GrafanaError(f"Grafana {method} {path}: {exc}") from exc
        if missing_ok and response.status_code == 404:
            return None
        if response.status_code >= 400:
            try:
                message = response.json().get("message", response.text)
            except ValueError:
                message = response.text
            raise GrafanaError(f"Grafana {method} {path}: {response.status_code} {message}")
        return response.json() if response.content else None

    # -- organisations ------------------------------------------------------------
    def get_org_by_name(self, name: str) -> Json | None:
        found: Json | None = self._call("GET", f"/api/orgs/name/{name}", missing_ok=True)
        return found

    def create_org(self, name: str) -> int:
        return int(self._call("POST", "/api/orgs", json={"name": name})["orgId"])

    # -- folders -------------------------------------------------------------------
    def get_folder(self, org_id: int, uid: str) -> Json | None:
        found: Json | None = self._call(
            "GET", f"/api/folders/{uid}", org_id=org_id, missing_ok=True
        )
        return found

    def create_folder(self, org_id: int, *, uid: str, title: str) -> None:
        self._call("POST", "/api/folders", org_id=org_id, json={"uid": uid, "title": title})

    def update_folder(self, org_id: int, *, uid: str, title: str, version: int) -> None:
        body = {"title": title, "version": version, "overwrite": True}
        self._call("PUT", f"/api/folders/{uid}", org_id=org_id, json=body)

    # -- data sources --------------------------------------------------------------
    def get_datasource(self, org_id: int, uid: str) -> Json | None:
        found: Json | None = self._call(
            "GET", f"/api/datasources/uid/{uid}", org_id=org_id, missing_ok=True
        )
        return found

    def create_datasource(self, org_id: int, body: Json) -> None:
        self._call("POST", "/api/datasources", org_id=org_id, json=body)

    def update_datasource(self, org_id: int, uid: str, body: Json) -> None:
        self._call("PUT", f"/api/datasources/uid/{uid}", org_id=org_id, json=body)

    # -- users ----------------------------------------------------------------------
    def list_org_users(self, org_id: int) -> list[Json]:
        users: list[Json] = self._call("GET", f"/api/orgs/{org_id}/users")
        return users

    def lookup_user(self, login_or_email: str) -> Json | None:
        found: Json | None = self._call(
            "GET", "/api/users/lookup", params={"loginOrEmail": login_or_email}, missing_ok=True
        )
        return found

    def create_user(self, *, login: str, email: str, name: str, password: str) -> int:
        body = {"login": login, "email": email, "name": name, "password": password}
        return int(self._call("POST", "/api/admin/users", json=body)["id"])

    def add_org_user(self, org_id: int, *, login_or_email: str, role: str) -> None:
        body = {"loginOrEmail": login_or_email, "role": role}
        self._call("POST", f"/api/orgs/{org_id}/users", json=body)

    def set_org_role(self, org_id: int, user_id: int, role: str) -> None:
        self._call("PATCH", f"/api/orgs/{org_id}/users/{user_id}", json={"role": role})

    def remove_org_user(self, org_id: int, user_id: int) -> None:
        self._call("DELETE", f"/api/orgs/{org_id}/users/{user_id}")

    # -- dashboards -------------------------------------------------------------------
    def get_dashboard(self, org_id: int, uid: str) -> Json | None:
        found: Json | None = self._call(
            "GET", f"/api/dashboards/uid/{uid}", org_id=org_id, missing_ok=True
        )
        return found

    def put_dashboard(self, org_id: int, *, dashboard: Json, folder_uid: str) -> None:
        body = {
            "dashboard": {**dashboard, "id": None},
            "folderUid": folder_uid,
            "overwrite": True,
            "message": "gpufleet grafana sync",
        }
        self._call("POST", "/api/dashboards/db", org_id=org_id, json=body)
