"""Node-side preflight probe: stdlib only, shipped as source text and run by the node's python.

``fleetctl check`` runs this once per node as ONE streamed remote command (every extra command
costs a remote shell start-up). It prints everything the controller needs in one go, then
optionally takes part in the N×N mesh test on the same channel. Every message is one frame
(``<tag> <json>``, see fleetctl/phases/frames.py):

1. ``D <facts>``: home, hostname, python, rsync, training NIC (address, MTU, speed, state),
   GPUs (nvidia-smi), free disk under the workdir, port bind tests, the clock, an optional
   environment's python/NCCL version (``envinfo.py``, run by the env's python), whether a code
   snapshot is already there.
2. with ``mesh``: bind a short-lived TCP listener on the training address (a port of the master
   port range, never the master port itself) and print ``R <port>`` (or ``N "<reason>"`` and
   exit).
3. read one JSON line from stdin: ``{"peers": [{"name", "addr", "port"}]}``; ping (ICMP from the
   training address, when permitted) and TCP-connect to every peer in parallel, print
   ``M <json>``. Another such line (the controller's second round: the pairs that failed,
   once every host finished the first) is answered the same way.
4. keep the listener up until stdin closes (the others may still be testing us) or ``linger``
   seconds pass, then exit 0.
5. with ``hold`` (``fleetctl run``): instead of exiting, close the listener when the controller
   says the mesh is over (an empty line), then wait up to ``hold`` seconds for one JSON line
   ``{"code", "argv"}`` and run that code in this process with that argv: the node supervisor,
   which then owns this channel. The launch then costs no second remote command, shell and
   interpreter start on the node. A line with ``"call": true`` (node 0's port claim) is run
   the same way before it, and the wait goes on. EOF or the time limit: exit 0.

Arguments come as one JSON object in ``sys.argv[1]`` (installed as ``W/bin/probe_<sha12>.py``
and run from there, else shipped packed: see ``bootstrap.py`` and
``fleetctl.phases.check.preflight.probe_command``); ``envinfo`` in it carries
the source of ``envinfo.py``. The facts are ``facts.py``'s, the bounded waits ``waits.py``'s,
the ICMP echo ``icmp.py``'s; the mesh test is here. Every wait here is bounded. Must stay
importable by an older node python (3.7+): no third-party imports, no newer syntax.
"""

from __future__ import annotations

import errno
import json
import os
import select
import socket
import sys
import threading
import time

from ..kit.facts import gather, lookup_name
from ..kit.framing import frame
from ..kit.icmp import icmp_echo
from ..kit.waits import Task, pmap, run, which

# subprocess is imported where a program is run: a node without GPUs runs one (rsync), and the
# import was a tenth of the probe's CPU; shutil and contextlib are not needed at all.


def emit(kind: str, payload: object) -> None:
    """One frame: ``<kind> <json>``."""
    frame(kind, payload, sort_keys=True)


# ----------------------------------------------------------------------------------- mesh


class StdinLines:
    """Line reader on fd 0 with timeouts (the controller talks to us over the SSH channel)."""

    def __init__(self) -> None:
        self.buf = b""
        self.eof = False

    def readline(self, timeout: float) -> bytes | None:
        deadline = time.monotonic() + timeout
        while b"\n" not in self.buf and not self.eof:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            ready, _, _ = select.select([0], [], [], left)
            if not ready:
                continue
            chunk = os.read(0, 65536)
            if not chunk:
                self.eof = True
            self.buf += chunk
        if b"\n" in self.buf:
            line, self.buf = self.buf.split(b"\n", 1)
            return line
        return None


def listen(addr: str, base: int, span: int, avoid: set) -> tuple:
    """(socket, port) of a listener on ``addr`` in base..base+span-1, or (None, reason)."""
    last = "no port tried"
    for port in range(base, base + span):
        if port in avoid:
            continue
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        # Like real servers: a TIME_WAIT left by the last check must not move us to another port.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((addr, port))
            s.listen(256)
        except OSError as e:
            s.close()
            last = f"cannot listen on {addr}:{port}: {e.strerror or e}"
            if e.errno == errno.EADDRINUSE:
                continue
            return None, last
        return s, port
    return None, last


def serve(sock: socket.socket, stop: threading.Event) -> None:
    sock.settimeout(0.2)
    while not stop.is_set():
        try:
            conn, _ = sock.accept()
        except socket.timeout:  # an alias of TimeoutError only from 3.10
            continue
        except OSError:
            return
        conn.close()


def ping(src: str, dst: str, timeout: float) -> str:
    echo = icmp_echo(src, dst, timeout)
    if echo is not None:
        return echo
    exe = which("ping")
    if not exe:
        return "n/a: no ping"
    code, out, err = run(
        [exe, "-n", "-c1", f"-W{max(1, int(timeout))}", "-I", src, dst], timeout + 2
    )
    if code == 0:
        return "ok"
    text = (err + out).lower()
    if "not permitted" in text or "permission denied" in text or "socket:" in text:
        return "n/a: ICMP not permitted"
    if code == 1 or code == 124:
        return "timeout"
    last = (err or out).strip().splitlines()
    return "error: " + (last[-1] if last else f"ping exited {code}")


def tcp(src: str, dst: str, port: int, timeout: float) -> str:
    """Open a TCP connection to ``dst:port`` from ``src`` within ``timeout``: "ok" or why not.

    A "no route to host" is tried again until the time is up: it is also what the kernel
    reports for every packet queued on a stale neighbour entry, one whose address resolution
    ran out while the peer's link was down, even if the link is back (a peer that recovered
    seconds ago). The next attempt resolves afresh; a link that is really down fails again.
    """
    deadline = time.monotonic() + timeout
    last = "timed out"
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return last
        try:
            s = socket.create_connection(
                (lookup_name(dst), port), timeout=left, source_address=(src, 0)
            )
        except socket.timeout:  # an alias of TimeoutError only from 3.10
            return "timed out"
        except ConnectionRefusedError:
            return "refused"
        except OSError as e:
            if e.errno == errno.EHOSTUNREACH:
                last = "unreachable"
                time.sleep(min(0.05, max(0.0, deadline - time.monotonic())))
                continue
            if e.errno == errno.ENETUNREACH:
                return "unreachable"
            return e.strerror or str(e)
        s.close()
        return "ok"


def route_source(dst: str) -> str | None:
    """The source address the kernel picks for ``dst`` (no packet is sent)."""
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        s.connect((dst, 9))
        return s.getsockname()[0]
    except OSError:
        return None
    finally:
        s.close()


def load_factor(most: float) -> float:
    """How much slower than idle this host runs now: 1-minute load per CPU, 1..most."""
    try:
        load = os.getloadavg()[0] / max(1, os.cpu_count() or 1)
    except OSError:
        return 1.0
    return min(most, max(1.0, load))


def mesh(
    src: str,
    peers: list,
    timeout: float,
    max_slowdown: float = 2.0,
    link_up: bool = True,
    echoed: bool = False,
) -> dict:
    """Ping and TCP-connect every peer. A pair that fails is tried once more with timeouts
    2 x this host's slowdown longer (``load_factor``): a busy host answers late, a cut link
    never does. Not retried: a peer that gave no echo where other peers did (the kernel
    answers echoes however busy the host is, so its address is not reachable at all: a cut
    link, a host down), and nothing when this host's own training NIC has no link
    (``link_up`` False: the check fails it for that). Either retry would only wait out the
    longer timeouts: 10 s of a 64-host check with one data link cut, on this lab. ``echoed``:
    a peer of an earlier round echoed (the second round measures only failed pairs, which
    would otherwise all look ICMP-filtered and wait out the long timeouts: 64 lab hosts, one
    data link cut, the check 9.3 -> 21.6 s).

    Not tried at all: a pair with an end whose own training NIC has no link (this host's,
    ``link_up`` False, or a peer's that the controller marks ``"link": false`` from that
    host's facts): nothing passes a NIC without carrier, however loaded the hosts are, and
    the try only waited out the TCP timeout (2 s of every check with a cut data link). The
    pair fails, its ``tcp`` saying which end has no link."""

    def one(peer: dict, ping_t: float, tcp_t: float) -> tuple:
        if not link_up or peer.get("link") is False:
            end = "source" if not link_up else "destination"
            why = f"not tried: the {end}'s NIC has no link"
            return peer["name"], {
                "ping": "not tried",
                "tcp": why,
                "route_src": route_source(peer["addr"]),
            }
        p = Task(ping, src, peer["addr"], ping_t)
        conn = tcp(src, peer["addr"], int(peer["port"]), tcp_t)
        echo = p.result(timeout=ping_t + 10)
        if conn == "ok" and echo != "ok" and not echo.startswith("n/a"):
            # The one echo may have died with a stale neighbour entry (see ``tcp``); now that
            # TCP got through, the peer's address is resolved: a filtered ICMP still fails.
            echo = ping(src, peer["addr"], ping_t)
        return peer["name"], {"ping": echo, "tcp": conn, "route_src": route_source(peer["addr"])}

    def run_all(todo: list, ping_t: float, tcp_t: float) -> None:
        width = min(32, len(todo))
        rounds = -(-len(todo) // width) if todo else 0
        bound = rounds * (2 * ping_t + tcp_t + 10)  # one's worst case: 2 echoes, 1 connect
        for name, res in pmap(lambda p: one(p, ping_t, tcp_t), todo, width, bound):
            results[name] = res

    results: dict = {}
    run_all(peers, 1.0, timeout)
    echoes = echoed or any(r["ping"] == "ok" for r in results.values())  # ICMP gets through
    # "refused" is an answer (nothing listens); a timeout may be this host or the peer busy
    again = [
        p
        for p in peers
        if link_up
        and p.get("link") is not False
        and results[p["name"]]["tcp"] not in ("ok", "refused")
        and not (echoes and results[p["name"]]["ping"] != "ok")
    ]
    if again:
        slow = 2.0 * load_factor(max_slowdown)
        run_all(again, slow, timeout * slow)
        for p in again:
            results[p["name"]]["retried"] = round(slow, 2)
    return {"src": src, "peers": results}


def handoff(stdin: StdinLines, hold: float) -> int:
    """Stay for the launch: run the controller's next line's code (the supervisor's start) in
    this process. The controller sends nothing after it until the code speaks first.

    A line with ``"call": true`` (node 0's port claim before the launch) is run the same way,
    and then the probe waits on for the rest of ``hold``: the claim costs no remote command of
    its own (an srun step is slurmctld round trips). A call that fails says ``N <why>``."""
    deadline = time.monotonic() + hold
    while True:
        line = stdin.readline(max(0.0, deadline - time.monotonic()))
        if not line:
            return 0
        msg = json.loads(line.decode())
        sys.argv[1:] = [str(a) for a in msg["argv"]]
        code = compile(msg["code"], "fleetctl-handoff", "exec")
        if not msg.get("call"):
            exec(code, {"__name__": "__main__", "__builtins__": __builtins__})
            return 0
        try:
            exec(code, {"__name__": "__main__", "__builtins__": __builtins__})
        except SystemExit as e:  # the probe stays for the launch
            if e.code not in (None, 0):
                emit("N", f"call exited {e.code}")
        except Exception as e:
            emit("N", f"call failed: {type(e).__name__}: {e}")
        sys.stdout.flush()


def main() -> int:
    args = json.loads(sys.argv[1] if len(sys.argv) > 1 else "{}")
    hold = float(args.get("hold") or 0)
    facts = gather(args)
    emit("D", facts)
    if not args.get("mesh"):
        return handoff(StdinLines(), hold) if hold > 0 else 0
    nic = facts["nic"]
    if not nic.get("addr"):
        emit("N", nic.get("error") or "no training address")
        return 0
    avoid = {int(p) for p in args.get("avoid_ports") or []}
    sock, port = listen(nic["addr"], int(args["mesh_port"]), int(args.get("mesh_span", 64)), avoid)
    if sock is None:
        emit("N", port)
        return 0
    stop = threading.Event()
    server = threading.Thread(target=serve, args=(sock, stop), daemon=True)
    server.start()
    stdin = StdinLines()
    try:
        emit("R", port)
        line = stdin.readline(float(args.get("peer_wait", 30)))
        if line is None:
            emit("M", {"error": "no peer list from the controller"})
            return 0
        peers = json.loads(line.decode() or "{}").get("peers") or []
        timeout, most = float(args.get("mesh_timeout", 2)), float(args.get("max_slowdown", 2))
        up = nic.get("up") is not False
        first = mesh(nic["addr"], peers, timeout, most, up)
        emit("M", first)
        echoed = any(r["ping"] == "ok" for r in first["peers"].values())
        while True:
            line = stdin.readline(float(args.get("linger", 30)))
            if line is None:  # EOF (or time up): no launch follows
                return 0
            if not line.strip():  # the mesh is over
                break
            # the second round: the pairs that failed, once every host finished the first
            again = json.loads(line.decode()).get("peers") or []
            emit("M", mesh(nic["addr"], again, timeout, most, up, echoed))
        if hold <= 0:
            return 0
    finally:
        stop.set()
        # wakes its accept() now (Linux), not at its next 0.2 s timeout: node 0's port claim
        # comes right after the mesh (no contextlib here: its import is probe CPU)
        try:  # noqa: SIM105
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        server.join(2.0)  # no thread of ours left running under the supervisor
        sock.close()
    return handoff(stdin, hold)


def program() -> None:
    """Run as the node's program, installed (``fleetctl.phases.check.preflight.probe_command``)."""
    sys.exit(main())


if __name__ == "__main__":
    sys.exit(main())
