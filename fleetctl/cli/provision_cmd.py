"""``fleetctl provision PLAYBOOK -i hosts.yml [--limit P] [-- ansible-playbook args…]``.

Runs the real ``ansible-playbook`` with the same inventory and host-key settings fleetctl uses
(``fleetctl.api.provision``), its output streamed as it comes. PLAYBOOK is a file or the short
name of a shipped playbook: ``bootstrap``, ``conda-env``, ``gpu-facts``.

Exit status: 0 success; 3 a host failed or was unreachable (the error line names them); 2 bad
playbook, inventory or options (fleetctl's own checks, or Ansible's parser); 130 interrupted;
1 anything else, including ansible-playbook missing from PATH.
"""

from __future__ import annotations

import sys

import click

from fleetctl.cli import cli
from fleetctl.cli.options import Seconds, inventory_option, limit_option


@cli.command(
    "provision",
    context_settings={"ignore_unknown_options": False, "allow_interspersed_args": True},
)
@click.argument("playbook")
@inventory_option
@limit_option
@click.option(
    "--known-hosts",
    type=click.Path(dir_okay=False),
    default=None,
    help="known_hosts file Ansible verifies host keys against (default: as fleetctl's).",
)
@click.option(
    "--accept-new",
    is_flag=True,
    help="Record unknown host keys (ssh's accept-new); changed keys still fail.",
)
@click.option(
    "--timeout",
    type=Seconds(min=0, min_open=True),
    default=None,
    help="Seconds the whole playbook may run (default 4 h).",
)
@click.option(
    "--print-command",
    is_flag=True,
    help="Print the ansible-playbook command instead of running it.",
)
@click.argument("ansible_args", nargs=-1, type=click.UNPROCESSED)
def provision_command(
    playbook: str,
    inventory: str | None,
    limit: str | None,
    known_hosts: str | None,
    accept_new: bool,
    timeout: float | None,
    print_command: bool,
    ansible_args: tuple[str, ...],
) -> None:
    """Run an Ansible PLAYBOOK on the fleet (everything after -- goes to ansible-playbook).

    \b
    Shipped playbooks (short names):
      bootstrap   python3, rsync, private workdir, sshd limits, firewall ports
      conda-env   build + conda-pack the training env on a build host
      gpu-facts   driver/CUDA/NCCL/GPU report from every node (./fleet-facts/)
    \b
    Examples:
      fleetctl provision bootstrap -i hosts.yml
      fleetctl provision gpu-facts -i hosts.yml --limit 'gpu0*'
      fleetctl provision bootstrap -i hosts.yml -- --check --diff -e fleetctl_sshd_manage=false
    """
    from fleetctl.api.provision import Playbook, provision
    from fleetctl.errors import UsageError

    if not inventory:
        raise UsageError("provision needs an inventory: -i hosts.yml")
    out = sys.stdout.buffer

    def write(chunk: bytes) -> None:
        out.write(chunk)
        out.flush()

    def planned(pb: Playbook) -> None:
        for warning in pb.warnings:
            click.echo(f"fleetctl: warning: {warning}", err=True)
        if print_command:
            if pb.overlay is not None:
                click.echo(f"# {pb.overlay} (temporary):\n{pb.overlay_text}", err=True)
            click.echo(pb.command)
            return
        click.echo(f"fleetctl: ansible-playbook {pb.name} on {len(pb.hosts)} host(s)", err=True)

    provision(
        playbook,
        inventory,
        limit=limit,
        ansible_args=ansible_args,
        known_hosts=known_hosts,
        accept_new=accept_new,
        timeout=timeout,
        output=write,
        color=sys.stdout.isatty(),
        on_plan=planned,
        dry_run=print_command,
    )
