"""Kernel-log prefixes: every reader's timestamp and header style comes off cleanly."""

from __future__ import annotations

import datetime as dt
import re

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from gpufleet.core import kernel_log as kl
from gpufleet.core.kernel_log import parse_line

MSG = "NVRM: Xid (PCI:0000:3b:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."
UTC = dt.UTC
T = dt.datetime(2024, 3, 5, 10, 12, 1)


@pytest.mark.parametrize(
    ("prefix", "timestamp", "uptime", "host"),
    [
        ("", None, None, None),
        ("[ 1234.567890] ", None, 1234.56789, None),
        ("[6781741.548779] ", None, 6781741.548779, None),
        ("[ 1234.567890 <    0.000010>] ", None, 1234.56789, None),
        ("[Tue Mar  5 10:12:01 2024] ", T, None, None),
        ("[Sun Feb 23 16:24:18 2025] ", dt.datetime(2025, 2, 23, 16, 24, 18), None, None),
        (
            "2024-03-05T10:12:01.123456+0000 gpu-7 kernel: ",
            T.replace(microsecond=123456, tzinfo=UTC),
            None,
            "gpu-7",
        ),
        ("2024-03-05T10:12:01+00:00 gpu-7 kernel: ", T.replace(tzinfo=UTC), None, "gpu-7"),
        (
            "2024-03-05T10:12:01.123456789+00:00 gpu-7 kernel: ",
            T.replace(microsecond=123456, tzinfo=UTC),
            None,
            "gpu-7",
        ),
        ("Mar 05 10:12:01 gpu-7 kernel: ", T, None, "gpu-7"),
        ("Mar  5 10:12:01 gpu-7 kernel: ", T, None, "gpu-7"),
        ("<4>Mar  5 10:12:01 gpu-7 kernel[0]: ", T, None, "gpu-7"),
        (
            "Mar  5 10:12:01 gpu-7.example.com kernel: [ 1234.567890] ",
            T,
            1234.56789,
            "gpu-7.example.com",
        ),
        ("<4>1 2024-03-05T10:12:01.000Z gpu-7 kernel - - - ", T.replace(tzinfo=UTC), None, "gpu-7"),
        (
            '<4>1 2024-03-05T10:12:01Z gpu-7 kernel - - [meta seq="1"] ',
            T.replace(tzinfo=UTC),
            None,
            "gpu-7",
        ),
        ("Tue 2024-03-05 10:12:01 UTC gpu-7 kernel: ", T.replace(tzinfo=UTC), None, "gpu-7"),
        ("[ 1234.567890] gpu-7 kernel: ", None, 1234.56789, "gpu-7"),
        (
            "kern  :warn  : 2025-01-21T04:41:44,283575+00:00 ",
            dt.datetime(2025, 1, 21, 4, 41, 44, 283575, tzinfo=UTC),
            None,
            None,
        ),
        ("kern  :err   : [ 1234.567890] ", None, 1234.56789, None),
        ("kern  :err   : [Tue Mar  5 10:12:01 2024] ", T, None, None),
        ("4,1234,1234567890,-;", None, 1234.56789, None),
        ("               ", None, None, None),
    ],
)
def test_prefix_is_stripped(
    prefix: str, timestamp: dt.datetime | None, uptime: float | None, host: str | None
) -> None:
    parsed = parse_line(prefix + MSG + "\n", year=2024)
    assert parsed.message == MSG
    assert parsed.timestamp == timestamp
    assert (
        parsed.uptime_s == pytest.approx(uptime) if uptime is not None else parsed.uptime_s is None
    )
    assert parsed.host == host


def test_yearless_stamp_without_a_year_has_no_timestamp() -> None:
    parsed = parse_line("Mar  5 10:12:01 gpu-7 kernel: " + MSG)
    assert parsed.timestamp is None
    assert parsed.host == "gpu-7"
    assert parsed.message == MSG


def test_levels_from_dmesg_x_and_kmsg() -> None:
    assert parse_line("kern  :warn  : [ 1.0] x").level == "warn"
    assert parse_line("3,1,1000,-;x").level == "err"


@pytest.mark.parametrize(
    "message",
    [
        "nvidia-nvswitch1: SXid (PCI:0000:06:00.0): 20034, Fatal, Link 48 LTSSM Fault Up",
        "pci 0000:04:00.0: 252.048 Gb/s available PCIe bandwidth, limited by 16.0 GT/s PCIe x16",
        "mlx5_core 0000:ab:00.0 mlx5_5: Port: 1 Link DOWN",
        "pt_main_thread[2536443]: segfault at 7f797fe00000 ip 00007f7c7ac69996",
        "[ERROR] [tid 841] detected NVSwitch fatal error 20034",
        "NVRM: GPU 0000:18:00.0: GPU has fallen off the bus.",
    ],
)
def test_messages_that_look_like_prefixes_are_kept_whole(message: str) -> None:
    assert parse_line("[ 5.000000] " + message).message == message
    assert parse_line("2024-03-05T10:12:01+00:00 " + message).message == message


def test_fabric_manager_stamp() -> None:
    parsed = parse_line("[Jul 23 2024 07:53:55] [ERROR] [tid 841] detected NVSwitch fatal error")
    assert parsed.timestamp == dt.datetime(2024, 7, 23, 7, 53, 55)
    assert parsed.message.startswith("[ERROR]")


def test_garbage_never_raises() -> None:
    for text in ["", "\n", "[", "[]", "<", "<999>", "9,", "kern  :", "\x00\xff", "[ 1.0"]:
        assert isinstance(parse_line(text).message, str)


# The pattern ``[stamp] host tag: `` was matched with before the stamp and what follows
# it were split (kernel_log._host_after_mono): the split must find what it found.
_MONO_HOST = re.compile(r"\[\s*(?P<mono>\d+\.\d+)\]\s+" + kl._HOST + r"\s+" + kl._TAG)
_TAILS = st.lists(
    st.one_of(
        st.text(alphabet=st.sampled_from(" \t:[]<>.-_@/0123456789aZ\u00a0\u0661ſK"), max_size=8),
        st.sampled_from(["gpu-7", "kernel:", "kernel[0]:", "NVRM:", "Xid", " ", "\t", ": "]),
    ),
    max_size=6,
).map("".join)


@settings(max_examples=400, deadline=None)
@given(
    head=st.one_of(st.from_regex(_MONO_HOST, fullmatch=True), st.from_regex(kl._BRACKET_MONO)),
    tail=_TAILS,
)
@example(head="[1.5]", tail="gpu-7 kernel: x")  # no space after the stamp: no host
@example(head="[ 1.5]", tail="\t gpu-7 kernel[0]: x")
@example(head="[ 1.5 <0.1>] ", tail="gpu-7 kernel: x")  # a delta: no host either
@example(head="[1.5] ", tail="NVRM: Xid: 4")  # NVRM: is no host
def test_host_after_a_monotonic_stamp_is_what_one_pattern_found(head: str, tail: str) -> None:
    text = head + tail
    stamp = kl._BRACKET_MONO.match(text)
    whole = _MONO_HOST.match(text)
    if stamp is None:
        assert whole is None
        return
    found = kl._host_after_mono(text, stamp)
    if whole is None:
        assert found is None
    else:
        assert found is not None
        assert (found["host"], found.end()) == (whole["host"], whole.end())


@settings(max_examples=400, deadline=None)
@given(
    head=st.one_of(st.from_regex(kl._RFC3164), st.from_regex(kl._SHORT_FULL)),
    tail=_TAILS,
)
def test_the_month_check_lets_every_syslog_header_through(head: str, tail: str) -> None:
    # split_line tries the two header patterns only on text that passes _month_like.
    text = head + tail
    if text[:1].isupper() and (kl._RFC3164.match(text) or kl._SHORT_FULL.match(text)):
        assert kl._month_like(text)


def test_split_line_is_parse_line_as_a_tuple() -> None:
    for prefix in ("", "[ 1.5] ", "[ 1.5] gpu-7 kernel: ", "Mar  5 10:12:01 gpu-7 kernel: "):
        parsed = parse_line(prefix + MSG, year=2024)
        assert kl.split_line(prefix + MSG, 2024) == (
            parsed.message,
            parsed.timestamp,
            parsed.uptime_s,
            parsed.host,
            parsed.level,
        )
