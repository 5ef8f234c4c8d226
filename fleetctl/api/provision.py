"""``fleetctl provision``: an Ansible playbook run with the inventory, host keys and jump hosts
fleetctl uses, its output handed over as it comes. The command module renders this call."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Playbook:
    """The ``ansible-playbook`` command as fleetctl runs it: ``warnings`` about the inventory
    (per-host settings Ansible reads otherwise), the shell line, and the temporary overlay
    inventory (its path and text) when one is needed."""

    name: str
    hosts: tuple[str, ...]
    warnings: tuple[str, ...]
    command: str
    overlay: Path | None = None
    overlay_text: str | None = None


def provision(
    playbook: str,
    inventory: str | Path,
    *,
    limit: str | None = None,
    ansible_args: Sequence[str] = (),
    known_hosts: str | None = None,
    accept_new: bool = False,
    timeout: float | None = None,
    output: Callable[[bytes], None] | None = None,
    color: bool = False,
    on_plan: Callable[[Playbook], None] | None = None,
    dry_run: bool = False,
) -> Playbook:
    """Run ``playbook`` (a file, or ``bootstrap``/``conda-env``/``gpu-facts``) on the hosts
    ``limit`` selects: ``on_plan`` sees the command first (``dry_run``: only that), then
    ansible-playbook runs with its stdout to ``output`` chunk by chunk (``timeout``: default
    4 h). ProvisionError carries the CLI's exit code (3: a host failed or was unreachable,
    naming them; 2: bad playbook or inventory; 130 interrupted); InventoryError (file:line)
    before Ansible starts."""
    from fleetctl.provision import DEFAULT_TIMEOUT, exit_error, playbook_command, run_playbook
    from fleetctl.transport.connection import SSHSettings

    settings = SSHSettings(known_hosts=known_hosts, accept_new=accept_new)
    with playbook_command(
        playbook, inventory, limit=limit, extra_args=tuple(ansible_args), settings=settings
    ) as cmd:
        plan = Playbook(
            name=cmd.playbook.name,
            hosts=tuple(cmd.hosts),
            warnings=tuple(cmd.warnings),
            command=cmd.display(),
            overlay=cmd.overlay,
            overlay_text=None if cmd.overlay is None else cmd.overlay.read_text(),
        )
        if on_plan is not None:
            on_plan(plan)
        if dry_run:
            return plan
        run = run_playbook(
            cmd, output or (lambda chunk: None), timeout=timeout or DEFAULT_TIMEOUT, color=color
        )
    error = exit_error(run.returncode, run.recap)
    if error is not None:
        raise error
    return plan
