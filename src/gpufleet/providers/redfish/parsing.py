"""Pure readers of Redfish JSON and of BMC addresses (no I/O), and the reset plan."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from gpufleet.providers.base import PowerState

ROOT_PATH = "/redfish/v1"
# Task states after which a BMC task will not change again (Redfish Task.v1 TaskState).
TASK_DONE_OK = frozenset({"Completed"})
TASK_DONE_FAILED = frozenset({"Exception", "Killed", "Cancelled", "Interrupted"})


class ParseError(ValueError):
    """The BMC's answer is not the Redfish we can read; the message says what is missing."""


@dataclass(frozen=True, slots=True)
class BmcUrl:
    base: str  # scheme://host[:port], no path
    root: str  # the service root path, "/redfish/v1"

    def __str__(self) -> str:
        return self.base + self.root


@dataclass(frozen=True, slots=True)
class SystemView:
    """What the driver reads of one ComputerSystem."""

    path: str  # its @odata.id
    power: PowerState
    power_text: str  # PowerState as the BMC wrote it ("PoweringOn"...), "" if absent
    reset_target: str  # the ComputerSystem.Reset action URL
    # ResetType@Redfish.AllowableValues; None when the BMC does not say (then ActionInfo,
    # or every type is tried).
    reset_allowed: tuple[str, ...] | None
    reset_action_info: str | None  # @Redfish.ActionInfo link
    boot_mode: str | None  # BootSourceOverrideMode: UEFI, Legacy, or None
    boot_targets: tuple[str, ...] | None  # BootSourceOverrideTarget@Redfish.AllowableValues


def bmc_url(address: str, *, port: int | None, scheme: str) -> BmcUrl:
    """The service root of a BMC from a host's ``address``: ``host``, ``host:port``,
    ``[v6]:port`` or a URL (``https://bmc:8443``, ``https://bmc/redfish/v1``).

    Raises ``ParseError`` for an empty address, an unknown scheme, or credentials written
    into the URL (they belong in the host's credential, where they are never printed).
    """
    text = address.strip()
    if not text:
        raise ParseError("the BMC address is empty")
    if "://" not in text:
        text = f"{scheme}://{text}"
    parts = urlsplit(text)
    if parts.scheme not in ("http", "https"):
        raise ParseError(f"BMC URL scheme must be http or https, got {parts.scheme!r}")
    if "@" in parts.netloc:
        raise ParseError(
            "the BMC address holds credentials (user@host); put them in the host's "
            "credential instead"
        )
    if not parts.hostname:
        raise ParseError(f"no host in the BMC address {address!r}")
    netloc = parts.netloc
    if port is not None and parts.port is None:
        netloc = f"{netloc}:{port}"
    path = parts.path.rstrip("/")
    if not path.endswith(ROOT_PATH):
        path = path + ROOT_PATH
    return BmcUrl(base=f"{parts.scheme}://{netloc}", root=path)


def power_state(text: object) -> PowerState:
    """Redfish PowerState → ours: On is on, Off is off, the rest (PoweringOn/Off, Paused,
    missing) is unknown."""
    if text == "On":
        return PowerState.ON
    if text == "Off":
        return PowerState.OFF
    return PowerState.UNKNOWN


def _strings(value: object) -> tuple[str, ...] | None:
    if not isinstance(value, list):
        return None
    return tuple(str(v) for v in value if isinstance(v, str))


def _link(value: object) -> str | None:
    if isinstance(value, Mapping):
        link = value.get("@odata.id")
        if isinstance(link, str) and link:
            return link
    return None


def members(doc: Mapping[str, Any]) -> list[str]:
    """The member links of a Redfish collection."""
    found = doc.get("Members")
    if not isinstance(found, list):
        raise ParseError("the collection has no Members list")
    out = [link for link in (_link(m) for m in found) if link is not None]
    if len(out) != len(found):
        raise ParseError("a collection member has no @odata.id")
    return out


def systems_link(root: Mapping[str, Any]) -> str:
    """The Systems collection link of the service root."""
    link = _link(root.get("Systems"))
    if link is None:
        raise ParseError("the service root has no Systems link")
    return link


def system_view(doc: Mapping[str, Any], *, path: str) -> SystemView:
    """Read a ComputerSystem document."""
    actions = doc.get("Actions")
    reset = actions.get("#ComputerSystem.Reset") if isinstance(actions, Mapping) else None
    if not isinstance(reset, Mapping):
        raise ParseError("the system has no #ComputerSystem.Reset action")
    target = reset.get("target")
    if not isinstance(target, str) or not target:
        raise ParseError("the system's Reset action has no target")
    info = reset.get("@Redfish.ActionInfo")
    boot = doc.get("Boot")
    boot = boot if isinstance(boot, Mapping) else {}
    mode = boot.get("BootSourceOverrideMode")
    text = doc.get("PowerState")
    return SystemView(
        path=str(doc.get("@odata.id") or path),
        power=power_state(text),
        power_text=text if isinstance(text, str) else "",
        reset_target=target,
        reset_allowed=_strings(reset.get("ResetType@Redfish.AllowableValues")),
        reset_action_info=info if isinstance(info, str) and info else None,
        boot_mode=mode if isinstance(mode, str) else None,
        boot_targets=_strings(boot.get("BootSourceOverrideTarget@Redfish.AllowableValues")),
    )


def action_info_reset_types(doc: Mapping[str, Any]) -> tuple[str, ...] | None:
    """The ResetType values an ActionInfo document allows; None if it does not say."""
    params = doc.get("Parameters")
    if not isinstance(params, list):
        return None
    for param in params:
        if isinstance(param, Mapping) and param.get("Name") == "ResetType":
            return _strings(param.get("AllowableValues"))
    return None


def redfish_version(root: Mapping[str, Any]) -> str:
    version = root.get("RedfishVersion")
    return version if isinstance(version, str) else "version unknown"


def reset_plan(order: Sequence[str], allowed: Sequence[str] | None) -> list[str]:
    """The steps of ``order`` the BMC advertises, in that order. ``ForceOffOn`` needs
    ForceOff and On (or ForceOn). ``allowed`` None (the BMC does not say): every step."""
    if allowed is None:
        return list(order)
    plan = []
    for step in order:
        if step == "ForceOffOn":
            if "ForceOff" in allowed and ("On" in allowed or "ForceOn" in allowed):
                plan.append(step)
        elif step in allowed:
            plan.append(step)
    return plan


def on_type(allowed: Sequence[str] | None) -> str:
    """The ResetType that powers a machine on: On, else ForceOn."""
    if allowed is not None and "On" not in allowed and "ForceOn" in allowed:
        return "ForceOn"
    return "On"


@dataclass(frozen=True, slots=True)
class TaskView:
    state: str  # TaskState, "" if absent
    status: str  # TaskStatus (OK, Warning, Critical), "" if absent
    messages: tuple[str, ...]

    @property
    def done(self) -> bool:
        return self.state in TASK_DONE_OK or self.state in TASK_DONE_FAILED

    @property
    def failed(self) -> bool:
        return self.state in TASK_DONE_FAILED or self.status == "Critical"


def task_view(doc: Mapping[str, Any]) -> TaskView:
    """Read a Task (or what a task monitor returns once the task ended)."""
    state = doc.get("TaskState")
    status = doc.get("TaskStatus")
    messages = []
    found = doc.get("Messages")
    if isinstance(found, list):
        for m in found:
            if isinstance(m, Mapping) and isinstance(m.get("Message"), str):
                messages.append(m["Message"])
    return TaskView(
        state=state if isinstance(state, str) else "",
        status=status if isinstance(status, str) else "",
        messages=tuple(messages),
    )
