"""The only I/O of the IPMI driver: running ``ipmitool`` against one BMC.

Why ipmitool and not pyghmi (pure Python): each call is a child process that a timeout
kills outright, so a hung BMC can never wedge the control plane's event loop or leave a
session thread behind. pyghmi shares sessions per BMC in module-global state served by
its own I/O thread, with retry timers a caller cannot bound; against ipmi_sim, pyghmi
1.6.19's second ``Command`` to the same BMC in one process hung for over 100 s. It
would also add a pin. ipmitool is the tool every BMC vendor tests against, ships in
every distribution, and speaks both IPMI 1.5 (``lan``) and 2.0 (``lanplus``). Its output
is parsed in ``parsing.py``.

The BMC password goes to the child in its environment (``-E`` reads ``IPMI_PASSWORD``),
never on its command line, where ``ps`` would show it to every local user; ipmitool's
output is scrubbed of it anyway before it reaches a message.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from dataclasses import dataclass

from gpufleet.core.errors import DriverError
from gpufleet.providers.base import HostAccess
from gpufleet.providers.ipmi.config import IpmiConfig
from gpufleet.providers.ipmi.parsing import Failure, classify_failure, failure_text

log = logging.getLogger(__name__)

_DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


class IpmiError(DriverError):
    """An ipmitool run failed; ``failure`` says how (auth, unreachable, timeout...)."""

    def __init__(self, message: str, *, failure: Failure) -> None:
        super().__init__(message)
        self.failure = failure


@dataclass(frozen=True, slots=True)
class _Run:
    returncode: int
    stdout: str
    stderr: str


class IpmitoolClient:
    """Runs ipmitool commands against the BMC of one host at a time."""

    def __init__(self, config: IpmiConfig) -> None:
        self._config = config

    def argv(self, access: HostAccess, command: tuple[str, ...]) -> list[str]:
        """The full command line for ``command`` (``("chassis", "power", "status")``).

        Holds no secret: the password travels in the environment (``-E``).
        """
        c = self._config
        argv = [c.ipmitool, "-v", "-I", c.interface, "-H", access.address]
        argv += ["-p", str(access.port or c.default_port)]
        if access.credential is not None and access.credential.username is not None:
            argv += ["-U", access.credential.username]
        argv += ["-E", "-L", c.privilege, "-N", str(c.udp_timeout_s), "-R", str(c.udp_retries)]
        if c.interface == "lanplus" and c.cipher_suite is not None:
            argv += ["-C", str(c.cipher_suite)]
        return [*argv, *command]

    def _where(self, access: HostAccess) -> str:
        port = access.port or self._config.default_port
        return f"ipmi: host {access.hostname} ({access.host_id}, BMC {access.address}:{port})"

    async def run(self, access: HostAccess, *command: str, retries: int | None = None) -> str:
        """Run one ipmitool command against the host's BMC; return what it printed.

        Transient failures (no answer, a timeout, no free session) are tried again, up to
        ``retries`` (default: the config's) more times with a doubling pause; anything
        else fails at once.

        Raises:
            IpmiError: the host has no credential, ipmitool is missing, or the command
                failed; the message names the host, the BMC and the command, and says
                what to do about refused credentials. It never holds the password.
        """
        where = self._where(access)
        shown = "`ipmitool " + " ".join(command) + "`"
        if access.credential is None:
            raise IpmiError(
                f"{where}: {shown}: the host inventory has no BMC credential for this host; "
                "add the BMC user and password",
                failure=Failure.AUTH,
            )
        attempts = (self._config.retries if retries is None else retries) + 1
        attempt = 1
        while True:
            result = await self._attempt(access, command, where=where, shown=shown)
            if isinstance(result, str):
                return result
            if not result.failure.transient:
                raise result
            if attempt == attempts:
                if attempts == 1:
                    raise result
                message = f"{result.message} (tried {attempts} times)"
                raise IpmiError(message, failure=result.failure)
            pause = self._config.retry_backoff_s * 2 ** (attempt - 1)
            log.info("%s; try %d of %d in %.1f s", result.message, attempt + 1, attempts, pause)
            await asyncio.sleep(pause)
            attempt += 1

    async def _attempt(
        self, access: HostAccess, command: tuple[str, ...], *, where: str, shown: str
    ) -> str | IpmiError:
        """One run: its stdout, or the error it ended with (not raised, to retry)."""
        assert access.credential is not None
        secret = access.credential.secret
        env = {
            "PATH": os.environ.get("PATH", _DEFAULT_PATH),
            "LC_ALL": "C",
            "IPMI_PASSWORD": secret,
        }
        timeout = self._config.timeout_s
        try:
            proc = await asyncio.create_subprocess_exec(
                *self.argv(access, command),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env=env,
            )
        except OSError as exc:
            raise IpmiError(
                f"{where}: {shown} could not start ({exc.strerror}); install ipmitool "
                "or set IpmiConfig.ipmitool to its path",
                failure=Failure.OTHER,
            ) from None
        try:
            out, err = await asyncio.wait_for(proc.communicate(), timeout)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
            return IpmiError(
                f"{where}: {shown} timed out: no result within {timeout:g} s "
                "(BMC hung, overloaded or unreachable); killed it",
                failure=Failure.TIMEOUT,
            )
        except asyncio.CancelledError:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()  # the caller gave up: leave no child behind
            raise
        run = _Run(
            returncode=proc.returncode if proc.returncode is not None else -1,
            stdout=_scrub(out.decode("utf-8", errors="replace"), secret),
            stderr=_scrub(err.decode("utf-8", errors="replace"), secret),
        )
        if run.returncode == 0:
            return run.stdout
        return self._error(access, run, where=where, shown=shown)

    def _error(self, access: HostAccess, run: _Run, *, where: str, shown: str) -> IpmiError:
        output = f"{run.stderr}\n{run.stdout}"
        failure = classify_failure(output)
        text = failure_text(output)
        user = access.credential.username if access.credential else None
        c = self._config
        match failure:
            case Failure.AUTH:
                detail = (
                    f"the BMC refused the credentials of user {user!r} ({text}); fix the "
                    "user name or password in the host inventory, and check the user is "
                    "enabled for IPMI over LAN on the BMC"
                )
            case Failure.PRIVILEGE:
                detail = (
                    f"user {user!r} may not act at {c.privilege} privilege ({text}); give it "
                    "at least OPERATOR on the BMC's LAN channel"
                )
            case Failure.CIPHER:
                detail = (
                    f"the BMC does not accept cipher suite {c.cipher_suite} ({text}); set "
                    "IpmiConfig.cipher_suite to one it offers (`ipmitool lan print` lists "
                    "them) or to None"
                )
            case Failure.UNREACHABLE:
                detail = (
                    f"no answer from the BMC (down, unreachable, or IPMI over LAN "
                    f"disabled) ({text})"
                )
            case Failure.BUSY:
                detail = f"the BMC has no free session ({text})"
            case Failure.NOT_IN_STATE:
                detail = f"the BMC refused it in the present power state ({text})"
            case _:
                detail = f"exited {run.returncode}: {text}"
        return IpmiError(f"{where}: {shown}: {detail}", failure=failure)


def _scrub(text: str, secret: str) -> str:
    return text.replace(secret, "***") if secret else text
