"""The fault half of ``SimWorld``: inject, clear, list, draw in the background, notify.

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
from gpufleet.sim.faults import FaultModel, SimFault
from gpufleet.sim.models import SimInstanceState
from gpufleet.sim.records import InstanceRecord

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

    def _require_live(self, instance_id: str, *, action: str) -> InstanceRecord:
        raise NotImplementedError

    def _touch(self, record: InstanceRecord) -> None:
        raise NotImplementedError

    def _save(self) -> None:
        raise NotImplementedError

    # -- faults (see faults.py) -------------------------------------------------------

    def inject_fault(
        self, instance_id: str, *, signature_id: str, gpu_index: int | None = None
    ) -> SimFault:
        """Make a machine (not terminated) fail with ``signature_id`` (a catalog id), on one GPU
        (picked at random for a GPU signature given none) or node-wide. Raises
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
            return self._add_fault(record, signature_id, gpu_index, origin="injected")

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
        self, record: InstanceRecord, signature_id: str, gpu_index: int | None, *, origin: str
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
            )
        except ValueError as exc:
            raise DriverError(f"sim: {exc}") from None
        self._touch(record)
        if origin == "injected":
            self._save()
            self._notify({record.instance_id})
        return fault

    def _step_faults(self, now: dt.datetime) -> set[str]:
        """Expire transient faults and draw background ones; the machines changed."""
        changed: set[str] = set()
        running = [
            r for r in self._instances.values()
            if r.terminated_at is None and r.state_at(now) is RUNNING
        ]  # fmt: skip
        for record in running:
            expired = fm.expire(record.faults, now=now) if record.faults else None
            if expired is not None:
                record.faults = expired
                self._touch(record)
                changed.add(record.instance_id)
        machines = ((r.instance_id, r.gpu_count) for r in running)
        for drawn in self._fault_model.draw(now=now, rng=self._rng, machines=machines):
            record = self._instances[drawn.instance_id]
            with contextlib.suppress(DriverError):  # a machine at its cap takes no more
                self._add_fault(record, drawn.signature_id, drawn.gpu_index, origin="background")
                changed.add(record.instance_id)
        return changed

    def _notify(self, instance_ids: set[str]) -> None:
        for instance_id in instance_ids:
            for listener in list(self._fault_listeners):
                try:
                    listener(instance_id)
                except Exception:  # a listener must never break a mutation
                    log.exception("sim: fault listener failed")
