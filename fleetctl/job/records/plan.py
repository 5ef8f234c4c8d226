"""``plan.json`` as a typed record: :class:`PlanRecord` (with :class:`PlanNode` per node), on
the run folder's record base (``files.FileRecord``), the only way the run folder's plan is
written (``RunFolder.write_plan``) and read (``RunFolder.load_plan``).

The plan itself is ``fleetctl.plan.rankplan.Plan`` (its ``to_dict`` is this file's shape and
``--dry-run --json --full``'s); this record is the file's side: types checked both ways, a
malformed file one line naming the file and the key (``fleet-runs/j/plan.json:
nodes[1].node_rank must be int, not str``), then ``Plan.from_dict`` makes the plan of it. Both
forms read: the full one and, past ``FULL_PLAN_MAX_NODES``, the compact one (``shared`` at
the end, a marker object in place of each shared value: so ``argv``'s items and ``env``'s
values are not checked as strings here; ``Plan.from_dict`` expands them). Keys this version
does not know are **kept** (a newer fleetctl's plan still reads, and ``status``/``logs``/
``resume`` need only the hosts); ``kind``, ``folder``, ``gpus``, ``work_dir``,
``container`` and ``shared`` are written only when the plan has them, as ``Plan.to_dict``
writes them.
"""

from __future__ import annotations

from fleetctl.job.records.files import FileRecord


class PlanNode(FileRecord):
    """One node's part of the plan (``NodePlan.to_dict``): where it runs, its rank, argv, env."""

    KIND = "node"
    OMIT = ("gpus", "work_dir", "container")
    host: str
    address: str
    node_rank: int
    nic: str | None = None
    train_addr: str | None = None  # older plans: the address
    python: str = ""
    workdir: str = ""
    code_dir: str = ""
    run_dir: str = ""
    cwd: str | None = None  # older plans: run_dir
    argv: list = []  # noqa: RUF012 (Record copies it): str, or a shared marker
    env: dict = {}  # noqa: RUF012 (Record copies it): name -> str, or a shared marker
    files: dict = {}  # noqa: RUF012 (Record copies it): path -> content, or a shared marker
    gpus: list[str] | None = None
    work_dir: str | None = None
    container: dict | None = None


class PlanRecord(FileRecord):
    """``plan.json``: the rank plan as run (``Plan.to_dict``, compact past 256 nodes)."""

    FILE = KIND = "plan.json"
    NESTED = {"nodes": PlanNode}  # noqa: RUF012
    OMIT = ("kind", "folder", "shared")
    version: int = 1
    job_id: str
    created: str | None = None
    launcher: str = ""
    script: str = ""
    kind: str | None = None  # what ``script`` is, when not a Python file
    folder: str | None = None  # where in the code the job runs
    args: list[str] = []  # noqa: RUF012
    master_addr: str = ""
    master_port: int = 0
    ips: list[str] = []  # noqa: RUF012
    nnodes: int = 0
    nproc_per_node: int = 1
    gpus_per_node: int = 0
    world_size: int = 0
    backend: str | None = None
    user_env: dict[str, str] = {}  # noqa: RUF012
    nodes: list[PlanNode] = []  # noqa: RUF012
    shared: dict | None = None  # the compact form: fleet-wide values written once
