"""The commands run on a host, as the strings sent over SSH. Pure: no I/O."""

from __future__ import annotations

import math
import shlex

# Reads two kernel files: changes nothing, needs no privilege, works on any Linux.
PROBE_COMMAND = "cat /proc/sys/kernel/random/boot_id /proc/uptime"

# The detached wrapper prints this once the command is scheduled: a session that drops
# after it means the host went down (or the network did), never that nothing was started.
STARTED_MARK = "detached command scheduled (gpufleet)"
RUNNING_MARK = "command still running (gpufleet)"
_TICK_S = 0.2

# ``sh -c`` so that the host user's login shell (bash, zsh, fish) only has to pass one
# quoted word on. The scheduled part runs in a subshell that ignores SIGHUP, with every
# stream off the SSH channel, in the background: it outlives the session, which the host
# ends when it goes down. The foreground waits a bounded time for the command's status,
# so a refusal (sudo: a password is required) comes back with its stderr. Whichever of the
# two ends last removes the temporary folder (``$$`` is the foreground's pid, subshell
# or not).
_DETACHED = """\
d=$(mktemp -d) || exit 125
( trap '' HUP; sleep {delay}; sh -c {command} >"$d/out" 2>&1 </dev/null
  echo $? >"$d/rc.new"; mv "$d/rc.new" "$d/rc"
  if [ -f "$d/abandoned" ] || ! kill -0 $$ 2>/dev/null; then rm -rf "$d"; fi
) </dev/null >/dev/null 2>&1 &
echo {started}
n=0
while [ ! -f "$d/rc" ]; do
  if [ "$n" -ge {ticks} ]; then : >"$d/abandoned"; echo {running}; exit 0; fi
  n=$((n+1)); sleep {tick} 2>/dev/null || sleep 1
done
rc=$(cat "$d/rc")
if [ "$rc" != 0 ]; then head -c 4000 "$d/out" >&2; fi
rm -rf "$d"
exit "$rc"
"""


def detached_command(command: str, *, delay_s: float, wait_s: float) -> str:
    """The string to send to run ``command`` on the host ``delay_s`` seconds from now,
    detached from the SSH session, waiting up to ``delay_s + wait_s`` for its status.

    Exits with the command's status if it ended in time (its output on stderr when it
    failed), 0 with ``RUNNING_MARK`` if it is still running, 125 if nothing was scheduled.
    """
    script = _DETACHED.format(
        delay=f"{delay_s:g}",
        command=shlex.quote(command),
        started=shlex.quote(STARTED_MARK),
        running=shlex.quote(RUNNING_MARK),
        ticks=math.ceil((delay_s + wait_s) / _TICK_S),
        tick=f"{_TICK_S:g}",
    )
    return f"sh -c {shlex.quote(script)}"
