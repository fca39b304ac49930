"""Settings of the Slurm scheduler driver."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class SlurmConfig:
    """How gpufleet reaches one Slurm cluster.

    The driver runs the Slurm commands (``sinfo``, ``squeue``, ``sacct``, ``scontrol``) as
    child processes, never through a shell. They find slurmctld the way an operator's
    shell would: through ``SLURM_CONF`` (or ``/etc/slurm/slurm.conf``) and munge. With
    ``rest_url`` set, the reads of nodes and jobs go to slurmrestd instead (``rest.py``).
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
    # slurmrestd, for the reads of nodes and jobs: ``http(s)://host:port`` (JWT auth, with
    # the token sent as ``X-SLURM-USER-TOKEN`` and ``rest_user`` as
    # ``X-SLURM-USER-NAME``), or ``unix:///path/slurmrestd.sock`` (``rest_auth/local``:
    # the socket's peer uid is the user; no token needed). None: every read uses the CLI.
    # Writes (drain, resume, down, requeue) and accounting stay on the CLI either way;
    # docs/slurm.md says why.
    rest_url: str | None = None
    # The JWT itself, or a file holding it (what `scontrol token` prints, with or without
    # its ``SLURM_JWT=``), read again whenever the file changes, so a cron job can renew
    # the token without restarting gpufleet. At most one of the two.
    rest_token: str | None = None
    rest_token_file: str | None = None
    rest_user: str = "root"

    def __post_init__(self) -> None:
        if not self.timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0 seconds, got {self.timeout_s}")
        if self.rest_token is not None and self.rest_token_file is not None:
            raise ValueError("set rest_token or rest_token_file, not both")
        if self.rest_url is not None:
            if not self.rest_url.startswith(("http://", "https://", "unix:")):
                raise ValueError(
                    "rest_url must start with http://, https:// or unix:// (a socket path), "
                    f"got {self.rest_url}"
                )
            if self.rest_url.startswith("unix:") and not self.rest_socket:
                raise ValueError(
                    f"rest_url {self.rest_url}: a unix socket needs an absolute path, e.g. "
                    "unix:///run/slurmrestd/slurmrestd.sock"
                )

    @property
    def rest_socket(self) -> str | None:
        """The socket path of a ``unix:`` ``rest_url`` (``unix:///run/x.sock`` and
        slurmrestd's own ``unix:/run/x.sock`` both give ``/run/x.sock``); None for http(s)
        or a relative path."""
        if self.rest_url is None or not self.rest_url.startswith("unix:"):
            return None
        path = self.rest_url.removeprefix("unix:")
        if path.startswith("//"):
            path = path[2:]
        return path if path.startswith("/") and len(path) > 1 else None
