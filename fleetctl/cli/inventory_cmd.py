"""``fleetctl inventory``: show the nodes an inventory selects, in rank order."""

from __future__ import annotations

import json

import click

from fleetctl.cli import cli, render
from fleetctl.cli.options import inventory_option, limit_option, load_selected


@cli.command("inventory")
@inventory_option
@limit_option
@click.option(
    "--group",
    default="all",
    show_default=True,
    metavar="PATTERN",
    help="Group (Ansible pattern) whose host order gives the node ranks.",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
def inventory_command(inventory: str | None, limit: str | None, group: str, as_json: bool) -> None:
    """List the selected nodes in rank order (node 0 first) with address, NIC and GPUs.

    \b
    Examples:
      fleetctl inventory -i inventories/example.yml
      fleetctl inventory -i hosts.ini --limit 'gpu0*:!gpu03' --json
    """
    inv = load_selected(inventory, limit, group=group)
    if as_json:
        click.echo(json.dumps(inv.as_dict(), indent=2))
    else:
        render.print_inventory(inv)
