"""Issue 28: ``--launcher plain`` set the old flight-recorder name (every rank printed torch's
deprecation warning) because torch's version came only from a launcher import starting with
``torch.`` — plain imports nothing, deepspeed's module is ``deepspeed.…``. The probe now says
torch's version for both (tests/remote/test_probe_torch_py38.py); here: from its facts to the
plan's variable name."""

from __future__ import annotations

from typing import Any

import pytest

from fleetctl.node import Node
from fleetctl.phases.check.judge import _node_facts
from fleetctl.plan.rankplan import JobSpec, make_plan

PLAIN = {"torch": {"version": "2.11.0+cu130"}}  # probe asked for torch_version, no launcher
DEEPSPEED = {
    "launcher": {"module": "deepspeed.launcher.runner", "version": "0.19.8", "torch": "2.11.0"}
}
OLD_TORCH = {"torch": {"version": "2.6.0"}}
NO_TORCH = {"torch": {"version": ""}}


@pytest.mark.parametrize(
    ("launcher", "facts", "torch", "name"),
    [
        ("plain", PLAIN, "2.11.0+cu130", "TORCH_FR_BUFFER_SIZE"),
        ("deepspeed", DEEPSPEED, "2.11.0", "TORCH_FR_BUFFER_SIZE"),
        ("plain", OLD_TORCH, "2.6.0", "TORCH_NCCL_TRACE_BUFFER_SIZE"),
        ("plain", NO_TORCH, None, "TORCH_NCCL_TRACE_BUFFER_SIZE"),  # unknown: the old name
    ],
)
def test_the_flight_recorders_name_follows_the_torch_the_probe_found(
    launcher: str, facts: dict[str, Any], torch: str | None, name: str
) -> None:
    nf = _node_facts(facts)
    assert nf.torch == torch
    nodes = [Node(name=f"g{i}", address=f"10.0.0.{i}", gpus=2) for i in (1, 2)]
    plan = make_plan(
        nodes,
        JobSpec(script="train.py", job_id="j1", launcher=launcher, backend="nccl"),
        facts={n.name: nf for n in nodes},
    )
    other = ({"TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE"} - {name}).pop()
    for node in plan.nodes:
        assert node.env[name] == "2000" and other not in node.env
