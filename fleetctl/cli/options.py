"""Click options every fleet command shares: which inventory, which hosts of it.

Usage in a command module::

    @cli.command("check")
    @inventory_option
    @limit_option
    def check_command(inventory: str | None, limit: str | None) -> None:
        selected = load_selected(inventory, limit)   # local_inventory() without -i
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click

from fleetctl.errors import UsageError
from fleetctl.inventory import Inventory, load_inventory, local_inventory

F = TypeVar("F", bound=Callable[..., Any])

inventory_option: Callable[[F], F] = click.option(
    "-i",
    "--inventory",
    "inventory",
    type=click.Path(dir_okay=True, path_type=str),  # existence: load_inventory says file:line
    default=None,
    metavar="FILE",
    help="Ansible inventory (YAML or INI). Default: this machine alone, no SSH.",
)

limit_option: Callable[[F], F] = click.option(
    "--limit",
    "limit",
    default=None,
    metavar="PATTERN",
    help="Select hosts like Ansible: names, groups, globs 'gpu0*', 'a:b', 'a:&b', 'a:!b', '~re'.",
)


def load_selected(inventory: str | None, limit: str | None, group: str = "all") -> Inventory:
    """The inventory a command works on: the file's selection, or this machine without -i."""
    if inventory is None:
        if limit or group != "all":
            option = "--limit" if limit else "--group"
            raise UsageError(
                f"{option} needs an inventory (-i FILE); without one the fleet is "
                "this machine alone"
            )
        return local_inventory()
    return load_inventory(inventory, limit=limit, group=group)
