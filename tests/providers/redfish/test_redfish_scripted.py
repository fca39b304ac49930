"""RedfishProvider against ``ScriptedBmc``, a stand-in for what sushy-emulator cannot
produce: a 202 with a task monitor, a 501 or a 400 "not supported" for an advertised reset
type, a 503 that goes away, reset types listed only in an ActionInfo. Sleeps are recorded,
never slept."""

from __future__ import annotations

import pytest
from redfish_fakes import InMemoryHostDirectory, Script, ScriptedBmc

from gpufleet.core.errors import DriverError
from gpufleet.providers.base import Credential, HostAccess
from gpufleet.providers.redfish.config import RedfishConfig
from gpufleet.providers.redfish.driver import RedfishProvider

CONFIG = RedfishConfig(scheme="http", request_timeout_s=2.0, retries=2, backoff_s=0.5)


class Sleeps:
    def __init__(self) -> None:
        self.seconds: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.seconds.append(seconds)


def provider(bmc: ScriptedBmc, sleeps: Sleeps, config: RedfishConfig = CONFIG) -> RedfishProvider:
    access = HostAccess(
        host_id="h1",
        hostname="node-01",
        address=f"http://127.0.0.1:{bmc.port}",
        credential=Credential("root", "calvin-secret"),
    )
    return RedfishProvider(config, InMemoryHostDirectory([access]), sleep=sleeps)


async def test_a_202_reset_is_followed_to_the_end_of_its_task() -> None:
    sleeps = Sleeps()
    with ScriptedBmc(Script(reset_answers={"GracefulRestart": 202})) as bmc:
        await provider(bmc, sleeps).reboot("h1")
    assert bmc.script.posts == ["GracefulRestart"]
    assert bmc.script.task_polls == 3  # 202, 202, then the Completed task
    assert sleeps.seconds == [CONFIG.task_poll_s] * 3


async def test_a_failed_task_is_a_driver_error_naming_the_host() -> None:
    script = Script(reset_answers={"GracefulRestart": 202}, task_state="Exception")
    with ScriptedBmc(script) as bmc, pytest.raises(DriverError) as caught:
        await provider(bmc, Sleeps()).reboot("h1")
    assert "redfish: host node-01 (h1)" in caught.value.message
    assert "task Exception" in caught.value.message


async def test_an_advertised_type_answered_501_falls_back_to_the_next() -> None:
    config = RedfishConfig(scheme="http", reset_order=("PowerCycle", "ForceRestart"))
    script = Script(
        allowed=["On", "ForceOff", "PowerCycle", "ForceRestart"],
        reset_answers={"PowerCycle": 501},
    )
    with ScriptedBmc(script) as bmc:
        await provider(bmc, Sleeps(), config).reboot("h1")
    assert bmc.script.posts == ["PowerCycle", "ForceRestart"]


async def test_a_400_not_supported_falls_back_but_another_400_fails() -> None:
    script = Script(reset_answers={"GracefulRestart": 400})
    with ScriptedBmc(script) as bmc:
        await provider(bmc, Sleeps()).reboot("h1")
    assert bmc.script.posts == ["GracefulRestart", "ForceRestart"]
    script = Script(
        reset_answers={"GracefulRestart": 400},
        reset_bodies={"GracefulRestart": "the system is in a firmware update"},
    )
    with ScriptedBmc(script) as bmc, pytest.raises(DriverError, match="firmware update"):
        await provider(bmc, Sleeps()).reboot("h1")
    assert bmc.script.posts == ["GracefulRestart"]


async def test_unadvertised_types_are_never_sent() -> None:
    script = Script(allowed=["On", "ForceOff", "ForceRestart"])
    with ScriptedBmc(script) as bmc:
        await provider(bmc, Sleeps()).reboot("h1")
    assert bmc.script.posts == ["ForceRestart"]


async def test_every_type_refused_is_an_error_listing_them() -> None:
    script = Script(reset_answers={"GracefulRestart": 501, "ForceRestart": 501, "ForceOff": 501})
    with ScriptedBmc(script) as bmc, pytest.raises(DriverError) as caught:
        await provider(bmc, Sleeps()).reboot("h1")
    assert "every reset type was refused" in caught.value.message
    assert "GracefulRestart" in caught.value.message and "ForceOffOn" in caught.value.message


async def test_reset_types_from_the_action_info() -> None:
    script = Script(allowed=None, action_info=["ForceRestart", "ForceOff", "On"])
    with ScriptedBmc(script) as bmc:
        p = provider(bmc, Sleeps())
        await p.reboot("h1")
        check = await p.check_reach("h1")
    assert bmc.script.posts == ["ForceRestart"]
    assert check.reachable
    assert check.detail == "Redfish 1.11.0, power On, resets: ForceRestart, ForceOff, On"


async def test_a_503_is_retried_with_backoff_then_gives_up() -> None:
    sleeps = Sleeps()
    with ScriptedBmc(Script(fail_system_gets=2)) as bmc:
        await provider(bmc, sleeps).power_state("h1")
    assert sleeps.seconds == [0.5, 1.0]  # doubling
    sleeps = Sleeps()
    with ScriptedBmc(Script(fail_system_gets=3)) as bmc, pytest.raises(DriverError) as caught:
        await provider(bmc, sleeps).power_state("h1")
    assert "after 3 tries" in caught.value.message and "HTTP 503" in caught.value.message
    assert "calvin-secret" not in caught.value.message


async def test_check_reach_makes_one_try_and_changes_nothing() -> None:
    sleeps = Sleeps()
    with ScriptedBmc(Script(fail_system_gets=1)) as bmc:
        check = await provider(bmc, sleeps).check_reach("h1")
    assert not check.reachable and "HTTP 503" in check.detail
    assert sleeps.seconds == [] and bmc.script.posts == []


async def test_a_bmc_advertising_no_usable_reset_type_says_so() -> None:
    with ScriptedBmc(Script(allowed=["On", "Nmi"])) as bmc, pytest.raises(DriverError) as caught:
        await provider(bmc, Sleeps()).reboot("h1")
    assert "advertises none of GracefulRestart, ForceRestart, PowerCycle, ForceOffOn" in (
        caught.value.message
    )
    assert bmc.script.posts == []


async def test_a_reset_answered_500_is_not_sent_again() -> None:
    # The BMC may have acted on it: a second reset would restart a booting host.
    sleeps = Sleeps()
    with (
        ScriptedBmc(Script(first_post_statuses=[500])) as bmc,
        pytest.raises(DriverError) as caught,
    ):
        await provider(bmc, sleeps).reboot("h1")
    assert bmc.script.posts == ["GracefulRestart"] and sleeps.seconds == []
    assert "not retried: the BMC may have acted on it" in caught.value.message


async def test_a_reset_answered_503_is_sent_again() -> None:
    sleeps = Sleeps()
    with ScriptedBmc(Script(first_post_statuses=[503])) as bmc:
        await provider(bmc, sleeps).reboot("h1")
    assert bmc.script.posts == ["GracefulRestart", "GracefulRestart"]
    assert sleeps.seconds == [CONFIG.backoff_s]


async def test_reprovision_asks_for_a_one_time_uefi_pxe_boot_with_the_etag() -> None:
    with ScriptedBmc(Script(boot_targets=["Pxe", "Hdd"])) as bmc:
        await provider(bmc, Sleeps()).reprovision("h1", user_data={})
    boot = {
        "BootSourceOverrideTarget": "Pxe",
        "BootSourceOverrideEnabled": "Once",
        "BootSourceOverrideMode": "UEFI",
    }
    assert bmc.script.patches == [({"Boot": boot}, 'W/"v1"')]
    assert bmc.script.posts == ["GracefulRestart"]


async def test_reprovision_without_a_pxe_boot_target_changes_nothing() -> None:
    with (
        ScriptedBmc(Script(boot_targets=["Hdd", "Cd"])) as bmc,
        pytest.raises(DriverError) as caught,
    ):
        await provider(bmc, Sleeps()).reprovision("h1", user_data={})
    assert "offers no Pxe boot override (it offers Hdd, Cd)" in caught.value.message
    assert bmc.script.patches == [] and bmc.script.posts == []
