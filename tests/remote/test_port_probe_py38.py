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
from conftest import node_tree

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


def _free_port() -> int:
    free = socket.socket()
    free.bind(("0.0.0.0", 0))
    port = free.getsockname()[1]
    free.close()
    return port


def _adopt(py38: str, claims: Path, job: str) -> list:
    """What the supervisor's ``adopt_port_claims`` finds, run by Python 3.8 from the flat node
    modules (as its bundle imports them)."""
    code = (
        "import json, sys; sys.path.insert(0, sys.argv[1]); "
        "from remote.kit import jobprocs; "
        "print(json.dumps(jobprocs.adopt_port_claims(sys.argv[2])))"
    )
    env = {**os.environ, "FLEETCTL_PORT_CLAIMS": str(claims)}
    out = subprocess.run(
        [py38, "-S", "-c", code, node_tree(), job],
        env=env, capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    return json.loads(out.stdout)


def test_a_claim_folder_name_taken_by_a_link_or_a_file_is_passed_over(
    run38: Run, py38: str, tmp_path: Path
) -> None:
    port = _free_port()
    mine = tmp_path / "mine"
    assert _probe(run38, mine, [port])["free"] == [port]
    assert mine.stat().st_mode & 0o777 == 0o700 and mine.stat().st_uid == os.getuid()
    link = tmp_path / "link"
    link.symlink_to(mine)
    assert _probe(run38, link, [port], job="K")["free"] == [port]
    assert json.loads((tmp_path / "link.1" / str(port)).read_text())["job"] == "K"
    assert json.loads((mine / str(port)).read_text())["job"] == "J"  # not through the link
    squat = tmp_path / "file"
    squat.write_text("")
    assert _probe(run38, squat, [port], job="L")["free"] == [port]
    assert _adopt(py38, squat, "L") == [str(tmp_path / "file.1" / str(port))]


def test_another_user_who_made_the_claim_folder_first_blocks_no_run(
    run38: Run, py38: str, tmp_path: Path
) -> None:
    """Another local user creates the folder first (/tmp is theirs to write too): the claims
    go to the next name, the supervisor adopts them there, and the user's later runs keep to
    that folder even once the squatter's is gone; only all the names taken refuses the run."""
    if os.getuid() != 0:
        pytest.skip("making a folder of another user needs root")
    base = tmp_path / "fleetctl-ports"
    base.mkdir(mode=0o755)
    os.chown(base, 65534, 65534)
    port = _free_port()
    assert _probe(run38, base, [port], job="J") == {"free": [port], "busy": {}}
    assert list(base.iterdir()) == []
    ours = tmp_path / "fleetctl-ports.1"
    assert ours.stat().st_uid == os.getuid() and ours.stat().st_mode & 0o777 == 0o700
    assert json.loads((ours / str(port)).read_text())["job"] == "J"
    assert _adopt(py38, base, "J") == [str(ours / str(port))]
    # the squatter gives up its folder: the next run still claims where J's claims are (J's
    # supervisor, the adopting process, is gone now: M takes its stale claim over)
    base.rmdir()
    assert _probe(run38, base, [port], job="M") == {"free": [port], "busy": {}}
    assert json.loads((ours / str(port)).read_text())["job"] == "M"
    assert not base.exists()
    # every name taken by another user: refused, saying so, nothing made
    for i in range(32):
        name = base if i == 0 else tmp_path / f"fleetctl-ports.{i}"
        if i != 1:
            name.mkdir(mode=0o755)
            os.chown(name, 65534, 65534)
    os.chown(ours, 65534, 65534)
    assert _probe(run38, base, [port], job="N") == {
        "error": f"port claim folders {base} and {base}.1 … .31 are all taken by other users "
        f"or are not folders (uid {os.getuid()}); remove them"
    }
    assert not (tmp_path / "fleetctl-ports.32").exists()


def test_a_claim_naming_a_live_pid_without_its_start_time_expires_after_the_grace(
    run38: Run, tmp_path: Path
) -> None:
    port = _free_port()
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


def test_the_probe_and_the_supervisor_share_one_rule_for_the_per_user_claim_folder() -> None:
    from fleetctl.remote.kit import jobprocs, portclaims
    from fleetctl.remote.programs import port_probe

    env = {k: v for k, v in os.environ.items() if k != "FLEETCTL_PORT_CLAIMS"}
    code = "import fleetctl.remote.kit.portclaims as c; print(*c.names())"
    out = subprocess.run(
        ["python3", "-c", code], env=env, capture_output=True, text=True, check=True
    ).stdout.split()
    uid = os.getuid()
    assert out == [f"/tmp/fleetctl-ports-{uid}"] + [
        f"/tmp/fleetctl-ports-{uid}.{i}" for i in range(1, 32)
    ]
    assert port_probe.claims_folder is portclaims.claims_folder
    assert jobprocs.existing_claims_folder is portclaims.existing_claims_folder
