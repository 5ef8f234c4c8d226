"""Which of a host's candidate ports are free now, and claiming them for one job.

``python -c SOURCE '{"candidates": [...], "need": N, "claim": {"job": J}}'``: binds each
candidate (TCP, all interfaces, with SO_REUSEADDR as the launchers bind it: a port whose last
job's connections are in TIME_WAIT is free, one something listens on is not) and answers the
first N that bind as one frame, ``D {"free": [...], "busy": {port: why}}`` (``D {"error": …}``
when the claim folder cannot be used).

With ``claim``, a port is also taken for job J in this user's claim folder (host-local, 0700,
a real folder of this user that another user cannot pre-empt: ``portclaims``): a file per port
created with O_EXCL, so of two jobs planned at the same instant only one gets it, the other
moves on (or is refused when the port was fixed). Per user, so nobody else can squat a port for
our jobs (another user's job is seen by its listener). The job's supervisor adopts its claims
(its pid and start time go in) and removes them when it ends; a claim whose supervisor is gone,
whose pid names another process now, or that no supervisor adopted within ``CLAIM_GRACE`` s,
is stale and taken over. Stdlib only; a separate program because it runs before the supervisor
is on the node.
"""

from __future__ import annotations

import errno
import json
import os
import socket
import sys
import time

from ..kit.framing import frame
from ..kit.portclaims import ClaimsUnusable, claims_folder, existing_claims_folder
from ..kit.procfs import proc_start_time

CLAIM_GRACE = 180.0  # s from claim to the supervisor adopting it (check, push, launch)


def claim_owner(path: str, now: float) -> str | None:
    """The job holding the claim at ``path``; None when there is none or it is stale."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        data = {}
    if not isinstance(data, dict):
        data = {}
    pid, start = data.get("pid"), data.get("start")
    if isinstance(pid, int) and pid > 0:
        alive = proc_start_time(pid)
        if alive is None or (isinstance(start, int) and alive != start):
            return None  # its claimant is gone (or the pid names another process now)
        if isinstance(start, int):
            return str(data.get("job") or "?")  # adopted: held while that very process lives
        # a live pid without its start time proves nothing: only the grace below holds it
    try:
        age = now - os.stat(path).st_mtime
    except OSError:
        return None
    return str(data.get("job") or "?") if age < CLAIM_GRACE else None


def claim(claims: str, port: int, job: str) -> str | None:
    """Take ``port`` for ``job`` in folder ``claims``; None when taken, else why not (another
    job holds it)."""
    path = os.path.join(claims, str(port))
    for _ in range(2):
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_NOFOLLOW, 0o600)
        except PermissionError as e:
            return f"claim {path} cannot be written: {e.strerror or e}"
        except FileExistsError:
            owner = claim_owner(path, time.time())
            if owner == job:
                return None
            if owner is not None:
                return "reserved by fleetctl job " + owner
            try:
                os.unlink(path)  # stale: its supervisor is gone
            except FileNotFoundError:
                pass
            except OSError as e:
                if e.errno in (errno.EPERM, errno.EACCES):
                    return f"stale claim {path} of another user"
                raise
            continue
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump({"job": job, "pid": None, "claimed_at": time.time()}, f)
        return None
    return "claim raced"


def free_ranges(candidates: list, span: int, claims: str, job: str, busy: dict) -> list:
    """The first candidate ``base`` whose ports base..base+span-1 all bind and are claimed for
    ``job`` (paddle's endpoints: start_port + local rank on every node); [] if none."""
    for base in candidates:
        ports = list(range(base, base + span))
        got = free_ports(ports, span, (claims, job), busy, stop_at_first=True)
        if len(got) == span:
            return [base]
        for port in got:  # claimed a part only: give it back
            unclaim(claims, port, job)
    return []


def unclaim(claims: str, port: int, job: str) -> None:
    path = os.path.join(claims, str(port))
    try:
        with open(path, encoding="utf-8") as f:
            if json.load(f).get("job") == job:
                os.unlink(path)
    except (OSError, ValueError, AttributeError):
        pass


def free_ports(
    candidates: list,
    need: int,
    claim_for: tuple | None = None,
    busy: dict | None = None,
    stop_at_first: bool = False,
) -> list:
    """The first ``need`` candidates that bind (and, with ``claim_for`` = (folder, job), that
    the job could claim there); ``stop_at_first``: stop at the first that does not."""
    free: list = []
    for port in candidates:
        if len(free) >= need or (stop_at_first and busy and str(port - 1) in busy):
            break
        if claim_for is not None:
            owner = claim_owner(os.path.join(claim_for[0], str(port)), time.time())
            if owner is not None and owner != claim_for[1]:
                if busy is not None:
                    busy[str(port)] = "reserved by fleetctl job " + owner
                continue
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            # as the launchers bind it: TIME_WAIT of the last job's connections does not make
            # the port taken (the next job would move on every time); a listener does
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(("0.0.0.0", port))
        except OSError as e:
            if busy is not None:
                busy[str(port)] = "in use" if e.errno == errno.EADDRINUSE else str(e)
            continue
        finally:
            s.close()
        why = claim(claim_for[0], port, claim_for[1]) if claim_for is not None else None
        if why is not None:
            if busy is not None:
                busy[str(port)] = why
            continue
        free.append(port)
    return free


def main() -> None:
    args = json.loads(sys.argv[1])
    if args.get("unclaim"):  # give back what a job claimed here (it went elsewhere)
        gone, claims = args["unclaim"], existing_claims_folder()
        for port in gone["ports"] if claims is not None else ():
            unclaim(claims, int(port), str(gone["job"]))
        frame("D", {"unclaimed": len(gone["ports"])})
        return
    job = (args.get("claim") or {}).get("job")
    claims = None
    if job is not None:
        try:
            claims = claims_folder()
        except ClaimsUnusable as e:
            frame("D", {"error": str(e)})
            return
    busy: dict = {}
    cands = [int(p) for p in args["candidates"]]
    span = int(args.get("span") or 1)
    if span > 1 and claims is not None:
        free = free_ranges(cands, span, claims, str(job), busy)
    else:
        claim_for = (claims, str(job)) if claims is not None else None
        free = free_ports(cands, int(args["need"]), claim_for, busy)
    frame("D", {"free": free, "busy": busy})
    sys.stdout.flush()


if __name__ == "__main__":
    main()
