"""Settings of the Slurm scheduler driver."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class SlurmConfig:
    """How gpufleet reaches one Slurm cluster.

    The driver runs the Slurm commands (``sinfo``, ``squeue``, ``sacct``, ``scontrol``) as
    child processes, never through a shell. They find slurmctld the way an operator's
    shell would: through ``SLURM_CONF`` (or ``/etc/slurm/slurm.conf``) and munge.
    """

    # Variables set for every Slurm command, on top of this process's environment (or
    # instead of it, with ``inherit_env=False``): ``SLURM_CONF`` to point at a cluster
    # other than the host's, ``PATH``... The driver always sets ``TZ=UTC`` and
    # ``SLURM_TIME_FORMAT=standard`` itself, because sacct prints times without a zone.
    env: Mapping[str, str] = field(default_factory=dict)
    inherit_env: bool = True
    # Folder holding the Slurm binaries; None finds them on PATH.
    bin_dir: str | None = None
    # Seconds one command may take. slurmctld answers in milliseconds when healthy; its
    # own MessageTimeout defaults to 10 s, and a client retries once, so 30 s means it is
    # down or hung and the call fails (DriverError) instead of blocking a reconciler.
    timeout_s: float = 30.0
    # JSON output (``sinfo --json``, ``squeue --json``; ``scontrol --json`` on 23.02+) or
    # the ``scontrol -o show`` text. None: JSON when the installed Slurm has it (21.08+),
    # detected once from ``sinfo --version``. False forces text (for old clusters, tests).
    use_json: bool | None = None
    # slurmrestd (e.g. ``http://127.0.0.1:6820``) and a JWT for ``X-SLURM-USER-TOKEN``.
    # TODO(issue 5): not used yet; every call goes through the CLI. Slurm 22.05's REST
    # API (v0.0.38) cannot update nodes, so drain/resume stay on scontrol there anyway.
    rest_url: str | None = None
    rest_token: str | None = None
    rest_user: str = "root"

    def __post_init__(self) -> None:
        if not self.timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0 seconds, got {self.timeout_s}")
        if self.rest_url is not None and not self.rest_url.startswith(("http://", "https://")):
            raise ValueError(f"rest_url must start with http:// or https://, got {self.rest_url}")
