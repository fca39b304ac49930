"""Rendering a project's admins as sudoers lines and Slurm AdminLevels (pure)."""

from __future__ import annotations

import pytest

from gpufleet.core.slurm_admins import (
    AdminLevel,
    is_unix_name,
    render_access,
    render_sudoers,
    unix_name_from,
)


@pytest.mark.parametrize(
    ("preferred", "email", "expected"),
    [
        ("alice", None, "alice"),
        ("Alice.Smith", None, "alice_smith"),
        ("bob@example.com", None, "bob"),
        (None, "Carol.Jones@example.com", "carol_jones"),
        ("9lives", None, "_9lives"),
        ("-dash", None, "dash"),
        ("ünïcode", None, "n_code"),
        ("x" * 40, None, "x" * 32),
        ("@@@", None, None),
        (None, None, None),
    ],
)
def test_unix_names_from_idp_claims(
    preferred: str | None, email: str | None, expected: str | None
) -> None:
    name = unix_name_from(preferred, email)
    assert name == expected
    assert name is None or is_unix_name(name)


@pytest.mark.parametrize("name", ["root ALL", "a:b", "ALL", "%admins", "a,b", "", "Bob", "x" * 33])
def test_names_sudoers_could_misread_are_not_unix_names(name: str) -> None:
    assert not is_unix_name(name)
    with pytest.raises(ValueError, match="not a Unix user name"):
        render_sudoers(cluster_name="c", project_name="p", admins=[name])


def test_sudoers_lists_each_admin_once_sorted() -> None:
    text = render_sudoers(cluster_name="train", project_name="ml", admins=["bob", "alice", "bob"])
    rules = [line for line in text.splitlines() if not line.startswith("#")]
    assert rules == ["alice ALL=(ALL:ALL) NOPASSWD: ALL", "bob ALL=(ALL:ALL) NOPASSWD: ALL"]
    assert text.endswith("\n")
    empty = render_sudoers(cluster_name="train", project_name="ml", admins=[])
    assert all(line.startswith("#") for line in empty.splitlines())


def test_access_levels_and_hash() -> None:
    def render(admins: list[tuple[str, str | None]], slurm: bool = True) -> object:
        members = [*admins, ("carol", "carol"), ("dan", None)]
        return render_access(
            cluster_id="c1", cluster_name="train", project_id="p1", project_name="ml",
            slurm=slurm, admins=admins, members=members,
        )  # fmt: skip

    access = render([("alice", "alice"), ("erin", None)])
    assert access.admin_levels == {"alice": AdminLevel.ADMINISTRATOR, "carol": AdminLevel.NONE}
    assert access.skipped == ["erin"]
    assert "alice ALL=" in access.sudoers and "carol" not in access.sudoers
    same = render([("alice", "alice"), ("erin", None)])
    assert same.content_hash == access.content_hash
    changed = render([("alice", "alice"), ("carol", "carol")])
    assert changed.content_hash != access.content_hash
    assert changed.admin_levels["carol"] is AdminLevel.ADMINISTRATOR
    assert render([("alice", "alice")], slurm=False).admin_levels == {}
