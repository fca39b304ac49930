"""Client calls for access control: members, users, tokens, storage volumes, the audit
log and a cluster's sudo/Slurm-admin rendering. Mixed into ``ApiClient``."""

from __future__ import annotations

import datetime as dt
from typing import TYPE_CHECKING

from gpufleet.client.calls import API, Calls, segment
from gpufleet.core.enums import Role
from gpufleet.core.models import ApiToken, Page, User

# These models load on first use, inside the calls that return them: importing them
# with the client was a good part of every command's start (issue 19).
if TYPE_CHECKING:
    from gpufleet.core.access import AuditEntry, Member, Volume
    from gpufleet.core.slurm_admins import AccessConfig


class AccessCalls(Calls):
    """Mixed into ``ApiClient``."""

    # -- members ------------------------------------------------------------------------
    def list_members(self, project: str) -> list[Member]:
        from gpufleet.core.access import Member

        data = self._call("GET", f"{API}/projects/{segment(project)}/members")
        return [Member.model_validate(m) for m in data]

    def add_member(self, project: str, *, user: str, role: Role = Role.MEMBER) -> Member:
        """Add an existing user (id or name); ``ApiError`` 409 if already a member."""
        from gpufleet.core.access import Member

        body = {"user": user, "role": role.value}
        path = f"{API}/projects/{segment(project)}/members"
        return Member.model_validate(self._call("POST", path, body=body))

    def set_member_role(self, project: str, user: str, *, role: Role) -> Member:
        """409 for the project's last admin and for roles an IdP group grants."""
        from gpufleet.core.access import Member

        path = f"{API}/projects/{segment(project)}/members/{segment(user)}"
        return Member.model_validate(self._call("PATCH", path, body={"role": role.value}))

    def remove_member(self, project: str, user: str) -> Member:
        from gpufleet.core.access import Member

        path = f"{API}/projects/{segment(project)}/members/{segment(user)}"
        return Member.model_validate(self._call("DELETE", path))

    # -- users (the platform owner) -----------------------------------------------------
    def list_users(self) -> list[User]:
        return [User.model_validate(u) for u in self._call("GET", f"{API}/users")]

    def create_user(
        self, name: str, *, email: str | None = None, unix_name: str | None = None
    ) -> User:
        body = {"name": name, "email": email, "unix_name": unix_name}
        return User.model_validate(self._call("POST", f"{API}/users", body=body))

    def set_unix_name(self, user: str, unix_name: str | None) -> User:
        """Set a user's Unix name; None removes it."""
        body = {"unix_name": unix_name}
        return User.model_validate(self._call("PATCH", f"{API}/users/{segment(user)}", body=body))

    # -- tokens -------------------------------------------------------------------------
    def list_tokens(self, *, project: str | None = None, revoked: bool = False) -> list[ApiToken]:
        """Your own tokens; with ``project``, every user's tokens of it (its admins)."""
        path = f"{API}/projects/{segment(project)}/tokens" if project else f"{API}/tokens"
        data = self._call("GET", path, params={"revoked": revoked})
        return [ApiToken.model_validate(t) for t in data]

    def revoke_token(self, token_id: str) -> ApiToken:
        """Revoke now: every later request with it gets 401."""
        return ApiToken.model_validate(self._call("DELETE", f"{API}/tokens/{segment(token_id)}"))

    # -- storage volumes ----------------------------------------------------------------
    def list_volumes(self, project: str) -> list[Volume]:
        from gpufleet.core.access import Volume

        data = self._call("GET", f"{API}/projects/{segment(project)}/volumes")
        return [Volume.model_validate(v) for v in data]

    def create_volume(self, project: str, *, name: str, size_gb: int, mount_path: str) -> Volume:
        from gpufleet.core.access import Volume

        body = {"name": name, "size_gb": size_gb, "mount_path": mount_path}
        path = f"{API}/projects/{segment(project)}/volumes"
        return Volume.model_validate(self._call("POST", path, body=body))

    def update_volume(
        self,
        project: str,
        volume: str,
        *,
        size_gb: int | None = None,
        mount_path: str | None = None,
    ) -> Volume:
        from gpufleet.core.access import Volume

        body = {k: v for k, v in (("size_gb", size_gb), ("mount_path", mount_path)) if v}
        path = f"{API}/projects/{segment(project)}/volumes/{segment(volume)}"
        return Volume.model_validate(self._call("PATCH", path, body=body))

    def delete_volume(self, project: str, volume: str) -> Volume:
        from gpufleet.core.access import Volume

        path = f"{API}/projects/{segment(project)}/volumes/{segment(volume)}"
        return Volume.model_validate(self._call("DELETE", path))

    def attach_volume(self, project: str, volume: str, *, cluster_id: str) -> Volume:
        from gpufleet.core.access import Volume

        path = f"{API}/projects/{segment(project)}/volumes/{segment(volume)}/attachments"
        return Volume.model_validate(self._call("POST", path, body={"cluster": cluster_id}))

    def detach_volume(self, project: str, volume: str, *, cluster_id: str) -> Volume:
        from gpufleet.core.access import Volume

        volume_path = f"{API}/projects/{segment(project)}/volumes/{segment(volume)}"
        path = f"{volume_path}/attachments/{segment(cluster_id)}"
        return Volume.model_validate(self._call("DELETE", path))

    # -- audit log, cluster access ------------------------------------------------------
    def list_audit(
        self,
        *,
        project: str | None = None,
        actor: str | None = None,
        action: str | None = None,
        since: dt.datetime | None = None,
        until: dt.datetime | None = None,
        cursor: str | None = None,
        limit: int | None = None,
    ) -> Page[AuditEntry]:
        """Newest first; ``action`` ending in ``.`` or ``*`` matches a prefix."""
        from gpufleet.core.access import AuditEntry

        params = {
            "project": project,
            "actor": actor,
            "action": action,
            "since": since,
            "until": until,
            "cursor": cursor,
            "limit": limit,
        }
        return Page[AuditEntry].model_validate(self._call("GET", f"{API}/audit", params=params))

    def cluster_access(self, cluster_id: str) -> AccessConfig:
        """Who a cluster's nodes give sudo and Slurm admin to."""
        from gpufleet.core.slurm_admins import AccessConfig

        path = f"{API}/clusters/{segment(cluster_id)}/access"
        return AccessConfig.model_validate(self._call("GET", path))
