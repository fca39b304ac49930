"""The transition tables: complete, closed, and enforced by check_transition."""

from __future__ import annotations

from enum import StrEnum

import pytest

from gpufleet.core.agent_protocol import CommandStatus
from gpufleet.core.enums import ClusterStatus, NodeState, RepairStatus
from gpufleet.core.errors import Conflict, InvalidTransition
from gpufleet.core.transitions import (
    CLUSTER_TRANSITIONS,
    COMMAND_TRANSITIONS,
    FINAL_COMMAND_STATUSES,
    LIFECYCLES,
    NODE_TRANSITIONS,
    REPAIR_TRANSITIONS,
    check_transition,
)

# Every lifecycle's table (cluster, node, repair, check run, node command, acceptance run
# status and stage, startup run).
TABLES: list[tuple[str, dict[StrEnum, frozenset[StrEnum]], type[StrEnum]]] = [
    (name, dict(lifecycle.table), lifecycle.states) for name, lifecycle in LIFECYCLES.items()
]


@pytest.mark.parametrize(("name", "table", "enum"), TABLES, ids=[t[0] for t in TABLES])
def test_every_state_has_a_row_and_targets_are_states(
    name: str, table: dict[StrEnum, frozenset[StrEnum]], enum: type[StrEnum]
) -> None:
    assert set(table) == set(enum), name
    for source, targets in table.items():
        assert targets <= set(enum)
        assert source not in targets, f"{name}: {source} lists itself"


@pytest.mark.parametrize(("name", "table", "enum"), TABLES, ids=[t[0] for t in TABLES])
def test_every_state_is_reachable_from_the_first(
    name: str, table: dict[StrEnum, frozenset[StrEnum]], enum: type[StrEnum]
) -> None:
    start = next(iter(enum))
    seen = {start}
    frontier = [start]
    while frontier:
        for target in table[frontier.pop()]:
            if target not in seen:
                seen.add(target)
                frontier.append(target)
    assert seen == set(enum), f"{name}: unreachable {set(enum) - seen}"


def test_terminal_states_have_no_way_out() -> None:
    assert CLUSTER_TRANSITIONS[ClusterStatus.DELETED] == frozenset()
    # A removed node's one way out: Slurm powers a cloud node it had powered down up
    # again, as the same node on a new machine (autoscaling, mode slurm).
    assert NODE_TRANSITIONS[NodeState.REMOVED] == frozenset({NodeState.PROVISIONING})
    for status in (
        RepairStatus.REJECTED,
        RepairStatus.SUPERSEDED,
        RepairStatus.RESOLVED,
        RepairStatus.SUCCEEDED,
        RepairStatus.FAILED,
    ):
        assert REPAIR_TRANSITIONS[status] == frozenset()


def test_final_command_statuses_are_the_table_s_dead_ends() -> None:
    assert {s for s, nxt in COMMAND_TRANSITIONS.items() if not nxt} == FINAL_COMMAND_STATUSES
    assert CommandStatus.SENT not in FINAL_COMMAND_STATUSES
    assert CommandStatus.TIMED_OUT in FINAL_COMMAND_STATUSES


def test_deletion_and_removal_are_one_way() -> None:
    assert CLUSTER_TRANSITIONS[ClusterStatus.DELETING] == {ClusterStatus.DELETED}
    assert NODE_TRANSITIONS[NodeState.REMOVING] == {NodeState.REMOVED}
    for state, targets in NODE_TRANSITIONS.items():
        if state not in (NodeState.REMOVING, NodeState.REMOVED):
            assert NodeState.REMOVING in targets, state
            assert NodeState.REMOVED not in targets, state
    for status, targets in CLUSTER_TRANSITIONS.items():
        if status not in (ClusterStatus.DELETING, ClusterStatus.DELETED):
            assert ClusterStatus.DELETING in targets, status
            assert ClusterStatus.DELETED not in targets, status


def test_approval_comes_before_any_action() -> None:
    acting = {
        RepairStatus.CORDONING,
        RepairStatus.DRAINING,
        RepairStatus.ACTING,
        RepairStatus.VERIFYING,
    }
    assert not REPAIR_TRANSITIONS[RepairStatus.PROPOSED] & acting


@pytest.mark.parametrize(("name", "table", "enum"), TABLES, ids=[t[0] for t in TABLES])
def test_check_transition_agrees_with_the_table(
    name: str, table: dict[StrEnum, frozenset[StrEnum]], enum: type[StrEnum]
) -> None:
    for current in enum:
        for target in enum:
            if target is current or target in table[current]:
                check_transition(table, entity=name, current=current, target=target)
            else:
                with pytest.raises(InvalidTransition):
                    check_transition(table, entity=name, current=current, target=target)


def test_invalid_transition_message_names_entity_and_allowed_targets() -> None:
    with pytest.raises(InvalidTransition) as info:
        check_transition(
            NODE_TRANSITIONS,
            entity="node train-000",
            current=NodeState.REMOVED,
            target=NodeState.IN_SERVICE,
        )
    assert isinstance(info.value, Conflict)  # so the API answers 409
    assert info.value.field == "status"
    assert "node train-000" in info.value.message
    assert "removed" in info.value.message
    assert "in_service" in info.value.message
    assert "allowed: provisioning" in info.value.message

    with pytest.raises(InvalidTransition) as info:
        check_transition(
            CLUSTER_TRANSITIONS,
            entity="cluster a",
            current=ClusterStatus.DELETING,
            target=ClusterStatus.READY,
        )
    assert "allowed: deleted" in info.value.message
