"""``fleetctl check``: preflight every host and every pair of hosts, print the verdict.

Output: a host × check table (✓ / ✗ with the reason), the mesh failures as directed pairs, the
warnings, then a one-line verdict; ``--json`` prints the same as one JSON object on stdout.
Exit status 0 when everything passed, 3 when anything failed. A passing result is cached for a
short time so ``fleetctl run`` right after is instant; ``--recheck`` ignores the cache.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import click

from fleetctl.api.names import BACKENDS, DEFAULT_MASTER_PORT, LAUNCHERS
from fleetctl.cli import cli
from fleetctl.cli.options import (
    Number,
    SSHOptions,
    field_option,
    inventory_option,
    limit_option,
    open_fleet,
    ssh_options,
    sub_options,
    sub_record,
)


@cli.command("check")
@inventory_option
@limit_option
@ssh_options(fanout_help="Hosts connected and checked at once.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as one JSON object.")
@click.option(
    "--master-port",
    type=click.IntRange(1, 65535),
    default=DEFAULT_MASTER_PORT,
    show_default=True,
    help="Port that must be free on node 0; the mesh test listens just above it.",
)
@click.option("--recheck", is_flag=True, help="Ignore a cached result and check again.")
@click.option(
    "--allow-busy-gpus",
    is_flag=True,
    help="GPUs with another job's processes or memory in use are a warning, not a failure.",
)
@click.option(
    "--launcher",
    type=click.Choice(LAUNCHERS),
    default=None,
    help="Check what this launcher needs: its module imports with each node's python, and the "
    "same GPU count everywhere.",
)
@click.option(
    "--backend",
    type=click.Choice(BACKENDS),
    default=None,
    help="nccl: a host without GPUs (no nvidia-smi) is an error.",
)
@click.option(
    "--mesh",
    "mesh",
    type=click.Choice(["auto", "full", "sparse", "off"]),
    default="auto",
    show_default=True,
    help="Which host pairs the mesh tests: every pair (full), each host's ring neighbours plus "
    "3 seeded random peers (sparse), auto = full up to 32 hosts, sparse beyond; off: none.",
)
@click.option(
    "--min-free",
    type=Number(min=0, max=1 << 20),
    default=1.0,
    show_default=True,
    help="GiB that must be free in each host's workdir.",
)
@field_option("probe_timeout")  # RunSpec's, as run's (its hosts group)
@click.option(
    "--dcgm",
    is_flag=True,
    help="Also run DCGM's level-1 diagnostics (dcgmi diag -r 1) where dcgmi is installed "
    "(a minute or two per host).",
)
@sub_options("collective")  # RunSpec's, as run's
def check_command(
    inventory: str | None,
    limit: str | None,
    as_json: bool,
    master_port: int,
    recheck: bool,
    allow_busy_gpus: bool,
    launcher: str | None,
    backend: str | None,
    mesh: str,
    min_free: float,
    probe_timeout: float,
    dcgm: bool,
    ssh: SSHOptions,
    **collective: Any,
) -> None:
    """Check SSH, ping, training NICs, the N×N mesh, GPUs and their health, ports, disk and
    tools on every host.

    GPU and link health: XIDs, ECC, clock throttling, PCIe links, IB ports (docs/health.md);
    a host that fails it is recorded in the health ledger (fleetctl health).

    With --collective, then a torch.distributed benchmark over the training NICs names slow or
    hung hosts and links. Exit status 0 if every check passed, 3 if any failed.
    """
    from fleetctl.cli import render
    from fleetctl.errors import CheckError

    fleet = open_fleet(inventory, limit, ssh)
    report = fleet.check(
        master_port=master_port,
        launcher=launcher,
        backend=backend,
        recheck=recheck,
        allow_busy_gpus=allow_busy_gpus,
        mesh=mesh,
        min_free_gib=min_free,
        probe_timeout=probe_timeout,
        dcgm=dcgm,
        collective=sub_record("collective", collective),
    )
    if as_json:
        sys.stdout.write(json.dumps(report.to_dict(), indent=2) + "\n")
        sys.stdout.flush()
    else:
        render.print_check_report(report)
    if not report.ok:
        raise CheckError(f"check failed: {report.summary()}", report)  # type: ignore[arg-type]
