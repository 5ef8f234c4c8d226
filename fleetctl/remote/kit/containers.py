"""A job's containers on this node, ended for sure: listed by the job's label, stopped,
removed, listed again. The argv come from the controller (``fleetctl/plan/runtimes/``) in
the spec's ``container`` entry; this module only runs them, each with a timeout.

Also where the ranks are: the host pid of the container's main process (``main_pid``).
Node module: stdlib only, Python >= 3.8.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time

from .procfs import pids, proc_stat

CALL_TIMEOUT = 30.0  # one runtime command (``cfg["timeout"]``: ``run --runtime-timeout``)
# a removal the runtime still has under way: docker's ``run --rm`` starts removing a stopped
# container on its own, and our ``rm --force`` then fails ("removal ... already in progress")
# while the container is still listed for a moment; asked again until then
SETTLE = 10.0


# Each runtime command runs under ``sh``, which stays its parent: a concurrent stop (``fleetctl
# stop`` kills every process under the supervisor) then shows as the shell's death by the
# signal. podman's client itself, SIGTERMed, may exit 0 having printed nothing: a listing of
# no containers that lies (seen here: 8 of 80 ``podman ps`` SIGTERMed as they ran).
SHELL = '"$@"; exit $?'  # not the command alone: bash would exec it and be gone


def _run(argv: list, timeout: float) -> tuple:
    """(exit code, stdout, stderr's last line); code None when it did not run or timed out,
    negative when a signal ended it (or its shell)."""
    words = [str(a) for a in argv]
    import shutil  # here: its import (bz2, lzma, fnmatch) is CPU at every supervisor start

    if shutil.which(words[0]) is None:
        return None, "", f"{words[0]}: No such file or directory"
    try:
        p = subprocess.Popen(
            ["sh", "-c", SHELL, "sh", *words],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,  # its own group: a timeout ends the shell and the command
        )
    except OSError as e:
        return None, "", f"{words[0]}: {e.strerror or e}"
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(OSError):
            os.killpg(p.pid, signal.SIGKILL)
        p.communicate()
        return None, "", hung_line(words, timeout)
    lines = err.decode("utf-8", "replace").strip().splitlines()
    code = p.returncode
    if code > 128:  # the shell's 128 + N: the command was ended by signal N
        code = 128 - code
    return code, out.decode("utf-8", "replace"), lines[-1] if lines else ""


HUNG = ": no answer within "  # what a call cut at its timeout says (``hung_line``)


def hung_line(words: list, timeout: float) -> str:
    """A runtime call cut at its timeout, named by its first two words (``podman stop``)."""
    return f"{' '.join(words[:2])}{HUNG}{timeout:g}s"


def call_timeout(cfg: dict) -> float:
    """The bound of one runtime call: the spec's ``timeout``, else ``CALL_TIMEOUT``."""
    try:
        return float(cfg.get("timeout") or CALL_TIMEOUT)
    except (TypeError, ValueError):
        return CALL_TIMEOUT


def end_bound(grace: float, timeout: float) -> float:
    """About the longest ``end_containers`` takes when the runtime hangs: a listing, a stop
    (``grace`` + its call), a removal and a listing, where a hung call ends the attempt."""
    return grace + 4 * timeout + 1.0


def listed(cfg: dict, timeout: float = CALL_TIMEOUT) -> tuple:
    """(container ids of the job, problem or None, exit code): ids one per line."""
    code, out, err = _run(cfg["list"], timeout)
    if code != 0:
        return [], err or f"{cfg['list'][0]} ps exited {code}", code
    return [line.strip() for line in out.splitlines() if line.strip()], None, code


def tells_pid(cfg: dict | None) -> bool:
    """The runtime says where the container's main process is (a pid file or an argv)."""
    return bool(cfg and (cfg.get("pidfile") or cfg.get("pid")))


def main_pid(cfg: dict, timeout: float = 5.0) -> int | None:
    """The host pid of the container's main process, None until it runs or where the runtime
    cannot say. ``cfg["pidfile"]``: the file the runtime writes it to (podman's
    ``--pidfile``), read without starting anything; else ``cfg["pid"]`` prints it (docker's
    ``inspect``: a whole client start per question, many while the container starts)."""
    if cfg.get("pidfile"):
        try:
            with open(cfg["pidfile"], "rb") as f:
                text = f.read(32).decode("ascii", "replace").strip()
        except OSError:
            return None
    elif cfg.get("pid"):
        code, out, _ = _run(cfg["pid"], timeout)
        text = out.strip() if code == 0 else ""
    else:
        return None
    return int(text) if text.isdigit() and int(text) > 0 else None


def client_half(pgid: int) -> int | None:
    """The half of the runtime's client left after the client (the supervisor's child, leader
    of the job's process group ``pgid``) ended: rootless podman's client is two processes, the
    parent re-executing podman inside the user namespace and waiting for it, and SIGTERM ends
    that parent with exit code 0 while the child still waits for its container. The parent's 0
    then says nothing of the job; the child's status does (the container's code, or the signal
    that ended it). Found as a process of that group left to this supervisor (the subreaper)
    by its parent, running or a zombie (not yet reaped: its status is still to be read); the
    container's own processes are in conmon's session, never in that group. None: no such."""
    me = os.getpid()
    for pid in pids():
        st = proc_stat(pid)
        if st is not None and pid != pgid and st[1] == me and st[2] == pgid:
            return pid
    return None


def wait_child(pid: int, timeout: float) -> int | None:
    """A child's exit code (-N: signal N) once it ends, None if it runs ``timeout`` s more."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            got, status = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            return None
        if got:
            return -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
        if time.monotonic() > deadline:
            return None
        time.sleep(0.05)


def stopped_code(
    code: int,
    half: int | None,
    cfg: dict | None,
    stop: bool,
    seen: int | None,
    ended: dict | None,
    leftovers: dict | None,
    stopped: dict | None = None,
) -> int:
    """``--image``: the node's code where the runtime's client ended 0 on a stop's SIGTERM, a
    0 that says nothing of the job (podman's client, rootless, caught early or racing its
    signal proxy, exits 0 and leaves its container to the stop). ``half``: rootless podman's
    other half (``client_half``), which still waited for the container: its status. Else,
    with a ``stop`` asked, the 0 is the container's only where this supervisor's own stop
    (``stopped``: what its scan found running when the stop began) proves the container's main
    process (``seen``) had ended before, and the client's ``--rm`` left nothing for the
    teardown (``ended["found"]``). Otherwise the stop ended it: SIGKILL where the sweep had
    to kill (``leftovers["killed"]``), else SIGTERM. Any other code is the container's, as
    the client relayed it."""
    if half is not None:
        got = wait_child(half, 5.0)
        return -signal.SIGKILL if got is None else got  # None: the sweep killed it
    if code != 0 or not tells_pid(cfg) or not stop:
        return code
    scanned = (stopped or {}).get("found")
    ended_first = seen is not None and scanned is not None and seen not in scanned
    if ended_first and not (ended or {}).get("found"):
        return code  # it had ended on its own before the stop: its 0 stands
    return -(signal.SIGKILL if (leftovers or {}).get("killed") else signal.SIGTERM)


def end_containers(cfg: dict, grace: float, timeout: float | None = None) -> dict:
    """Stop and remove every container labelled with the job, then check none is left.

    ``cfg``: ``list`` (argv printing the ids), ``stop`` and ``remove`` (argv prefixes the ids
    are appended to), ``timeout`` (one call's bound; ``timeout`` here wins). Returns ``found``,
    ``remaining`` (ids still listed after) and ``problem`` (the last failure, None when the end
    is verified); ``hung`` too when a call got no answer in time (the runtime hangs): which
    call, the problem then. A ``fleetctl stop`` on this node kills every process under the
    supervisor, the runtime commands of this very teardown included: one ended by a signal is
    tried again, for ``grace`` + 10 s at most. A hung call is not: the whole end is bounded
    by ``end_bound``."""
    limit = call_timeout(cfg) if timeout is None else timeout
    deadline = time.monotonic() + grace + 10.0
    found: list = []
    while True:
        said = _end_once(cfg, grace, limit)
        found = sorted({*found, *said["found"]})
        if not said.pop("killed") or said.get("hung") or time.monotonic() > deadline:
            return {**said, "found": found}
        time.sleep(0.2)


def _end_once(cfg: dict, grace: float, timeout: float) -> dict:
    """One attempt. A call the runtime does not answer in time ends it: a hung runtime answers
    the next no sooner, and each would cost the teardown another ``timeout``."""
    found, problem, code = listed(cfg, timeout)
    killed = code is not None and code < 0
    if code is None and problem and HUNG in problem:
        return {**_hung([], problem), "remaining": []}
    if not found and problem is None:  # verified: nothing to end (no second listing to pay)
        return {"found": [], "remaining": [], "problem": None, "killed": False}
    if found:
        code, _, err = _run([*cfg["stop"], *found], grace + timeout)
        killed = killed or (code is not None and code < 0)
        if code != 0:  # a stop that failed is no end: removing with force kills
            problem = err or f"{cfg['stop'][0]} stop exited {code}"
        if code is None and HUNG in problem:
            return _hung(found, problem)
        code, _, err = _run([*cfg["remove"], *found], timeout)
        killed = killed or (code is not None and code < 0)
        if code != 0:
            problem = err or f"{cfg['remove'][0]} rm exited {code}"
        if code is None and HUNG in problem:
            return _hung(found, problem)
    remaining, again, code = listed(cfg, timeout)
    if code is None and again and HUNG in again:
        return _hung(found, again)
    settle = time.monotonic() + min(SETTLE, timeout)
    while found and remaining and again is None and time.monotonic() < settle:
        time.sleep(0.2)
        _run([*cfg["remove"], *remaining], timeout)
        remaining, again, code = listed(cfg, timeout)
    killed = killed or (code is not None and code < 0)
    if again is not None:
        problem = again
    elif remaining:
        problem = problem or f"{len(remaining)} container(s) of the job still listed"
    else:
        problem = None  # verified: whatever failed on the way, nothing of the job is left
        killed = False
    return {"found": found, "remaining": remaining, "problem": problem, "killed": killed}


def _hung(found: list, problem: str) -> dict:
    """The end cut at a hung call: what was found is not known to be gone."""
    said = {"found": found, "remaining": found, "problem": problem, "killed": False}
    return {**said, "hung": problem}
