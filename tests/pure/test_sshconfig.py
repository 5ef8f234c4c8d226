"""The one ssh_config resolver (``fleetctl.transport.sshconfig``) as a golden table, checked against
OpenSSH's own resolver (``ssh -G``, offline), and its users: the rsync argv and the ping."""

from __future__ import annotations

import getpass
import shutil
import subprocess
from pathlib import Path

import pytest

from fleetctl.errors import SSHConfigError
from fleetctl.node import Node
from fleetctl.transport import sshconfig
from fleetctl.transport.connection import SSHSettings
from fleetctl.transport.openssh import ssh_argv

CONFIG = """\
Host gpu01
  HostName 10.1.0.1
  User train
  Port 2201
  IdentityFile /keys/gpu01
  IdentityFile /keys/shared

Host gpu*
  HostName %h.cluster.example
  User ops
  Port 2200

Host far
  HostName 10.2.0.9
  ProxyJump bastion

Host piped
  ProxyCommand nc %h %p

Host *
  User everyone
  IdentityFile /keys/default
"""

ME = getpass.getuser()

# (node fields) -> (hostname, port, user, identity files, proxy_jump)
CASES: list[tuple[dict, tuple[str, int, str, tuple[str, ...], str | None]]] = [
    (
        {"address": "gpu01"},
        ("10.1.0.1", 2201, "train", ("/keys/gpu01", "/keys/shared", "/keys/default"), None),
    ),
    # first match wins per option: gpu* and * only add what gpu01 left unset
    ({"address": "gpu07"}, ("gpu07.cluster.example", 2200, "ops", ("/keys/default",), None)),
    # the inventory's user, key and non-22 port win; its key comes first
    (
        {"address": "gpu07", "user": "me", "port": 2222, "key_file": "INV_KEY"},
        ("gpu07.cluster.example", 2222, "me", ("INV_KEY", "/keys/default"), None),
    ),
    # port 22 cannot be told from "not set": ssh_config's Port applies (as in fabric)
    (
        {"address": "gpu07", "port": 22},
        ("gpu07.cluster.example", 2200, "ops", ("/keys/default",), None),
    ),
    ({"address": "far"}, ("10.2.0.9", 22, "everyone", ("/keys/default",), "bastion")),
    ({"address": "10.9.9.9"}, ("10.9.9.9", 22, "everyone", ("/keys/default",), None)),
]


def _config(tmp_path: Path, text: str = CONFIG) -> Path:
    path = tmp_path / "ssh_config"
    path.write_text(text)
    return path


def _case(tmp_path: Path, fields: dict, want: tuple) -> tuple[Node, tuple]:
    """The case with INV_KEY as a real file (OpenSSH drops ``-i`` files that do not exist)."""
    key = tmp_path / "inv_key"
    key.touch()
    fields = {k: str(key) if v == "INV_KEY" else v for k, v in fields.items()}
    keys = tuple(str(key) if k == "INV_KEY" else k for k in want[3])
    return Node(name=fields["address"], **fields), (*want[:3], keys, want[4])


@pytest.mark.parametrize(("fields", "want"), CASES, ids=[str(c[0]) for c in CASES])
def test_resolver_answers_like_the_golden_table(tmp_path: Path, fields: dict, want: tuple) -> None:
    path = _config(tmp_path)
    node, want = _case(tmp_path, fields, want)
    t = sshconfig.resolve(node, SSHSettings(ssh_config=str(path)))
    assert (t.hostname, t.port, t.user, t.identity_files, t.proxy_jump) == want
    assert t.config == str(path) and t.alias == fields["address"]


@pytest.mark.skipif(shutil.which("ssh") is None, reason="no OpenSSH client to compare with")
@pytest.mark.parametrize(("fields", "want"), CASES, ids=[str(c[0]) for c in CASES])
def test_resolver_agrees_with_openssh_ssh_dash_g(tmp_path: Path, fields: dict, want: tuple) -> None:
    node, want = _case(tmp_path, fields, want)
    argv = ["ssh", "-G", "-F", str(_config(tmp_path))]
    if node.port != 22:
        argv += ["-p", str(node.port)]
    if node.user:
        argv += ["-l", node.user]
    if node.key_file:
        argv += ["-i", node.key_file]
    out = subprocess.run(
        [*argv, node.address], capture_output=True, text=True, timeout=30, check=True
    ).stdout
    g: dict[str, list[str]] = {}
    for line in out.splitlines():
        key, _, value = line.partition(" ")
        g.setdefault(key, []).append(value)
    hostname, port, user, keys, jump = want
    assert g["hostname"] == [hostname]
    assert g["port"] == [str(port)]
    assert g["user"] == [user]
    assert tuple(g["identityfile"]) == keys
    assert g.get("proxyjump") == ([jump] if jump else None)


def test_proxy_command_means_proxied_and_no_config_means_the_node_as_written() -> None:
    t = sshconfig.resolve(Node("n", "10.0.0.5", port=2022), SSHSettings(ssh_config="/dev/null"))
    assert (t.hostname, t.port, t.user, t.identity_files, t.config) == (
        "10.0.0.5",
        2022,
        ME,
        (),
        None,
    )
    assert not t.proxied


def test_a_proxycommand_host_is_proxied(tmp_path: Path) -> None:
    st = SSHSettings(ssh_config=str(_config(tmp_path)))
    t = sshconfig.resolve(Node("piped", "piped"), st)
    assert t.proxied and t.proxy_command == "nc piped 22"


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("Host a\n  HostName\n", "Unparsable line"),
        ("Host a\n  Port twenty\n", "Port 'twenty' is not a number"),
    ],
)
def test_a_broken_ssh_config_is_an_error_naming_the_file(
    tmp_path: Path, text: str, why: str
) -> None:
    path = _config(tmp_path, text)
    with pytest.raises(SSHConfigError) as ei:
        sshconfig.resolve(Node("a", "a"), SSHSettings(ssh_config=str(path)))
    assert ei.value.one_line().startswith(f"a: cannot use ssh_config {path}: ")
    assert why in ei.value.one_line()


def test_a_named_ssh_config_that_does_not_exist_is_an_error(tmp_path: Path) -> None:
    missing = tmp_path / "nope"
    with pytest.raises(SSHConfigError, match=f"cannot use ssh_config {missing}: No such file"):
        sshconfig.resolve(Node("a", "a"), SSHSettings(ssh_config=str(missing)))


def test_an_edited_ssh_config_is_read_again(tmp_path: Path) -> None:
    path = _config(tmp_path, "Host a\n  Port 2001\n")
    st = SSHSettings(ssh_config=str(path))
    assert sshconfig.resolve(Node("a", "a"), st).port == 2001
    path.write_text("Host a\n  Port 2002\n\n")  # another size: a new version even within 1 ns
    assert sshconfig.resolve(Node("a", "a"), st).port == 2002


def test_rsyncs_openssh_gets_the_same_file_port_and_user_the_connection_resolved(
    tmp_path: Path,
) -> None:
    path = _config(tmp_path)
    argv = ssh_argv(Node("gpu07", "gpu07"), SSHSettings(ssh_config=str(path)))
    assert argv[1:3] == ["-F", str(path)]
    # OpenSSH would pick Port 2200 from the file itself; -p 22 would have overridden it
    assert argv[-4:] == ["-p", "2200", "-l", "ops"]


def test_the_ping_dials_the_resolved_address_and_skips_jump_hosts(tmp_path: Path) -> None:
    from fleetctl.phases.check.preflight import PingResult, ping_host

    path = tmp_path / "ssh_config"
    path.write_text("Host viajump\n  ProxyJump bastion\nHost badname\n  HostName bad..name\n")
    st = SSHSettings(ssh_config=str(path))
    assert ping_host(Node("v", "viajump"), st) == PingResult("skip", "behind a jump host")
    assert ping_host(Node("b", "badname"), st).state == "unresolved"
    path.write_text("Host x\n  HostName\n")
    with pytest.raises(SSHConfigError):
        ping_host(Node("b", "badname"), st)


RACE = """
import sys, threading
from fleetctl.errors import ConnectError
from fleetctl.node import Node
from fleetctl.transport import sshconfig
from fleetctl.transport.connection import SSHSettings
from fleetctl.transport.ssh import SSHConnection
st = SSHSettings(ssh_config="/dev/null", connect_timeout=2, known_hosts="/dev/null")
errs = []
def ping():
    try:
        sshconfig.resolve(Node("a", "127.0.0.1"), st)
    except Exception as e:
        errs.append(repr(e))
def conn():
    try:
        SSHConnection(Node("b", "127.0.0.1", port=1), st)  # refused: nothing listens on 1
    except ConnectError:
        pass
    except Exception as e:
        errs.append(repr(e))
ts = [threading.Thread(target=f) for f in (ping, conn) * 4]
[t.start() for t in ts]
[t.join(30) for t in ts]
print(errs[:1])
"""


def test_pings_and_connects_racing_in_a_fresh_process_import_paramiko_cleanly() -> None:
    """Without the import lock, about half of such starts fail inside paramiko's circular
    imports ("partially initialized module"): `fleetctl check` starts exactly like this."""
    import sys

    for _ in range(3):
        p = subprocess.run([sys.executable, "-c", RACE], capture_output=True, text=True, timeout=60)
        assert p.returncode == 0, p.stderr
        assert p.stdout.strip() == "[]"


def _after_ssh_stack(code: str) -> list[str]:
    """stdout words of ``code`` run by a fresh interpreter once fleetctl loaded paramiko."""
    import subprocess
    import sys

    head = "import sys\nfrom fleetctl.transport import sshconfig\nsshconfig.import_ssh_stack()\n"
    out = subprocess.run(
        [sys.executable, "-c", head + code], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr  # its traceback, not only "non-zero exit status"
    return out.stdout.split()


def test_paramiko_loads_without_invoke_and_match_exec_still_runs() -> None:
    """paramiko.config imports invoke for ``Match exec`` alone (~50 ms per command): fleetctl
    holds it back and hands it over lazily, so such a block still runs its command."""
    code = (
        "before = 'invoke' in sys.modules\n"
        "import paramiko\n"
        "cfg = paramiko.SSHConfig.from_text("
        "'Match exec \"test -n x\"\\n  User viaexec\\nMatch exec false\\n  Port 2\\n')\n"
        "print(before, cfg.lookup('h').get('user'), cfg.lookup('h').get('port'))\n"
    )
    assert _after_ssh_stack(code) == ["False", "viaexec", "None"]


def test_paramiko_learns_its_version_without_importlib_metadata() -> None:
    """paramiko's __init__ asks importlib.metadata for its version (~15 ms per command): it gets
    the same answer from its own dist-info, and the real module is untouched for others."""
    code = (
        "import paramiko\n"
        "loaded = 'importlib.metadata' in sys.modules\n"
        "from importlib import metadata\n"
        "print(loaded, paramiko.__version__ == metadata.version('paramiko'),\n"
        "      type(metadata).__name__, metadata.version('pyyaml') != '')\n"
    )
    assert _after_ssh_stack(code) == ["False", "True", "module", "True"]
