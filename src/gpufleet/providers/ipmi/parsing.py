"""Pure parsers of what ``ipmitool`` prints. No I/O; tested on recorded output
(``tests/fixtures/ipmi``) plus variants.

ipmitool's wording moved between releases (1.8.11 to 1.8.19) and some BMC vendors ship
their own builds, so each parser keys on the few words that stayed, ignores what it does
not know, and raises ``ValueError`` saying what was wrong for anything it cannot read.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum

from gpufleet.providers.base import PowerState

# "Chassis Power is on" (``power status``, ``chassis power status``); "System Power : on"
# (``chassis status``). Some vendor builds capitalise ("On").
_POWER_LINE = re.compile(r"^\s*(?:Chassis Power is|System Power\s*:)\s*(on|off)\b", re.I | re.M)


def parse_power_status(text: str) -> PowerState:
    """``ipmitool power status`` (or ``chassis status``) → ON or OFF.

    Raises:
        ValueError: no power line in ``text``.
    """
    match = _POWER_LINE.search(text)
    if match is None:
        raise ValueError(f"no power state in ipmitool output: {text.strip()[:200]!r}")
    return PowerState.ON if match.group(1).lower() == "on" else PowerState.OFF


# ------------------------------------------------------------------ boot flags (param 5)

# The boot device selector (IPMI 2.0 table 28-14, data 2 bits 5:2) → ipmitool's bootdev
# name.
_DEVICE_BY_CODE = {
    0x0: "none",
    0x1: "pxe",
    0x2: "disk",
    0x3: "safe",
    0x4: "diag",
    0x5: "cdrom",
    0x6: "bios",
    0xF: "floppy",
}
# The same, from ipmitool's words ("Force PXE", "No override"...), first match wins.
_DEVICE_BY_WORDS = (
    ("pxe", "pxe"),
    ("no override", "none"),
    ("safe", "safe"),
    ("diagnostic", "diag"),
    ("hard-drive", "disk"),
    ("hard drive", "disk"),
    ("cd/dvd", "cdrom"),
    ("bios setup", "bios"),
    ("floppy", "floppy"),
    ("remote", "remote"),
)
_DATA_LINE = re.compile(r"Boot parameter data:\s*([0-9a-fA-F]+)")
_SELECTOR_LINE = re.compile(r"Boot Device Selector\s*:\s*(.+)", re.I)


@dataclass(frozen=True, slots=True)
class BootFlags:
    """The boot override a BMC holds (``chassis bootparam get 5``)."""

    device: str  # ipmitool's bootdev name: none, pxe, disk, cdrom, bios...
    persistent: bool  # every boot (True) or the next one only
    efi: bool  # UEFI boot (True) or legacy BIOS
    valid: bool  # the BMC flags the override as set; some (ipmi_sim) never do


def parse_boot_flags(text: str) -> BootFlags:
    """``ipmitool chassis bootparam get 5`` → the boot override.

    Reads the raw ``Boot parameter data`` bytes when printed (every release since 1.8.9),
    otherwise ipmitool's words.

    Raises:
        ValueError: neither the data bytes nor a device selector line is in ``text``.
    """
    data = _DATA_LINE.search(text)
    if data is not None and len(data.group(1)) >= 4:
        raw = bytes.fromhex(data.group(1)[: len(data.group(1)) // 2 * 2])
        selector = (raw[1] >> 2) & 0xF
        return BootFlags(
            device=_DEVICE_BY_CODE.get(selector, f"0x{selector:x}"),
            persistent=bool(raw[0] & 0x40),
            efi=bool(raw[0] & 0x20),
            valid=bool(raw[0] & 0x80),
        )
    line = _SELECTOR_LINE.search(text)
    if line is None:
        raise ValueError(f"no boot device in ipmitool output: {text.strip()[:200]!r}")
    words = line.group(1).strip().lower()
    device = next((name for key, name in _DEVICE_BY_WORDS if key in words), words)
    lowered = text.lower()
    return BootFlags(
        device=device,
        persistent="all future boots" in lowered,
        efi="efi boot" in lowered,
        valid="boot flag valid" in lowered,
    )


# ------------------------------------------------------------------------- failures


class Failure(StrEnum):
    """What an ipmitool run that failed ran into, read from its stderr (with ``-v``)."""

    AUTH = "auth"  # user or password refused
    PRIVILEGE = "privilege"  # the user may not act at the asked privilege
    CIPHER = "cipher"  # the BMC does not offer the configured cipher suite
    UNREACHABLE = "unreachable"  # no answer at all
    TIMEOUT = "timeout"  # ipmitool did not finish in time (set by the client, not parsed)
    BUSY = "busy"  # the BMC has no free session
    NOT_IN_STATE = "not_in_state"  # refused in the present state (cycle while off)
    OTHER = "other"

    @property
    def transient(self) -> bool:
        """Worth another try after a pause."""
        return self in (Failure.UNREACHABLE, Failure.TIMEOUT, Failure.BUSY)


# Checked in order: a refused password also prints "Unable to establish ... session",
# so the specific lines come before the generic ones.
_FAILURE_PATTERNS: tuple[tuple[Failure, re.Pattern[str]], ...] = (
    (
        Failure.AUTH,
        re.compile(
            r"RAKP \d HMAC is invalid|unauthorized name|invalid integrity check value"
            r"|Activate Session (?:command failed|error)|Invalid user name"
            r"|Null user name .* not enabled"
            r"|password (?:invalid|incorrect)|Authentication failed",
            re.I,
        ),
    ),
    (
        Failure.PRIVILEGE,
        re.compile(
            r"Insufficient privilege|invalid role|requested privilege level"
            r"|Set Session Privilege Level to \w+ failed",
            re.I,
        ),
    ),
    (
        Failure.CIPHER,
        re.compile(
            r"invalid (?:authentication|integrity|confidentiality) algorithm"
            r"|no matching cipher suite|cipher suite .* not supported|Invalid cipher suite",
            re.I,
        ),
    ),
    (Failure.BUSY, re.compile(r"insufficient resources", re.I)),
    (Failure.NOT_IN_STATE, re.compile(r"not supported in present state", re.I)),
    (
        Failure.UNREACHABLE,
        re.compile(
            r"Get Auth Capabilities|Get Channel Authentication Capabilities"
            r"|No response from remote controller|Connection refused|Address lookup"
            r"|Unable to establish|timeout",
            re.I,
        ),
    ),
)

# ipmitool's chatter under ``-v``: the probes it makes after opening a session (VSO,
# PICMG, HPM.x) and their refusals ("Invalid completion code received: Insufficient
# privilege level" comes from a probe even when the command itself then succeeds).
_NOISE = re.compile(
    r"^\s*(?:Loading IANA PEN Registry|Running Get VSO Capabilities|Running Get PICMG"
    r"|Discovered IPMB address|Invalid completion code received"
    r"|Get HPM\.x Capabilities request failed|Password:).*$",
    re.I | re.M,
)


def classify_failure(output: str) -> Failure:
    """What a failed ipmitool run ran into, from its stderr (and stdout)."""
    meaningful = _NOISE.sub("", output)
    for failure, pattern in _FAILURE_PATTERNS:
        if pattern.search(meaningful):
            return failure
    return Failure.OTHER


def failure_text(output: str, *, limit: int = 500) -> str:
    """ipmitool's error lines for a message: chatter dropped, on one line."""
    lines = [line.strip() for line in _NOISE.sub("", output).splitlines()]
    text = "; ".join(line for line in lines if line)
    return (text or "(no output)")[:limit]
