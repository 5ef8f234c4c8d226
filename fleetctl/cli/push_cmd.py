"""``fleetctl push``: ship the code snapshot and the conda-pack env to every host, verify them.

Live progress per host on stderr (a tty only), then a per-host table on stdout; ``--json``
prints the report as one JSON object instead. Exit status 0 when every host has the code and a
working env with the same NCCL version, 3 otherwise.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import click

from fleetctl.cli import cli
from fleetctl.cli.options import (
    Count,
    RegularFile,
    SSHOptions,
    field_option,
    inventory_option,
    limit_option,
    open_fleet,
    spec_keywords,
    ssh_options,
)


@cli.command("push")
@inventory_option
@limit_option
@ssh_options(fanout_help="Hosts pushed to at once.")
@click.option(
    "--code",
    "code_dir",
    type=click.Path(exists=True, file_okay=False),
    default=None,
    help="Project directory to ship (default: the git work tree holding ., else .).",
)
@field_option("allow_secrets")  # RunSpec's, as run's
@click.option("--no-code", is_flag=True, help="Push only the env.")
@click.option(
    "--env",
    "env",  # Fleet.push's env: the archive
    type=RegularFile(),
    default=None,
    help="conda-pack archive (default: each host's fleetctl_env_archive).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the report as one JSON object.")
@click.option(
    "--backend",
    type=click.Choice(["nccl", "gloo"]),
    default=None,
    help="nccl: an env without a loadable libnccl.so.2 is an error.",
)
@click.option("--check-torch", is_flag=True, help="Also check `import torch` in the env.")
@click.option(
    "--peer/--no-peer",
    default=None,
    help="Hosts fetch the archive from each other (default: from --peer-min hosts).",
)
@click.option(
    "--peer-min",
    type=Count(min=2),
    default=4,
    show_default=True,
    help="Hosts needing the archive from which peer distribution is used.",
)
@click.option(
    "--keep",
    type=Count(min=1, max=1000),
    default=5,
    show_default=True,
    help="Code snapshots kept per host.",
)
@field_option("image")  # RunSpec's Container group, as run's
@field_option("container_runtime")
def push_command(
    inventory: str | None,
    limit: str | None,
    code_dir: str | None,
    allow_secrets: tuple[str, ...],
    no_code: bool,
    env: str | None,
    as_json: bool,
    backend: str | None,
    check_torch: bool,
    peer: bool | None,
    peer_min: int,
    keep: int,
    ssh: SSHOptions,
    **params: Any,
) -> None:
    """Ship code and the conda-pack env to every host; verify python and NCCL there.

    With --image: this machine's container image alone (no code, no env) to the hosts that
    lack it, saved here by --container-runtime (default: podman; podman or docker).
    """
    from fleetctl.api.runspec import Container, RunSpec
    from fleetctl.cli import render
    from fleetctl.errors import PushError

    # --image and its runtime: RunSpec's container group, as run's
    box = RunSpec().replace(**spec_keywords(params, "container")).container
    if box != Container() and (box.image is None or code_dir or env):
        from fleetctl.errors import UsageError

        raise UsageError("--image pushes the image alone: no --code, --env; give --image")
    fleet = open_fleet(inventory, limit, ssh)
    if box.image is not None:
        from fleetctl.cli.push_image_cmd import show_image_push

        return show_image_push(lambda: fleet.push_image(box, peer=peer), as_json)
    display = render.PushProgress(
        [n.name for n in fleet.nodes], enabled=not as_json and sys.stderr.isatty()
    )
    error: PushError | None = None
    with display:
        try:
            report = fleet.push(
                None if no_code else ".",
                env,
                code=None if no_code else code_dir,
                allow_secrets=allow_secrets,
                backend=backend,
                check_torch=check_torch,
                keep=keep,
                peer=peer,
                peer_min=peer_min,
                on_event=display,
            )
        except PushError as e:
            error, report = e, e.report  # type: ignore[attr-defined]
    for w in report.code_warnings:  # the code folder's own (checkpoints, data): JSON too
        click.echo(f"fleetctl: warning: {render.terminal_safe(w)}", err=True)
    failures = failures_of(error)
    if as_json:
        write_json(report, error, failures)
    else:
        render.print_push_report(report, failures)
    if error is not None:
        raise error


def failures_of(error: Exception | None) -> dict[str, str]:
    """Each failed host's one-line reason, from a push error's fan-out result."""
    if error is None:
        return {}
    failed = error.result.failed  # type: ignore[attr-defined]
    return {k: (v.one_line() if hasattr(v, "one_line") else str(v)) for k, v in failed.items()}


def write_json(report: object, error: Exception | None, failures: dict[str, str]) -> None:
    """``--json``: the report, whether it all worked, and what failed where."""
    doc = report.to_dict()  # type: ignore[attr-defined]
    doc["ok"] = error is None
    doc["failures"] = failures
    sys.stdout.write(json.dumps(doc, indent=2) + "\n")
    sys.stdout.flush()
