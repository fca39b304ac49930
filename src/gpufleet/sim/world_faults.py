"""The fault half of ``SimWorld``: inject, clear, list, draw in the background, notify,
and reset a GPU (the repair that clears a GPU's faults without a reboot).

A mixin so ``world.py`` stays one screenful per concern; the fault rules themselves are
pure functions in ``faults.py``. It uses the world's lock, records, clock, random stream
and journal exactly as the rest of the world does, so faults persist and survive a
restart like every other record.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import random
import threading
from collections.abc import Callable

from gpufleet.core.clock import Clock
from gpufleet.core.errors import DriverError
from gpufleet.sim import faults as fm
from gpufleet.sim.faults import FaultModel, SimFault, pci_bus_id
from gpufleet.sim.models import BootPlan, SimInstance, SimInstanceState
from gpufleet.sim.records import InstanceRecord
from gpufleet.sim.workload import Workload

log = logging.getLogger(__name__)
RUNNING = SimInstanceState.RUNNING


class WorldFaults:
    # Provided by SimWorld.
    _lock: threading.RLock
    _clock: Clock
    _rng: random.Random
    _instances: dict[str, InstanceRecord]
    _fault_model: FaultModel
    _fault_listeners: list[Callable[[str], None]]
    _workload: Workload

    def _require_live(self, instance_id: str, *, action: str) -> InstanceRecord:
        raise NotImplementedError

    def _touch(self, record: InstanceRecord) -> None:
        raise NotImplementedError

    def _save(self) -> None:
        raise NotImplementedError

    # -- faults (see faults.py) -------------------------------------------------------

    def inject_fault(
        self,
        instance_id: str,
        *,
        signature_id: str,
        gpu_index: int | None = None,
        sticky: bool = False,
    ) -> SimFault:
        """Make a machine (not terminated) fail with ``signature_id`` (a catalog id), on one GPU
        (picked at random for a GPU signature given none) or node-wide. ``sticky``: bad
        hardware, which survives reboot, reinstall and GPU reset and is reported again
        after each (see ``faults.py``); only a new host is rid of it. Raises
        ``DriverError`` for an unknown machine or signature or a GPU out of range."""
        with self._lock:
            record = self._require_live(instance_id, action="inject a fault into")
            try:
                signature = fm.signature_or_error(signature_id)
            except ValueError as exc:
                raise DriverError(f"sim: {exc}") from None
            if gpu_index is not None and not 0 <= gpu_index < record.gpu_count:
                raise DriverError(
                    f"sim: node {record.node_name} has GPUs 0..{record.gpu_count - 1}, "
                    f"not {gpu_index}"
                )
            if gpu_index is None and fm.is_gpu_scoped(signature):
                gpu_index = self._rng.randrange(record.gpu_count)
            return self._add_fault(
                record, signature_id, gpu_index, origin="injected", sticky=sticky
            )

    def clear_fault(
        self, instance_id: str, *, signature_id: str, gpu_index: int | None = None
    ) -> list[SimFault]:
        """Clear the machine's open faults of ``signature_id`` (any GPU unless given)."""
        with self._lock:
            record = self._require_live(instance_id, action="clear a fault on")
            now = self._clock.now()
            kept, cleared = fm.clear_matching(
                record.faults, signature_id=signature_id, gpu_index=gpu_index, now=now
            )
            if cleared:
                record.faults = kept
                self._touch(record)
                self._save()
                self._notify({instance_id})
            return cleared

    def faults_of(self, instance_id: str, *, include_cleared: bool = False) -> list[SimFault]:
        """The machine's faults, oldest first (recently cleared ones too, if asked)."""
        with self._lock:
            record = self._instances.get(instance_id)
            faults = [] if record is None else record.faults
            return [f for f in faults if include_cleared or f.active]

    def active_faults(self) -> dict[str, tuple[SimFault, ...]]:
        """Open faults of every live machine that has any, by instance id."""
        with self._lock:
            return {
                iid: tuple(f for f in r.faults if f.active)
                for iid, r in self._instances.items()
                if r.terminated_at is None and any(f.active for f in r.faults)
            }

    def reset_gpu(self, instance_id: str, *, gpu_index: int | None, plan: BootPlan) -> SimInstance:
        """``nvidia-smi -r`` on one GPU (every GPU if None) of a running machine.

        Returns at once; the GPU is then off the bus for a drawn ``plan.delay_range_s``
        (``resetting_until``: left out of the agent's reports, and no job starts on the
        node) and back after it. Kills the node's job (NODE_FAIL: jobs take whole nodes).
        Clears the GPU's non-sticky faults; node-wide faults stay, sticky ones recur after
        the reset. At ``plan.failure_rate`` the reset fails: ``DriverError``, and nothing
        changes (the job runs on, the faults stay). Raises ``DriverError`` too for a
        machine that is not running or a GPU out of range.
        """
        with self._lock:
            record = self._require_live(instance_id, action="reset a GPU of")
            now = self._clock.now()
            name = record.node_name
            command = "nvidia-smi -r" if gpu_index is None else f"nvidia-smi -r -i {gpu_index}"
            if record.state_at(now) is not RUNNING:
                raise DriverError(
                    f"sim: node {name}: {command}: machine {instance_id} is "
                    f"{record.state_at(now).value}, not running"
                )
            if gpu_index is not None and not 0 <= gpu_index < record.gpu_count:
                raise DriverError(
                    f"sim: node {name}: {command}: no GPU {gpu_index} "
                    f"(GPUs 0..{record.gpu_count - 1})"
                )
            # No draw at rate 0, so old seeds replay as before.
            if plan.failure_rate > 0 and self._rng.random() < plan.failure_rate:
                record.actions["reset_gpu_failed"] = record.actions.get("reset_gpu_failed", 0) + 1
                self._touch(record)
                self._save()
                what = "the GPUs" if gpu_index is None else f"GPU {pci_bus_id(gpu_index)}"
                raise DriverError(f"sim: node {name}: {command} failed: Unable to reset {what}")
            self._workload.kill_on((record.cluster_id, name), now)
            until = now + dt.timedelta(seconds=self._rng.uniform(*plan.delay_range_s))
            gpus = range(record.gpu_count) if gpu_index is None else (gpu_index,)
            for index in gpus:
                record.gpu_resets[index] = until
            record.actions["reset_gpu"] = record.actions.get("reset_gpu", 0) + 1
            faults = fm.restart(
                record.faults,
                now=now,
                back_at=until,
                config=self._fault_model.config,
                rng=self._rng,
                gpus=frozenset(gpus),
            )
            if faults is not None:
                record.faults = faults
            self._touch(record)
            self._save()
            if faults is not None:
                self._notify({instance_id})
            return record.snapshot(now)

    def resetting_gpus(self) -> dict[str, frozenset[int]]:
        """The GPUs off the bus for a reset now, by instance id (machines with any)."""
        with self._lock:
            now = self._clock.now()
            out: dict[str, frozenset[int]] = {}
            for iid, record in self._instances.items():
                if record.gpu_resets and record.terminated_at is None:
                    resetting = record.resetting_at(now)
                    if resetting:
                        out[iid] = frozenset(resetting)
            return out

    def add_fault_listener(self, listener: Callable[[str], None]) -> None:
        """Call ``listener(instance_id)`` whenever a machine's faults change. It runs on
        the mutating thread with the world locked: it must only hand the news on."""
        with self._lock:
            self._fault_listeners.append(listener)

    def remove_fault_listener(self, listener: Callable[[str], None]) -> None:
        with self._lock:
            if listener in self._fault_listeners:
                self._fault_listeners.remove(listener)

    # -- internals --------------------------------------------------------------------

    def _add_fault(
        self,
        record: InstanceRecord,
        signature_id: str,
        gpu_index: int | None,
        *,
        origin: str,
        sticky: bool = False,
    ) -> SimFault:
        try:
            record.faults, fault = fm.add_fault(
                record.faults,
                instance_id=record.instance_id,
                signature_id=signature_id,
                gpu_index=gpu_index,
                now=self._clock.now(),
                rng=self._rng,
                origin=origin,
                sticky=sticky,
            )
        except ValueError as exc:
            raise DriverError(f"sim: {exc}") from None
        self._touch(record)
        if origin == "injected":
            self._save()
            self._notify({record.instance_id})
        return fault

    def _step_faults(self, now: dt.datetime) -> set[str]:
        """Expire transient faults, make due sticky ones recur and draw background ones;
        the machines changed."""
        changed: set[str] = set()
        running = [
            r for r in self._instances.values()
            if r.terminated_at is None and r.state_at(now) is RUNNING
        ]  # fmt: skip
        repeat_s = self._fault_model.config.sticky_repeat_s
        for record in running:
            if not record.faults:
                continue
            expired = fm.expire(record.faults, now=now)
            if expired is not None:
                record.faults = expired
            recurred = fm.recur(record.faults, now=now, repeat_s=repeat_s)
            if recurred is not None:
                record.faults = recurred
            if expired is not None or recurred is not None:
                self._touch(record)
                changed.add(record.instance_id)
        machines = ((r.instance_id, r.gpu_count) for r in running)
        for drawn in self._fault_model.draw(now=now, rng=self._rng, machines=machines):
            record = self._instances[drawn.instance_id]
            with contextlib.suppress(DriverError):  # a machine at its cap takes no more
                self._add_fault(
                    record,
                    drawn.signature_id,
                    drawn.gpu_index,
                    origin="background",
                    sticky=drawn.sticky,
                )
                changed.add(record.instance_id)
        return changed

    def _notify(self, instance_ids: set[str]) -> None:
        for instance_id in instance_ids:
            for listener in list(self._fault_listeners):
                try:
                    listener(instance_id)
                except Exception:  # a listener must never break a mutation
                    log.exception("sim: fault listener failed")
