"""The reads the reviewers' inbox makes over many runs: `open_interrupts` (the open requests
of waiting runs, their reviews, no histories) and `soonest_deadlines` (the runs whose
requests expire first, however old)."""

from __future__ import annotations

import pytest

from layby.wire import InterruptState
from tests.store.conftest import World, interrupt

pytestmark = pytest.mark.store


def test_open_interrupts_are_those_still_open_of_runs_that_wait(world: World) -> None:
    at = world.now()
    world.make("interrupted", "run_1", interrupts=[interrupt("int_a", expires_ms=at + 60_000),
                                                   interrupt("int_b")])
    world.make("interrupted", "run_2")
    world.make("completed", "run_3")
    found = world.store.inbox.open_interrupts(["run_1", "run_2", "run_3", "run_gone"])
    assert [(run_id, agent, sorted(i.id for i in intrs)) for run_id, agent, intrs in found] \
        == [("run_1", "demo.agent", ["int_a", "int_b"]), ("run_2", "demo.agent", ["int_a"])]
    assert all(i.state is InterruptState.OPEN for _, _, intrs in found for i in intrs)
    # What a view says of the same requests.
    view = world.store.runs.view("run_1")
    assert view is not None
    assert {i.id: i for i in found[0][2]} == {i.id: i for i in view.interrupts}


def test_the_soonest_deadlines_come_first_whatever_the_run(world: World) -> None:
    at = world.now()
    for run_id, due in (("run_late", 3_600_000), ("run_past", -5_000), ("run_soon", 60_000)):
        world.make("interrupted", run_id, interrupts=[interrupt("int_a", expires_ms=at + due)])
    world.make("interrupted", "run_never")  # no expiry: no deadline
    assert world.store.deadlines.soonest_deadlines(2) == ["run_past", "run_soon"]
    assert world.store.deadlines.soonest_deadlines() == ["run_past", "run_soon", "run_late"]
