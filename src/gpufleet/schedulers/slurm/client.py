"""The only I/O of the Slurm driver: running the Slurm commands as child processes.

Never through a shell (arguments such as a drain reason are passed as they are), always
with a timeout, with the environment from ``SlurmConfig``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shlex
from dataclasses import dataclass

from gpufleet.core.errors import DriverError
from gpufleet.schedulers.slurm.config import SlurmConfig

# sacct and scontrol print local times without a zone; with these the parsers can read
# them as UTC, and ``sacct -S`` reads our UTC times back the same way.
_FIXED_ENV = {"TZ": "UTC", "SLURM_TIME_FORMAT": "standard"}
_OUTPUT_LIMIT = 2000  # characters of stderr (or stdout) kept in an error message


@dataclass(frozen=True, slots=True)
class CommandResult:
    argv: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str

    @property
    def command(self) -> str:
        """The command as a person would type it (for messages only; never run)."""
        return shlex.join(self.argv)


def describe_failure(result: CommandResult, *, node: str | None) -> str:
    """``slurm: node n1: `scontrol update ...` exited 1: <stderr, else stdout>``."""
    where = f"node {node}: " if node else ""
    # Some errors go to stdout ("Node nosuch not found" from scontrol show node).
    output = result.stderr.strip() or result.stdout.strip() or "(no output)"
    return f"slurm: {where}`{result.command}` exited {result.returncode}: {output[:_OUTPUT_LIMIT]}"


class SlurmCli:
    """Runs ``sinfo``, ``squeue``, ``sacct`` and ``scontrol`` for one cluster."""

    def __init__(self, config: SlurmConfig) -> None:
        self._config = config
        base = dict(os.environ) if config.inherit_env else {}
        self._env = {**base, **config.env, **_FIXED_ENV}

    async def run(self, *argv: str, node: str | None = None, check: bool = True) -> CommandResult:
        """Run one Slurm command and return what it printed.

        Args:
            argv: the command and its arguments, e.g. ``("sinfo", "--json")``.
            node: the node the call is about, named in error messages.
            check: raise when the command exits non-zero (else return the result).

        Raises:
            DriverError: the command is missing, ran past ``timeout_s`` (it is killed),
                or (with ``check``) exited non-zero; the message names the node, the
                command and its stderr.
        """
        program = argv[0]
        if self._config.bin_dir is not None:
            program = os.path.join(self._config.bin_dir, program)
        where = f"node {node}: " if node else ""
        command = shlex.join(argv)
        try:
            proc = await asyncio.create_subprocess_exec(
                program,
                *argv[1:],
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env=self._env,
            )
        except OSError as exc:
            raise DriverError(f"slurm: {where}`{command}` could not start: {exc}") from exc
        try:
            out, err = await asyncio.wait_for(proc.communicate(), self._config.timeout_s)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
            raise DriverError(
                f"slurm: {where}`{command}` did not answer within {self._config.timeout_s:g} s "
                "(slurmctld down or hung?); killed it"
            ) from None
        except asyncio.CancelledError:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()  # the caller gave up: leave no child behind
            raise
        result = CommandResult(
            argv=tuple(argv),
            returncode=proc.returncode if proc.returncode is not None else -1,
            stdout=out.decode("utf-8", errors="replace"),
            stderr=err.decode("utf-8", errors="replace"),
        )
        if check and result.returncode != 0:
            raise DriverError(describe_failure(result, node=node))
        return result
