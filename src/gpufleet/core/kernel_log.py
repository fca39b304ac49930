"""Kernel-log line prefixes: split a saved or followed log line into time, host, message.

The same driver message reaches gpufleet through many readers, each adding its own
prefix, sometimes two (a syslog header around a dmesg timestamp). Matchers must see only
the message, so this module strips every prefix it knows, repeatedly, and keeps what the
prefixes said. It never raises: a line it does not recognise is all message.

Recognised (any nesting, e.g. ``Dec  2 10:43:35 host kernel: [240314.528856] NVRM: …``):

* ``/dev/kmsg`` records: ``4,1234,5678901234,-;message``
* ``dmesg -x`` decoding: ``kern  :warn  : `` (facility and level)
* monotonic: ``[ 1234.567890]``, also ``dmesg -d`` ``[ 1234.5 <    0.000010>]``
* ``dmesg -T``: ``[Tue Mar  5 10:12:01 2024]``
* ISO 8601 (``dmesg --time-format iso``, ``journalctl -o short-iso[-precise]``, rsyslog):
  ``2024-03-05T10:12:01.123456+0000`` or with a comma before the fraction
* RFC 3164 / ``journalctl -o short``: ``<4>Mar  5 10:12:01 host kernel: ``
* RFC 5424: ``<4>1 2024-03-05T10:12:01.1Z host kernel - - - ``
* ``journalctl -o short-full``: ``Tue 2024-03-05 10:12:01 UTC host kernel: ``
* ``journalctl -o short-precise``: ``Mar 05 10:12:01.123456 host kernel: ``
* ``journalctl -o short-unix``: ``1709633521.123456 host kernel: `` (UTC)
* ``dmesg -r`` (raw): ``<4>[ 1234.567890]``, the priority before the monotonic stamp
* continuation lines that dmesg indents with spaces
* a UTF-8 byte-order mark before the first line (logs saved by a Windows editor)

``/dev/kmsg`` escapes a record's newlines (and other control bytes) as ``\\xNN``: a message
the driver printed over several lines arrives as one; its ``\\x0a`` become spaces, so the
message reads as ``dmesg`` joins it.
"""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass

_MONTHS = {
    m: i
    for i, m in enumerate(
        ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"), 1
    )
}

# A syslog program tag after the host: ``kernel:``, ``kernel[0]:``, ``nv-fabricmanager[9]:``.
_TAG = r"(?P<tag>[A-Za-z0-9_./@-]+?)(?:\[\d+\])?:\s"
# Not ending in ":": ``[ 12.3] NVRM: Xid: 43, ...`` is no host ``NVRM:`` and tag ``Xid``.
_HOST = r"(?P<host>[A-Za-z0-9_.:-]*[A-Za-z0-9_.-])"
_ISO = (
    r"(?P<iso>\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}:\d{2}(?:[.,]\d{1,9})?"
    r"(?:Z|[+-]\d{2}:?\d{2})?)"
)

_KMSG = re.compile(r"(?P<prio>\d{1,3}),(?P<seq>\d+),(?P<usec>\d+),[^;]*;")
_KMSG_ESCAPE = re.compile(r"\\x([0-9a-fA-F]{2})")
_RAW_PRIO = re.compile(r"<(?P<prio>\d{1,3})>(?=\[)")
_DMESG_X = re.compile(r"(?P<fac>[a-z]{2,8})\s*:(?P<lvl>[a-z]{3,6})\s*:\s")
_BRACKET_MONO = re.compile(r"\[\s*(?P<mono>\d+\.\d+)(?:\s*<[^>]*>)?\]\s?")
_BRACKET_CTIME = re.compile(
    r"\[(?:[A-Z][a-z]{2} )?(?P<mon>[A-Z][a-z]{2})\s+(?P<day>\d{1,2}) "
    # Fabric Manager writes the year before the time: ``[Jul 23 2024 07:53:55]``.
    r"(?:(?P<fmyear>\d{4}) )?(?P<time>\d{2}:\d{2}:\d{2})(?: (?P<year>\d{4}))?\]\s?"
)
_RFC5424 = re.compile(
    r"(?:<\d{1,3}>)?1 " + _ISO + r" " + _HOST + r" (?P<tag>\S+) \S+ \S+ (?:-|(?:\[.*?\])+)\s?"
)
_ISO_HEAD = re.compile(_ISO + r"(?:\s+" + _HOST + r"\s+" + _TAG + r"|\s)")
_RFC3164 = re.compile(
    r"(?:<\d{1,3}>)?(?P<mon>[A-Z][a-z]{2})\s+(?P<day>\d{1,2}) (?P<time>\d{2}:\d{2}:\d{2})"
    # ``journalctl -o short-precise`` adds microseconds: ``Mar 05 10:12:01.123456``.
    r"(?:\.(?P<frac>\d{1,9}))?(?: (?P<year>\d{4}))?\s+" + _HOST + r"\s+" + _TAG
)
# ``journalctl -o short-unix``: seconds since the epoch, then host and tag.
_UNIX_HEAD = re.compile(r"(?P<epoch>\d{9,11}\.\d{1,9}) " + _HOST + r"\s+" + _TAG)
_SHORT_FULL = re.compile(
    r"[A-Z][a-z]{2} (?P<date>\d{4}-\d{2}-\d{2}) (?P<time>\d{2}:\d{2}:\d{2})(?:\.\d+)? "
    r"(?P<zone>[A-Z]{1,5}|[+-]\d{4}) " + _HOST + r"\s+" + _TAG
)
# After a monotonic stamp's ``]``, host then tag: ``journalctl -o short-monotonic``.
_AFTER_MONO = re.compile(r"\s+" + _HOST + r"\s+" + _TAG)


@dataclass(frozen=True, slots=True)
class LogLine:
    """One log line with its prefixes taken apart.

    ``timestamp`` is wall-clock time when a prefix gave one (timezone-aware when the
    prefix had a zone, naive otherwise); ``uptime_s`` is seconds since boot from a
    monotonic stamp. Year-less stamps (RFC 3164, ``dmesg -T`` without a year) get the
    ``year`` passed to :func:`parse_line`, or no ``timestamp`` at all.
    """

    message: str
    timestamp: dt.datetime | None = None
    uptime_s: float | None = None
    host: str | None = None
    level: str | None = None


def _ctime(mon: str, day: str, time: str, year: int | None) -> dt.datetime | None:
    if year is None or mon not in _MONTHS:
        return None
    try:  # ``time`` is ``\d{2}:\d{2}:\d{2}``, as every pattern that captures it says
        return dt.datetime(
            year, _MONTHS[mon], int(day), int(time[:2]), int(time[3:5]), int(time[6:8])
        )
    except ValueError:
        return None


def _iso(text: str) -> dt.datetime | None:
    text = text.replace(",", ".", 1).replace(" ", "T", 1)
    if text.endswith("Z"):
        text = text[:-1] + "+00:00"
    # fromisoformat takes at most 6 fraction digits on 3.11; journald can print 9.
    head, dot, rest = text.partition(".")
    if dot:
        digits = len(rest) - len(rest.lstrip("0123456789"))
        text = head + "." + rest[: min(digits, 6)].ljust(6, "0") + rest[digits:]
    try:
        return dt.datetime.fromisoformat(text)
    except ValueError:
        return None


_LEVELS = ("emerg", "alert", "crit", "err", "warn", "notice", "info", "debug")


# What :func:`split_line` returns: message, timestamp, uptime_s, host, level.
Split = tuple[str, dt.datetime | None, float | None, str | None, str | None]


def parse_line(line: str, *, year: int | None = None) -> LogLine:
    """Strip the known prefixes from one line and return what they said."""
    return LogLine(*split_line(line, year))


def _host_after_mono(text: str, stamp: re.Match[str]) -> re.Match[str] | None:
    """Host and tag right after a monotonic stamp (``[ 12.5] gpu-7 kernel: ``,
    ``journalctl -o short-monotonic``), ``stamp`` being :data:`_BRACKET_MONO`'s match.

    One regex for the stamp with or without them: most lines have none, and a second
    pattern over the same stamp cost each of them a failed match."""
    close = stamp.end("mono")
    return _AFTER_MONO.match(text, close + 1) if text[close] == "]" else None


def _month_like(text: str) -> bool:
    """Whether ``text`` (starting with an uppercase letter) could open an RFC 3164 or
    ``short-full`` header: both need ``[A-Z][a-z]{2}`` then whitespace. Most messages
    (``NVRM: …``, ``SXid …``) fail here, without two regexes."""
    head = text[1:3]
    return head.isascii() and head.isalpha() and head.islower() and text[3:4].isspace()


def split_line(line: str, year: int | None = None) -> Split:
    """:func:`parse_line`'s fields as a tuple, for the matcher's hot path (a
    ``LogLine`` costs as much to build as a third of the parse)."""
    text = line.rstrip("\r\n").lstrip()
    if text[:1] == "\ufeff":
        text = text[1:].lstrip()
    kmsg = False
    timestamp: dt.datetime | None = None
    uptime: float | None = None
    host: str | None = None
    level: str | None = None
    # Prefixes nest at most three deep in practice (syslog header, dmesg -x, stamp).
    for _ in range(5):
        if not text:
            break
        first = text[0]
        m: re.Match[str] | None
        if first == "[":
            if m := _BRACKET_MONO.match(text):
                uptime = float(m["mono"])
                if h := _host_after_mono(text, m):
                    host, m = h["host"], h  # the prefix ends after the tag
            elif m := _BRACKET_CTIME.match(text):
                found = m["year"] or m["fmyear"]
                timestamp = _ctime(m["mon"], m["day"], m["time"], _year(found, year))
            else:
                break
        elif first.isdigit():
            if m := _KMSG.match(text):
                level = _LEVELS[int(m["prio"]) & 7]
                uptime = int(m["usec"]) / 1e6
                kmsg = True
            elif m := _RFC5424.match(text):
                timestamp, host = _iso(m["iso"]), m["host"]
            elif m := _ISO_HEAD.match(text):
                timestamp, host = _iso(m["iso"]), m["host"] or host
            elif m := _UNIX_HEAD.match(text):
                timestamp = dt.datetime.fromtimestamp(float(m["epoch"]), tz=dt.UTC)
                host = m["host"]
            else:
                break
        elif first == "<":
            if m := _RAW_PRIO.match(text):
                level = _LEVELS[int(m["prio"]) & 7]
            elif m := _RFC5424.match(text):
                timestamp, host = _iso(m["iso"]), m["host"]
            elif m := _RFC3164.match(text):
                timestamp = _ctime(m["mon"], m["day"], m["time"], _year(m["year"], year))
                timestamp = _with_fraction(timestamp, m["frac"])
                host = m["host"]
            else:
                break
        elif first.isupper():
            if not _month_like(text):
                break
            if m := _RFC3164.match(text):
                timestamp = _ctime(m["mon"], m["day"], m["time"], _year(m["year"], year))
                timestamp = _with_fraction(timestamp, m["frac"])
                host = m["host"]
            elif m := _SHORT_FULL.match(text):
                timestamp = _iso(f"{m['date']}T{m['time']}" + _zone(m["zone"]))
                host = m["host"]
            else:
                break
        elif first.islower() and (m := _DMESG_X.match(text)):
            level = m["lvl"]
        else:
            break
        text = text[m.end() :].lstrip()
    if kmsg and "\\x" in text:
        text = _KMSG_ESCAPE.sub(_unescape, text)
    return text, timestamp, uptime, host, level


def _unescape(m: re.Match[str]) -> str:
    char = chr(int(m[1], 16))
    # A record's line breaks join its lines with a space, as the matcher joins lines.
    return " " if char in "\r\n" else char


def _with_fraction(stamp: dt.datetime | None, frac: str | None) -> dt.datetime | None:
    if stamp is None or not frac:
        return stamp
    return stamp.replace(microsecond=int(frac[:6].ljust(6, "0")))


def _year(found: str | None, default: int | None) -> int | None:
    return int(found) if found else default


def _zone(zone: str) -> str:
    if zone in ("UTC", "GMT", "Z"):
        return "+00:00"
    if zone[0] in "+-":
        return zone
    # A named zone other than UTC cannot be resolved without tz data: leave it naive.
    return ""
