"""A real multi-node Slurm cluster on this machine, for tests: ``deploy/slurm-lab/slurm-lab``
driven from Python.

The lab is real Slurm 22.05 from Debian (slurmctld, one ``slurmd -N <node>`` per node with
fake GPUs, slurmdbd on MariaDB, slurmrestd, its own munged), all as root on loopback.
``deploy/slurm-lab/README.md`` says what runs and what it costs.

Stable API (the Slurm driver's tests rely on it; add to it, do not change it)::

    lab = SlurmLab(dir=Path("/tmp/lab"), nodes=3, gpus=8)   # keyword-only; see __init__
                               #   (cgroup="none": proctrack/linuxproc)
    lab.up()                   # idempotent; from an empty dir waits until every node is idle
    lab.env()                  # {"SLURM_CONF": ..., "SLURM_LAB_DIR": ...}: the variables a
                               #   Slurm command needs, to lay over os.environ
                               #   (e.g. SlurmConfig(env=lab.env()))
    lab.run("sinfo", "-N")     # CompletedProcess[str] of a Slurm command against the lab;
                               #   non-zero exit raises SlurmLabError (check=False: returned)
    lab.node_names             # ("lab-001", "lab-002", "lab-003")
    lab.version                # "22.05.8" (sinfo --version)
    lab.startup_s              # seconds the last up() took; None before
    lab.restart_slurmdbd()     # stop + start slurmdbd; returns once it answers
    lab.kill_slurmd(node)      # SIGKILL (a crash); signal.SIGSTOP / SIGCONT for a hang
    lab.start_slurmd(node)     # start it again (returns once it runs, not once idle)
    lab.stop_slurmd(node)      # SIGTERM, wait until it is gone (a cloud node's too)
    lab.node_states()          # {"lab-001": "idle", "lab-002": "drain", "lab-003": "idle*"}
    lab.wait_for_node_state(node, "idle", timeout_s=30.0)      # -> the state reached
    lab.wait_until(check, timeout_s=..., what="...")           # poll a condition
    lab.reset()                # cancel every job, resume every node, wait until all idle
    lab.set_hook("epilog", "gpufleet slurm epilog ...")        # or None; takes effect at once
    lab.faults_dir             # a file <node> here drains <node> at the next health check
    lab.logs_tail(lines=40)    # every lab log's last lines, for failure messages
    lab.rest_socket            # slurmrestd with local auth: unix:// + this path
    lab.rest_url               # slurmrestd with JWT auth on TCP: "http://127.0.0.1:<base+20>"
    lab.jwt("root", lifespan_s=600)   # a token for it (`scontrol token`)
    lab.stop_slurmrestd("local")      # or "jwt": SIGTERM, wait until it is gone
    lab.start_slurmrestd()     # start what is stopped; returns once both accept connections
    lab.down()                 # stop every daemon (state kept: up() again resumes it)
    lab.purge()                # down, drop the accounting database, delete the dir

Power saving (Slurm's elastic cloud), off unless asked for::

    lab = SlurmLab(dir=..., cloud=CloudNodes(count=2, resume_program=Path("/tmp/r.sh"),
                   suspend_program=Path("/tmp/s.sh"), resume_timeout_s=10,
                   suspend_time_s=4, suspend_timeout_s=3))
    lab.cloud_node_names       # ("cloud1", "cloud2"): State=CLOUD, partition "cloud"
                               #   (not the default; "gpu" then lists only the lab nodes)
    lab.start_slurmd("cloud1") # what a ResumeProgram's machine does: slurmd -b (a fresh
                               #   BootTime) on the node's own port; register -> in service
    lab.stop_slurmd("cloud1")  # what a SuspendProgram's machine does
    lab.power_log              # what the default programs (None above) log, one line each

Slurm runs the programs as SlurmUser (root in the lab) with the hostlist as the only
argument, ``SLURM_RESUME_FILE`` for resume; nothing starts a cloud node's slurmd but
``start_slurmd``, so a node nobody starts goes DOWN after ``resume_timeout_s``.

States are sinfo's compact ``%t`` form: ``idle``, ``alloc``, ``mix``, ``drain``, ``drng``,
``down``..., with ``*`` appended while the node does not respond. Errors are
``SlurmLabError``; ``SlurmNotInstalledError`` when the Debian packages are missing.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[3] / "deploy" / "slurm-lab" / "slurm-lab"
INSTALL_HINT = "run `sudo deploy/slurm-lab/slurm-lab install` (Debian 12: apt-get installs Slurm)"
# What the lab starts; found on PATH plus the sbin folders, where Debian puts the daemons.
REQUIRED_BINARIES = ("slurmctld", "slurmd", "slurmdbd", "munged", "sinfo", "sacct", "mariadb")
HOOKS = ("healthcheck", "prolog", "epilog")
_SEARCH_PATH = os.pathsep.join(
    [os.environ.get("PATH", ""), "/usr/local/sbin", "/usr/sbin", "/sbin", "/usr/bin", "/bin"]
)


class SlurmLabError(RuntimeError):
    """The lab could not do what was asked; the message has the command and its output."""


class SlurmNotInstalledError(SlurmLabError):
    """The Slurm packages are not on this machine."""


def _gone(pid: int) -> bool:
    """The process has exited (a zombie counts: PID 1 here may reap it late)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rpartition(")")[2].split()[0] in {"Z", "X"}


def missing_binaries() -> list[str]:
    """The lab's programs that are not installed (empty when it can run)."""
    return [b for b in REQUIRED_BINARIES if shutil.which(b, path=_SEARCH_PATH) is None]


def _ports_free(first: int, last: int) -> bool:
    for port in range(first, last + 1):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                return False
    return True


def free_port_base(
    *, nodes: int, rng: random.Random | None = None, stripe: tuple[int, int] = (0, 1)
) -> int:
    """A ``SLURM_LAB_PORT_BASE`` whose ports (base+6 .. base+101+nodes) are all free now,
    so a lab can run next to others (another test session, a developer's own lab).

    ``stripe`` (index, count): only bases whose block number is ``index`` modulo
    ``count``, so labs started at the same moment (parallel test workers) never pick the
    same block before either has bound its ports."""
    pick = rng or random.Random()  # noqa: S311 - not security-relevant
    index, count = stripe
    for _ in range(200 * count):
        base = pick.randrange(20000, 60000, 200)
        if (base // 200) % count != index:
            continue
        if _ports_free(base + 6, base + 101 + nodes):
            return base
    raise SlurmLabError("no free block of ports found in 20000..60000 for a Slurm lab")


@dataclass(frozen=True)
class CloudNodes:
    """The lab's ``State=CLOUD`` nodes ``cloud1..cloud<count>`` and Slurm's power saving
    for them (``SLURM_LAB_CLOUD_*`` and the rest in ``deploy/slurm-lab/slurm-lab``).

    ``resume_program`` / ``suspend_program``: absolute paths of executables (None: the
    lab's scripts, which only log to ``power_log``). The times are whole seconds and
    apply to the cloud partition only: the global SuspendTime stays INFINITE, so the lab
    nodes never power down. ``power_save_interval_s``: how often slurmctld looks (its
    default, 10 s, makes tests slow).
    """

    count: int
    resume_program: Path | None = None
    suspend_program: Path | None = None
    resume_timeout_s: int = 30
    suspend_time_s: int = 30
    suspend_timeout_s: int = 10
    power_save_interval_s: int = 1

    def __post_init__(self) -> None:
        if not 1 <= self.count <= 99:
            raise ValueError(f"cloud nodes: count must be 1..99, got {self.count}")
        for name in ("resume_program", "suspend_program"):
            path = getattr(self, name)
            if path is not None and (not path.is_absolute() or any(c in str(path) for c in " |#")):
                raise ValueError(f"cloud nodes: {name} must be an absolute path without "
                                 f"spaces, '|' or '#', got {str(path)!r}")  # fmt: skip
        for name in ("resume_timeout_s", "suspend_time_s", "suspend_timeout_s",
                     "power_save_interval_s"):  # fmt: skip
            if getattr(self, name) < 1:
                raise ValueError(f"cloud nodes: {name} must be at least 1 s")

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(f"cloud{i}" for i in range(1, self.count + 1))

    def env(self) -> dict[str, str]:
        return {
            "SLURM_LAB_CLOUD_NODES": str(self.count),
            "SLURM_LAB_RESUME_PROGRAM": str(self.resume_program or ""),
            "SLURM_LAB_SUSPEND_PROGRAM": str(self.suspend_program or ""),
            "SLURM_LAB_RESUME_TIMEOUT": str(self.resume_timeout_s),
            "SLURM_LAB_SUSPEND_TIME": str(self.suspend_time_s),
            "SLURM_LAB_SUSPEND_TIMEOUT": str(self.suspend_timeout_s),
            "SLURM_LAB_POWER_SAVE_INTERVAL": str(self.power_save_interval_s),
        }


class SlurmLab:
    """One lab: a directory holding its config, state and logs, and the daemons run from it."""

    def __init__(
        self,
        *,
        dir: Path,
        nodes: int = 3,
        gpus: int = 8,
        port_base: int | None = None,
        first_job_id: int | None = None,
        hooks: Mapping[str, str | None] | None = None,
        up_timeout_s: float = 60.0,
        script: Path = SCRIPT,
        cgroup: str | None = None,
        cloud: CloudNodes | None = None,
    ) -> None:
        """Describe a lab; nothing starts before ``up()``.

        Args:
            dir: the lab's directory (made by ``up()``); keep it short: the munge socket
                path inside must fit a unix socket (about 100 characters).
            nodes: compute nodes, named ``lab-001``...
            gpus: fake GPUs per node (GRES ``gpu:h100:<gpus>``).
            port_base: ``SLURM_LAB_PORT_BASE``; None keeps what the dir recorded, else
                16800. Labs side by side need different ones (see ``free_port_base``).
            first_job_id: Slurm's FirstJobId; None keeps the recorded one, else 1. Labs
                running side by side share this host's cgroup tree per node name, so
                their job ids should not overlap.
            hooks: commands for the lab's ``healthcheck``, ``prolog`` and ``epilog``
                scripts (None or "" for none); see ``set_hook``.
            up_timeout_s: how long ``up()`` waits for the nodes.
            script: the ``slurm-lab`` script.
            cgroup: ``SLURM_LAB_CGROUP``: ``auto`` (cgroup v1 when the host has it),
                ``v1``, or ``none`` (proctrack/linuxproc: a ``setsid`` child escapes
                the job); None keeps what the dir recorded, else auto.
            cloud: ``State=CLOUD`` nodes with Slurm's power saving (see ``CloudNodes``);
                None keeps what the dir recorded, else none. Their ports follow the
                lab nodes' (``free_port_base(nodes=nodes + cloud.count)``).
        """
        if nodes < 1 or gpus < 1:
            raise ValueError(f"a lab needs at least 1 node and 1 GPU, got {nodes} and {gpus}")
        unknown = set(hooks or {}) - set(HOOKS)
        if unknown:
            raise ValueError(f"unknown hooks {sorted(unknown)}; known: {', '.join(HOOKS)}")
        self.dir = Path(dir).absolute()
        self.nodes = nodes
        self.gpus = gpus
        self.port_base = port_base
        self.first_job_id = first_job_id
        self.hooks: dict[str, str | None] = dict(hooks or {})
        self.up_timeout_s = up_timeout_s
        self.script = script
        if cgroup not in (None, "auto", "v1", "none"):
            raise ValueError(f"cgroup must be auto, v1 or none, got {cgroup!r}")
        self.cgroup = cgroup
        self.cloud = cloud
        self.startup_s: float | None = None

    # ---------------------------------------------------------------- facts

    @property
    def node_names(self) -> tuple[str, ...]:
        return tuple(f"lab-{i:03d}" for i in range(1, self.nodes + 1))

    @property
    def cloud_node_names(self) -> tuple[str, ...]:
        """The ``State=CLOUD`` nodes (``cloud1``...); empty without ``cloud``."""
        return self.cloud.names if self.cloud is not None else ()

    @property
    def power_log(self) -> Path:
        """Where the lab's own resume/suspend scripts log each call."""
        return self.log_dir / "power.log"

    @property
    def slurm_conf(self) -> Path:
        return self.dir / "etc" / "slurm.conf"

    @property
    def log_dir(self) -> Path:
        return self.dir / "log"

    @property
    def faults_dir(self) -> Path:
        return self.dir / "faults"

    @cached_property
    def version(self) -> str:
        """Slurm's version, e.g. ``22.05.8`` (needs no running lab)."""
        # not `sinfo --version`: before up() SLURM_CONF names a missing file and the
        # client retries reading it for 60 s
        binary = shutil.which("slurmctld", path=_SEARCH_PATH)
        if binary is None:
            raise SlurmNotInstalledError(f"slurmctld not found: {INSTALL_HINT}")
        out = subprocess.run(
            [binary, "-V"], capture_output=True, text=True, timeout=30, check=False
        ).stdout.split()
        if not out:
            raise SlurmLabError("`slurmctld -V` printed nothing")
        return out[-1]

    @property
    def rest_socket(self) -> Path:
        """The unix socket of the lab's slurmrestd with ``rest_auth/local`` (root)."""
        return self.dir / "run" / "slurmrestd.sock"

    @cached_property
    def rest_url(self) -> str:
        """``http://127.0.0.1:<port base + 20>``: the lab's slurmrestd with ``rest_auth/jwt``
        (the port recorded by ``up()``, as ``slurm-lab env`` prints it)."""
        for line in self._script("env", timeout_s=30).stdout.splitlines():
            name, _, value = line.removeprefix("export ").partition("=")
            if name == "SLURM_LAB_REST_URL":
                return value
        raise SlurmLabError(f"`slurm-lab env` printed no SLURM_LAB_REST_URL (lab {self.dir})")

    def jwt(self, user: str = "root", *, lifespan_s: int = 600) -> str:
        """A JWT for ``user`` from ``scontrol token``, valid ``lifespan_s`` seconds."""
        out = self.run("scontrol", "token", f"username={user}", f"lifespan={lifespan_s}").stdout
        name, _, token = out.strip().partition("=")
        if name != "SLURM_JWT" or not token:
            raise SlurmLabError(f"`scontrol token` printed no SLURM_JWT=...: {out.strip()!r}")
        return token

    def stop_slurmrestd(self, which: str = "local", *, timeout_s: float = 15.0) -> None:
        """Stop one of the lab's slurmrestd daemons (``local``: the unix socket one;
        ``jwt``: the TCP one) with SIGTERM, SIGKILL past ``timeout_s``; returns once it is
        gone. ``start_slurmrestd`` (or ``up``) starts it again."""
        if which not in ("local", "jwt"):
            raise ValueError(f"which must be 'local' or 'jwt', got {which!r}")
        pidfile = self.dir / "run" / f"slurmrestd-{which}.pid"
        try:
            pid = int(pidfile.read_text().strip())
            comm = Path(f"/proc/{pid}/comm").read_text().strip()
        except (OSError, ValueError):
            return  # not running
        if comm != "slurmrestd":
            pidfile.unlink(missing_ok=True)  # a reused pid: not ours
            return
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        while not _gone(pid):
            if time.monotonic() > deadline:
                os.kill(pid, signal.SIGKILL)
                deadline = time.monotonic() + 5.0
            time.sleep(0.05)
        pidfile.unlink(missing_ok=True)

    def start_slurmrestd(self, *, timeout_s: float = 15.0) -> None:
        """Start whichever slurmrestd is not running (``up``); returns once the socket and
        the TCP port accept connections."""
        self.up()
        host, _, port = self.rest_url.removeprefix("http://").partition(":")

        def accepting() -> bool:
            for family, address in (
                (socket.AF_UNIX, str(self.rest_socket)),
                (socket.AF_INET, (host, int(port))),
            ):
                with socket.socket(family) as s:
                    try:
                        s.connect(address)
                    except OSError:
                        return False
            return True

        self.wait_until(accepting, timeout_s=timeout_s, what="slurmrestd accepting connections")

    def env(self) -> dict[str, str]:
        """What a Slurm command needs to talk to this lab, to add to ``os.environ``."""
        return {"SLURM_CONF": str(self.slurm_conf), "SLURM_LAB_DIR": str(self.dir)}

    # ---------------------------------------------------------------- life cycle

    def up(self) -> None:
        """Start the lab, or what of it is not running; idempotent.

        From an empty dir it returns once every node is idle; on existing state once every
        node is registered and responding. Sets ``startup_s``.

        Raises:
            SlurmNotInstalledError: the Slurm packages are missing.
            SlurmLabError: not root, or a daemon did not come up (with the logs' tails).
        """
        missing = missing_binaries()
        if missing:
            raise SlurmNotInstalledError(
                f"Slurm is not installed here (missing: {', '.join(missing)}): {INSTALL_HINT}"
            )
        if os.geteuid() != 0:
            raise SlurmLabError(
                "the Slurm lab runs slurmd and munged as root (they switch to job users); "
                "run the tests as root (CI does)"
            )
        start = time.monotonic()
        self._script("up", timeout_s=self.up_timeout_s + 60)
        self.startup_s = time.monotonic() - start

    def down(self) -> None:
        """Stop every daemon of the lab by PID, and what its jobs left running."""
        if self.dir.exists():
            self._script("down", timeout_s=120)

    def purge(self) -> None:
        """``down``, drop the lab's accounting database and delete its directory."""
        if self.dir.exists():
            self._script("purge", timeout_s=120)

    def restart_slurmdbd(self) -> None:
        """Stop slurmdbd and start it again; returns once it answers."""
        self._script("restart-slurmdbd", timeout_s=90)

    def reset(self, *, timeout_s: float = 40.0) -> None:
        """Cancel every job and resume every node, then wait until each is idle: what a
        test that shares the lab does when it ends.

        The nodes are resumed once every job is gone: a job cancelled while slurmd
        launches it can still fail its launch (the lab's cgroup v1 hierarchy races with
        the epilog of the job before), and Slurm then drains its node ("batch job
        complete failure") after a resume made too early, for the next test to find."""

        def jobs() -> list[str]:
            return self.run("squeue", "-h", "-o", "%A").stdout.split()

        if listed := jobs():
            self.run("scancel", *listed, check=False)
            # A job held on a node that cannot finish it (its slurmd killed) stays: the
            # nodes' idle wait below says so.
            with contextlib.suppress(SlurmLabError):
                self.wait_until(lambda: not jobs(), timeout_s=timeout_s, what="every job gone")
        for node in self.node_names:
            self.run("scontrol", "update", f"nodename={node}", "state=resume", check=False)
        for node in self.node_names:
            self.wait_for_node_state(node, "idle", timeout_s=timeout_s)

    def kill_slurmd(self, node: str, sig: signal.Signals = signal.SIGKILL) -> None:
        """Send one node's slurmd a signal: SIGKILL crashes it (the node goes ``*`` after
        about SlurmdTimeout = 10 s, then ``down*``), SIGSTOP hangs it, SIGCONT resumes it,
        SIGTERM stops it cleanly."""
        self._check_node(node)
        self._script("kill-slurmd", node, sig.name, timeout_s=60)

    def start_slurmd(self, node: str) -> None:
        """Start one node's slurmd again (with ReturnToService=2 the node is idle again
        within about a second; poll with ``wait_for_node_state``). A cloud node's slurmd
        starts with ``-b``: it reports a boot now, as a machine just made would, which
        slurmctld needs of a node it resumed."""
        self._check_node(node)
        self._script("start-slurmd", node, timeout_s=60)

    def stop_slurmd(self, node: str) -> None:
        """Stop one node's slurmd cleanly (SIGTERM); returns once it is gone."""
        self._check_node(node)
        self._script("stop-slurmd", node, timeout_s=60)

    def set_hook(self, name: str, command: str | None) -> None:
        """Make the lab's ``healthcheck``/``prolog``/``epilog`` run ``command`` (a shell
        command line, run as root with the hook's Slurm variables; its exit status counts:
        a failing prolog or epilog drains the node), or nothing. On a running lab it takes
        effect at the next call of the hook."""
        if name not in HOOKS:
            raise ValueError(f"unknown hook {name!r}; known: {', '.join(HOOKS)}")
        self.hooks[name] = command
        if (self.dir / "lab.env").exists():
            self.up()  # rewrites the hook files; the daemons keep running

    # ---------------------------------------------------------------- commands

    def run(
        self,
        *argv: str,
        check: bool = True,
        timeout_s: float = 60.0,
        input: str | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """Run a Slurm command (``sinfo``, ``sbatch``, ``scontrol``...) against the lab.

        Raises:
            SlurmLabError: it exited non-zero (with ``check``), could not start, or ran
                past ``timeout_s``; the message has the command and its stderr.
        """
        if not self.slurm_conf.is_file():
            # else the client retries reading the missing file for 60 s
            raise SlurmLabError(f"the lab at {self.dir} has no config yet: call up() first")
        env = {**os.environ, "PATH": _SEARCH_PATH, **self.env()}
        try:
            proc = subprocess.run(
                list(argv),
                env=env,
                capture_output=True,
                text=True,
                timeout=timeout_s,
                input=input,
                check=False,
            )
        except FileNotFoundError as exc:
            raise SlurmNotInstalledError(f"`{argv[0]}` not found: {INSTALL_HINT}") from exc
        except subprocess.TimeoutExpired as exc:
            raise SlurmLabError(f"`{' '.join(argv)}` ran past {timeout_s:g} s") from exc
        if check and proc.returncode != 0:
            raise SlurmLabError(
                f"`{' '.join(argv)}` exited {proc.returncode}: "
                f"{proc.stderr.strip() or proc.stdout.strip() or '(no output)'}"
            )
        return proc

    def node_states(self) -> dict[str, str]:
        """Each node's state as ``sinfo -N -o %t`` prints it (``idle``, ``drain``, ``idle*``)."""
        out = self.run("sinfo", "-h", "-N", "-o", "%N %t").stdout
        states: dict[str, str] = {}
        for line in out.splitlines():
            name, _, state = line.strip().partition(" ")
            if name:
                states[name] = state.strip()
        return states

    def wait_until(
        self, check: Callable[[], bool], *, timeout_s: float, what: str, interval_s: float = 0.2
    ) -> None:
        """Poll ``check`` until it is true. Daemons move in real time, so this sleeps.

        Raises:
            SlurmLabError: still false after ``timeout_s`` (naming ``what`` and the nodes).
        """
        deadline = time.monotonic() + timeout_s
        while not check():
            if time.monotonic() > deadline:
                raise SlurmLabError(
                    f"{what}: not within {timeout_s:g} s (nodes: {self._states_or_error()})"
                )
            time.sleep(interval_s)

    def wait_for_node_state(self, node: str, *states: str, timeout_s: float = 30.0) -> str:
        """Wait until ``node`` is in one of ``states`` (sinfo ``%t`` form); return it."""
        self._check_node(node)
        seen: list[str] = []

        def reached() -> bool:
            state = self.node_states().get(node, "")
            seen[:] = [state]
            return state in states

        self.wait_until(reached, timeout_s=timeout_s, what=f"{node} in {'/'.join(states)}")
        return seen[0]

    def logs_tail(self, *, lines: int = 40) -> str:
        """The last ``lines`` of every lab log, headed by its path."""
        parts: list[str] = []
        for path in sorted(self.log_dir.glob("*.log")):
            text = path.read_text(errors="replace").splitlines()[-lines:]
            parts.append(f"---- {path}\n" + "\n".join(text))
        return "\n".join(parts) if parts else f"(no logs in {self.log_dir})"

    # ---------------------------------------------------------------- internals

    def _check_node(self, node: str) -> None:
        known = self.node_names + self.cloud_node_names
        if node not in known:
            raise ValueError(f"no node {node!r} in this lab; nodes: {', '.join(known)}")

    def _states_or_error(self) -> str:
        try:
            return ", ".join(f"{n}={s}" for n, s in self.node_states().items()) or "none"
        except SlurmLabError as exc:
            return f"sinfo failed: {exc}"

    def _script_env(self) -> dict[str, str]:
        env = {
            **os.environ,
            "SLURM_LAB_DIR": str(self.dir),
            "SLURM_LAB_NODES": str(self.nodes),
            "SLURM_LAB_NODE_PREFIX": "lab-",
            "SLURM_LAB_GPUS": str(self.gpus),
            "SLURM_LAB_UP_TIMEOUT": f"{self.up_timeout_s:g}",
        }
        if self.port_base is not None:
            env["SLURM_LAB_PORT_BASE"] = str(self.port_base)
        if self.first_job_id is not None:
            env["SLURM_LAB_FIRST_JOB_ID"] = str(self.first_job_id)
        if self.cgroup is not None:
            env["SLURM_LAB_CGROUP"] = self.cgroup
        if self.cloud is not None:
            env.update(self.cloud.env())
        for name, command in self.hooks.items():
            env[f"SLURM_LAB_{name.upper()}"] = command or ""
        return env

    def _script(self, *args: str, timeout_s: float) -> subprocess.CompletedProcess[str]:
        command = f"{self.script.name} {' '.join(args)}"
        try:
            proc = subprocess.run(
                [str(self.script), *args],
                env=self._script_env(),
                capture_output=True,
                text=True,
                timeout=timeout_s,
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            raise SlurmLabError(
                f"`{command}` (lab {self.dir}) ran past {timeout_s:g} s\n{self.logs_tail()}"
            ) from exc
        if proc.returncode != 0:
            raise SlurmLabError(
                f"`{command}` (lab {self.dir}) exited {proc.returncode}:\n"
                f"{proc.stderr.strip()}\n{proc.stdout.strip()}".rstrip()
            )
        return proc
