"""Client calls for stack rollouts: a cluster migrated to another stack inside
maintenance windows, node by node (the answers: ``gpufleet.core.rollouts``). Mixed into
``ApiClient``."""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpufleet.client.calls import API, Calls, segment
from gpufleet.core.enums import WindowClose

# These models load on first use, inside the calls that return them: importing them
# with the client was a good part of every command's start (issue 19).
if TYPE_CHECKING:
    from gpufleet.core.rollouts import Rollout


class RolloutCalls(Calls):
    """Mixed into ``ApiClient``."""

    def list_rollouts(self, cluster_id: str) -> list[Rollout]:
        """The cluster's rollouts, newest first, each with its nodes' progress."""
        from gpufleet.core.rollouts import Rollout

        data = self._call("GET", f"{API}/clusters/{segment(cluster_id)}/rollouts")
        return [Rollout.model_validate(r) for r in data]

    def create_rollout(
        self,
        cluster_id: str,
        *,
        to_stack: str,
        window: str,
        tz: str = "UTC",
        max_unavailable: str = "1",
        failure_budget: int = 1,
        on_window_close: WindowClose = WindowClose.WAIT,
        reason: str = "",
    ) -> Rollout:
        """Schedule the cluster's migration to ``to_stack`` (project admins): nodes move
        only while ``window`` is open (``sat 02:00/4h``, ``daily 01:00/90m``,
        ``2026-12-06T02:00/2h``; local time in ``tz``), at most ``max_unavailable``
        (``"2"`` or ``"25%"``) out at once; paused after ``failure_budget`` failures; a
        node not reinstalled when the window closes waits or is released
        (``on_window_close``).
        ``ApiError`` 422 for a bad window or spec, 409 when one is already under way."""
        from gpufleet.core.rollouts import Rollout

        body = {
            "to_stack": to_stack,
            "window": window,
            "tz": tz,
            "max_unavailable": max_unavailable,
            "failure_budget": failure_budget,
            "on_window_close": on_window_close.value,
            "reason": reason,
        }
        path = f"{API}/clusters/{segment(cluster_id)}/rollouts"
        return Rollout.model_validate(self._call("POST", path, body=body))

    def get_rollout(self, rollout_id: str) -> Rollout:
        from gpufleet.core.rollouts import Rollout

        return Rollout.model_validate(self._call("GET", f"{API}/rollouts/{segment(rollout_id)}"))

    def pause_rollout(self, rollout_id: str, *, reason: str = "") -> Rollout:
        """No node starts until resumed; nodes under way finish."""
        return self._act(rollout_id, "pause", {"reason": reason})

    def resume_rollout(
        self, rollout_id: str, *, reason: str = "", retry_failed: bool = False
    ) -> Rollout:
        """Resume a paused rollout; ``retry_failed`` puts failed nodes back in line and
        forgives their failures (needed once the failure budget is spent)."""
        return self._act(rollout_id, "resume", {"reason": reason, "retry_failed": retry_failed})

    def abort_rollout(self, rollout_id: str, *, reason: str = "") -> Rollout:
        """No node starts any more; nodes under way finish and return to service."""
        return self._act(rollout_id, "abort", {"reason": reason})

    def rollback_rollout_node(self, rollout_id: str, node_id: str, *, reason: str = "") -> Rollout:
        """Put one node (by id) back on the stack it came from, in the window like the
        others; only a node done or failed, of a rollout not yet finished."""
        from gpufleet.core.rollouts import Rollout

        path = f"{API}/rollouts/{segment(rollout_id)}/nodes/{segment(node_id)}/rollback"
        return Rollout.model_validate(self._call("POST", path, body={"reason": reason}))

    def _act(self, rollout_id: str, verb: str, body: dict[str, object]) -> Rollout:
        from gpufleet.core.rollouts import Rollout

        path = f"{API}/rollouts/{segment(rollout_id)}/{verb}"
        return Rollout.model_validate(self._call("POST", path, body=body))
