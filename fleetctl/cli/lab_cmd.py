"""`fleetctl lab …`: real SSH hosts in network namespaces on this machine (needs root).

Thin layer over :mod:`fleetctl.lab`; errors propagate to ``fleetctl.cli.main`` (LabError exits 1,
bad arguments exit 2).
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Callable
from typing import Any

import click

from fleetctl.cli import cli
from fleetctl.cli.options import Number
from fleetctl.errors import LabError
from fleetctl.lab import Lab

_NET = click.Choice(["mgmt", "data"])


def _pick(dir: str | None, name: str | None) -> Lab:
    return Lab.find(dir=dir, name=name)


def _where(lab: Lab) -> str:
    return f"--name {lab.name}" if lab.dir.parent.name == "fleetctl-lab" else f"--dir {lab.dir}"


def _print_status(st: dict[str, Any]) -> None:
    data = st.get("data")
    nets = f"mgmt {st['mgmt']['subnet']} on {st['mgmt']['bridge']}"
    if data:
        nets += f", data {data['subnet']} on {data['bridge']}"
    click.echo(f"lab {st['name']} ({st['phase']}): {nets}")
    click.echo(f"  dir {st['dir']}")
    for h in st["hosts"]:
        if h["init_pid"] is None:
            state = "down"
        elif h["sshd_pid"] is None:
            state = "sshd stopped"
        elif h["ssh_ok"] is False:
            state = "unreachable"
        else:
            state = "ok"
        data_part = f"  {h['nic'] + ' ' + h['data_addr']:<18}" if h["data_addr"] else ""
        gpus = f"  gpus {h['gpus']}" if h["gpus"] else ""
        click.echo(f"  {h['name']:<7} {h['mgmt_addr']:<15}{data_part}{gpus}  [{state}]")
    for f in st["faults"]:
        extra = ", ".join(f"{k}={v}" for k, v in f.items() if k not in ("kind", "host"))
        click.echo(f"  fault: {f['kind']} on {f['host']}" + (f" ({extra})" if extra else ""))


@cli.group("lab")
def lab_group() -> None:
    """Namespace lab: N real sshd hosts on this machine, for trying and testing fleetctl."""


@lab_group.command("up")
@click.argument("n", type=click.IntRange(1, 200))
@click.option(
    "--dir",
    "dir_",
    type=click.Path(file_okay=False),
    default=None,
    help="State directory (default /var/tmp/fleetctl-lab/NAME; not under /tmp).",
)
@click.option(
    "--networks",
    type=click.IntRange(1, 2),
    default=1,
    show_default=True,
    help="2 adds a data network (NIC data0, ib0 on the last host).",
)
@click.option(
    "--gpus",
    type=click.IntRange(0, 64),
    default=0,
    show_default=True,
    help="Fake nvidia-smi reporting K GPUs on each host.",
)
@click.option("--name", default=None, help="Lab name, 1-8 of [a-z0-9] (default fl + 4 hex).")
@click.option(
    "--subnet",
    default=None,
    help="Management subnet (private CIDR); the data network is the next block.",
)
@click.option(
    "--machine-bashrc",
    is_flag=True,
    help="Keep this machine's ~/.bashrc on the hosts (default: a minimal one).",
)
@click.option(
    "--user",
    default=None,
    metavar="NAME",
    help="Log in as this non-root user (created if missing, removed by `lab down` then); "
    "root's home is hidden on the hosts.",
)
@click.option(
    "--shared-home",
    is_flag=True,
    help="With --user: one home directory shared by every host, as on an NFS home.",
)
@click.option(
    "--slurm",
    is_flag=True,
    help="Also start a real Slurm: munged + slurmctld here, one slurmd per host "
    "(needs slurm-wlm and munge; see docs/slurm.md).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the lab status as JSON.")
def lab_up(
    n: int,
    dir_: str | None,
    networks: int,
    gpus: int,
    name: str | None,
    subnet: str | None,
    machine_bashrc: bool,
    user: str | None,
    shared_home: bool,
    slurm: bool,
    as_json: bool,
) -> None:
    """Start N hosts (node1..nodeN), each with its own sshd, and write DIR/hosts.yml."""
    lab = Lab.up(
        n,
        dir=dir_,
        networks=networks,
        gpus=gpus,
        name=name,
        subnet=subnet,
        machine_bashrc=machine_bashrc,
        user=user,
        shared_home=shared_home,
    )
    slurm_conf = None
    if slurm:
        from fleetctl.lab.slurm import SlurmLab

        try:
            slurm_conf = SlurmLab.start(lab).conf
        except BaseException:
            lab.down()
            raise
    st = lab.status(probe=False)
    if as_json:
        click.echo(json.dumps(st, indent=2))
        return
    click.echo(
        f"lab {lab.name} up: {n} host{'s' if n != 1 else ''} in "
        f"{lab.state.get('up_seconds', 0):.2f} s"
    )
    _print_status(lab.status(probe=False))
    click.echo(f"  inventory  {lab.inventory_path}")
    click.echo(f"  ssh        ssh -F {lab.ssh_config} node1")
    if slurm_conf is not None:
        click.echo(f"  slurm      export SLURM_CONF={slurm_conf}; salloc -N {n}")
    click.echo(f"  tear down  fleetctl lab down {_where(lab)}")


@lab_group.command("status")
@click.option("--dir", "dir_", default=None, help="Lab state directory.")
@click.option("--name", default=None, help="Lab name.")
@click.option("--all", "all_", is_flag=True, help="Every lab on this machine.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def lab_status(dir_: str | None, name: str | None, all_: bool, as_json: bool) -> None:
    """Show hosts, addresses, whether each sshd answers, and active faults."""
    labs = Lab.running() if all_ else [_pick(dir_, name)]
    states = [lab.status(probe=True) for lab in labs]
    if as_json:
        click.echo(json.dumps(states if all_ else states[0], indent=2))
        return
    if not states:
        click.echo("no lab is running")
    for st in states:
        _print_status(st)


def _progress(what: str) -> Callable[[str], None]:
    """Each step of a long lab operation on stderr, with the seconds since it began."""
    t0 = time.monotonic()

    def say(step: str) -> None:
        click.echo(f"fleetctl: {what}: {step} ({time.monotonic() - t0:.1f} s)", err=True)

    return say


@lab_group.command("down")
@click.option("--dir", "dir_", default=None, help="Lab state directory.")
@click.option("--name", default=None, help="Lab name.")
@click.option("--all", "all_", is_flag=True, help="Tear down every lab on this machine.")
@click.option("--keep-dir", is_flag=True, help="Keep DIR (logs, keys) after teardown.")
def lab_down(dir_: str | None, name: str | None, all_: bool, keep_dir: bool) -> None:
    """Stop the lab's processes; remove its namespaces, links, bridges and files. Idempotent."""
    if all_:
        labs = Lab.running()
    else:
        try:
            labs = [_pick(dir_, name)]
        except LabError as e:
            if "no lab" in str(e):  # nothing to do is success: `down` is idempotent
                click.echo(f"nothing to tear down ({e.one_line()})")
                return
            raise
    for lab in labs:
        removed = lab.down(keep_dir=keep_dir, progress=_progress(f"lab {lab.name}"))
        click.echo(
            f"lab {lab.name} down"
            + (f" (removed {len(removed)} items)" if removed else " (already down)")
        )


@lab_group.command("ssh", context_settings={"ignore_unknown_options": True})
@click.option("--dir", "dir_", default=None, help="Lab state directory.")
@click.option("--name", default=None, help="Lab name.")
@click.argument("host")
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def lab_ssh(dir_: str | None, name: str | None, host: str, command: tuple[str, ...]) -> None:
    """Open an OpenSSH session to HOST with the lab's key and pinned host keys."""
    lab = _pick(dir_, name)
    lab.host(host)
    ssh = shutil.which("ssh")
    if ssh is None:
        raise LabError("ssh not found (install openssh-client)")
    os.execv(ssh, ["ssh", "-F", str(lab.ssh_config), host, *command])


@lab_group.group("fault")
@click.option("--dir", "dir_", default=None, help="Lab state directory.")
@click.option("--name", default=None, help="Lab name.")
@click.pass_context
def lab_fault(ctx: click.Context, dir_: str | None, name: str | None) -> None:
    """Inject or undo a fault on one lab host."""
    ctx.ensure_object(dict)
    ctx.obj["lab_where"] = (dir_, name)


def _lab(ctx: click.Context) -> Lab:
    return _pick(*ctx.obj["lab_where"])


def _done(msg: str) -> None:
    click.echo(msg)


@lab_fault.command("cut")
@click.argument("host")
@click.option("--net", "network", type=_NET, default="mgmt", show_default=True)
@click.pass_context
def fault_cut(ctx: click.Context, host: str, network: str) -> None:
    """Unplug HOST's link on a network."""
    _lab(ctx).cut_link(host, network)
    _done(f"{host}: {network} link cut")


@lab_fault.command("heal")
@click.argument("host")
@click.option("--net", "network", type=_NET, default="mgmt", show_default=True)
@click.pass_context
def fault_heal(ctx: click.Context, host: str, network: str) -> None:
    """Plug HOST's link back in."""
    _lab(ctx).heal_link(host, network)
    _done(f"{host}: {network} link up")


@lab_fault.command("kill-sshd")
@click.argument("host")
@click.pass_context
def fault_kill_sshd(ctx: click.Context, host: str) -> None:
    """Kill HOST's sshd listener (SIGKILL); open sessions survive."""
    pid = _lab(ctx).kill_sshd(host)
    _done(f"{host}: sshd (pid {pid}) killed")


@lab_fault.command("start-sshd")
@click.argument("host")
@click.pass_context
def fault_start_sshd(ctx: click.Context, host: str) -> None:
    """Start HOST's sshd again and wait for its banner."""
    _lab(ctx).start_sshd(host)
    _done(f"{host}: sshd running")


@lab_fault.command("netem")
@click.argument("host")
@click.option("--delay", "delay_ms", type=Number(0, 600_000), default=0.0, help="ms each way")
@click.option("--jitter", "jitter_ms", type=Number(0, 600_000), default=0.0, help="ms")
@click.option("--loss", "loss_pct", type=Number(0, 100), default=0.0, help="percent")
@click.option("--net", "network", type=_NET, default="mgmt", show_default=True)
@click.pass_context
def fault_netem(
    ctx: click.Context, host: str, delay_ms: float, jitter_ms: float, loss_pct: float, network: str
) -> None:
    """Add delay/jitter/loss on HOST's link, both directions (tc netem)."""
    _lab(ctx).netem(host, network, delay_ms=delay_ms, jitter_ms=jitter_ms, loss_pct=loss_pct)
    _done(f"{host}: {network} netem delay {delay_ms:g}ms jitter {jitter_ms:g}ms loss {loss_pct:g}%")


@lab_fault.command("clear-netem")
@click.argument("host")
@click.option("--net", "network", type=_NET, default="mgmt", show_default=True)
@click.pass_context
def fault_clear_netem(ctx: click.Context, host: str, network: str) -> None:
    """Remove delay/loss from HOST's link."""
    _lab(ctx).clear_netem(host, network)
    _done(f"{host}: {network} netem cleared")


@lab_fault.command("slow")
@click.argument("host")
@click.option("--rate", default="50mbit", show_default=True, help="tc rate, e.g. 50mbit, 1gbit.")
@click.option("--net", "network", type=_NET, default="data", show_default=True)
@click.pass_context
def fault_slow(ctx: click.Context, host: str, rate: str, network: str) -> None:
    """Throttle traffic into HOST on a network (tc tbf): a NIC that negotiated a low speed."""
    _lab(ctx).slow_link(host, network, rate)
    _done(f"{host}: {network} link throttled to {rate}")


@lab_fault.command("clear")
@click.argument("host")
@click.option("--net", "network", type=_NET, default="data", show_default=True)
@click.pass_context
def fault_clear(ctx: click.Context, host: str, network: str) -> None:
    """Undo ``slow`` on HOST's link."""
    _lab(ctx).clear_slow(host, network)
    _done(f"{host}: {network} link at full speed")


@lab_fault.command("cpu-cap")
@click.argument("host")
@click.option(
    "--percent", type=Number(1, 100), default=20.0, show_default=True, help="% of one CPU."
)
@click.pass_context
def fault_cpu_cap(ctx: click.Context, host: str, percent: float) -> None:
    """Hold every process of HOST to a share of one CPU (its own cpu cgroup)."""
    _lab(ctx).cpu_cap(host, percent)
    _done(f"{host}: capped at {percent:g}% of one CPU")


@lab_fault.command("clear-cpu-cap")
@click.argument("host")
@click.pass_context
def fault_clear_cpu_cap(ctx: click.Context, host: str) -> None:
    """Undo ``cpu-cap`` on HOST."""
    _lab(ctx).clear_cpu_cap(host)
    _done(f"{host}: cpu cap cleared")


@lab_fault.command("disk-full")
@click.argument("host")
@click.option(
    "--path",
    default="/root/.fleetctl",
    show_default=True,
    help="Directory on the host to cover with a tiny tmpfs.",
)
@click.option("--size", default="1m", show_default=True, help="tmpfs size (e.g. 512k, 1m).")
@click.pass_context
def fault_disk_full(ctx: click.Context, host: str, path: str, size: str) -> None:
    """Make PATH on HOST (nearly) full: a tiny tmpfs covers it until disk-ok."""
    _lab(ctx).disk_full(host, path, size)
    _done(f"{host}: {path} is now a {size} tmpfs")


@lab_fault.command("disk-ok")
@click.argument("host")
@click.option("--path", default="/root/.fleetctl", show_default=True)
@click.pass_context
def fault_disk_ok(ctx: click.Context, host: str, path: str) -> None:
    """Undo disk-full on HOST."""
    _lab(ctx).disk_ok(host, path)
    _done(f"{host}: {path} back to normal")


@lab_fault.command("crash")
@click.argument("host")
@click.pass_context
def fault_crash(ctx: click.Context, host: str) -> None:
    """Crash HOST: kill its PID 1, and with it every process on the host."""
    _lab(ctx).crash_host(host)
    _done(f"{host}: crashed")


@lab_fault.command("boot")
@click.argument("host")
@click.pass_context
def fault_boot(ctx: click.Context, host: str) -> None:
    """Boot a crashed HOST again (same disk area and keys)."""
    _lab(ctx).boot_host(host)
    _done(f"{host}: booted")


@lab_fault.command("gpus")
@click.argument("host")
@click.argument("count", type=click.IntRange(0, 64))
@click.pass_context
def fault_gpus(ctx: click.Context, host: str, count: int) -> None:
    """Make HOST's fake nvidia-smi report COUNT GPUs."""
    _lab(ctx).set_gpus(host, count)
    _done(f"{host}: nvidia-smi now reports {count} GPU(s)")


@lab_fault.command("gpu-xid")
@click.argument("host")
@click.option("--gpu", type=click.IntRange(0, 63), default=0, show_default=True)
@click.option("--xid", type=click.IntRange(1, 999), default=79, show_default=True)
@click.pass_context
def fault_gpu_xid(ctx: click.Context, host: str, gpu: int, xid: int) -> None:
    """An NVRM Xid line for one of HOST's fake GPUs in its kernel log (79: off the bus)."""
    _done(f"{host}: " + _lab(ctx).health_fault(host, "gpu-xid", gpu=gpu, xid=xid))


@lab_fault.command("ecc")
@click.argument("host")
@click.option("--gpu", type=click.IntRange(0, 63), default=0, show_default=True)
@click.option("--count", type=click.IntRange(1, 1 << 20), default=1, show_default=True)
@click.pass_context
def fault_ecc(ctx: click.Context, host: str, gpu: int, count: int) -> None:
    """Uncorrectable ECC errors on one of HOST's fake GPUs (nvidia-smi -q -x)."""
    _done(f"{host}: " + _lab(ctx).health_fault(host, "ecc", gpu=gpu, count=count))


@lab_fault.command("throttle")
@click.argument("host")
@click.option("--gpu", type=click.IntRange(0, 63), default=0, show_default=True)
@click.option(
    "--reason",
    type=click.Choice(
        ["hw_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown", "sw_thermal_slowdown"]
    ),
    default="hw_slowdown",
    show_default=True,
)
@click.pass_context
def fault_throttle(ctx: click.Context, host: str, gpu: int, reason: str) -> None:
    """A clock throttle reason active on one of HOST's fake GPUs."""
    _done(f"{host}: " + _lab(ctx).health_fault(host, "throttle", gpu=gpu, reason=reason))


@lab_fault.command("ib-flap")
@click.argument("host")
@click.option("--count", type=click.IntRange(1, 1000), default=1, show_default=True)
@click.pass_context
def fault_ib_flap(ctx: click.Context, host: str, count: int) -> None:
    """HOST's fake IB port went down and up COUNT times (link_downed moves)."""
    _done(f"{host}: " + _lab(ctx).health_fault(host, "ib-flap", count=count))


@lab_fault.command("reset")
@click.pass_context
def fault_reset(ctx: click.Context) -> None:
    """Undo every active fault of the lab."""
    lab = _lab(ctx)
    n = len(lab.faults)
    lab.reset_faults()
    _done(f"lab {lab.name}: {n} fault(s) undone")


@lab_group.command("box")
@click.option(
    "--cache",
    type=click.Path(file_okay=False),
    default=None,
    help="Cache folder (default /var/cache/fleetctl/box; one entry per recipe hash).",
)
@click.option("--rebuild", is_flag=True, help="Build again even if the cache has this recipe.")
@click.option("--no-add", is_flag=True, help="Build only; skip `vagrant box add`.")
def lab_box(cache: str | None, rebuild: bool, no_add: bool) -> None:
    """Build the Vagrant libvirt box fleetctl/bookworm64 from Debian packages (minutes, once).

    Direct kernel boot on plain qemu (TCG); also starts libvirtd if nothing runs it. Then
    `vagrant up` in the repository brings up the 3 VMs (docs/lab.md).
    """
    from pathlib import Path

    from fleetctl.lab.box import DEFAULT_CACHE, build_box, ensure_libvirtd

    def say(msg: str) -> None:
        click.echo(msg, err=True)

    entry = build_box(
        Path(cache) if cache else DEFAULT_CACHE, rebuild=rebuild, add=not no_add, log=say
    )
    if not no_add:
        ensure_libvirtd(log=say)
    _done(f"box fleetctl/bookworm64 from {entry}")


from fleetctl.cli.lab_containers_cmd import containers_group  # noqa: E402

lab_group.add_command(containers_group)
