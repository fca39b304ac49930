"""Client calls for a cluster's autoscaling and Slurm's power saving. Mixed into
``ApiClient``."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from gpufleet.client.calls import API, Calls, segment
from gpufleet.core.models import Page

# These models load on first use, inside the calls that return them: importing them
# with the client was a good part of every command's start (issue 19).
if TYPE_CHECKING:
    from gpufleet.core.autoscaling import (
        AutoscaleAction,
        AutoscaleSettings,
        PowerAction,
        PowerResult,
    )


# What ``set_autoscale`` may change (``PUT .../autoscale``).
AUTOSCALE_FIELDS = frozenset(
    {
        "mode",
        "min_nodes",
        "max_nodes",
        "scale_up_after_s",
        "scale_down_after_s",
        "up_cooldown_s",
        "down_cooldown_s",
        "max_step",
    }
)
# What each job of ``power_nodes`` may carry (the rest of Slurm's resume file stays out).
POWER_JOB_FIELDS = frozenset({"job_id", "nodes", "features", "partition"})


class AutoscaleCalls(Calls):
    """Mixed into ``ApiClient``."""

    def get_autoscale(self, cluster_id: str) -> AutoscaleSettings:
        """The cluster's autoscaling: who decides its size, its bounds and thresholds,
        and when it last stepped."""
        from gpufleet.core.autoscaling import AutoscaleSettings

        path = f"{API}/clusters/{segment(cluster_id)}/autoscale"
        return AutoscaleSettings.model_validate(self._call("GET", path))

    def set_autoscale(
        self, cluster_id: str, *, reason: str = "", **fields: Any
    ) -> AutoscaleSettings:
        """Change the fields given (project admins): ``mode`` (an ``AutoscaleMode`` or
        its value), ``min_nodes`` / ``max_nodes`` (None removes the bound), the
        ``*_s`` thresholds and cooldowns in seconds, ``max_step``. Only those change."""
        from gpufleet.core.autoscaling import AutoscaleSettings

        unknown = sorted(set(fields) - AUTOSCALE_FIELDS)
        if unknown:
            raise TypeError(
                f"set_autoscale() got unknown fields {unknown}; known: {sorted(AUTOSCALE_FIELDS)}"
            )
        body: dict[str, Any] = {
            name: getattr(value, "value", value) for name, value in fields.items()
        }
        body["reason"] = reason
        path = f"{API}/clusters/{segment(cluster_id)}/autoscale"
        return AutoscaleSettings.model_validate(self._call("PUT", path, body=body))

    def list_autoscale_actions(
        self, cluster_id: str, *, limit: int = 50, cursor: str | None = None
    ) -> Page[AutoscaleAction]:
        """The cluster's changes of size (steps up and down, Slurm's resumes and
        suspends), newest first."""
        from gpufleet.core.autoscaling import AutoscaleAction

        path = f"{API}/clusters/{segment(cluster_id)}/autoscale/actions"
        data = self._call("GET", path, params={"limit": limit, "cursor": cursor})
        return Page[AutoscaleAction].model_validate(data)

    def power_nodes(
        self,
        cluster_id: str,
        *,
        action: PowerAction,
        nodes: Sequence[str],
        jobs: Sequence[Mapping[str, object]] | None = None,
        reason: str = "",
    ) -> PowerResult:
        """Slurm's power saving (``gpufleet slurm resume|suspend``): ``resume`` gets
        machines for the named ``State=CLOUD`` nodes, ``suspend`` gives them back. The
        server answers at once (202); the machines come or go in the background. ``jobs``:
        from the resume file, each with ``job_id``, ``nodes`` and optionally
        ``features`` and ``partition``. Returns the action started (``action`` None when
        there was nothing to do: every node already up or on its way, or already gone)
        and why (``detail``)."""
        from gpufleet.core.autoscaling import PowerAction, PowerResult

        items: list[dict[str, object]] = []
        for job in jobs or ():
            unknown = sorted(set(job) - POWER_JOB_FIELDS)
            if unknown:
                raise TypeError(f"power_nodes(): a job has unknown fields {unknown}")
            items.append(dict(job))
        body = {
            "action": PowerAction(action).value,
            "nodes": list(nodes),
            "jobs": items,
            "reason": reason,
        }
        path = f"{API}/clusters/{segment(cluster_id)}/power"
        return PowerResult.model_validate(self._call("POST", path, body=body))
