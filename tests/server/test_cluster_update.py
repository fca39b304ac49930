"""PATCH /clusters/{id}: acceptance opt-out and suite, startup scripts, autoscaling bounds;
the opt-out is an event and an audit row, at creation and at every change."""

from __future__ import annotations

from apihelpers import count_rows, create_cluster, create_project, error_of, member_client
from sqlalchemy import select

from gpufleet.core.acceptance import default_suite
from gpufleet.server.db.tables import AuditLogRow, EventRow
from gpufleet.testing.app import RunningApp


async def _rows(app: RunningApp, cluster_id: str) -> tuple[list[EventRow], list[AuditLogRow]]:
    async with app.ctx.db.session() as session:
        events = list(
            await session.scalars(
                select(EventRow)
                .where(EventRow.cluster_id == cluster_id, EventRow.kind.like("cluster.%"))
                .order_by(EventRow.id)
            )
        )
        audits = list(
            await session.scalars(
                select(AuditLogRow)
                .where(AuditLogRow.object_id == cluster_id)
                .order_by(AuditLogRow.id)
            )
        )
    return events, audits


async def test_opt_out_at_creation_is_an_event_and_an_audit_row(app: RunningApp) -> None:
    await create_project(app.client, "ml")
    cluster = await create_cluster(app.client, name="quick", acceptance_tests=False)
    assert cluster["acceptance_tests"] is False
    events, audits = await _rows(app, cluster["id"])
    opt_out = [e for e in events if e.kind == "cluster.acceptance_opt_out"]
    assert len(opt_out) == 1 and opt_out[0].data["acceptance_tests"] is False
    assert "opt-out" in opt_out[0].message and opt_out[0].actor is not None
    # The creation's audit row says it: acceptance_tests false in what was asked for.
    assert [a.action for a in audits] == ["cluster.create"]
    assert audits[0].detail["acceptance_tests"] is False

    # A cluster that keeps its acceptance tests records no opt-out.
    other = await create_cluster(app.client, name="careful", acceptance_tests=True)
    assert other["acceptance_tests"] is True
    assert other["acceptance_suite"] == default_suite().model_dump(mode="json")
    events, _ = await _rows(app, other["id"])
    assert not [e for e in events if e.kind == "cluster.acceptance_opt_out"]


async def test_patch_changes_only_the_fields_given_and_records_each_change(
    app: RunningApp,
) -> None:
    await create_project(app.client, "ml")
    cluster = await create_cluster(
        app.client, size=2, startup_scripts=["echo one"], acceptance_tests=True
    )
    suite = {
        "checks": [{"kind": "dcgm-diag", "params": {"level": 2}}, {"kind": "gpu-burn"}],
        "timeout_s": 600,
    }
    response = await app.client.patch(
        f"/api/v1/clusters/{cluster['id']}",
        json={
            "acceptance_suite": suite,
            "startup_scripts": ["echo one", "nvidia-smi -pm 1"],
            "autoscale_max": 8,
            "reason": "shorter suite for the debug cluster",
        },
    )
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["acceptance_suite"]["timeout_s"] == 600
    assert [c["kind"] for c in body["acceptance_suite"]["checks"]] == ["dcgm-diag", "gpu-burn"]
    assert body["startup_scripts"] == ["echo one", "nvidia-smi -pm 1"]
    assert (body["autoscale_min"], body["autoscale_max"]) == (None, 8)
    assert body["acceptance_tests"] is True  # not given: unchanged

    # Opt out, then back in: each is an event and an audit row with the reason.
    for on in (False, True):
        response = await app.client.patch(
            f"/api/v1/clusters/{cluster['id']}",
            json={"acceptance_tests": on, "reason": f"set to {on}"},
        )
        assert response.status_code == 200, response.text
        assert response.json()["acceptance_tests"] is on
    # Resetting the suite to the default is an explicit null.
    response = await app.client.patch(
        f"/api/v1/clusters/{cluster['id']}", json={"acceptance_suite": None}
    )
    assert response.json()["acceptance_suite"] == default_suite().model_dump(mode="json")

    events, audits = await _rows(app, cluster["id"])
    opt = [e for e in events if e.kind == "cluster.acceptance_opt_out"]
    assert [(e.data["acceptance_tests"], e.data["reason"]) for e in opt] == [
        (False, "set to False"),
        (True, "set to True"),
    ]
    updated = [e for e in events if e.kind == "cluster.updated"]
    assert [e.data["changed"] for e in updated] == [
        ["acceptance_suite", "autoscale_max", "startup_scripts"],
        ["acceptance_tests"],
        ["acceptance_tests"],
        ["acceptance_suite"],
    ]
    actions = [a.action for a in audits]
    assert actions.count("cluster.update") == 4  # and the no-op below makes 5
    assert actions.count("cluster.acceptance_opt_out") == 1
    assert actions.count("cluster.acceptance_opt_in") == 1
    # The audit names the scripts by digest, never their text.
    first = next(a for a in audits if a.action == "cluster.update")
    assert "nvidia-smi -pm 1" not in str(first.detail)

    # The same value again changes nothing: no event, only its audit row (changed: []).
    before = await count_rows(app)
    response = await app.client.patch(
        f"/api/v1/clusters/{cluster['id']}", json={"acceptance_tests": True}
    )
    assert response.status_code == 200
    assert await count_rows(app) == {**before, "audit_log": before["audit_log"] + 1}


async def test_patch_refuses_bad_input_members_and_writes_nothing(app: RunningApp) -> None:
    await create_project(app.client, "ml")
    cluster = await create_cluster(app.client, size=4, acceptance_tests=True)
    url = f"/api/v1/clusters/{cluster['id']}"
    member = await member_client(app)
    before = await count_rows(app)
    cases = [
        ({}, "nothing to change"),
        ({"autoscale_max": 2}, "size must not exceed autoscale_max"),
        ({"autoscale_min": 5}, "size must not be below autoscale_min"),
        ({"acceptance_tests": None}, "true or false"),
        ({"startup_scripts": None}, "a list"),
        (
            {"acceptance_suite": {"checks": [{"kind": "dcgm-diag", "params": {"level": 9}}]}},
            "acceptance_suite.checks[0] (dcgm-diag): level must be a whole number 1..4",
        ),
        (
            {"acceptance_suite": {"checks": [{"kind": "nccl"}], "fabric": "token-ring"}},
            "unknown fabric 'token-ring'",
        ),
    ]
    for body, message in cases:
        response = await app.client.patch(url, json=body)
        assert response.status_code == 422, (body, response.text)
        assert message in error_of(response)["message"]
    bad = [
        {"acceptance_suite": {"checks": []}},
        {"acceptance_suite": {"checks": [{"kind": "dcgm-diag", "scope": "cluster"}]}},
        {"acceptance_suite": {"checks": [{"kind": "memtest"}]}},
        {"startup_scripts": [""]},
        {"size": 9},
    ]
    for body in bad:
        response = await app.client.patch(url, json=body)
        assert response.status_code == 422, (body, response.text)
    async with member:
        refused = await member.patch(url, json={"acceptance_tests": False})
        assert refused.status_code == 403, refused.text
        seen = await member.get(url)
        assert seen.status_code == 200 and seen.json()["acceptance_tests"] is True
    after = await count_rows(app)
    # Only refusals may be audited (the access-control middleware writes those).
    assert {k: v for k, v in after.items() if k != "audit_log"} == {
        k: v for k, v in before.items() if k != "audit_log"
    }
    missing = await app.client.patch(
        "/api/v1/clusters/0190a000-0000-7000-8000-000000000000", json={"acceptance_tests": False}
    )
    assert missing.status_code == 404
