"""Make one Grafana organisation match one gpufleet project: level-triggered, so a
second run changes nothing and a run after someone deleted a folder, the data source or
a dashboard puts it back.

Each step reads first (GET) and writes only what differs. The data source's token is
write-only in Grafana (``secureJsonFields`` says only that one is set), so a token is
made, through ``new_token``, only when the data source is created or has none: a sync
never mints tokens it does not need.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from gpufleet.grafana.client import GrafanaClient, Json

FOLDER_UID = "gpufleet"
DATASOURCE_UID = "gpufleet-prometheus"
DATASOURCE_NAME = "gpufleet Prometheus"
# gpufleet role → Grafana org role. Members view (the dashboards are gpufleet's: sync
# overwrites edits); a project's admins administer their organisation.
ROLES = {"admin": "Admin", "member": "Viewer"}


@dataclass(frozen=True)
class Member:
    login: str
    email: str
    name: str
    role: str  # gpufleet's: admin or member


@dataclass(frozen=True)
class ProjectSpec:
    name: str
    members: tuple[Member, ...]
    proxy_url: str  # the project's query proxy: .../api/v1/projects/<name>/prometheus


@dataclass
class SyncReport:
    project: str
    org_id: int = 0
    changes: list[str] = field(default_factory=list)


def org_name(project: str) -> str:
    return f"gpufleet-{project}"


def sync_project(
    grafana: GrafanaClient,
    spec: ProjectSpec,
    *,
    dashboards: Sequence[Json],
    new_token: Callable[[str], str],
) -> SyncReport:
    """Bring the project's organisation in line; the report lists what was changed."""
    report = SyncReport(project=spec.name)
    org = grafana.get_org_by_name(org_name(spec.name))
    if org is None:
        report.org_id = grafana.create_org(org_name(spec.name))
        report.changes.append(f"created organisation {org_name(spec.name)}")
    else:
        report.org_id = int(org["id"])
    org_id = report.org_id
    _sync_folder(grafana, org_id, spec, report)
    _sync_datasource(grafana, org_id, spec, report, new_token)
    _sync_members(grafana, org_id, spec, report)
    for dashboard in dashboards:
        _sync_dashboard(grafana, org_id, dashboard, report)
    return report


def _sync_folder(
    grafana: GrafanaClient, org_id: int, spec: ProjectSpec, report: SyncReport
) -> None:
    title = f"{spec.name} (gpufleet)"
    folder = grafana.get_folder(org_id, FOLDER_UID)
    if folder is None:
        grafana.create_folder(org_id, uid=FOLDER_UID, title=title)
        report.changes.append("created folder")
    elif folder.get("title") != title:
        grafana.update_folder(org_id, uid=FOLDER_UID, title=title, version=int(folder["version"]))
        report.changes.append("renamed folder")


def datasource_body(spec: ProjectSpec) -> Json:
    """The data source as gpufleet wants it, less the secret."""
    return {
        "name": DATASOURCE_NAME,
        "uid": DATASOURCE_UID,
        "type": "prometheus",
        "access": "proxy",
        "url": spec.proxy_url,
        "isDefault": True,
        "jsonData": {"httpMethod": "POST", "httpHeaderName1": "Authorization"},
    }


def _sync_datasource(
    grafana: GrafanaClient,
    org_id: int,
    spec: ProjectSpec,
    report: SyncReport,
    new_token: Callable[[str], str],
) -> None:
    want = datasource_body(spec)
    have = grafana.get_datasource(org_id, DATASOURCE_UID)
    if have is None:
        secure = {"httpHeaderValue1": f"Bearer {new_token(spec.name)}"}
        grafana.create_datasource(org_id, {**want, "secureJsonData": secure})
        report.changes.append("created data source")
        return
    has_token = bool((have.get("secureJsonFields") or {}).get("httpHeaderValue1"))
    if has_token and _subset_equal(want, have):
        return
    body: Json = dict(want)
    if not has_token:
        body["secureJsonData"] = {"httpHeaderValue1": f"Bearer {new_token(spec.name)}"}
    grafana.update_datasource(org_id, DATASOURCE_UID, body)
    report.changes.append("updated data source")


def _sync_members(
    grafana: GrafanaClient, org_id: int, spec: ProjectSpec, report: SyncReport
) -> None:
    current = {u["login"]: u for u in grafana.list_org_users(org_id)}
    wanted = {m.login: m for m in spec.members}
    for login, member in sorted(wanted.items()):
        role = ROLES[member.role]
        have = current.get(login)
        if have is None:
            if grafana.lookup_user(login) is None:
                # Grafana needs a password; nobody learns this one: people sign in
                # through the organisation's SSO, matched on login or email.
                grafana.create_user(
                    login=login, email=member.email, name=member.name,
                    password=secrets.token_urlsafe(32),
                )  # fmt: skip
                report.changes.append(f"created user {login}")
            grafana.add_org_user(org_id, login_or_email=login, role=role)
            report.changes.append(f"added {login} as {role}")
        elif have.get("role") != role:
            grafana.set_org_role(org_id, int(have["userId"]), role)
            report.changes.append(f"made {login} {role}")
    for login, have in sorted(current.items()):
        if login not in wanted and login != grafana.admin_login:
            grafana.remove_org_user(org_id, int(have["userId"]))
            report.changes.append(f"removed {login}")


def _sync_dashboard(
    grafana: GrafanaClient, org_id: int, dashboard: Json, report: SyncReport
) -> None:
    uid = str(dashboard["uid"])
    have = grafana.get_dashboard(org_id, uid)
    if have is not None:
        in_folder = (have.get("meta") or {}).get("folderUid") == FOLDER_UID
        if in_folder and _subset_equal(
            dashboard, have.get("dashboard") or {}, skip=("id", "version")
        ):
            return
    grafana.put_dashboard(org_id, dashboard=dashboard, folder_uid=FOLDER_UID)
    report.changes.append(f"pushed dashboard {uid}")


def _subset_equal(want: Json, have: Json, *, skip: tuple[str, ...] = ()) -> bool:
    """Whether every key gpufleet sets has its value in ``have`` (Grafana adds more)."""
    return all(have.get(k) == v for k, v in want.items() if k not in skip)
