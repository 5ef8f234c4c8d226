"""``fleetctl run --help`` in sections: the options grouped as ``RunSpec`` groups them (what to
run, where, supervision, retries, …), then examples. Plain click: a ``Command`` whose
``format_options`` writes one section per group (issue 40: 59 options in one flat list)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import click

#: ``fleetctl run``'s parameters that are no ``RunSpec`` field (the fleet's selection, how the
#: command prints, options parsed into a field such as ``--collect-max``): by section, those
#: listed before the group's fields and those after them
EXTRA: Mapping[str, tuple[Sequence[str], Sequence[str]]] = {
    "Where": (("inventory", "limit"), ("accept_new", "known_hosts", "connect_timeout")),
    "Collection": (("collect_max", "collect_exclude"), ()),
    "Collective benchmark": (
        (
            "collective",
            "collective_size",
            "collective_min",
            "collective_floor",
            "collective_timeout",
        ),
        (),
    ),
    "Slurm": (("slurm",), ("slurm_no_shared_fs", "no_slurm")),
    "Output": (("dry_run", "as_json", "full", "runs_dir", "tail", "raw_output"), ()),
}

RUN_EXAMPLES = """\
fleetctl run train.py --epochs 3                  # this machine, one rank per GPU
fleetctl run -i hosts.yml --limit gpu train.py    # every host of group gpu
fleetctl run -i hosts.yml --dry-run --json train.py   # the plan, nothing started
fleetctl run -i hosts.yml --nodes 4 --max-retries 2 --checkpoint-dir ckpt train.py
fleetctl run -i hosts.yml --stall-timeout 600 --timeout 86400 train.py
fleetctl run -i hosts.yml --image reg.example/train:1 train.py
fleetctl run --slurm --nodes 8 --gres gpu:4 --partition batch train.py
fleetctl run -i hosts.yml --job roles.yml          # a role job (servers, workers)
fleetctl run -i hosts.yml --detach train.py        # then: logs -f, status, stop"""


def run_sections() -> list[tuple[str, tuple[str, ...]]]:
    """(title, parameter names) in help order: ``RunSpec``'s groups, then the rest."""
    from dataclasses import fields

    from fleetctl.api.runspec import GROUPS, keyword

    sections: dict[str, list[str]] = {}
    for cls in GROUPS.values():
        names = sections.setdefault(cls.TITLE, [])
        for f in fields(cls):  # type: ignore[arg-type]
            if f.metadata.get("flags"):
                names.append(f.metadata.get("param") or keyword(f))
    for title, (lead, trail) in EXTRA.items():
        own = sections.get(title, [])
        sections[title] = list(dict.fromkeys([*lead, *own, *trail]))
    return [(title, tuple(names)) for title, names in sections.items() if names]


class SectionedCommand(click.Command):
    """A command whose options print in named sections (``sections``: title → parameter
    names; the rest, ``--help`` too, under "Other options"), and an Examples section."""

    def __init__(
        self,
        *args: Any,
        sections: Iterable[tuple[str, Sequence[str]]] = (),
        examples: str = "",
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.sections = list(sections)
        self.examples = examples

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        records: dict[str, tuple[str, str]] = {}
        order: list[str] = []
        for p in self.get_params(ctx):
            rec = None if isinstance(p, click.Argument) else p.get_help_record(ctx)
            if rec is not None and p.name is not None:
                records[p.name] = rec
                order.append(p.name)
        placed: set[str] = set()
        for title, names in self.sections:
            rows = [records[n] for n in names if n in records and n not in placed]
            placed.update(names)
            if rows:
                with formatter.section(title):
                    formatter.write_dl(rows)
        rest = [records[n] for n in order if n not in placed]
        if rest:
            with formatter.section("Other options"):
                formatter.write_dl(rest)

    def format_epilog(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        if self.examples:
            with formatter.section("Examples"):
                for line in self.examples.splitlines():  # as written: no rewrapping
                    formatter.write(f"{'':>{formatter.current_indent}}{line}\n")
        super().format_epilog(ctx, formatter)
