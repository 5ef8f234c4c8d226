"""``plan.json`` as a typed record: :class:`PlanRecord` (with :class:`PlanNode` per node), on
the run folder's record base (``files.FileRecord``), the only way the run folder's plan is
written (``RunFolder.write_plan``) and read (``RunFolder.load_plan``).

The plan itself is ``fleetctl.plan.rankplan.Plan`` (its ``to_dict`` is this file's shape and
``--dry-run --json --full``'s); the plan-wide keys, their types and defaults are the plan
layer's (``plan/planfile.PLAN_KEYS``: one list for the Plan that writes them and this record,
which cannot be on the plan layer: its base is the job layer's). This record is the file's
side: types checked both ways, a malformed file one line naming the file and the key
(``fleet-runs/j/plan.json: nodes[1].node_rank must be int, not str``), then
``Plan.from_dict`` makes the plan of it. Both forms read: the full one and, past
``FULL_PLAN_MAX_NODES``, the compact one (``shared`` at the end, a marker object in place of
each shared value: so ``argv``'s items and ``env``'s values are not checked as strings here;
``Plan.from_dict`` expands them). Keys this version does not know are **kept** (a newer
fleetctl's plan still reads, and ``status``/``logs``/``resume`` need only the hosts);
``kind``, ``folder``, ``gpus``, ``work_dir``, ``container`` and ``shared`` are written only
when the plan has them, as ``Plan.to_dict`` writes them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fleetctl.job.records.files import FileRecord
from fleetctl.plan.planfile import OPTIONAL_KEYS, PLAN_KEYS, REQUIRED


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
    """``plan.json``: the rank plan as run (``Plan.to_dict``, compact past 256 nodes). Its
    plan-wide keys are the plan's own (``plan/planfile.PLAN_KEYS``: key, type, default, in the
    file's order; :func:`_plan_keys` makes them this class's fields), then these."""

    FILE = KIND = "plan.json"
    NESTED = {"nodes": PlanNode}  # noqa: RUF012
    OMIT = (*OPTIONAL_KEYS, "shared")
    nodes: list[PlanNode] = []  # noqa: RUF012
    shared: dict | None = None  # the compact form: fleet-wide values written once
    if TYPE_CHECKING:  # the plan's keys read by name here, as the type checker sees them
        script: str


def _plan_keys(cls: type[FileRecord]) -> None:
    """The plan's keys as ``cls``'s first fields (annotations and defaults, as if written in
    its body), before the fields are first read."""
    assert "_fields" not in cls.__dict__, "its fields were read before the plan's keys"
    own = dict(cls.__annotations__)  # its own: the class body has some
    cls.__annotations__ = {**{k: note for k, (note, _) in PLAN_KEYS.items()}, **own}
    for key, (_, default) in PLAN_KEYS.items():
        if default is not REQUIRED:
            setattr(cls, key, default)


_plan_keys(PlanRecord)
