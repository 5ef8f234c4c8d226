"""``run --resume JOB``: a new job that continues an earlier one, as the same script
resubmitted with sbatch would (it finds its checkpoint in the folder it runs in).

Each job has a work folder of its own on every node (``W/work/<job-id>/``, shared by that job's
retries), so a second ``fleetctl run`` would start from scratch. With ``--resume`` the earlier
job's checkpoint files — what its rank 0 wrote into its work folder (or ``--checkpoint-dir``),
on the node of rank 0 of its last attempt that got as far as a plan — are relayed to the work
folder of every node of the new job before launch, as a retry's are (``fleetctl.job.
checkpoints``). :func:`resolve` reads the earlier job's run folder only (exit 2 when it is
unknown or never planned); :func:`check_files` asks its node, before anything starts, that
there is something to resume from (exit 2 when not).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from fleetctl.errors import ConnectError, NodePushError, RunFolderError, UsageError

if TYPE_CHECKING:
    from fleetctl.job.run.checkpoints import CheckpointRelay
    from fleetctl.node import Node
    from fleetctl.phases.push.request import PushRequest
    from fleetctl.transport.connection import SSHSettings

LAST = "last"  # --resume last: the newest job of the runs folder
SINCE_SLACK = 10.0  # s before the earlier job's start that still count as written by it


def resolve(
    text: str, runs_dir: str | Path, pool: Sequence[Node], relayed: str | None
) -> CheckpointRelay:
    """The relay from the earlier job ``text`` (an id, a unique prefix, or ``last``): its
    rank 0's node (as the new run's inventory names it, else as it was reached then), work
    folder, code snapshot; ``relayed``: the checkpoint folder in it, resolved
    (``Retry.checkpoint_folder``). UsageError naming the value when there is no such job or
    it never got as far as a plan."""
    from fleetctl.job.records.runfolder import RunFolder, check_job_id, read_job
    from fleetctl.job.records.runs import (
        ATTEMPT_RE,
        _parse_iso,
        attempt_folders,
        latest_attempt,
        list_records,
        load_nodes,
        load_plan,
    )
    from fleetctl.job.run.checkpoints import CheckpointRelay
    from fleetctl.phases.push.relay import RelaySource

    bad = f"--resume {text!r}"
    if not text or text != text.strip() or any(c in text for c in "\0\n\r"):
        raise UsageError(f"{bad}: give a job id (see `fleetctl runs`) or '{LAST}'")
    if text == LAST:
        records = list_records(runs_dir)
        if not records:
            raise UsageError(f"{bad}: no job in {runs_dir} to resume")
        text = records[-1].job_id
    try:
        check_job_id(text)
        newest = latest_attempt(runs_dir, text)
    except (RunFolderError, UsageError) as e:
        raise UsageError(f"{bad}: {e.one_line()} (see `fleetctl runs`)") from None
    m = ATTEMPT_RE.match(newest.path.name)
    root = newest.path.parent
    base = m.group("base") if m and (root / m.group("base")).is_dir() else newest.path.name
    folders = attempt_folders(RunFolder(root / base))
    for k, folder in reversed(folders):
        try:
            plan = load_plan(folder)
        except (RunFolderError, KeyError, TypeError, ValueError):
            continue  # never planned (a preflight that failed): an earlier attempt may have
        if not plan.nodes:
            continue
        np = plan.nodes[0]
        # the host as today's inventory reaches it, else as the job reached it then
        node = next((n for n in [*pool, *load_nodes(folder)] if n.name == np.host), None)
        if node is None:
            raise UsageError(f"{bad}: its rank 0 ran on {np.host}, which no inventory names now")
        work = np.work_dir or np.cwd  # cwd may be the script's folder in it
        source = RelaySource(node, work, np.code_dir, np.train_addr or None, k, np.cwd)
        try:
            started = _parse_iso(read_job(root / base / "job.json").started)
        except RunFolderError:
            started = None
        since = None if started is None else started - SINCE_SLACK
        return CheckpointRelay(source, dir=relayed, resume=base, since=since)
    raise UsageError(f"{bad}: job {base} never got as far as a plan: no checkpoint files")


def check_files(
    relay: CheckpointRelay, settings: SSHSettings | None, policy: PushRequest | None = None
) -> None:
    """Before anything starts: the earlier job's node lists its checkpoint files (``policy``:
    the job's push, whose allowed key-like files the node's scan lets through). UsageError
    (exit 2) when there are none or too many to relay; what the node says when it cannot be
    asked (ConnectError: exit 3), one line."""
    from fleetctl.phases.push.relay import CHECKPOINT_MAX, list_checkpoints
    from fleetctl.phases.push.request import PushRequest

    src, job = relay.source, relay.resume
    try:
        listed = list_checkpoints(
            src,
            settings,
            folder=relay.dir,
            policy=policy or PushRequest(),
            since=relay.since,
        )
    except ConnectError as e:
        raise ConnectError(
            e.node, f"--resume {job}: cannot list its checkpoints: {e.reason}"
        ) from e
    except NodePushError as e:
        raise NodePushError(
            e.node, f"--resume {job}: cannot list its checkpoints: {e.reason}"
        ) from e
    where = str(listed.get("root") or src.work_dir)
    if not int(listed.get("count", 0)):
        raise UsageError(
            f"--resume {job}: no checkpoint files in {where} on {src.node.name} (rank 0 of "
            f"job {job}){'' if relay.dir else '; --checkpoint-dir names another folder'}"
        )
    if int(listed.get("bytes", 0)) > CHECKPOINT_MAX:
        raise UsageError(
            f"--resume {job}: {listed['bytes']} bytes in {where} on {src.node.name}, over "
            f"the relay cap of {CHECKPOINT_MAX}; name the checkpoint folder (--checkpoint-dir)"
        )
