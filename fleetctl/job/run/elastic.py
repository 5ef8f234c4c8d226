"""``run --elastic``: a lost node's place goes to a spare while the job runs on.

torchrun runs with a c10d rendezvous on node 0's training address and the node range N:N
(``fleetctl.plan.launchers.torchrun``). When a node other than node 0 is lost, the attempt
does not end: its place (its rank slot in the job) goes to the next spare that passes a fresh
check (``fleetctl.job.run.spares.check_spare``: a dead spare is skipped, not left to hang the
rendezvous). The spare gets the code (push), the newest files of rank 0's work folder (the
relay retries use), its own rank plan and a supervisor whose torchrun joins the same
rendezvous; the survivors' torchrun agents stay the same processes and restart their workers
into the new round (a membership change), the workers load the newest checkpoint. The lost
node is left to its dead-man switch (it cannot hear us). Everything said goes through the
job's events (``events.log``, the live lines) and job.json's ``membership`` (``status`` shows
the members from it: ``fleetctl.job.records.members``). With no spare left and
``--min-nodes M``, the job goes on without the lost node while at least M nodes remain
(its slot ``left``; torchrun's node range is ``M:POOL``, so the survivors' next round closes
with fewer nodes).
Not taken over (the job ends as without ``--elastic``): node 0 (its agent hosts the c10d
store the others keep their rendezvous in; said why, ``NODE0_LOST``), a loss once no spare is
left (and too few nodes would remain), a loss while the job is being stopped.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from typing import TYPE_CHECKING, Any

from fleetctl.errors import FleetctlError
from fleetctl.job.run.stepwatch import StepWatch

if TYPE_CHECKING:
    from fleetctl.job.run.context import JobContext
    from fleetctl.node import Node
    from fleetctl.phases.launch import NodeRun
    from fleetctl.phases.watch import Event, Watch
    from fleetctl.plan.rankplan import NodePlan
    from fleetctl.ssh.fanout import FanOut


#: why node 0's loss ends the job even with --elastic (docs/commands/run.md, Elastic jobs)
NODE0_LOST = (
    "node 0 hosts the job's rendezvous store (torchrun's c10d --rdzv-endpoint) and the "
    "other nodes' agents cannot go on without it: the job ends (with --max-retries the "
    "next attempt relaunches every node, a spare in its place)"
)


def iso(t: float) -> str:
    import datetime

    return datetime.datetime.fromtimestamp(t, datetime.timezone.utc).isoformat(
        timespec="milliseconds"
    )


class Membership:
    """The spares of one elastic attempt and the changes made so far."""

    def __init__(self, job: JobContext, fleet: FanOut, watch: Watch) -> None:
        self.job, self.fleet, self.watch = job, fleet, watch
        self.spares: list[Node] = list(job.options.spares)
        self.threads: list[threading.Thread] = []
        self.steps = StepWatch()  # a spare that starts from step 0 (fleetctl.job.run.stepwatch)
        self.changes: dict[int, dict[str, Any]] = {}  # slot -> its latest change

    def lines(self, ev: Event) -> None:
        """A slot's output lines: said once, live and in its change, when a spare's first step
        shows that it started afresh while the others resumed."""
        fresh = self.steps.lines(ev.rank, ev.lines)
        change = self.changes.get(ev.rank)
        if fresh is None or change is None:
            return
        change["warning"] = fresh.line()
        self.job.emit("warning", fresh.line(), rank=ev.rank, ts=ev.time)
        self.job.save()

    def lost(self, ev: Event) -> bool:
        """Node ``ev.rank`` was lost: True when a spare takes its place (the caller goes on
        watching), False when the job ends as it would without ``--elastic``."""
        job = self.job
        if job.stopping or job.plan is None:
            return False
        when = ev.heard if ev.heard is not None else ev.time
        change: dict[str, Any] = {
            "rank": ev.rank,
            "left": job.result.nodes[ev.rank].host,
            "why": ev.text,
            "left_at": iso(when),
            "lost_at": iso(ev.time),
            "joined": None,
            "joined_at": None,
            "seconds": None,  # from its last word to the spare's start
        }
        if ev.rank == 0:  # the job ends: on the record why no spare took its place
            change["not_replaced"] = NODE0_LOST
            job.result.membership = [*(job.result.membership or []), change]
            job.emit("notice", f"not replaced (--elastic): {NODE0_LOST}", rank=0, ts=ev.time)
            return False
        found = self._live_spare(ev, change)
        if found is None:
            return self._shrink(ev, change)
        spare, own = found
        change["joined"] = spare.name
        job.result.membership = [*(job.result.membership or []), change]
        job.emit(
            "notice", f"lost ({ev.text}); spare {spare.name} joining", rank=ev.rank, ts=ev.time
        )
        self._take_slot(ev.rank, spare)
        self.changes[ev.rank] = change
        self.steps.spare(ev.rank, spare.name)
        t = threading.Thread(
            target=self._join, args=(ev.rank, spare, own, change, when), daemon=True, name="spare"
        )
        self.threads.append(t)
        t.start()
        job.save()
        return True

    def _live_spare(self, ev: Event, change: dict[str, Any]) -> tuple[Node, FanOut] | None:
        """The next spare that passes a fresh check (``fleetctl.job.run.spares.check_spare``),
        with its connection; each one that fails is skipped for good, said live, in
        events.log and in the change (``skipped``: host -> why). None: no live spare left."""
        from fleetctl.job.run.spares import check_spare
        from fleetctl.ssh.fanout import FanOut

        job = self.job
        while self.spares:
            spare = self.spares.pop(0)
            own = FanOut([spare], job.options.settings)
            began = time.monotonic()
            try:
                why = check_spare(own, job.spec, job.options)
            except FleetctlError as e:
                why = e.one_line()
            if why is None:
                change["check_seconds"] = round(time.monotonic() - began, 3)
                return spare, own
            own.close()
            change.setdefault("skipped", {})[spare.name] = why
            job.emit(
                "warning", f"spare {spare.name} skipped: failed its check: {why}", rank=ev.rank
            )
        return None

    def _shrink(self, ev: Event, change: dict[str, Any]) -> bool:
        """No spare left: with ``--min-nodes`` and enough nodes left, the slot is left empty
        (its node ``left``, no failure) and the survivors' agents close their next round with
        fewer nodes; else False (the job ends)."""
        from fleetctl.job.records.state import NodeState

        job = self.job
        low = job.options.retry.min_nodes
        left = sum(
            1 for r, s in enumerate(job.state.states) if r != ev.rank and not (s.bad or s.ended)
        )
        if low is None or left < low:
            why = "" if low is None else f" and {left} node(s) would remain (--min-nodes {low})"
            job.emit("notice", f"no spare left{why}: the job ends", rank=ev.rank, ts=ev.time)
            return False
        change["world"] = left
        job.result.membership = [*(job.result.membership or []), change]
        node = job.result.nodes[ev.rank]
        node.reason, node.end_time = ev.text, ev.heard if ev.heard is not None else ev.time
        node.state = job.state.end(ev.rank, NodeState.LEFT, node.end_time).state
        self.steps.gone(ev.rank)
        job.emit(
            "notice",
            f"lost ({ev.text}); no spare left, going on with {left} nodes (--min-nodes {low})",
            rank=ev.rank,
            ts=ev.time,
        )
        job.sync()
        job.save()
        return True

    def _take_slot(self, rank: int, spare: Node) -> None:
        """The rank slot is the spare's from now on: its result record, its streamed log."""
        from fleetctl.job.records.result import NodeOutcome
        from fleetctl.job.records.state import NodeState

        job = self.job
        f = job.spools.pop(rank, None)
        if f is not None:  # the lost node's streamed lines stay: its own logs never come home
            f.close()
        job.nodes[rank] = spare
        job.pythons[spare.name] = spare.python
        job.result.nodes[rank] = NodeOutcome(rank, spare.name, spare.address, spare.train_addr)
        job.state.states[rank] = NodeState.PENDING

    def _join(
        self, rank: int, spare: Node, own: FanOut, change: dict[str, Any], cut: float
    ) -> None:
        from fleetctl.phases.watch import Event

        try:
            run = self._start(rank, spare, own)
        except BaseException as e:  # the slot's outcome: could not start, the job ends
            why = e.one_line() if isinstance(e, FleetctlError) else f"{type(e).__name__}: {e}"
            self.watch.events.put(Event("start_failed", rank, spare.name, time.time(), why))
            return
        change["joined_at"] = iso(run.started)
        change["seconds"] = round(run.started - cut, 3)
        self.watch.ended.pop(rank, None)
        self.watch.events.put(Event("started", rank, spare.name, run.started, "spare joined"))
        self.watch.attach(run)

    def _start(self, rank: int, spare: Node, own: FanOut) -> NodeRun:
        """Code, plan, checkpoints, supervisor: the spare's torchrun joins the rendezvous."""
        from fleetctl.job.run.prepare import plan_document
        from fleetctl.phases.collect import CollectOptions
        from fleetctl.phases.launch import node_spec, start_node

        job, options = self.job, self.job.options
        digest = self._push(own, spare)
        slot = self._slot(rank, digest)
        conn = own.connection(spare)
        self.fleet.join(spare, conn)  # teardown and collect reach it as any node of the job
        assert job.plan is not None
        job.plan = dataclasses.replace(
            job.plan, nodes=tuple(slot if np.node_rank == rank else np for np in job.plan.nodes)
        )
        job.result.plan = job.plan
        job.result.nodes[rank].train_addr = slot.train_addr
        job.folder.write_plan(plan_document(job.plan))
        job.write_connect()  # `fleetctl status/stop/collect` reach the spare, not the lost node
        self._relay(spare, slot)
        spec = node_spec(
            slot,
            conn,
            job_id=job.plan.job_id,
            deadman=options.supervision.deadman,
            grace=options.supervision.grace,
            heartbeat=options.heartbeat,
            path_prepend=job.path_prepend.get(spare.name, []),
            collect=(options.collect or CollectOptions()).wire(),
        )
        return start_node(spare, conn, spec, python=spare.python)

    def _push(self, fleet: FanOut, spare: Node) -> str | None:
        options = self.job.options
        if not options.push.asked():
            return None
        from fleetctl.phases import push as push_mod

        report = push_mod.push(fleet, options.push)
        prefix = push_mod.env_path_prefix(report, spare.name)
        if prefix:
            self.job.path_prepend[spare.name] = [prefix]
        return report.code_digest

    def _slot(self, rank: int, digest: str | None) -> NodePlan:
        """The spare's rank plan: the plan made again with the spare in the lost node's place
        (same rendezvous, same port: refused if node 0's address came out otherwise)."""
        from fleetctl.errors import LaunchError
        from fleetctl.plan.rankplan import make_plan

        job = self.job
        assert job.plan is not None
        plan = make_plan(job.nodes, job.spec, code_digest=digest)
        if plan.master_addr != job.plan.master_addr:
            raise LaunchError(
                f"{job.nodes[rank].name}: --elastic: the rendezvous address came out as "
                f"{plan.master_addr}, not {job.plan.master_addr}"
            )
        return plan.nodes[rank]

    def _relay(self, spare: Node, slot: NodePlan) -> None:
        """Rank 0's newest work-folder files (or ``--checkpoint-dir``) to the spare."""
        from fleetctl.phases.push.relay import RelaySource, RelayTarget, relay_checkpoints

        job = self.job
        assert job.plan is not None
        np0 = job.plan.nodes[0]
        work = getattr(np0, "work_dir", "") or np0.cwd
        src = RelaySource(
            job.nodes[0], work, np0.code_dir, np0.train_addr or None, job.options.attempt, np0.cwd
        )
        target = RelayTarget(
            spare, getattr(slot, "work_dir", "") or slot.cwd, slot.code_dir, slot.cwd
        )
        job.emit("notice", f"relaying checkpoints from {src.node.name} to spare {spare.name}")
        report = relay_checkpoints(
            self.fleet,
            src,
            [target],
            folder=job.options.retry.checkpoint_folder(),
            policy=job.options.push,
        )
        job.emit("warning" if report.skipped else "notice", report.summary())
