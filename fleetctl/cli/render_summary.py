"""The run's closing summary: the fleet-wide verdict (like paddle's, for every node), the ranks
the failing node's launcher named, its last lines, stacks of a stalled job, what was not
collected."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from fleetctl.cli.render import fold_ranks, stack_lines

if TYPE_CHECKING:
    from fleetctl.api.types import JobResult


def run_summary_lines(result: JobResult, *, tail_lines: int = 20) -> list[str]:
    """The fleet-wide verdict, like paddle's but for every node, plus the failing node's tail.

    ``Out of all 3 nodes, node 1 (node2 10.0.0.3) failed first: exit code 1 after 41.2 s;
    nodes 0,2 were stopped.``
    """
    n = len(result.nodes)
    lines: list[str] = []
    ff = result.failed_node
    slow = getattr(result, "slow", None)  # the node named slow during the run (docs/health.md)
    slow_first = bool(slow and ff is not None and slow.get("rank") == ff.rank)
    by_state: dict[str, list[int]] = {}
    for node in result.nodes:
        if ff is None or node.rank != ff.rank:
            by_state.setdefault(node.state, []).append(node.rank)

    def others() -> str:
        parts = []
        for state, verb in (
            ("stopped", "were stopped"),
            ("lost", "were lost"),
            ("left", "left the job (--min-nodes)"),
            ("failed", "also failed"),
            ("start_failed", "could not start"),
            ("succeeded", "had succeeded"),
            ("running", "did not report"),
        ):
            ranks = by_state.get(state)
            if ranks:
                one = len(ranks) == 1
                verb = verb.replace("were", "was") if one else verb
                parts.append(f"{'node' if one else 'nodes'} {fold_ranks(ranks)} {verb}")
        return "; ".join(parts)

    if result.status == "succeeded":
        dur = (
            ""
            if result.ended is None or result.started is None
            else (f" in {result.ended - result.started:.1f} s")
        )
        verdict = getattr(result, "verdict", None)  # a role job's completion policy
        if verdict and any(node.state != "succeeded" for node in result.nodes):
            rest = others()
            lines.append(f"Job {result.job_id} succeeded{dur}: {verdict}; {rest}.")
        elif n == 1:  # "All 1 node succeeded" reads as a template
            only = result.nodes[0]
            lines.append(f"Node {only.rank} ({only.host}) succeeded{dur}.")
        elif any(node.state == "left" for node in result.nodes):  # run --elastic --min-nodes
            ok = [node.rank for node in result.nodes if node.state == "succeeded"]
            lines.append(f"{len(ok)} of {n} nodes succeeded{dur}; {others()}.")
        else:
            lines.append(f"All {n} nodes succeeded{dur}.")
        lines += _membership(result)
    elif ff is not None:
        lines += _membership(result)
        addr = ff.train_addr or ff.address
        after = "" if result.failed_after is None else f" after {result.failed_after:.1f} s"
        rest = others()
        who = f"{ff.rank} ({ff.host} {addr})"
        head = f"Out of all {n} nodes, node {who} failed first" if n > 1 else f"Node {who} failed"
        how = f"slows the job ({slow['why']})" if slow_first else ff.how()  # type: ignore[index]
        lines.append(f"{head}: {how}{after}" + (f"; {rest}." if rest else "."))
        for cause in result.culprits or []:
            lines.append(f"  likely cause: {cause}")
        lines += _proof(result)
        if result.failed_ranks:
            from fleetctl.api.helpers import describe_rank as describe

            lines.extend("  " + describe(f, result.folder) for f in result.failed_ranks)
        tail = result.log_tail(ff.rank, tail_lines)
        if tail:
            lines.append(f"--- last {len(tail)} lines of node {ff.rank} ({ff.host}) ---")
            lines.extend(tail)
            lines.append("---")
        lines.extend(_rank_errors(result.failed_ranks or [], tail))
        if ff.folder:
            lines.append(f"node {ff.rank} logs: {ff.folder}")
    elif result.status == "failed" and result.verdict:  # --timeout, a stall: no node failed
        rest = others()
        lines.append(
            f"Job {result.job_id} failed: {result.verdict}" + (f"; {rest}." if rest else ".")
        )
        lines += _proof(result)
        if result.stacks is not None:
            from fleetctl.api.types import StackGroup

            groups = [
                StackGroup(g["frame"], tuple(g["ranks"]), tuple(g["launcher_nodes"]))
                for g in result.stacks
            ]
            lines.append("where every rank was (innermost Python frame):")
            lines.extend("  " + line for line in stack_lines(groups))
            for sn in result.stack_nodes or []:
                if sn.get("methods", {}).get("faulthandler"):
                    lines.append(
                        f"  node {sn['rank']} ({sn['host']}): py-spy could not read "
                        f"{sn['methods']['faulthandler']} process(es); faulthandler wrote their "
                        "threads to the node's console.log"
                    )
                if sn.get("error"):
                    lines.append(f"  node {sn['rank']} ({sn['host']}): no stacks: {sn['error']}")
    elif result.status == "interrupted":
        rest = others()
        where = f"all {n} nodes" if n != 1 else "its node"
        lines.append(
            f"Interrupted: job {result.job_id} stopped on {where}"
            + (f" ({rest})." if rest else ".")
        )
    else:
        lines.append(f"Job {result.job_id} {result.status}.")
    if slow and not slow_first:
        lines.append(f"warning: {slow.get('line')}")
    if result.teardown is not None and not result.teardown.verified:
        for host, procs in result.teardown.leftovers.items():
            pids = ", ".join(f"{p['pid']} {p['cmd'][:60]}" for p in procs)
            lines.append(f"ERROR: processes of the job left on {host}: {pids}")
    for err in result.errors:
        lines.append(f"error: {err}")
    for path in result.nccl_traces():
        lines.append(f"NCCL flight-recorder dump: {path}")
    from fleetctl.cli.render_collect import collect_summary_lines, node_problem_lines

    lines.extend(node_problem_lines(result.nodes))
    lines.extend(collect_summary_lines(result.collected, result.job_id))
    lines.append(f"run folder: {result.folder}")
    return lines


def _rank_errors(failed: list[dict[str, Any]], tail: list[str]) -> list[str]:
    """Each failed rank's own error (its traceback, from its rank log: ``job.ranks.rank_error``)
    unless the node's tail above already shows it (plain, paddle's echoed worker log)."""
    out: list[str] = []
    hints: list[str] = []
    for f in failed:
        error = f.get("error") or []
        if f.get("hint") and f["hint"] not in hints:
            hints.append(f["hint"])
        if not error or set(error) <= set(tail):
            continue
        out.append(f"--- rank {f['rank']} ({f['node']}), from {f.get('error_log')} ---")
        out.extend(error)
        out.append("---")
    return out + [f"hint: {h}" for h in hints]


def _membership(result: JobResult) -> list[str]:
    """``run --elastic``: each lost node, the spare that took its place and how long it took
    (or the smaller world the job went on with)."""
    changes = getattr(result, "membership", None) or []
    out = []
    for c in changes:
        took = "" if c.get("seconds") is None else f" {c['seconds']:.1f} s after its last word"
        if c.get("not_replaced"):  # node 0: it held the rendezvous (fleetctl.job.run.elastic)
            joined = f"not replaced: {c['not_replaced']}"
        elif c.get("joined") is None:
            joined = f"no spare left, went on with {c.get('world')} nodes"
        elif c.get("joined_at"):
            joined = f"spare {c['joined']} joined{took}"
        else:
            joined = "its spare did not start"
        out.append(f"  node {c['rank']}: {c['left']} lost ({c['why']}); {joined}")
        for host, why in sorted((c.get("skipped") or {}).items()):  # failed its fresh check
            out.append(f"    spare {host} skipped: {why}")
        if c.get("warning"):  # a spare that started from step 0 (fleetctl.job.run.stepwatch)
            out.append(f"    warning: {c['warning']}")
    if changes:
        each = ", each given to a spare" if all(c.get("joined") for c in changes) else ""
        out.insert(0, f"  {len(changes)} lost node(s){each} (--elastic):")
    return out


def member_lines(members: Sequence[Mapping[str, Any]]) -> list[str]:
    """``fleetctl status`` of a ``run --elastic`` job: each slot's holder and the hosts that
    lost theirs, in aligned columns (``StatusReport.to_dict()["members"]``)."""
    if not members:
        return []
    rows = [
        (
            f"slot {m['slot']}",
            str(m["host"]),
            str(m["state"]),
            "since " + (m["since"] or "-").replace("T", " ")[:19],
            f"({m['why']})" if m.get("why") else "",
        )
        for m in members
    ]
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    out = ["  members (--elastic):"]
    for r in rows:
        cells = [c.ljust(w) for c, w in zip(r[:3], widths, strict=False)]
        out.append(("    " + "  ".join([*cells, r[3], r[4]])).rstrip())
    return out


def _proof(result: JobResult) -> list[str]:
    """The post-mortem's proof under the verdict (docs/health.md): its finding, then its
    rounds."""
    return [
        f"    {line.strip()}" if line.startswith("  ") else f"  post-mortem proof: {line}"
        for line in result.proof_lines()
    ]
