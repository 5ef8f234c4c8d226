"""``fleetctl push --image IMAGE``: the image alone, to the nodes that lack it (see
:mod:`fleetctl.phases.push.image`); a table per node on stdout, or ``--json``. The command
(``cli/push_cmd.py``) says what to push; this runs it and shows what came of it."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import click


def show_image_push(push: Callable[[], Any], as_json: bool) -> None:
    """Run the image push (``push``: ``Fleet.push_image`` with the command's arguments) and
    print its report; raise its error (exit 2 or 3) after."""
    from fleetctl.cli.push_cmd import failures_of, write_json
    from fleetctl.errors import PushError

    error: PushError | None = None
    try:
        report = push()
    except PushError as e:
        if not hasattr(e, "report"):
            raise
        error, report = e, e.report
    failures = failures_of(error)
    if as_json:
        write_json(report, error, failures)
    else:
        rows = [("node", "image", "how", "sent", "time")]
        for name, n in report.nodes.items():
            how = n.status
            if n.status == "replaced":
                how += f" (was {(n.previous_id or '')[:12]})"
            if n.via:
                how += f", {n.via}" + (f" from {n.source}" if n.source else "")
            rows.append(
                (
                    name,
                    n.image_id[:12] if n.image_id else "–",
                    how,
                    _bytes(n.bytes_sent),
                    f"{n.seconds:.1f}s",
                )
            )
        for name, why in failures.items():
            rows.append((name, "–", f"failed: {why}", "–", "–"))
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        for r in rows:
            click.echo(
                "  " + "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
            )
        click.echo(
            f"\nimage {report.image} ({report.image_id[:12]}, {_bytes(report.archive_bytes)}"
            f" saved): controller sent {_bytes(report.controller_bytes)}"
            f" in {report.seconds:.1f}s"
        )
    sys.stdout.flush()
    if error is not None:
        raise error


def _bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB"):
        if n < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"
