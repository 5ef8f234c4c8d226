"""``fleetctl provision``: run a real ``ansible-playbook`` on the fleet fleetctl runs jobs on.

The inventory is the same file (Ansible's own format), and so is the way host keys are checked:
a node whose inventory does not tell Ansible's ssh which known_hosts file to use gets
``-o UserKnownHostsFile=<the file fleetctl uses> -o StrictHostKeyChecking=yes`` (plus
``-F <ssh config>`` when fleetctl is told to use one, e.g. ``FLEETCTL_SSH_CONFIG=/dev/null``), and
``ANSIBLE_HOST_KEY_CHECKING`` is forced on. An unknown or changed key fails the run, never gets
added. ansible-core is an optional extra (``pip install 'fleetctl[ansible]'``): without it
``fleetctl provision`` stops with a one-line error.

Playbooks given by short name (``bootstrap``) are the ones shipped with fleetctl: the canonical
copies live in the repository's ``playbooks/``; ``fleetctl/data/playbooks`` links to them and is
installed as package data, so an installed fleetctl finds them at the same place.

The library builds the command (``playbook_command``) and runs it (``run_playbook``), handing
Ansible's output to a callback as it comes (the CLI writes it through) while keeping the tail
to read the PLAY RECAP: exit code 4 means "hosts unreachable" after a recap and "bad playbook"
without one, and error messages name the failed hosts. It never prints.
"""

from __future__ import annotations

import os
import re
import select
import shlex
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from fleetctl.errors import ProvisionError, UsageError
from fleetctl.node import Node
from fleetctl.plan.inventory import load_inventory
from fleetctl.transport import sshconfig
from fleetctl.transport.connection import SSHSettings

__all__ = [
    "ANSIBLE_EXIT_MEANINGS",
    "DEFAULT_TIMEOUT",
    "PlaybookCommand",
    "PlaybookRun",
    "exit_error",
    "find_ansible_playbook",
    "parse_recap",
    "playbook_command",
    "playbooks_dir",
    "resolve_playbook",
    "run_playbook",
    "shipped_playbooks",
    "ssh_common_args",
]

#: Generous: conda-env.yml builds a CUDA PyTorch env (many GiB). ``--timeout`` overrides.
DEFAULT_TIMEOUT = 4 * 3600.0
#: How long Ansible gets to stop its workers after SIGINT/SIGTERM before it is killed.
STOP_GRACE = 15.0

#: ansible-core's exit codes (ansible.errors.ExitCode; 2 and 4 are bit flags of the run, and 4
#: is also the parser's code) -> (meaning, fleetctl exit code). 4 with a PLAY RECAP means
#: unreachable hosts (exit 3), without one a playbook/inventory error (exit 2).
ANSIBLE_EXIT_MEANINGS: dict[int, tuple[str, int]] = {
    1: ("error", 1),
    2: ("one or more hosts failed", 3),
    4: ("parser error: bad playbook or inventory", 2),
    5: ("bad or incomplete options", 2),
    6: ("hosts failed and hosts unreachable", 3),
    99: ("interrupted", 130),
    250: ("unexpected error", 1),
}
_RECAP = re.compile(
    rb"^(\S+)\s+:\s+ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)", re.M
)
_ANSI = re.compile(rb"\x1b\[[0-9;]*m")
#: Output kept to find the PLAY RECAP (it is at the very end).
TAIL_BYTES = 256 * 1024


def playbooks_dir() -> Path:
    """Where the shipped playbooks are (the package-data link, resolved to the real folder)."""
    return (Path(__file__).parent / "data" / "playbooks").resolve()


def shipped_playbooks() -> list[str]:
    """Short names of the shipped playbooks (``bootstrap``, ``conda-env``, ``gpu-facts``)."""
    d = playbooks_dir()
    return sorted(p.stem for p in d.glob("*.yml")) if d.is_dir() else []


def resolve_playbook(name: str) -> Path:
    """A playbook file: an existing path as given, else a shipped playbook's short name.

    ``bootstrap`` and ``bootstrap.yml`` both mean the shipped one unless a file of that name
    exists in the current folder. UsageError (exit 2) names the shipped ones otherwise.
    """
    given = Path(name).expanduser()
    if given.is_file():
        return given.resolve()
    if "/" not in name:
        stem = name[:-4] if name.endswith((".yml", ".yaml")) else name
        shipped = playbooks_dir() / f"{stem}.yml"
        if shipped.is_file():
            return shipped
    names = ", ".join(shipped_playbooks()) or f"none found in {playbooks_dir()}"
    raise UsageError(f"playbook not found: {name} (shipped playbooks: {names})")


def find_ansible_playbook(environ: Mapping[str, str] | None = None) -> str:
    """The ``ansible-playbook`` on PATH; ProvisionError (exit 1) with the install hint if none."""
    env = os.environ if environ is None else environ
    exe = shutil.which("ansible-playbook", path=env.get("PATH", os.defpath))
    if exe is None:
        raise ProvisionError(
            "ansible-playbook not found on PATH; install ansible-core with "
            "`pip install 'fleetctl[ansible]'` (or your distribution's ansible package)"
        )
    return exe


def _has_option(args: Sequence[str], option: str) -> bool:
    """Whether ssh args already set ``option`` (``-o Name=v``, ``-oName=v``, ``-o Name v``)."""
    want = option.lower()
    for i, a in enumerate(args):
        text = a[2:] if a.startswith("-o") and len(a) > 2 else None
        if a == "-o" and i + 1 < len(args):
            text = args[i + 1]
        if text is not None and text.strip().lower().replace(" ", "=").startswith(want + "="):
            return True
    return False


def ssh_common_args(
    node: Node, settings: SSHSettings, environ: Mapping[str, str] | None = None
) -> tuple[str | None, list[str]]:
    """The ``ansible_ssh_common_args`` this node needs so Ansible checks keys like fleetctl.

    Returns ``(value, warnings)``: ``value`` is None when the inventory's own args already say
    which known_hosts file to use and how strictly (and which ssh config, when fleetctl is told
    one); otherwise the inventory's args followed by what is missing. ssh takes the first value of
    an option, so the inventory's own choices are kept.
    """
    env = os.environ if environ is None else environ
    existing_text = str(node.vars.get("ansible_ssh_common_args") or "")
    try:
        existing = shlex.split(existing_text)
    except ValueError as e:
        raise UsageError(f"host {node.name}: ansible_ssh_common_args cannot be parsed: {e}") from e
    warnings: list[str] = []
    add: list[str] = []
    config = sshconfig.named_path(node, settings, env)
    if config and "-F" not in existing and not any(a.startswith("-F") for a in existing):
        add += ["-F", os.path.expanduser(config)]
    if not _has_option(existing, "UserKnownHostsFile"):
        add += ["-o", f"UserKnownHostsFile={settings.known_hosts_for(node)}"]
    # (an inventory that turns checking off never gets here: loading it is refused)
    if not _has_option(existing, "StrictHostKeyChecking"):
        add += ["-o", "StrictHostKeyChecking=" + ("accept-new" if settings.accept_new else "yes")]
    if not add:
        return None, warnings
    return (shlex.join([*existing, *add]) if existing else shlex.join(add)), warnings


@dataclass
class PlaybookCommand:
    """What ``run_playbook`` executes: ``argv`` with ``env``. ``overlay`` is a temporary
    inventory carrying per-host ssh args when they differ between hosts (removed on exit)."""

    argv: list[str]
    env: dict[str, str]
    playbook: Path
    hosts: tuple[str, ...]
    overlay: Path | None = None
    warnings: list[str] = field(default_factory=list)

    def display(self) -> str:
        """The command as a shell line (for --print-command and error messages)."""
        forced = " ".join(f"{k}={v}" for k, v in FORCED_ENV.items())
        return f"{forced} {shlex.join(self.argv)}"


#: Set for every run, whatever the caller's environment says.
FORCED_ENV = {"ANSIBLE_HOST_KEY_CHECKING": "True", "ANSIBLE_RETRY_FILES_ENABLED": "False"}


@contextmanager
def playbook_command(
    playbook: str,
    inventory: str | Path,
    *,
    limit: str | None = None,
    extra_args: Sequence[str] = (),
    settings: SSHSettings | None = None,
    environ: Mapping[str, str] | None = None,
) -> Iterator[PlaybookCommand]:
    """Build the ``ansible-playbook`` command for ``playbook`` on the inventory's hosts.

    The inventory is read with fleetctl's own reader first (``limit`` applied, same syntax as
    Ansible's, which gets it verbatim), so a bad file or limit fails here with ``file:line``
    before Ansible starts. Temporary files live until the ``with`` block ends.
    """
    env = dict(os.environ if environ is None else environ)
    settings = settings or SSHSettings()
    exe = find_ansible_playbook(env)
    path = resolve_playbook(playbook)
    inv = load_inventory(inventory, limit=limit)
    nodes = [n for n in inv.nodes if not n.local]

    per_host: dict[str, str] = {}
    warnings: list[str] = []
    uniform = True
    for node in nodes:
        value, notes = ssh_common_args(node, settings, env)
        warnings += notes
        if value is not None:
            per_host[node.name] = value
            uniform = uniform and not node.vars.get("ansible_ssh_common_args")

    argv = [exe, "-i", str(inventory)]
    tmp: tempfile.TemporaryDirectory[str] | None = None
    overlay: Path | None = None
    values = set(per_host.values())
    # One shared value for hosts without their own args: a plain flag (inventory vars beat CLI
    # flags in Ansible, so hosts that have their own keep them). Otherwise a per-host overlay.
    if per_host and uniform and len(values) == 1:
        argv += ["--ssh-common-args", values.pop()]
    elif per_host:
        tmp = tempfile.TemporaryDirectory(prefix="fleetctl-provision-")
        overlay = Path(tmp.name) / "ssh-args.yml"
        doc = {"all": {"hosts": {h: {"ansible_ssh_common_args": v} for h, v in per_host.items()}}}
        overlay.write_text(
            "# fleetctl provision: ssh args so Ansible checks host keys like fleetctl\n"
            + yaml.safe_dump(doc, sort_keys=False)
        )
        argv += ["-i", str(overlay)]
    if limit:
        argv += ["--limit", limit]
    argv += [str(path), *extra_args]
    env.update(FORCED_ENV)
    try:
        yield PlaybookCommand(
            argv=argv, env=env, playbook=path, hosts=inv.names, overlay=overlay, warnings=warnings
        )
    finally:
        if tmp is not None:
            tmp.cleanup()


@dataclass(frozen=True)
class PlaybookRun:
    """How a run ended: ansible-playbook's exit status and its PLAY RECAP, per host
    (``{"node1": {"ok": 9, "changed": 0, "unreachable": 0, "failed": 0}}``; empty when none)."""

    returncode: int
    recap: dict[str, dict[str, int]]


def parse_recap(output: bytes) -> dict[str, dict[str, int]]:
    """The last PLAY RECAP in Ansible's output (colour codes ignored)."""
    text = _ANSI.sub(b"", output)
    at = text.rfind(b"PLAY RECAP")
    if at < 0:
        return {}
    keys = ("ok", "changed", "unreachable", "failed")
    return {
        m.group(1).decode("utf-8", "replace"): dict(
            zip(keys, map(int, m.groups()[1:]), strict=True)
        )
        for m in _RECAP.finditer(text, at)
    }


def exit_error(
    returncode: int, recap: dict[str, dict[str, int]] | None = None
) -> ProvisionError | None:
    """The error for how ansible-playbook ended (None for success), with fleetctl's exit code.

    With a recap the message names the hosts that failed or were unreachable.
    """
    if returncode == 0:
        return None
    recap = recap or {}
    if returncode < 0:
        meaning, code = f"killed by signal {-returncode}", 1
    else:
        meaning, code = ANSIBLE_EXIT_MEANINGS.get(returncode, ("error", 1))
    failed = sorted(h for h, r in recap.items() if r["failed"])
    unreachable = sorted(h for h, r in recap.items() if r["unreachable"])
    if returncode in (2, 4, 6) and (failed or unreachable):
        parts = [f"failed on {', '.join(failed)}"] if failed else []
        parts += [f"unreachable: {', '.join(unreachable)}"] if unreachable else []
        meaning, code = "; ".join(parts), 3
    return ProvisionError(
        f"ansible-playbook exited {returncode}: {meaning} (see its output above)",
        exit_code=code,
        returncode=returncode,
    )


def _stop(proc: subprocess.Popen[bytes], first: int) -> None:
    """Ask Ansible to stop (it stops its forks), then kill it if it does not within the grace."""
    for sig in (first, signal.SIGKILL):
        if proc.poll() is not None:
            return
        proc.send_signal(sig)
        try:
            proc.wait(timeout=STOP_GRACE)
            return
        except subprocess.TimeoutExpired:
            continue


def run_playbook(
    cmd: PlaybookCommand,
    on_output: Callable[[bytes], None],
    *,
    timeout: float = DEFAULT_TIMEOUT,
    color: bool = False,
) -> PlaybookRun:
    """Run the command; its stdout goes to ``on_output`` chunk by chunk as it comes (stderr and
    stdin stay this process's). ``color`` keeps Ansible's colours although stdout is a pipe.

    Ctrl-C reaches Ansible directly (same process group); this waits for it to stop and then
    re-raises KeyboardInterrupt. Past ``timeout`` Ansible is stopped and ProvisionError raised.
    """
    env = dict(cmd.env)
    if color:
        env.setdefault("ANSIBLE_FORCE_COLOR", "1")
    try:
        proc = subprocess.Popen(cmd.argv, env=env, stdout=subprocess.PIPE)
    except OSError as e:
        raise ProvisionError(f"cannot start {cmd.argv[0]}: {e.strerror or e}") from e
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    tail = bytearray()
    try:
        fd = proc.stdout.fileno()
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                _stop(proc, signal.SIGTERM)
                raise ProvisionError(
                    f"ansible-playbook still running after {timeout:g}s; stopped it (see --timeout)"
                )
            ready, _, _ = select.select([fd], [], [], min(left, 1.0))
            if not ready:
                continue
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            on_output(chunk)
            tail += chunk
            del tail[:-TAIL_BYTES]
        returncode = proc.wait(timeout=max(deadline - time.monotonic(), STOP_GRACE))
    except KeyboardInterrupt:
        _stop(proc, signal.SIGINT)
        raise
    except subprocess.TimeoutExpired as e:
        _stop(proc, signal.SIGTERM)
        raise ProvisionError("ansible-playbook closed its output but did not exit") from e
    finally:
        proc.stdout.close()
    return PlaybookRun(returncode, parse_recap(bytes(tail)))
