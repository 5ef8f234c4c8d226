"""A passing check's probe, held on its channel, becomes the node supervisor (Python 3.8).

``fleetctl run`` keeps each probe waiting after the check (``CheckOptions.hold``); the launch
then sends it the supervisor's start instead of starting a second remote command
(``fleetctl.phases.launch.start_node(held=...)``). Real processes, files and sockets here.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

# tests/remote is on sys.path (pytest's rootdir-relative import): its supervisor fixtures
from test_programs_py38 import Jobs, drain, jid

from fleetctl import remote
from fleetctl.phases.check.preflight import probe_command
from fleetctl.phases.check.report import HeldProbe
from fleetctl.phases.frames import PROBE_KINDS, FrameStream
from fleetctl.phases.launch import NodeRun, handoff_line, supervisor_path
from fleetctl.remote.programs.supervisor import proc_stat
from fleetctl.transport.connection import Stream


def alive(pid: int) -> bool:
    st = proc_stat(pid)
    return st is not None and st[0] not in ("Z", "X")


def wait_gone(pid: int, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not alive(pid):
            return True
        time.sleep(0.05)
    return False


class Probes:
    """Probes started as a check starts them, on a local node with a Python 3.8; the jobs they
    become the supervisor of (``Jobs`` of test_programs_py38)."""

    def __init__(self, root: Path, python: str) -> None:
        self.root, self.python = root, python
        self.jobs = Jobs(root, python)
        self.streams: list[Stream] = []

    def args(self, hold: float, **extra: Any) -> dict[str, Any]:
        return {
            "address": "127.0.0.1",
            "nic": "lo",
            "train_addr": "127.0.0.1",
            "workdir": str(self.root / "w"),
            "ports": [],
            "allow_loopback": True,
            "mesh": False,
            "hold": hold,
            **extra,
        }

    def start(self, hold: float, **extra: Any) -> tuple[Stream, FrameStream, dict[str, Any]]:
        stream = self.jobs.conn.start(probe_command(self.python, self.args(hold, **extra)))
        self.streams.append(stream)
        lines = FrameStream(stream, PROBE_KINDS, json_kinds=PROBE_KINDS)
        got = lines.next("D", time.monotonic() + 60)
        assert got is not None, f"no facts: {lines.tail}"
        facts = got.data()
        assert isinstance(facts, dict) and isinstance(facts["pid"], int)
        return stream, lines, facts

    def launch(self, name: str, argv: list[str], held: HeldProbe) -> NodeRun:
        return self.jobs.start(jid(name), argv, held=held)

    def close(self) -> None:
        for s in self.streams:
            with contextlib.suppress(Exception):
                s.close()
        self.jobs.close()


@pytest.fixture
def probes(tmp_path: Path, py38: str) -> Iterator[Probes]:
    p = Probes(tmp_path, py38)
    try:
        yield p
    finally:
        p.close()


def test_a_held_probe_becomes_the_supervisor_and_runs_the_job_in_its_own_process(
    probes: Probes,
) -> None:
    for i, upload in enumerate((True, False)):  # the loader installs it; then it is there
        stream, _, facts = probes.start(hold=60)
        held = HeldProbe(stream, probes.python, time.monotonic() + 30, facts["pid"])
        run = probes.launch(f"held{i}", ["sh", "-c", "echo ppid=$PPID; exit 3"], held)
        assert run.stream is stream and run.uploaded is upload
        # the job's supervisor is the very process that answered the check
        assert run.info["supervisor_pid"] == facts["pid"]
        frames = drain(run)
        assert ("L", f"ppid={facts['pid']}") in frames
        assert frames[-1][0] == "X" and frames[-1][1].split(" ", 1)[0] == "3"
        assert (
            Path(supervisor_path(str(probes.root / "w"))) / remote.node_file("supervisor.py")
        ).is_file()
        assert wait_gone(facts["pid"])


def test_a_held_probe_exits_on_eof_and_on_its_time_limit(probes: Probes) -> None:
    stream, _, facts = probes.start(hold=60)
    assert alive(facts["pid"])
    stream.close_stdin()  # the controller let it go (check failed, run over)
    assert stream.exit_code(10) == 0 and wait_gone(facts["pid"])

    stream, _, facts = probes.start(hold=0.5)  # nobody came for it
    assert stream.exit_code(10) == 0 and wait_gone(facts["pid"])

    stream, _, facts = probes.start(hold=0)  # a plain check: no waiting at all
    assert stream.exit_code(10) == 0


def test_a_probe_held_too_long_is_let_go_and_the_supervisor_starts_afresh(
    probes: Probes,
) -> None:
    stream, _, facts = probes.start(hold=60)
    stale = HeldProbe(stream, probes.python, time.monotonic() - 1, facts["pid"])
    run = probes.launch("stale", ["true"], stale)
    assert run.stream is not stream and run.info["supervisor_pid"] != facts["pid"]
    assert wait_gone(facts["pid"])  # closed, not left waiting
    last = drain(run)[-1]
    assert last[0] == "X" and last[1].split(" ", 1)[0] == "0"


def test_a_held_mesh_probe_closes_its_listener_then_runs_the_handed_code(
    probes: Probes, tmp_path: Path
) -> None:
    port_base = 44000 + os.getpid() % 2000
    extra = {"mesh": True, "mesh_port": port_base, "avoid_ports": [], "peer_wait": 30}
    stream, lines, facts = probes.start(hold=60, linger=30, mesh_timeout=2, **extra)
    got = lines.next("R", time.monotonic() + 30)
    assert got is not None
    port = int(got.data())
    peers = {"peers": [{"name": "self", "addr": "127.0.0.1", "port": port}]}
    stream.send(json.dumps(peers).encode() + b"\n")
    mesh = lines.next("M", time.monotonic() + 30)
    assert mesh is not None and mesh.data()["peers"]["self"]["tcp"] == "ok"
    # the others may still test us: the listener stays up until the controller says so
    socket.create_connection(("127.0.0.1", port), timeout=5).close()
    stream.send(b"\n")
    out = tmp_path / "handed.json"
    code = (
        "import json, os, sys, threading\n"
        "json.dump({'pid': os.getpid(), 'argv': sys.argv[1:],\n"
        "           'threads': threading.active_count()}, open(sys.argv[1], 'w'))\n"
    )
    stream.send(json.dumps({"code": code, "argv": [str(out), "x y"]}).encode() + b"\n")
    assert stream.exit_code(20) == 0
    ran = json.loads(out.read_text())
    # in the probe's own process, with the argv handed over, no thread of the probe left
    assert ran == {"pid": facts["pid"], "argv": [str(out), "x y"], "threads": 1}
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=5).close()


def test_the_handoff_line_is_one_json_line_that_starts_or_installs_the_supervisor(
    py38: str,
) -> None:
    line = handoff_line("/w/bin/supervisor_abc.py")
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    msg = json.loads(line)
    assert msg["argv"] == ["/w/bin/supervisor_abc.py", "run"]
    res = subprocess.run(  # by the oldest python a supervisor runs on
        [py38, "-c", f"compile({msg['code']!r}, 'h', 'exec')"], capture_output=True
    )
    assert res.returncode == 0, res.stderr


class _NoCommands:
    """A fleet that starts no command: the claim must go through the held probe."""

    def connection(self, node: Any) -> Any:
        raise AssertionError(f"a new command on {node.name}: the held probe was not used")


def test_node_0s_held_probe_claims_the_port_in_place_then_its_supervisor_adopts_it(
    probes: Probes, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from fleetctl.job.run.ports import reserve_master_port
    from fleetctl.plan.rankplan import JobSpec

    claims = tmp_path / "claims"
    monkeypatch.setenv("FLEETCTL_PORT_CLAIMS", str(claims))  # the probe's and supervisor's
    stream, _, facts = probes.start(hold=60)
    held = {probes.jobs.node.name: HeldProbe(stream, probes.python, time.monotonic() + 30)}
    port0 = 45000 + os.getpid() % 2000
    spec = JobSpec(script="x.py", job_id=jid("claim"), rdzv_port=port0)
    # no srun step, no SSH channel: the probe's own process claims, and stays held
    port = reserve_master_port(_NoCommands(), probes.jobs.node, spec, held=held)  # type: ignore[arg-type]
    assert port0 <= port < port0 + 64 and probes.jobs.node.name in held
    claim = json.loads((claims / str(port)).read_text())
    assert claim["job"] == spec.job_id and claim["pid"] is None
    run = probes.launch("claim", ["true"], held[probes.jobs.node.name])
    assert run.stream is stream and run.info["supervisor_pid"] == facts["pid"]
    last = drain(run)[-1]
    assert last[0] == "X" and last[1].split(" ", 1)[0] == "0"
    assert not (claims / str(port)).exists()  # adopted by that process, freed at its end


def test_a_held_probe_whose_call_fails_says_so_and_still_becomes_the_supervisor(
    probes: Probes,
) -> None:
    stream, lines, facts = probes.start(hold=60)
    bad = {"code": "raise RuntimeError('boom')", "argv": [], "call": True}
    stream.send(json.dumps(bad).encode() + b"\n")
    got = lines.next("N", time.monotonic() + 20)
    assert got is not None and "RuntimeError: boom" in str(got.data())
    held = HeldProbe(stream, probes.python, time.monotonic() + 30, facts["pid"])
    run = probes.launch("after-call", ["true"], held)
    assert run.stream is stream and run.info["supervisor_pid"] == facts["pid"]
