"""The job's rendezvous port, claimed on node 0 before launch.

Two runs planned at the same instant on the same hosts both saw port 29500 free in their
checks; one job's rank 0 then failed to bind it and that job's other ranks joined the other
job's rendezvous. So the port is not just probed but claimed for this job id on node 0
(``remote/programs/port_probe.py``: an O_EXCL file per port in the user's private host-local folder,
``remote/kit/portclaims.py``) before any node starts; node 0's supervisor adopts the claim and
frees it when the job ends. Without ``--master-port`` the first claimable port from 29500 on is
taken (recorded in plan.json); a port in TIME_WAIT from the last job is free, so jobs keep
29500 (what firewalls open); with it, a port another fleetctl job holds is refused, naming that
job. Where the check left node 0's probe held for the launch, the probe runs the claim in its
own process (``remote/programs/probe.py``'s ``handoff``): no remote command of its own, which under
Slurm is a whole srun step (slurmctld round trips), over SSH a channel and an interpreter.
"""

from __future__ import annotations

import json
import time
from collections.abc import MutableMapping, Sequence
from typing import TYPE_CHECKING, Any

from fleetctl import remote
from fleetctl.errors import LaunchError
from fleetctl.phases.frames import FrameStream, last_data

if TYPE_CHECKING:
    from fleetctl.node import Node
    from fleetctl.phases.check.report import HeldProbe
    from fleetctl.plan.rankplan import JobSpec
    from fleetctl.ssh.fanout import FanOut

PORT_SPAN = 64  # ports tried from the default when none was given
MAX_SPAN_TRIES = 8  # paddle: bases tried when a port of the span is taken on another node
CLAIM_TIMEOUT = 20.0


class ClaimFolderError(LaunchError):
    """A node's port claim folder cannot be used (another user's, a link): no port will do."""


def reserve_master_port(
    fleet: FanOut,
    node0: Node,
    spec: JobSpec,
    *,
    span: int = 1,
    others: Sequence[Node] = (),
    held: MutableMapping[str, HeldProbe] | None = None,
) -> int:
    """Claim the rendezvous port on ``node0`` for ``spec.job_id``; the port, or LaunchError.

    ``span`` > 1 (paddle: its endpoints are start_port + local rank on every node): the ports
    base..base+span-1 are claimed on node 0, then the same ones on each of ``others``.
    ``held``: the check's probes held for the launch, which claim in place of a new command
    (one that does not answer is let go and dropped from it)."""
    base = spec.rdzv_port
    cands = [base] if spec.rdzv_port_fixed else list(range(base, min(base + PORT_SPAN, 65536)))
    busy: dict[str, str] = {}
    for attempt in range(MAX_SPAN_TRIES):
        free, busy = _claim(fleet, node0, cands, spec.job_id, span, held)
        if not free:
            break
        try:
            _claim_everywhere(fleet, others, free[0], spec.job_id, span, held)
        except ClaimFolderError:
            _unclaim(fleet, [node0], free[0], spec.job_id, span)
            raise
        except LaunchError:
            # a port of the span is taken on another node (TIME_WAIT, another service): give
            # back what was claimed, and with a port of our choosing try the next base
            _unclaim(fleet, [node0, *others], free[0], spec.job_id, span)
            later = [p for p in cands if p > free[0]]
            if spec.rdzv_port_fixed or not later or attempt == MAX_SPAN_TRIES - 1:
                raise
            cands = later
            continue
        return free[0]
    if spec.rdzv_port_fixed:
        bad = next((p for p in range(base, base + span) if str(p) in busy), base)
        why = busy.get(str(bad), "not free")
        what = f"master port {base}" if span == 1 else f"port {bad} (of {base}-{base + span - 1})"
        raise LaunchError(f"{node0.label}: {what} is {why}; pick another --master-port")
    raise LaunchError(
        f"{node0.label}: no free rendezvous port in {base}-{cands[-1]} "
        f"({len(busy)} in use or held by other fleetctl jobs)"
    )


def _claim(
    fleet: FanOut,
    node: Node,
    cands: list[int],
    job: str,
    span: int,
    held: MutableMapping[str, HeldProbe] | None = None,
) -> tuple[list[int], dict[str, str]]:
    args: dict[str, Any] = {"candidates": cands, "need": 1, "claim": {"job": job}}
    if span > 1:
        args["span"] = span
    source = remote.inline("port_probe.py")
    data: Any = _held_call(held, node, source, json.dumps(args))  # JSON: checked below
    detail = "(held probe)"
    if data is None:
        conn = fleet.connection(node)
        res = conn.run(
            [conn.expand(node.python), remote.NO_SITE, "-c", source, json.dumps(args)],
            timeout=CLAIM_TIMEOUT,
        )
        data = last_data(res.stdout)
        tail = " ".join((res.stderr or res.stdout).split())[-200:]
        detail = f"(exit {res.exit_code}): {tail}"
    try:
        if isinstance(data, dict) and data.get("error"):
            raise ClaimFolderError(f"{node.label}: {data['error']}")
        return [int(p) for p in data["free"]], dict(data.get("busy") or {})
    except (ValueError, KeyError, TypeError) as e:
        raise LaunchError(f"{node.label}: could not claim the job's ports {detail}") from e


def _held_call(
    held: MutableMapping[str, HeldProbe] | None, node: Node, source: str, arg: str
) -> Any:
    """``source`` run with ``arg`` by the node's held probe; its ``D`` payload, or None when
    there is no usable probe or it did not answer (then it is let go: the launch starts the
    supervisor by a command of its own)."""
    probe = held.get(node.name) if held is not None else None
    if probe is None or not probe.usable(node.python, time.monotonic()):
        return None
    msg = json.dumps({"code": source, "argv": [arg], "call": True}).encode() + b"\n"
    try:
        probe.stream.send(msg)
        frames = FrameStream(probe.stream, "DN", json_kinds="DN")
        got = frames.next("DN", time.monotonic() + CLAIM_TIMEOUT)
    except OSError:
        got = None
    if got is not None and got.kind == "D":
        return got.data()
    if held is not None:
        held.pop(node.name, None)
    probe.close()
    return None


def _unclaim(fleet: FanOut, nodes: Sequence[Node], base: int, job: str, span: int) -> None:
    """Give back the job's claims of base..base+span-1 on ``nodes`` (best effort: a claim
    left behind goes stale once its claimer is gone)."""
    source = remote.inline("port_probe.py")
    args = json.dumps({"unclaim": {"job": job, "ports": list(range(base, base + span))}})
    for node in nodes:
        try:
            conn = fleet.connection(node)
            argv = [conn.expand(node.python), remote.NO_SITE, "-c", source, args]
            conn.run(argv, timeout=CLAIM_TIMEOUT)
        except Exception:  # best effort, see above
            continue


def _claim_everywhere(
    fleet: FanOut,
    nodes: Sequence[Node],
    base: int,
    job: str,
    span: int,
    held: MutableMapping[str, HeldProbe] | None = None,
) -> None:
    """The same ports on every other node (all at once); LaunchError naming each that cannot."""
    if not nodes:
        return
    from concurrent.futures import ThreadPoolExecutor

    def one(node: Node) -> str | None:
        free, busy = _claim(fleet, node, [base], job, span, held)
        if free:
            return None
        bad = next((p for p in range(base, base + span) if str(p) in busy), base)
        return f"{node.label}: port {bad} is {busy.get(str(bad), 'not free')}"

    with ThreadPoolExecutor(max_workers=min(32, len(nodes))) as pool:
        problems = [p for p in pool.map(one, nodes) if p]
    if problems:
        raise LaunchError(
            f"paddle endpoint ports {base}-{base + span - 1} are not free on "
            f"{len(problems)} node(s): " + "; ".join(problems)
        )
