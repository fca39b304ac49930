"""A project's admins become Slurm Administrators on the real lab (slurmdbd), and stop
being so when they leave; an operator's own Administrator is never touched."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from gpufleet.agent.access import AccessApplier, parse_admin_levels
from gpufleet.core.slurm_admins import AccessConfig, render_access
from gpufleet.testing.slurm_lab import SlurmLab

USERS = ("gpf_alice", "gpf_bob", "gpf_ops")


def levels(lab: SlurmLab) -> dict[str, str]:
    out = lab.run("sacctmgr", "-n", "-P", "show", "user", "format=user,adminlevel").stdout
    return {u: level for u, level in parse_admin_levels(out).items() if u in USERS}


def access(admins: list[str], members: list[str]) -> AccessConfig:
    return render_access(
        cluster_id="c",
        cluster_name="lab",
        project_id="p",
        project_name="ml",
        slurm=True,
        admins=[(n, n) for n in admins],
        members=[(n, n) for n in admins + members],
    )


@pytest.fixture
def lab_users(slurm_lab: SlurmLab) -> Iterator[SlurmLab]:
    """Leaves slurmdbd without the test's users, whatever the test did."""
    yield slurm_lab
    for user in USERS:
        slurm_lab.run("sacctmgr", "-i", "delete", "user", f"name={user}", check=False)


def test_admin_levels_follow_the_project_on_the_real_lab(
    lab_users: SlurmLab, tmp_path: Path
) -> None:
    lab = lab_users
    # An operator made this one Administrator by hand: gpufleet must leave it alone.
    lab.run("sacctmgr", "-i", "add", "user", "name=gpf_ops", "account=root",
            "adminlevel=Administrator")  # fmt: skip
    applier = AccessApplier(
        state_dir=tmp_path,
        sudoers_path=None,
        sacctmgr=("sacctmgr",),
        env=lab.env(),
    )

    done = applier.apply(access(admins=["gpf_alice"], members=["gpf_bob"]))
    assert done == ["added Slurm user gpf_alice (Administrator)"]
    assert levels(lab) == {"gpf_alice": "Administrator", "gpf_ops": "Administrator"}

    # bob is promoted, alice leaves the project: bob added as admin, alice back to None.
    done = applier.apply(access(admins=["gpf_bob"], members=[]))
    assert sorted(done) == [
        "Slurm AdminLevel of gpf_alice: Administrator → None",
        "added Slurm user gpf_bob (Administrator)",
    ]
    assert levels(lab) == {
        "gpf_alice": "None",
        "gpf_bob": "Administrator",
        "gpf_ops": "Administrator",
    }

    # bob demoted to member: None; the same configuration again changes nothing.
    demoted = access(admins=[], members=["gpf_bob"])
    assert applier.apply(demoted) == ["Slurm AdminLevel of gpf_bob: Administrator → None"]
    assert applier.apply(demoted) == []
    assert levels(lab)["gpf_bob"] == "None"
    assert levels(lab)["gpf_ops"] == "Administrator"
