"""The SSH connection layer (``fleetctl.transport.ssh``) against real sshd hosts in the lab.

``tests/lab/test_check.py`` covers unknown/changed host keys and a wrong key through
``fleetctl check``; here: ssh_config (alias, User/Port/IdentityFile, ProxyJump with the jump host's
key verified too), ssh-agent, passphrase keys (never a prompt), ``accept_new``, connect timeouts,
a lost link, and what ``run``/``start``/files do on a real server. Every test that could hang runs
under ``within`` (a generous no-hang guard, not a speed assert). The shared lab's files are never
edited; the test that gives a host a new key does it on a private lab.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest

from fleetctl.errors import ConnectError, HostKeyError, RemoteCommandError
from fleetctl.lab import Lab
from fleetctl.node import Node
from fleetctl.ssh.fanout import FanOut
from fleetctl.transport.connection import SSHSettings, connect
from fleetctl.transport.ssh import SSHConnection

pytestmark = pytest.mark.lab

T = TypeVar("T")

# Prints its argv as JSON: what the remote program really received, byte for byte.
ARGV_JSON = ["python3", "-c", "import json, sys; print(json.dumps(sys.argv[1:]))"]


def within(seconds: float, fn: Callable[[], T]) -> T:
    """Run ``fn`` and fail (instead of hanging the suite) if it is still blocked after
    ``seconds``; its exception, if any, is re-raised here."""
    box: dict[str, object] = {}

    def target() -> None:
        try:
            box["value"] = fn()
        except BaseException as e:  # handed to the test thread
            box["error"] = e

    t = threading.Thread(target=target, daemon=True, name="within")
    t.start()
    t.join(seconds)
    assert not t.is_alive(), f"still blocked after {seconds:g}s (a wait without a timeout)"
    if "error" in box:
        raise box["error"]  # type: ignore[misc]
    return box["value"]  # type: ignore[return-value]


def lab_node(lab: Lab, host: str, **kw: object) -> Node:
    """A node as an inventory would give it: address, root, the lab key, the lab's known_hosts."""
    h = lab.host(host)
    base: dict[str, object] = {
        "name": h.name,
        "address": h.mgmt_addr,
        "user": "root",
        "key_file": str(lab.key_path),
        "known_hosts": str(lab.known_hosts),
    }
    base.update(kw)
    return Node(**base)  # type: ignore[arg-type]


def settings(**kw: object) -> SSHSettings:
    kw.setdefault("connect_timeout", 5)
    return SSHSettings(**kw)  # type: ignore[arg-type]


def known_hosts_line(lab: Lab, host: str) -> str:
    addr = lab.host(host).mgmt_addr
    return next(ln for ln in lab.known_hosts.read_text().splitlines() if addr in ln.split()[0])


@pytest.fixture
def conn(lab3: Lab) -> Iterator[SSHConnection]:
    c = connect(lab_node(lab3, "node1"), settings())
    assert isinstance(c, SSHConnection)
    try:
        yield c
    finally:
        c.close()


# ------------------------------------------------------------------------------- ssh_config


def test_ssh_config_alias_supplies_hostname_user_port_and_identity(
    lab3: Lab, tmp_path: Path
) -> None:
    h = lab3.host("node2")
    cfg = tmp_path / "ssh_config"
    block = "  HostName {addr}\n  User {user}\n  Port {port}\n  IdentityFile {key}\n"
    cfg.write_text(
        "Host web\n"
        + block.format(addr=h.mgmt_addr, user="root", port=22, key=lab3.key_path)
        + "Host web-port\n"
        + block.format(addr=h.mgmt_addr, user="root", port=2222, key=lab3.key_path)
        + "Host web-user\n"
        + block.format(addr=h.mgmt_addr, user="nobody", port=22, key=lab3.key_path)
        + "Host web-nokey\n"
        + block.format(addr=h.mgmt_addr, user="root", port=22, key=tmp_path / "absent")
    )
    st = settings(ssh_config=str(cfg), known_hosts=str(lab3.known_hosts), use_agent=False)
    # The node knows only the alias: no address, user, port or key of its own.
    with SSHConnection(Node("web", "web"), st) as c:
        r = c.run("hostname; id -un; echo $SSH_CONNECTION", timeout=10)
    name, user, ssh_conn = r.stdout.splitlines()
    assert (name, user) == ("node2", "root")
    assert ssh_conn.split()[2:] == [h.mgmt_addr, "22"]
    # Each field is really read from the file: change one and the connection fails because of it.
    with pytest.raises(ConnectError, match=rf"refused by {h.mgmt_addr}:2222"):
        SSHConnection(Node("web-port", "web-port"), st)
    with pytest.raises(ConnectError, match=rf"authentication failed for nobody@{h.mgmt_addr}"):
        SSHConnection(Node("web-user", "web-user"), st)
    with pytest.raises(ConnectError, match="authentication failed for root@"):
        SSHConnection(Node("web-nokey", "web-nokey"), st)


def test_missing_identity_files_are_skipped_but_a_missing_inventory_key_is_named(
    lab3: Lab, tmp_path: Path
) -> None:
    h = lab3.host("node2")
    cfg = tmp_path / "ssh_config"
    # Like a typical ~/.ssh/config: several IdentityFile lines, the first one absent here.
    cfg.write_text(
        f"Host web\n  HostName {h.mgmt_addr}\n  User root\n"
        f"  IdentityFile {tmp_path / 'id_absent'}\n  IdentityFile {lab3.key_path}\n"
    )
    st = settings(ssh_config=str(cfg), known_hosts=str(lab3.known_hosts))
    with SSHConnection(Node("web", "web"), st) as c:
        assert c.run(["hostname"], timeout=10).stdout == "node2\n"
    # A key file the inventory names explicitly must exist: say so, not "No such file".
    missing = tmp_path / "id_typo"
    with pytest.raises(ConnectError, match=f"private key file {missing} not found"):
        SSHConnection(lab_node(lab3, "node2", key_file=str(missing)), settings())


def test_users_ssh_config_is_read_by_default_and_hidden_by_the_env_var(
    lab3: Lab, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    addr = lab3.host("node3").mgmt_addr
    (tmp_path / ".ssh").mkdir(mode=0o700)
    (tmp_path / ".ssh" / "config").write_text(
        f"Host {addr}\n  User root\n  IdentityFile {lab3.key_path}\n"
    )
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("FLEETCTL_SSH_CONFIG")
    node = Node("node3", addr)  # no user, no key: both come from ~/.ssh/config
    st = settings(known_hosts=str(lab3.known_hosts))
    assert st.ssh_config_for(node) == str(tmp_path / ".ssh" / "config")
    with SSHConnection(node, st) as c:
        assert c.run(["hostname"], timeout=10).stdout == "node3\n"
    monkeypatch.setenv("FLEETCTL_SSH_CONFIG", "/dev/null")
    with pytest.raises(ConnectError, match="no key to offer"):
        SSHConnection(node, st)


def _jump_config(lab: Lab, path: Path) -> Path:
    j, f = lab.host("node1"), lab.host("node3")
    path.write_text(
        f"Host jump\n  HostName {j.mgmt_addr}\n  User root\n  IdentityFile {lab.key_path}\n"
        f"Host far\n  HostName {f.mgmt_addr}\n  User root\n  IdentityFile {lab.key_path}\n"
        "  ProxyJump jump\n"
    )
    return path


def test_proxyjump_reaches_node3_through_node1(lab3: Lab, tmp_path: Path) -> None:
    cfg = _jump_config(lab3, tmp_path / "ssh_config")
    st = settings(ssh_config=str(cfg), known_hosts=str(lab3.known_hosts))
    c = SSHConnection(Node("far", "far"), st)
    try:
        r = c.run("hostname; echo $SSH_CONNECTION", timeout=10)
        (jump,) = c.jump_clients
        gateway = jump.get_transport()
        assert gateway is not None and gateway.is_active()
        # both hops use AES-GCM (one C call per packet, see transport.tuning.transport_factory)
        assert gateway.local_cipher == "aes128-gcm@openssh.com"
        assert c.client.get_transport().local_cipher == "aes128-gcm@openssh.com"
    finally:
        c.close()
    name, ssh_conn = r.stdout.splitlines()
    assert name == "node3"
    # node3 saw the TCP connection come from node1: the traffic really went through the jump.
    assert ssh_conn.split()[0] == lab3.host("node1").mgmt_addr
    assert not gateway.is_active(), "close() must close the jump host's connection too"


def test_proxyjump_verifies_the_jump_hosts_key_too(lab3: Lab, tmp_path: Path) -> None:
    cfg = _jump_config(lab3, tmp_path / "ssh_config")
    jump_addr = lab3.host("node1").mgmt_addr
    # Only the target's key is known: the jump host's key must not be taken blindly.
    only_far = tmp_path / "only_far"
    only_far.write_text(known_hosts_line(lab3, "node3") + "\n")
    with pytest.raises(HostKeyError) as ei:
        SSHConnection(Node("far", "far"), settings(ssh_config=str(cfg), known_hosts=str(only_far)))
    msg = str(ei.value)
    assert f"jump host {jump_addr}:22 is unknown" in msg
    assert f"ssh-keyscan -p 22 {jump_addr} >> {only_far}" in msg
    # The jump host's address pinned to another host's key: changed, refused with the -R hint.
    wrong = tmp_path / "wrong_jump"
    node2_key = known_hosts_line(lab3, "node2").split(None, 1)[1]
    wrong.write_text(f"{jump_addr} {node2_key}\n" + known_hosts_line(lab3, "node3") + "\n")
    with pytest.raises(HostKeyError) as ei:
        SSHConnection(Node("far", "far"), settings(ssh_config=str(cfg), known_hosts=str(wrong)))
    msg = str(ei.value)
    assert f"jump host {jump_addr}:22 CHANGED" in msg
    assert f"ssh-keygen -f {wrong} -R '{jump_addr}'" in msg


# ------------------------------------------------------------------------ agent, passphrase


@pytest.fixture
def agent(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A real ssh-agent on a private socket, killed by its PID afterwards; SSH_AUTH_SOCK set."""
    sock = str(tmp_path / "agent.sock")
    proc = subprocess.Popen(
        ["ssh-agent", "-D", "-a", sock], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        deadline = time.monotonic() + 10
        while not os.path.exists(sock):
            assert proc.poll() is None, "ssh-agent exited"
            assert time.monotonic() < deadline, "ssh-agent socket never appeared"
            time.sleep(0.02)
        monkeypatch.setenv("SSH_AUTH_SOCK", sock)
        yield sock
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)


def passphrase_key(lab: Lab, tmp_path: Path) -> Path:
    """The lab key (so it is authorized) re-encrypted with a passphrase."""
    key = tmp_path / "id_locked"
    shutil.copyfile(lab.key_path, key)
    key.chmod(0o600)
    subprocess.run(
        ["ssh-keygen", "-q", "-p", "-f", str(key), "-P", "", "-N", "s3cret-pass"],
        check=True,
        capture_output=True,
        timeout=30,
        stdin=subprocess.DEVNULL,
    )
    unlocked = subprocess.run(
        ["ssh-keygen", "-y", "-P", "", "-f", str(key)],
        capture_output=True,
        timeout=30,
        stdin=subprocess.DEVNULL,
    )
    assert unlocked.returncode != 0, "the key must really need its passphrase"
    return key


def test_agent_authenticates_without_a_key_file(lab3: Lab, agent: str, tmp_path: Path) -> None:
    add = subprocess.run(
        ["ssh-add", str(lab3.key_path)],
        capture_output=True,
        text=True,
        timeout=30,
        stdin=subprocess.DEVNULL,
    )
    assert add.returncode == 0, add.stderr
    node = lab_node(lab3, "node2", key_file=None)
    with SSHConnection(node, settings()) as c:
        assert c.run(["hostname"], timeout=10).stdout == "node2\n"
    # A passphrase key on disk is skipped (no prompt) and the agent's copy is used instead.
    locked = passphrase_key(lab3, tmp_path)
    with SSHConnection(lab_node(lab3, "node2", key_file=str(locked)), settings()) as c:
        assert c.run(["hostname"], timeout=10).stdout == "node2\n"
    # The agent is what made it work: without it the same node cannot log in.
    with pytest.raises(ConnectError, match="authentication failed"):
        SSHConnection(node, settings(use_agent=False))


def test_passphrase_key_without_agent_fails_clearly_without_prompting(
    lab3: Lab, tmp_path: Path
) -> None:
    locked = passphrase_key(lab3, tmp_path)
    node = lab_node(lab3, "node2", key_file=str(locked))
    with pytest.raises(ConnectError) as ei:
        within(20, lambda: SSHConnection(node, settings()))
    assert "passphrase" in str(ei.value) and "ssh-agent" in str(ei.value)
    assert "node2" in str(ei.value)


# ------------------------------------------------------------------------------- accept-new


def test_accept_new_records_an_unknown_key_and_still_refuses_a_changed_one(
    make_lab: Callable[..., Lab], tmp_path: Path
) -> None:
    lab = make_lab(1)
    kh = tmp_path / "ssh" / "known_hosts"  # neither the file nor its folder exists yet
    node = lab_node(lab, "node1", known_hosts=None)
    with SSHConnection(node, settings(known_hosts=str(kh), accept_new=True)) as c:
        assert c.run(["hostname"], timeout=10).stdout == "node1\n"
    addr = lab.host("node1").mgmt_addr
    recorded = kh.read_text().splitlines()
    assert recorded == [f"{addr} {known_hosts_line(lab, 'node1').split(None, 1)[1]}"]
    # Recorded means known: strict mode now accepts it, and accept-new adds nothing twice.
    with SSHConnection(node, settings(known_hosts=str(kh))) as c:
        assert c.run(["true"], timeout=10).exit_code == 0
    with SSHConnection(node, settings(known_hosts=str(kh), accept_new=True)):
        pass
    assert kh.read_text().splitlines() == recorded

    # The host is "reinstalled": new host key, same address. accept-new must refuse it.
    host_key = lab.host_dir("node1") / "ssh" / "ssh_host_ed25519_key"
    host_key.unlink()
    host_key.with_suffix(".pub").unlink()
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(host_key)],
        check=True,
        capture_output=True,
        timeout=30,
        stdin=subprocess.DEVNULL,
    )
    lab.kill_sshd("node1")
    lab.start_sshd("node1")
    with pytest.raises(HostKeyError) as ei:
        SSHConnection(node, settings(known_hosts=str(kh), accept_new=True))
    assert f"host key for {addr}:22 CHANGED" in str(ei.value)
    assert f"ssh-keygen -f {kh} -R '{addr}'" in str(ei.value)
    assert kh.read_text().splitlines() == recorded  # the old key is kept, nothing replaced


# ------------------------------------------------------------------------- timeouts, lost link


@pytest.mark.parametrize("timeout", [2, 0.5])
def test_connect_to_a_cut_link_times_out(lab3: Lab, timeout: float) -> None:
    lab3.cut_link("node2")
    node = lab_node(lab3, "node2")
    with pytest.raises(ConnectError) as ei:
        within(timeout + 15, lambda: SSHConnection(node, settings(connect_timeout=timeout)))
    addr = lab3.host("node2").mgmt_addr
    assert f"timed out after {timeout:g}s connecting to {addr}:22" in str(ei.value)


def test_run_on_a_connection_whose_link_is_cut_fails_instead_of_hanging(lab3: Lab) -> None:
    node = lab_node(lab3, "node3")
    with SSHConnection(node, settings(connect_timeout=2)) as c:
        assert c.run(["true"], timeout=10).exit_code == 0
        # The link goes down while a command runs: its exit status never comes back.
        result: dict[str, BaseException] = {}

        def victim() -> None:
            try:
                c.run(["sh", "-c", "sleep 2; echo done"], timeout=3)
            except BaseException as e:
                result["error"] = e

        t = threading.Thread(target=victim, daemon=True)
        t.start()
        time.sleep(0.5)
        lab3.cut_link("node3")
        t.join(3 + 2 + 15)
        assert not t.is_alive(), "run() outlived its timeout on a dead link"
        err = result.get("error")
        assert isinstance(err, (ConnectError, RemoteCommandError)), err
        assert "node3" in str(err)
        # With the link still cut, a new command fails too (no channel opens), within bounds.
        with pytest.raises(ConnectError, match="node3"):
            within(2 + 15, lambda: c.run(["true"], timeout=3))


# ----------------------------------------------------------------------------------- run()


def test_the_session_cipher_is_aes_gcm_from_the_servers_list(conn: SSHConnection) -> None:
    """The real OpenSSH server offers both: we must pick GCM, not paramiko's aes128-ctr + HMAC."""
    t = conn.client.get_transport()
    assert t is not None
    assert (t.local_cipher, t.remote_cipher) == ("aes128-gcm@openssh.com",) * 2


def test_run_passes_argv_literally(conn: SSHConnection) -> None:
    args = [
        "a b",
        "semi;colon",
        "it's",
        'dq"x',
        "$HOME",
        "`id`",
        "$(id)",
        "two\nlines",
        "*",
        "back\\slash",
        "",
        "-n",
        "tab\there",
        "ünïcode",
    ]
    r = conn.run([*ARGV_JSON, *args], timeout=10, check=True)
    assert json.loads(r.stdout) == args
    # A string is a shell command line: the remote shell expands it.
    assert conn.run("echo $HOME", timeout=10).stdout == "/root\n"
    assert conn.run(["echo", "$HOME"], timeout=10).stdout == "$HOME\n"


def test_run_stdin_stdout_stderr_and_exit_code(conn: SSHConnection) -> None:
    data = os.urandom(3 << 20)  # larger than the SSH window: flow control both ways
    r = conn.run(["sh", "-c", "sha256sum; echo to-stderr >&2; exit 7"], timeout=20, stdin=data)
    import hashlib

    assert r.exit_code == 7 and not r.ok
    assert r.stdout.split()[0] == hashlib.sha256(data).hexdigest()
    assert r.stderr == "to-stderr\n"
    # Without stdin the command sees EOF at once (it never waits for input).
    assert conn.run(["cat"], timeout=10).stdout == ""
    with pytest.raises(RemoteCommandError) as ei:
        conn.run("exit 3", timeout=10, check=True)
    assert "node1" in str(ei.value)
    # Killed by a signal: 128+N like a shell (sshd sends exit-signal, no exit-status), not -1.
    assert conn.run("kill -KILL $$", timeout=10).exit_code == 137
    s = conn.start("kill -TERM $$")
    try:
        assert s.exit_code(10) == 143
    finally:
        s.close()


def test_run_timeout_raises_naming_the_node_and_the_connection_survives(
    conn: SSHConnection,
) -> None:
    with pytest.raises(RemoteCommandError) as ei:
        within(15, lambda: conn.run(["sleep", "4"], timeout=1))
    assert "node1" in str(ei.value) and "timed out after 1s" in str(ei.value)
    # stdin that nobody reads fills the SSH window; the timeout still holds (no blocked send).
    with pytest.raises(RemoteCommandError, match="timed out after 1s"):
        within(15, lambda: conn.run(["sleep", "4"], timeout=1, stdin=b"x" * (8 << 20)))
    assert conn.run(["echo", "still", "here"], timeout=10).stdout == "still here\n"


# ------------------------------------------------------------------------------- start()


def test_stream_recv_send_close_stdin_and_exit_code(conn: SSHConnection) -> None:
    s = conn.start(["sh", "-c", "echo ready; read line; echo got:$line; echo err >&2; exit 3"])
    try:
        buf = b""
        while b"ready\n" not in buf:
            chunk = within(15, lambda: s.recv(10))
            assert chunk, f"stream ended early: {buf!r}"
            buf += chunk
        assert s.recv(0.3) is None  # it waits for input: nothing to read yet
        assert s.exit_code(0.1) is None
        s.send(b"hello\n")
        while (chunk := within(15, lambda: s.recv(10))) != b"":
            assert chunk is not None, f"no EOF: {buf!r}"
            buf += chunk
        assert buf == b"ready\ngot:hello\nerr\n"  # stderr merged into the one stream
        assert s.exit_code(10) == 3
    finally:
        s.close()

    s = conn.start(["cat"])
    try:
        s.send(b"one\n")
        s.send(b"two\n")
        s.close_stdin()  # cat ends only when its stdin does
        out = b""
        while (chunk := within(15, lambda: s.recv(10))) != b"":
            assert chunk is not None
            out += chunk
        assert out == b"one\ntwo\n"
        assert s.exit_code(10) == 0
    finally:
        s.close()


# ---------------------------------------------------------------------------------- files


def test_put_get_listdir_home_and_expand(conn: SSHConnection, tmp_path: Path) -> None:
    remote = f"/tmp/fleetctl-conn-{uuid.uuid4().hex[:8]}"
    conn.run(["sh", "-c", 'mkdir -p "$1/sub" && printf abc > "$1/first"', "sh", remote], timeout=10)
    try:
        # get/listdir as the first SFTP use (home not known yet) must not wait on themselves.
        assert within(15, lambda: sorted(conn.listdir(remote))) == [
            ("first", False, 3),
            ("sub", True, 0),
        ]
        within(15, lambda: conn.get(f"{remote}/first", tmp_path / "first"))
        assert (tmp_path / "first").read_bytes() == b"abc"
        with pytest.raises(FileNotFoundError):  # the remote file's own error passes through
            conn.get(f"{remote}/absent", tmp_path / "absent")
        data = os.urandom(300_000)
        local = tmp_path / "blob"
        local.write_bytes(data)
        conn.put(local, f"{remote}/blob", mode=0o640)
        conn.put(local, f"{remote}/blob", mode=0o640)  # replaces in place
        st = conn.run(["stat", "-c", "%a %s", f"{remote}/blob"], timeout=10, check=True)
        assert st.stdout.split() == ["640", str(len(data))]
        conn.get(f"{remote}/blob", tmp_path / "back")
        assert (tmp_path / "back").read_bytes() == data
        # Exactly these entries: no ".part" left behind by the atomic put.
        assert sorted(conn.listdir(remote)) == [
            ("blob", False, len(data)),
            ("first", False, 3),
            ("sub", True, 0),
        ]
    finally:
        conn.run(["rm", "-rf", remote], timeout=10)
    assert conn.home == "/root"
    assert conn.expand("~") == "/root"
    assert conn.expand("~/.fleetctl/x") == "/root/.fleetctl/x"
    assert conn.expand("/abs/~/x") == "/abs/~/x"
    conn.remember_home("/home/elsewhere")
    assert conn.expand("~/w") == "/home/elsewhere/w"


def test_sftp_on_a_cut_link_fails_instead_of_hanging(
    lab3: Lab, monkeypatch: pytest.MonkeyPatch
) -> None:
    import fleetctl.transport.ssh as ssh_mod

    monkeypatch.setattr(ssh_mod, "SFTP_IDLE_TIMEOUT", 1.0)
    with SSHConnection(lab_node(lab3, "node2"), settings(connect_timeout=2)) as c:
        assert c.home == "/root"  # the SFTP session is open
        lab3.cut_link("node2")
        with pytest.raises(ConnectError, match="SFTP listdir /tmp"):
            within(15, lambda: c.listdir("/tmp"))
        # The broken session was dropped: the next call tries a new one, which fails in bounds.
        with pytest.raises(ConnectError, match="node2"):
            within(15, lambda: c.listdir("/tmp"))


# ---------------------------------------------------------------------------------- FanOut


def test_fleet_connect_keeps_every_nodes_outcome(lab3: Lab) -> None:
    nodes = [lab_node(lab3, h.name) for h in lab3.hosts]
    lab3.kill_sshd("node2")
    with FanOut(nodes, settings(connect_timeout=3)) as fleet:
        res = fleet.connect()
        assert list(res) == ["node1", "node2", "node3"]
        assert set(res.succeeded) == {"node1", "node3"}
        err = res.failed["node2"]
        assert isinstance(err, ConnectError)
        assert f"refused by {lab3.host('node2').mgmt_addr}:22" in str(err)
        out = fleet.map(lambda n, c: c.run(["hostname"], timeout=10).stdout.strip(), timeout=20)
        assert out.succeeded == {"node1": "node1", "node3": "node3"}
        assert out["node2"] is err  # the node's connect error, not a second attempt's
        assert [n.name for n in fleet.connected] == ["node1", "node3"]
