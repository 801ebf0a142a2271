"""The core's shortcuts and bounds are one explicit value (``scheduler.core.tuning.Tuning``),
never module-level switches a test flips."""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil

import pytest

import scheduler.core
from replay.examples import EXAMPLES
from replay.sim import Simulation
from scheduler.core.policy import REVISION
from scheduler.core.tuning import DEFAULT, Tuning
from scheduler.fold.step import Runtime


def test_no_module_of_the_core_holds_a_switch() -> None:
    """A module-level bool or int a rule reads at each use is a switch: tests would flip it
    by monkeypatching, and a runner could not see which way it was set."""
    found = []
    for info in pkgutil.iter_modules(scheduler.core.__path__):
        module = importlib.import_module(f"scheduler.core.{info.name}")
        tree = ast.parse(inspect.getsource(module))
        for node in tree.body:
            targets = [node.target] if isinstance(node, ast.AnnAssign) else []
            targets += node.targets if isinstance(node, ast.Assign) else []
            for target in targets:
                name = getattr(target, "id", "")
                value = getattr(module, name, None)
                if name.isupper() and not name.startswith("_") and type(value) in (bool, int):
                    found.append(f"scheduler.core.{info.name}.{name} = {value!r}")
    # Constants of the domain, not of how the core works: units and markers.
    constants = {
        "scheduler.core.fairshare.RESOURCES = 3",
        f"scheduler.core.policy.REVISION = {REVISION}",  # the ledgers' revision, not a switch
        "scheduler.core.running.NEVER = 4611686018427387904",
        "scheduler.core.state.NON_PREEMPTIBLE_FROM = 100",
        "scheduler.core.state.UNLIMITED = -1",
    }
    assert sorted(set(found) - constants) == []


def test_runners_use_the_default_tuning() -> None:
    assert Runtime().state.tuning is DEFAULT
    cluster, queues, workload = EXAMPLES["demo"].inputs()
    sim = Simulation(cluster, queues, workload, "gpuledger")
    assert sim.engine.state.tuning is DEFAULT
    other = Tuning(skip_held=False)
    sim = Simulation(cluster, queues, workload, "gpuledger", tuning=other)
    assert sim.engine.state.tuning is other


@pytest.mark.parametrize("field", ["block", "backfill_tries", "one_instead_tries"])
def test_a_bound_out_of_range_is_refused(field: str) -> None:
    with pytest.raises(ValueError, match=field):
        Tuning(**{field: 0})
    assert Tuning(probe=0).probe == 0
