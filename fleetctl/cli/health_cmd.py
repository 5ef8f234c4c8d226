"""``fleetctl health``: the health ledger — every host found sick, why, until when — and
``--clear HOST`` / ``--clear-all`` to bring hosts back (docs/health.md)."""

from __future__ import annotations

import json
import shlex

import click

from fleetctl.cli import cli
from fleetctl.cli.options import inventory_option, limit_option, load_selected


@cli.command("health")
@inventory_option
@limit_option
@click.option("--json", "as_json", is_flag=True, help="Print the ledger as one JSON object.")
@click.option("--clear", "clear", multiple=True, metavar="HOST", help="Forget HOST (repeatable).")
@click.option("--clear-all", is_flag=True, help="Forget every host.")
@click.option(
    "--drain",
    is_flag=True,
    help="Inside a Slurm allocation: run the printed scontrol drain line for each host.",
)
def health_command(
    inventory: str | None,
    limit: str | None,
    as_json: bool,
    clear: tuple[str, ...],
    clear_all: bool,
    drain: bool,
) -> None:
    """List the health ledger: the hosts found sick, why, and until when.

    A host is out for 24 h after the check's health gate (or another verdict) found it sick
    ($FLEETCTL_HEALTH_TTL seconds), and until cleared once it was found sick twice within
    72 h. `run --nodes N` leaves such hosts out while there are others.
    """
    from fleetctl.api import health

    if clear_all:
        click.echo(f"health ledger: {health.clear_all()} entry(ies) cleared", err=True)
        return
    if clear:
        had = health.clear(list(clear))
        for host in clear:
            state = "cleared" if host in had else "not in the ledger"
            click.echo(f"{host}: {state}", err=True)
        return
    hosts = None
    if inventory is not None:
        hosts = [n.name for n in load_selected(inventory, limit).nodes]
    held = health.status(hosts)
    if as_json:
        doc = {"hosts": [health.to_dict(s) for s in held]}
        click.echo(json.dumps(doc, indent=2))
    elif not held:
        click.echo("health ledger: no host is out")
    for s in held if not as_json else []:
        click.echo(f"{s.host}: out: {s.why()}")
        for e in s.entries:
            click.echo(f"  {e.source}{f' job {e.job_id}' if e.job_id else ''}: {e.evidence}")
    from fleetctl.api import Fleet

    in_slurm = Fleet.in_slurm() is not None
    for s in held if in_slurm else []:
        click.echo(shlex.join(health.drain_argv(s)), err=as_json)
        if drain:
            health.drain(s)
