"""The port probe under Python 3.8: TIME_WAIT does not move the rendezvous port, and port
claims live in a private folder of the user that nobody else can squat."""

from __future__ import annotations

import json
import os
import socket
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from fleetctl.phases.frames import last_data

Run = Callable[..., subprocess.CompletedProcess[bytes]]


def _probe(run38: Run, claims: Path, cands: list[int], job: str | None = "J") -> dict:
    args: dict = {"candidates": cands, "need": 1}
    if job is not None:
        args["claim"] = {"job": job}
    env = {**os.environ, "FLEETCTL_PORT_CLAIMS": str(claims)}
    return last_data(run38("port_probe.py", [json.dumps(args)], env=env).stdout)


def _time_wait_port() -> int:
    """A port whose only socket is a connection in TIME_WAIT (the server closed first, as a
    rendezvous store does when the last job ended)."""
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    port = srv.getsockname()[1]
    cli = socket.create_connection(("127.0.0.1", port))
    conn, _ = srv.accept()
    srv.close()
    conn.close()  # active close on the server side: its end goes to TIME_WAIT
    cli.recv(1)  # EOF: the FIN arrived
    cli.close()
    return port


def _in_time_wait(port: int) -> bool:
    for name in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(name) as f:
            for line in f.readlines()[1:]:
                local, state = line.split()[1], line.split()[3]
                if int(local.rsplit(":", 1)[1], 16) == port and state == "06":
                    return True
    return False


def test_a_port_in_time_wait_from_the_last_job_is_free_and_a_listening_one_is_not(
    run38: Run, tmp_path: Path
) -> None:
    port = _time_wait_port()
    assert _in_time_wait(port)
    assert _probe(run38, tmp_path / "c", [port], job=None) == {"free": [port], "busy": {}}
    busy = socket.socket()
    busy.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    busy.bind(("0.0.0.0", 0))
    busy.listen(1)
    try:
        held = busy.getsockname()[1]
        got = _probe(run38, tmp_path / "c", [held, port])
    finally:
        busy.close()
    assert got == {"free": [port], "busy": {str(held): "in use"}}


def test_the_claim_folder_is_made_private_and_a_foreign_or_linked_one_is_refused(
    run38: Run, tmp_path: Path
) -> None:
    free = socket.socket()
    free.bind(("0.0.0.0", 0))
    port = free.getsockname()[1]
    free.close()
    mine = tmp_path / "mine"
    assert _probe(run38, mine, [port])["free"] == [port]
    assert mine.stat().st_mode & 0o777 == 0o700 and mine.stat().st_uid == os.getuid()
    link = tmp_path / "link"
    link.symlink_to(mine)
    got = _probe(run38, link, [port])
    assert got == {"error": f"port claim folder {link} is not a folder (a link or a file)"}
    if os.getuid() != 0:
        pytest.skip("making a folder of another user needs root")
    other = tmp_path / "other"
    other.mkdir(mode=0o755)
    os.chown(other, 65534, 65534)
    got = _probe(run38, other, [port])
    assert got == {
        "error": f"port claim folder {other} belongs to uid 65534, not to this user "
        f"(uid {os.getuid()}); remove it"
    }
    assert list(other.iterdir()) == []


def test_a_claim_naming_a_live_pid_without_its_start_time_expires_after_the_grace(
    run38: Run, tmp_path: Path
) -> None:
    free = socket.socket()
    free.bind(("0.0.0.0", 0))
    port = free.getsockname()[1]
    free.close()
    claims = tmp_path / "claims"
    claims.mkdir(mode=0o700)
    squat = claims / str(port)
    squat.write_text(json.dumps({"job": "evil", "pid": 1}))  # pid 1: alive for good
    assert _probe(run38, claims, [port]) == {
        "free": [],
        "busy": {str(port): "reserved by fleetctl job evil"},
    }  # fresh: a claim not adopted yet holds for the grace period
    old = squat.stat().st_mtime - 181
    os.utime(squat, (old, old))
    assert _probe(run38, claims, [port]) == {"free": [port], "busy": {}}
    assert json.loads(squat.read_text())["job"] == "J"


def test_the_probe_and_the_supervisor_name_the_same_per_user_claim_folder() -> None:
    env = {k: v for k, v in os.environ.items() if k != "FLEETCTL_PORT_CLAIMS"}
    code = (
        "import fleetctl.remote.port_probe as p, fleetctl.remote.jobprocs as s;"
        "print(p.CLAIMS, s.PORT_CLAIMS)"
    )
    out = subprocess.run(
        ["python3", "-c", code], env=env, capture_output=True, text=True, check=True
    ).stdout.split()
    assert out == [f"/tmp/fleetctl-ports-{os.getuid()}"] * 2
