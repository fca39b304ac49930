"""The only I/O of the ssh provider: asyncssh connections to one host at a time.

Every connection trusts exactly one host key (the pinned one), offers exactly one
credential (never ``~/.ssh``, an agent or ``~/.ssh/config``), and is bounded by the
config's timeouts. Errors are ``SshError``s whose messages name the host and never hold
the secret.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass, field
from typing import TypeVar

import asyncssh

from gpufleet.providers.base import Credential, HostAccess
from gpufleet.providers.ssh.commands import RUNNING_MARK, STARTED_MARK
from gpufleet.providers.ssh.config import SshConfig
from gpufleet.providers.ssh.errors import SshError, SshFailure, redact

log = logging.getLogger(__name__)
T = TypeVar("T")

OUTPUT_LIMIT = 2000  # characters of a command's stderr (or stdout) kept in a message


@dataclass(frozen=True, slots=True)
class RemoteResult:
    command: str
    exit_status: int | None  # None: the session ended without one (the host went down)
    stdout: str
    stderr: str


@dataclass(frozen=True, slots=True)
class DetachedOutcome:
    finished: bool  # the command ended (with status 0) before the wrapper returned
    dropped: bool  # the session ended without a status after the command was scheduled


@dataclass(frozen=True, slots=True)
class _Login:
    username: str
    key: asyncssh.SSHKey | None = field(repr=False)
    password: str | None = field(repr=False)
    secret: str = field(repr=False)  # for redaction only


class _PinCheck(asyncssh.SSHClient):
    """Sees the key a server shows when it is not the pinned one, so that a mismatch can
    name both fingerprints; accepts it only under trust-on-first-use."""

    def __init__(self, *, trust_unknown: bool) -> None:
        self.offered: asyncssh.SSHKey | None = None
        self._trust_unknown = trust_unknown

    # asyncssh's callback signature; only the key matters here.
    def validate_host_public_key(
        self,
        host: str,  # noqa: ARG002
        addr: str,  # noqa: ARG002
        port: int,  # noqa: ARG002
        key: asyncssh.SSHKey,
    ) -> bool:
        self.offered = key
        return self._trust_unknown


def fingerprint(key: asyncssh.SSHKey) -> str:
    return f"{key.get_algorithm()} {key.get_fingerprint('sha256')}"


class SshClient:
    """Connections to the hosts of one provider. Keeps the keys learnt on first use."""

    def __init__(self, config: SshConfig) -> None:
        self._config = config
        self._learnt: dict[str, asyncssh.SSHKey] = {}  # host_id → key, trust-on-first-use

    def _where(self, access: HostAccess) -> str:
        return f"ssh: host {access.host_id} ({access.address}:{self._port(access)})"

    def _port(self, access: HostAccess) -> int:
        return access.port if access.port is not None else self._config.port

    def _login(self, access: HostAccess) -> _Login:
        where = self._where(access)
        credential: Credential | None = access.credential
        if credential is None or not credential.secret:
            raise SshError(f"{where}: no credential in the inventory", reason=SshFailure.CREDENTIAL)
        username = credential.username or self._config.username
        if not username:
            raise SshError(
                f"{where}: the credential names no user and SshConfig.username is not set",
                reason=SshFailure.CREDENTIAL,
            )
        secret = credential.secret
        if "PRIVATE KEY-----" in secret:
            try:
                key = asyncssh.import_private_key(secret)
            except (asyncssh.KeyImportError, ValueError) as exc:
                # An encrypted key lands here too: no passphrase is ever stored.
                raise SshError(
                    f"{where}: the private key of user {username} could not be read "
                    f"({redact(str(exc), secret)}); keys must be unencrypted PEM or OpenSSH",
                    reason=SshFailure.CREDENTIAL,
                ) from None
            return _Login(username=username, key=key, password=None, secret=secret)
        if not self._config.allow_password:
            raise SshError(
                f"{where}: the credential of user {username} is not a private key, and "
                "password logins are off (SshConfig.allow_password)",
                reason=SshFailure.CREDENTIAL,
            )
        return _Login(username=username, key=None, password=secret, secret=secret)

    def _pinned(self, access: HostAccess) -> asyncssh.SSHKey | None:
        if access.host_key is None:
            return self._learnt.get(access.host_id)
        try:
            return asyncssh.import_public_key(access.host_key)
        except (asyncssh.KeyImportError, ValueError) as exc:
            raise SshError(
                f"{self._where(access)}: the pinned host key could not be read ({exc}); "
                'expected one OpenSSH public key line, e.g. "ssh-ed25519 AAAA..."',
                reason=SshFailure.HOST_KEY,
            ) from None

    @asynccontextmanager
    async def connection(
        self, access: HostAccess, *, retry: bool = True
    ) -> AsyncIterator[asyncssh.SSHClientConnection]:
        """One authenticated connection, closed on exit. With ``retry``, transient
        failures are tried again (``attempts`` tries in all, with backoff).

        Raises:
            SshError: with ``reason`` AUTH, HOST_KEY, CREDENTIAL, UNREACHABLE, TIMEOUT or
                PROTOCOL; the message names the host and never holds the secret.
        """
        conn = await (
            self._retrying(lambda: self._connect(access)) if retry else self._connect(access)
        )
        try:
            yield conn
        finally:
            conn.close()
            # A host going down may never answer the close: do not wait on it forever.
            with suppress(TimeoutError, OSError, asyncssh.Error):
                await asyncio.wait_for(conn.wait_closed(), self._config.connect_timeout_s)

    async def _retrying(self, call: Callable[[], Awaitable[T]]) -> T:
        """``call()``, tried again on a transient ``SshError`` with backoff, ``attempts``
        tries in all; any other error, or the last try's, is raised."""
        delay = self._config.retry_backoff_s
        for attempt in range(1, self._config.attempts):
            try:
                return await call()
            except SshError as exc:
                if not exc.transient:
                    raise
                log.info(
                    "%s (try %d of %d); again in %g s", exc, attempt, self._config.attempts, delay
                )
            await asyncio.sleep(delay)
            delay = min(delay * 2, self._config.retry_backoff_max_s)
        return await call()

    async def _connect(self, access: HostAccess) -> asyncssh.SSHClientConnection:
        login = self._login(access)
        pinned = self._pinned(access)
        where = self._where(access)
        if pinned is None and not self._config.trust_on_first_use:
            raise SshError(
                f"{where}: no host key is pinned for this host; refusing to connect. Pin "
                "its public key (ssh-keyscan, checked out of band) in the inventory",
                reason=SshFailure.HOST_KEY,
            )
        known = asyncssh.import_known_hosts(
            f"* {pinned.export_public_key('openssh').decode().strip()}\n" if pinned else ""
        )
        pin_check = _PinCheck(trust_unknown=pinned is None)
        timeout = self._config.connect_timeout_s
        try:
            async with asyncio.timeout(timeout):
                conn = await asyncssh.connect(
                    access.address,
                    self._port(access),
                    username=login.username,
                    client_keys=[login.key] if login.key is not None else None,
                    password=login.password,
                    preferred_auth="publickey" if login.key is not None else "password",
                    known_hosts=known,
                    client_factory=lambda: pin_check,
                    config=[],
                    agent_path=None,
                    agent_forwarding=False,
                    x509_trusted_certs=None,
                    disable_trivial_auth=True,
                    connect_timeout=timeout,
                    login_timeout=timeout,
                )
        except TimeoutError:
            raise SshError(
                f"{where}: no SSH session within {timeout:g} s (connect, handshake and login)",
                reason=SshFailure.TIMEOUT,
            ) from None
        except asyncssh.HostKeyNotVerifiable:
            raise SshError(
                self._mismatch(where, pinned=pinned, offered=pin_check.offered),
                reason=SshFailure.HOST_KEY,
            ) from None
        except asyncssh.KeyExchangeFailed as exc:
            alg = pinned.get_algorithm() if pinned is not None else "any"
            raise SshError(
                f"{where}: key exchange failed ({exc.reason}); the server offers no host key "
                f"of the pinned type {alg}: the host key may have changed",
                reason=SshFailure.HOST_KEY,
            ) from None
        except asyncssh.PermissionDenied as exc:
            how = "key" if login.key is not None else "password"
            raise SshError(
                f"{where}: authentication refused for user {login.username} by {how} "
                f"({redact(exc.reason, login.secret)})",
                reason=SshFailure.AUTH,
            ) from None
        except asyncssh.ConnectionLost as exc:
            raise SshError(
                f"{where}: connection lost during login ({redact(exc.reason, login.secret)})",
                reason=SshFailure.UNREACHABLE,
            ) from None
        except asyncssh.DisconnectError as exc:
            raise SshError(
                f"{where}: the server ended the connection: {redact(exc.reason, login.secret)}",
                reason=SshFailure.PROTOCOL,
            ) from None
        except socket.gaierror as exc:
            raise SshError(
                f"{where}: the address does not resolve ({exc.strerror})",
                reason=SshFailure.UNREACHABLE,
                transient=False,
            ) from None
        except ConnectionRefusedError:
            raise SshError(
                f"{where}: connection refused (sshd not running, or another port?)",
                reason=SshFailure.UNREACHABLE,
            ) from None
        except OSError as exc:
            raise SshError(
                f"{where}: unreachable ({exc.strerror or type(exc).__name__})",
                reason=SshFailure.UNREACHABLE,
            ) from None
        except (asyncssh.Error, ValueError) as exc:
            raise SshError(
                f"{where}: SSH failed: {redact(str(exc), login.secret)}",
                reason=SshFailure.PROTOCOL,
            ) from None
        if pinned is None and pin_check.offered is not None:
            self._learnt[access.host_id] = pin_check.offered
            log.warning(
                "%s: no pinned host key; trusting the first one seen (trust_on_first_use): "
                "%s. Pin it in the inventory.",
                where,
                fingerprint(pin_check.offered),
            )
        return conn

    @staticmethod
    def _mismatch(
        where: str, *, pinned: asyncssh.SSHKey | None, offered: asyncssh.SSHKey | None
    ) -> str:
        seen = fingerprint(offered) if offered is not None else "(not seen)"
        expected = fingerprint(pinned) if pinned is not None else "(none)"
        return (
            f"{where}: HOST KEY CHANGED, possible man-in-the-middle: the server shows "
            f"{seen}, the pinned key is {expected}. Refusing to connect; if the host was "
            "reinstalled, check its new key out of band and pin it in the inventory"
        )

    async def run(self, access: HostAccess, command: str) -> RemoteResult:
        """Run a command that changes nothing, retrying the whole call (connect and run)
        on transient failures.

        Raises:
            SshError: as ``connection``; TIMEOUT past ``command_timeout_s``;
                UNREACHABLE when the session drops.
        """

        async def once() -> RemoteResult:
            # One connect per try: this is the only retry, so a dead host costs
            # ``attempts`` connects, not ``attempts`` squared.
            async with self.connection(access, retry=False) as conn:
                return await self._run_once(access, conn, command)

        return await self._retrying(once)

    async def _run_once(
        self, access: HostAccess, conn: asyncssh.SSHClientConnection, command: str
    ) -> RemoteResult:
        where = self._where(access)
        timeout = self._config.command_timeout_s
        try:
            async with asyncio.timeout(timeout):
                done = await conn.run(command, check=False, stdin=asyncssh.DEVNULL)
        except TimeoutError:
            raise SshError(
                f"{where}: `{command}` did not finish within {timeout:g} s",
                reason=SshFailure.TIMEOUT,
            ) from None
        except (asyncssh.Error, OSError) as exc:
            raise SshError(
                f"{where}: `{command}`: the session failed ({_redacted(exc, access)})",
                reason=SshFailure.UNREACHABLE,
            ) from None
        return RemoteResult(
            command=command,
            exit_status=done.exit_status,
            stdout=_text(done.stdout),
            stderr=_text(done.stderr),
        )

    async def run_detached(
        self, access: HostAccess, wrapper: str, *, shown: str
    ) -> DetachedOutcome:
        """Send a ``commands.detached_command`` wrapper once (never twice: the command
        may already be scheduled) and read how it went. ``shown`` is the command as
        messages name it.

        Returns once the wrapper reports, or once the session drops after the command
        was scheduled (the host going down ends it).

        Raises:
            SshError: as ``connection`` (nothing was sent then); COMMAND when the command
                failed at once, with its stderr; UNREACHABLE or TIMEOUT when the session
                ended before the command was scheduled (it may still run: check the boot
                id before trying again).
        """
        where = self._where(access)
        timeout = self._config.command_timeout_s
        async with self.connection(access) as conn:
            scheduled = False
            try:
                async with asyncio.timeout(timeout):
                    proc = await conn.create_process(wrapper, stdin=asyncssh.DEVNULL)
                    first = _text(await proc.stdout.readline())
                    scheduled = first.strip() == STARTED_MARK
                    done = await proc.wait(check=False)
            except TimeoutError:
                if scheduled:
                    log.warning("%s: `%s` scheduled; no answer within %g s", where, shown, timeout)
                    return DetachedOutcome(finished=False, dropped=True)
                raise SshError(
                    f"{where}: `{shown}`: no answer within {timeout:g} s; it may or may not "
                    "run: check the boot id before trying again",
                    reason=SshFailure.TIMEOUT,
                    transient=False,
                ) from None
            except (asyncssh.Error, OSError) as exc:
                if scheduled:
                    return DetachedOutcome(finished=False, dropped=True)
                raise SshError(
                    f"{where}: `{shown}`: the session failed before the command was "
                    f"scheduled ({_redacted(exc, access)}); it may or may not run: check the "
                    "boot id",
                    reason=SshFailure.UNREACHABLE,
                    transient=False,
                ) from None
        out, err = _text(done.stdout), _text(done.stderr)
        if done.exit_status is None:
            if scheduled:
                return DetachedOutcome(finished=False, dropped=True)
            raise SshError(
                f"{where}: `{shown}`: the session ended before the command was scheduled"
                f"{_output(err, out)}",
                reason=SshFailure.COMMAND,
                transient=False,
            )
        if done.exit_status != 0:
            raise SshError(
                f"{where}: `{shown}` exited {done.exit_status}{_output(err, out)}",
                reason=SshFailure.COMMAND,
                transient=False,
            )
        return DetachedOutcome(finished=RUNNING_MARK not in out, dropped=False)


def _redacted(exc: BaseException, access: HostAccess) -> str:
    return redact(str(exc), access.credential.secret if access.credential else None)


def _text(data: str | bytes | None) -> str:
    if data is None:
        return ""
    return data.decode("utf-8", errors="replace") if isinstance(data, bytes) else data


def _output(stderr: str, stdout: str) -> str:
    text = stderr.strip() or stdout.strip()
    return f": {text[:OUTPUT_LIMIT]}" if text else " (no output)"
