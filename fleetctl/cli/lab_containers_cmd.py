"""`fleetctl lab containers …`: a fleet of sshd containers (podman), or the files for one that
``docker compose`` starts (fleetctl/data/compose.yaml). Thin layer over
:mod:`fleetctl.lab.container_fleet`; see docs/lab.md, "A container fleet"."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import click

from fleetctl.lab import container_fleet as cf
from fleetctl.lab import container_image

COMPOSE = Path(__file__).resolve().parents[1] / "data" / "compose.yaml"


@click.group("containers")
def containers_group() -> None:
    """Container fleet: N sshd hosts in podman (or docker compose) on one internal network."""


@containers_group.command("image")
@click.option("--runtime", type=click.Choice(container_image.RUNTIMES), default="podman")
@click.option("--rebuild", is_flag=True, help="Build the tarball and import it again.")
def containers_image(runtime: str, rebuild: bool) -> None:
    """Build (once, from Debian packages) and import the host image; print its tag."""
    click.echo(container_image.ensure_image(runtime, rebuild=rebuild))


@containers_group.command("up")
@click.argument("n", type=click.IntRange(1, 64))
@click.option("--name", default=None, help="Fleet name, 1-8 of [a-z0-9] (default fc + 4 hex).")
@click.option(
    "--dir",
    "dir_",
    default=None,
    help="State directory (default /var/tmp/fleetctl-containers/NAME).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the fleet as JSON.")
def containers_up(n: int, name: str | None, dir_: str | None, as_json: bool) -> None:
    """Start N hosts node1..N (podman) and write their inventory."""
    fleet = cf.ContainerFleet.up(n, name=name, dir=Path(dir_) if dir_ else None)
    if as_json:
        hosts = [{"name": h.name, "addr": h.addr} for h in fleet.hosts]
        doc = {"name": fleet.name, "dir": str(fleet.dir), "network": fleet.network,
               "inventory": str(fleet.inventory_path), "hosts": hosts}  # fmt: skip
        click.echo(json.dumps(doc, indent=1))
        return
    click.echo(f"container fleet {fleet.name}: {n} host(s) on network {fleet.network}")
    for h in fleet.hosts:
        click.echo(f"  {h.name:<7} {h.addr}")
    click.echo(f"inventory: {fleet.inventory_path}")
    click.echo(f"down:      fleetctl lab containers down {fleet.name}")


@containers_group.command("down")
@click.argument("names", nargs=-1)
@click.option("--all", "all_", is_flag=True, help="Every podman container fleet on this machine.")
@click.option("--runtime", type=click.Choice(container_image.RUNTIMES), default="podman")
def containers_down(names: tuple[str, ...], all_: bool, runtime: str) -> None:
    """Remove the fleets' containers and networks, found by label fleetctl.lab=NAME."""
    if all_:
        names = tuple(cf.list_fleets())
    elif not names:
        raise click.UsageError("name a fleet, or --all")
    for name in names:
        removed = cf.remove_by_label(name, runtime)
        shutil.rmtree(cf.BASE / name, ignore_errors=True)
        click.echo(f"container fleet {name}: removed {len(removed)} object(s)")


@containers_group.command("ls")
def containers_ls() -> None:
    """The container fleets on this machine (by label)."""
    for name, labels in sorted(cf.list_fleets().items()):
        click.echo(f"{name}  owner={labels.get(cf.OWNER_LABEL, '?')}  dir={cf.BASE / name}")


@containers_group.command("prepare")
@click.argument("dir_", metavar="DIR")
def containers_prepare(dir_: str) -> None:
    """Write DIR for docker compose: client key, authorized_keys, compose.yaml."""
    d = Path(dir_)
    cf.prepare(d)
    shutil.copyfile(COMPOSE, d / "compose.yaml")
    click.echo(f"prepared {d}; next:")
    click.echo("  fleetctl lab containers image --runtime docker")
    click.echo(f"  cd {d} && docker compose up -d")
    click.echo(f"  fleetctl lab containers inventory {d}")


@containers_group.command("inventory")
@click.argument("dir_", metavar="DIR")
@click.option("--hosts", "count", type=click.IntRange(1, 64), default=3, show_default=True)
@click.option("--python", default="python3", show_default=True, help="fleetctl_python on hosts.")
@click.option("--timeout", type=click.IntRange(1, 600), default=60, show_default=True)
@click.option(
    "--podman", "podman_", is_flag=True,
    help="podman-compose started them: give their network's bridge its gateway address.",
)  # fmt: skip
def containers_inventory(dir_: str, count: int, python: str, timeout: int, podman_: bool) -> None:
    """Wait for COUNT hosts started from DIR and write DIR/known_hosts and DIR/hosts.yml."""
    d = Path(dir_)
    if podman_:
        cf.give_gateway_for([h.addr for h in cf.wait_announced(d, count, timeout)])
    hosts = cf.wait_hosts(d, count, timeout)
    click.echo(f"inventory: {cf.write_inventory(d, hosts, python)}")
