"""Slurm's GPUs against the hardware's: parsing (on recorded lab output) and the decisions."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from gpufleet.agent.collectors.base import CollectorResult, Sample
from gpufleet.agent.collectors.slurm import SlurmCollector, SlurmNode, parse_json, parse_text
from gpufleet.agent.gres_check import (
    GresCheck,
    SlurmGpus,
    model_matches,
    parse_gres,
    slurm_gpus,
)
from gpufleet.agent.outbox import Outbox

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "slurm"
H100 = "NVIDIA H100 80GB HBM3"


@pytest.mark.parametrize(
    ("gres", "features", "count", "types"),
    [
        ("gpu:h100:8", (), 8, {"h100"}),
        ("gpu:h100:8(S:0-1)", (), 8, {"h100"}),
        ("gpu:h100:8(S:0-1),nic:2", (), 8, {"h100"}),
        ("gpu:8", (), 8, set()),
        ("gpu:8(S:0)", (), 8, set()),
        ("gpu:a100:4,gpu:a100_1g.5gb:2,nic:1", (), 6, {"a100", "a100_1g.5gb"}),
        ("gpu:h100:4(S:0),gpu:h100:4(S:1)", ("gpu", "H100", "ib"), 8, {"h100"}),
        ("", ("gpu_h200",), 0, {"h200"}),
        ("", ("nvidia-l40s", "ib", "x86"), 0, {"l40s"}),
        ("(null)", (), 0, set()),
        ("gpu", (), 0, set()),  # no count: not guessed
        ("gpu:1K", (), 1024, set()),
    ],
)
def test_parse_gres(gres: str, features: tuple[str, ...], count: int, types: set[str]) -> None:
    assert parse_gres(gres, features) == SlurmGpus(count, frozenset(types))


def recorded(name: str) -> SlurmNode:
    node = parse_text((FIXTURES / name).read_text())
    assert node is not None
    return node


def test_recorded_22_05_text() -> None:
    idle = recorded("scontrol-show-node-one-22.05.txt")
    assert (idle.gres, idle.features, idle.states) == ("gpu:h100:8", (), frozenset({"IDLE"}))
    assert slurm_gpus(idle) == SlurmGpus(8, frozenset({"h100"}))
    # slurmd registered 6 of 8: Gres= still says 8, the refused count is in Slurm's reason
    refused = recorded("scontrol-show-node-invalid-reg-22.05.txt")
    assert refused.states == {"IDLE", "DRAIN", "INVALID_REG"} and refused.gres == "gpu:h100:8"
    assert slurm_gpus(refused) == SlurmGpus(8, frozenset({"h100"}), registered=6)
    assert slurm_gpus(refused).offered == 6
    # registered again with 8: the drain and its reason stay, the count is 8 again
    again = recorded("scontrol-show-node-reregistered-22.05.txt")
    assert again.states == {"IDLE", "DRAIN"} and "(6 < 8)" in again.reason
    assert slurm_gpus(again).offered == 8
    # the all-nodes --oneliner recording parses the same
    line = (FIXTURES / "scontrol-show-node-22.05.txt").read_text().splitlines()[1]
    node = parse_text(line)
    assert node is not None and parse_gres(node.gres).count == 8


def test_23_02_json() -> None:
    text = (FIXTURES / "scontrol-show-node-23.02-ref.json").read_text()
    node = parse_json(text)
    assert node is not None and node.gres == "gpu:h100:8(S:0-1)" and node.features == ("gpu",)
    assert slurm_gpus(node) == SlurmGpus(8, frozenset({"h100"}))
    doc = json.loads(text)
    doc["nodes"][0].update(
        state=["IDLE", "DRAIN", "INVALID_REG"],
        reason="gres/gpu count reported lower than configured (7 < 8)",
        features="gpu,h100,ib",  # 22.05's sinfo form: one string
    )
    refused = parse_json(json.dumps(doc))
    assert refused is not None and slurm_gpus(refused).offered == 7
    assert refused.features == ("gpu", "h100", "ib")


def test_model_matches() -> None:
    assert model_matches("h100", H100)
    assert model_matches("h100_80gb", H100)
    assert model_matches("a100", "NVIDIA A100-SXM4-80GB")
    assert model_matches("l40s", "NVIDIA L40S")
    assert model_matches("tesla", H100)  # names no GPU family: nothing to judge by
    assert not model_matches("a100", H100)
    assert not model_matches("h100", "NVIDIA H200")
    assert not model_matches("a10", "NVIDIA A100-SXM4-80GB")


# -- the decisions -------------------------------------------------------------------


def gpus(n: int, model: str = H100, *, first: int = 0) -> CollectorResult:
    return CollectorResult(
        samples=[
            Sample(scope="gpu", gpu_index=i, gpu_uuid=f"GPU-{i}", model=model, values={})
            for i in range(first, first + n)
        ]
    )


def slurm_view(gres: str = "gpu:h100:8", *, registered: int | None = None) -> SlurmCollector:
    c = SlurmCollector(hostname="n1")
    set_view(c, gres, registered=registered)
    return c


def set_view(c: SlurmCollector, gres: str, *, registered: int | None = None) -> None:
    if registered is None:
        c.last = SlurmNode(frozenset({"IDLE"}), "", gres=gres)
    else:
        reason = f"gres/gpu count reported lower than configured ({registered} < 8)"
        c.last = SlurmNode(frozenset({"IDLE", "DRAIN", "INVALID_REG"}), reason, gres=gres)


class Monotonic:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


async def active(check: GresCheck, result: CollectorResult) -> dict[str, str]:
    return {c.attrs["mismatch"]: c.evidence for c in await check.observe(result) if c.active}


async def settle(check: GresCheck) -> None:
    """Let a fix that is running finish (the agent would go on sampling meanwhile)."""
    if check._fix is not None:
        await check._fix.task


def messages(state_dir: Path) -> list[str]:
    return [e.message for _, e in Outbox(state_dir).pending(50)]


async def test_more_in_slurm_than_hardware_is_raised_and_clears(tmp_path: Path) -> None:
    check = GresCheck(slurm_view(), state_dir=tmp_path, fix_command=("false",))
    assert await active(check, gpus(8)) == {}
    assert messages(tmp_path) == []
    conditions = await check.observe(gpus(6))  # two GPUs fell off after slurmd registered
    [high] = [c for c in conditions if c.active]
    assert high.component == "slurm-gres-count-high"
    assert high.attrs == {
        "mismatch": "count_high",
        "slurm_count": "8",
        "hw_count": "6",
        "slurm_type": "h100",
        "hw_model": H100,
    }
    assert "Slurm offers 8 GPU(s); the node has 6" in high.evidence
    assert "Gres=gpu:h100:8" in high.evidence and f"hardware 6 GPU(s): {H100}" in high.evidence
    assert await active(check, gpus(6)) == {"count_high": high.evidence}
    assert check._fix is None  # never the agent's to fix
    assert await active(check, gpus(8)) == {}
    [(_, first), (_, agree)] = Outbox(tmp_path).pending(5)  # one per change, not per sample
    assert first.kind.value == "node.gpu_state" and first.data["hardware_gpus"] == 6
    assert first.data["slurm_gpus"] == 8 and first.data["slurm_gres"] == "gpu:h100:8"
    assert agree.message == "GPU state: Slurm and the hardware agree again"


async def test_type_mismatch_from_gres_or_feature(tmp_path: Path) -> None:
    check = GresCheck(slurm_view("gpu:a100:8"), state_dir=tmp_path)
    found = await active(check, gpus(8))
    assert list(found) == ["type"] and f"Slurm says a100; the node has {H100}" in found["type"]
    c = slurm_view("gpu:8")
    c.last = SlurmNode(frozenset({"IDLE"}), "", gres="gpu:8", features=("ib", "h200"))
    assert list(await active(GresCheck(c, state_dir=tmp_path / "b"), gpus(8))) == ["type"]
    no_model = GresCheck(slurm_view("gpu:a100:8"), state_dir=tmp_path / "c")
    assert await active(no_model, gpus(8, model="")) == {}  # nothing to judge by


async def test_refused_registration_is_fixed_by_a_slurmd_restart(tmp_path: Path) -> None:
    """slurmd started while 2 GPUs were missing (INVALID_REG, 6 < 8); they are back."""
    marker = tmp_path / "restarted"
    c = slurm_view(registered=6)
    clock = Monotonic()
    check = GresCheck(
        c, state_dir=tmp_path, fix_command=("touch", str(marker)), verify_s=30, monotonic=clock
    )
    assert await active(check, gpus(8)) == {}  # the restart runs; judged later
    await settle(check)
    assert marker.exists()
    clock.t += 5
    assert await active(check, gpus(8)) == {}  # not registered yet: still within verify_s
    set_view(c, "gpu:h100:8")  # slurmd registered all 8
    assert await active(check, gpus(8)) == {}
    ran, fixed = messages(tmp_path)
    assert ran.startswith("Slurm offers 6 GPU(s) (slurmd registered 6 of the 8 configured)")
    assert f"ran `touch {marker}`" in ran
    assert fixed == "GPU state fixed: Slurm counts all 8 GPUs again"


async def test_a_fix_that_does_not_take_is_raised_and_not_retried(tmp_path: Path) -> None:
    marker = tmp_path / "restarted"
    clock = Monotonic()
    check = GresCheck(
        slurm_view("gpu:h100:4"),  # slurm.conf configures 4 of the node's 8
        state_dir=tmp_path,
        fix_command=("touch", str(marker)),
        verify_s=30,
        monotonic=clock,
    )
    assert await active(check, gpus(8)) == {}
    await settle(check)
    assert await active(check, gpus(8)) == {}
    clock.t += 31
    found = await active(check, gpus(8))
    assert (
        list(found) == ["count_low"]
        and "Slurm offers 4 GPU(s); the node has 8" in found["count_low"]
    )
    assert "did not fix it" in found["count_low"]
    marker.unlink()
    assert list(await active(check, gpus(8))) == ["count_low"]
    assert not marker.exists() and check._fix is None  # once per GPU set, not per sample
    assert messages(tmp_path)[-1].startswith("GPU state: Slurm offers 4 GPU(s); the node has 8")
    # another GPU set (a GPU replaced: a new UUID) is tried once again
    assert await active(check, gpus(8, first=1)) == {}
    await settle(check)
    assert marker.exists()


async def test_a_failing_or_hanging_fix_never_stalls_sampling(tmp_path: Path) -> None:
    failing = GresCheck(slurm_view(registered=6), state_dir=tmp_path, fix_command=("false",))
    assert await active(failing, gpus(8)) == {}
    await settle(failing)
    assert "did not fix it (exit 1)" in (await active(failing, gpus(8)))["count_low"]

    hanging = GresCheck(
        slurm_view(registered=6),
        state_dir=tmp_path / "b",
        fix_command=("sleep", "30"),
        fix_timeout_s=0.3,
    )
    started = time.monotonic()
    assert await active(hanging, gpus(8)) == {}
    assert await active(hanging, gpus(8)) == {}
    assert time.monotonic() - started < 0.2  # the command runs beside the sampling
    await settle(hanging)
    assert "took over 0.3 s" in (await active(hanging, gpus(8)))["count_low"]
    assert "it failed: sleep 30 took over 0.3 s" in messages(tmp_path / "b")[0]

    missing = GresCheck(
        slurm_view(registered=6), state_dir=tmp_path / "c", fix_command=("/nonexistent/x",)
    )
    await active(missing, gpus(8))
    await settle(missing)
    assert "cannot run /nonexistent/x" in (await active(missing, gpus(8)))["count_low"]


async def test_without_a_fix_command_fewer_is_raised_at_once(tmp_path: Path) -> None:
    check = GresCheck(slurm_view(registered=6), state_dir=tmp_path)
    found = await active(check, gpus(8))
    assert list(found) == ["count_low"] and "registered 6 of the 8" in found["count_low"]


async def test_refused_registration_matching_the_hardware_is_slurms_own_finding(
    tmp_path: Path,
) -> None:
    # slurmd registered the 6 the node has; Slurm drained it itself with its reason, which
    # the catalog's slurm-gres-gpu-count-low already reports: nothing more from here.
    check = GresCheck(slurm_view(registered=6), state_dir=tmp_path, fix_command=("false",))
    assert await active(check, gpus(6)) == {}
    assert check._fix is None


async def test_no_slurm_view_or_no_gpus_yet_no_conditions(tmp_path: Path) -> None:
    check = GresCheck(SlurmCollector(hostname="n1"), state_dir=tmp_path)
    assert await check.observe(gpus(8)) == []
    assert await GresCheck(slurm_view(), state_dir=tmp_path).observe(CollectorResult()) == []
