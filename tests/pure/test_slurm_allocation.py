"""The allocation → nodes mapping (fleetctl.slurm.allocation) and the srun step argv."""

from __future__ import annotations

import pytest

from fleetctl.errors import UsageError
from fleetctl.node import Node
from fleetctl.plan.inventory.load import Inventory
from fleetctl.slurm import allocation
from fleetctl.slurm.allocation import (
    Allocation,
    fleet_nodes,
    from_env,
    gpus_from,
    node_addrs,
    tres_gpus,
)
from fleetctl.transport.connection import connect
from fleetctl.transport.srun import JOB_VAR, is_srun, srun_argv

SHOW_NODE = (
    "NodeName=gpu01 Arch=x86_64 CoresPerSocket=1 NodeAddr=10.0.0.1 NodeHostName=gpu01 State=IDLE\n"
    "NodeName=gpu02 Arch=x86_64 CoresPerSocket=1 NodeAddr=10.0.0.2 NodeHostName=gpu02 State=IDLE\n"
)


def test_from_env() -> None:
    assert from_env({}) is None
    env = {"SLURM_JOB_ID": "42", "SLURM_JOB_NODELIST": "gpu[02,01]", "SLURM_GPUS_ON_NODE": "2"}
    assert from_env(env) == Allocation("42", ("gpu02", "gpu01"), 2)
    with pytest.raises(UsageError, match="SLURM_JOB_NODELIST"):
        from_env({"SLURM_JOB_ID": "42"})


@pytest.mark.parametrize(
    ("key", "value", "gpus"),
    [
        ("SLURM_GPUS_ON_NODE", "4", 4),
        ("SLURM_GPUS_PER_NODE", "gpu:2", 2),
        ("SLURM_GPUS_PER_NODE", "a100:8", 8),
        ("SLURM_GPUS_PER_NODE", "gpu:a100:3(IDX:0-2)", 3),
        ("SLURM_JOB_GPUS", "0,1,3", 3),
    ],
)
def test_gpus_from(key: str, value: str, gpus: int) -> None:
    assert gpus_from(key, value) == gpus


@pytest.mark.parametrize(
    ("line", "gpus"),
    [
        ("JobId=1 NumNodes=2 TRES=cpu=4,node=2 TresPerNode=gres:gpu:1 ", 1),  # Slurm 22.05
        ("JobId=1 TresPerNode=gres/gpu:a100:2", 2),  # newer Slurm, a type
        ("JobId=1 TresPerNode=gres:shard:2,gres:gpu:4", 4),
        ("JobId=1 TresPerNode=gres:shard:2", None),  # shares, not GPUs: the env's count stands
        ("JobId=1 TRES=cpu=4,mem=2M,node=2 Power=", None),  # no gres asked
    ],
)
def test_tres_gpus_of_a_hand_written_sbatch(line: str, gpus: int | None) -> None:
    """``#SBATCH --gres=gpu:K`` reaches the batch step only as the exclusive node's
    SLURM_GPUS_ON_NODE: the steps' count is asked of ``scontrol show job``."""
    assert tres_gpus(line) == gpus


def test_node_addrs() -> None:
    assert node_addrs(SHOW_NODE) == {"gpu01": "10.0.0.1", "gpu02": "10.0.0.2"}


def test_allocation_alone_is_the_fleet_in_slurm_order() -> None:
    alloc = Allocation("7", ("gpu02", "gpu01", "login"), 1)
    asked: list[list[str]] = []

    def addrs(hosts: list[str]) -> dict[str, str]:
        asked.append(list(hosts))
        return node_addrs(SHOW_NODE)

    nodes = fleet_nodes(alloc, None, resolves=lambda h: h == "login", addrs=addrs)
    assert [n.name for n in nodes] == ["gpu02", "gpu01", "login"]
    # NodeAddr only where the name does not resolve; scontrol asked once, for those
    assert [n.address for n in nodes] == ["10.0.0.2", "10.0.0.1", "login"]
    assert asked == [["gpu02", "gpu01"]]
    assert all(n.gpus == 1 and is_srun(n) for n in nodes)
    assert nodes[0].vars[JOB_VAR] == "7"


def test_inventory_selected_and_ordered_by_the_allocation() -> None:
    inv = [
        Node("gpu01", "10.1.0.1", nic="ib0", vars={"fleetctl_nic": "ib0"}),
        Node("gpu02", "10.1.0.2", gpus=8),
        Node("gpu03", "10.1.0.3"),
    ]
    nodes = fleet_nodes(Allocation("9", ("gpu02", "gpu01"), 4), inv)
    assert [(n.name, n.address, n.nic, n.gpus) for n in nodes] == [
        ("gpu02", "10.1.0.2", None, 8),  # the inventory's gpus win over the allocation's
        ("gpu01", "10.1.0.1", "ib0", 4),
    ]
    assert nodes[1].vars["fleetctl_nic"] == "ib0" and is_srun(nodes[1])
    with pytest.raises(UsageError, match="gpu04 of the allocation are not in the inventory"):
        fleet_nodes(Allocation("9", ("gpu01", "gpu04")), inv)


def test_apply_outside_an_allocation_changes_nothing() -> None:
    inv = Inventory(path=None, nodes=(Node("a", "a"),), groups={"all": ("a",)}, digest="d")
    assert allocation.apply(inv, has_inventory=False, env={}) is inv
    env = {"SLURM_JOB_ID": "3", "SLURM_JOB_NODELIST": "a"}
    got = allocation.apply(inv, has_inventory=True, env=env)
    assert [n.name for n in got.nodes] == ["a"] and got.digest != "d"


def test_srun_node_gets_an_srun_connection() -> None:
    node = fleet_nodes(Allocation("5", ("n1",)), None, resolves=lambda h: True)[0]
    conn = connect(node)
    assert type(conn).__name__ == "SrunConnection" and conn.job_id == "5"


def test_srun_argv() -> None:
    argv = srun_argv("12", "gpu03", "echo hi")
    assert argv[0] == "srun" and argv[-3:] == ["/bin/sh", "-c", "echo hi"]
    for opt in ("--jobid=12", "--nodelist=gpu03", "--nodes=1", "--ntasks=1", "--overlap"):
        assert opt in argv
    assert "--kill-on-bad-exit=1" in argv


def test_probe_home_saves_the_srun_home_step(monkeypatch: pytest.MonkeyPatch) -> None:
    """The check's reported home is primed into an srun connection: no ``$HOME`` job step
    (each one is slurmctld round trips) before the launch."""
    from fleetctl.phases.check.report import CheckReport

    node = fleet_nodes(Allocation("5", ("n1",)), None, resolves=lambda h: True)[0]
    conn = connect(node)

    def no_step(*a: object, **k: object) -> None:
        raise AssertionError("a job step was started")

    monkeypatch.setattr(conn, "run", no_step)

    class FakeFleet:
        connected = (node,)

        def connection(self, n: object) -> object:
            return conn

    CheckReport(hosts={}, homes={"n1": "/home/u"}).prime(FakeFleet())  # type: ignore[arg-type]
    assert conn.expand("~/.fleetctl/x") == "/home/u/.fleetctl/x"


def test_an_allocations_node_is_not_pinged_through_ssh_config(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """srun reaches it (no SSH port to try), and resolving its ssh_config would import
    paramiko in a run that never opens an SSH connection."""
    from fleetctl.phases.check.preflight import ping_host
    from fleetctl.transport import sshconfig
    from fleetctl.transport.connection import SSHSettings

    def resolve(*_: object) -> None:
        raise AssertionError("ssh_config resolved for an srun node")

    monkeypatch.setattr(sshconfig, "resolve", resolve)
    node = fleet_nodes(Allocation("5", ("n1",)), None, resolves=lambda h: True)[0]
    assert ping_host(node, SSHSettings()).state == "skip"
