"""``--collective`` and its knobs, shared by ``fleetctl check`` and ``fleetctl run``."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import click

from fleetctl.cli.options import Number, Seconds

if TYPE_CHECKING:
    from fleetctl.api.types import CollectiveOptions

F = TypeVar("F", bound=Callable[..., Any])


def collective_options(fn: F) -> F:
    """Adds ``collective``, ``collective_size``, ``collective_min``, ``collective_floor`` and
    ``collective_timeout`` parameters."""
    opts = [
        click.option(
            "--collective",
            is_flag=True,
            help="After the check, benchmark torch.distributed over the training NICs (nccl on "
            "GPUs, gloo otherwise): an all-reduce across all hosts and send/recv between pairs; "
            "a slow or hung host or link fails the check.",
        ),
        click.option(
            "--collective-size",
            type=Number(min=0.001, max=1 << 16),
            default=32.0,
            show_default=True,
            help="MiB per all-reduce and per send/recv.",
        ),
        click.option(
            "--collective-min",
            type=Number(min=0, max=1),
            default=0.5,
            show_default=True,
            help="A host or link below this fraction of the fleet's median link busbw fails.",
        ),
        click.option(
            "--collective-floor",
            type=Number(min=0, max=1 << 20),
            default=None,
            help="GB/s busbw every host, link and the fleet all-reduce must reach (off unless "
            "given).",
        ),
        click.option(
            "--collective-timeout",
            type=Seconds(min=1, max=3600),
            default=120.0,
            show_default=True,
            help="Seconds the benchmark may take on a node; past it the host is named hung, "
            "with its stacks.",
        ),
    ]
    for opt in reversed(opts):
        fn = opt(fn)
    return fn


def collective_settings(
    enabled: bool, size_mib: float, min_fraction: float, floor: float | None, timeout: float
) -> CollectiveOptions | None:
    if not enabled:
        return None
    from fleetctl.api.helpers import MiB
    from fleetctl.api.types import CollectiveOptions

    return CollectiveOptions(
        size=max(4, int(size_mib * MiB)), min_fraction=min_fraction, floor=floor, timeout=timeout
    )
