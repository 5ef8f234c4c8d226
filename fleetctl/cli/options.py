"""Click options every fleet command shares: which inventory, which hosts of it.

Usage in a command module::

    @cli.command("check")
    @inventory_option
    @limit_option
    def check_command(inventory: str | None, limit: str | None) -> None:
        selected = load_selected(inventory, limit)   # local_inventory() without -i
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import click

from fleetctl.api.helpers import (
    DEFAULT_FANOUT,
    MAX_COUNT,
    MAX_SECONDS,
    load_inventory,
    local_inventory,
)
from fleetctl.api.types import SSHSettings
from fleetctl.errors import UsageError

if TYPE_CHECKING:
    from fleetctl.api import Fleet as ApiFleet
    from fleetctl.api.types import Inventory

F = TypeVar("F", bound=Callable[..., Any])


class Number(click.FloatRange):
    """A finite number in range. click's FloatRange lets ``nan`` pass every bound and takes
    ``inf`` and ``1e309``; those then disable a timeout silently or overflow a socket call.
    The check is the library's (``fleetctl.api.checks.Number``): one message for both."""

    name = "number"
    integer = False

    def check(self) -> Any:
        from fleetctl.api.checks import Number as Check

        return Check(
            self.min, self.max, self.min_open, self.max_open, integer=self.integer, name=self.name
        )

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        from fleetctl.api.checks import Invalid

        try:
            return self.check()(value)
        except Invalid as e:
            self.fail(str(e), param, ctx)


class Seconds(Number):
    """A duration in seconds: finite, and at most :data:`MAX_SECONDS` unless ``max`` says."""

    name = "seconds"

    def __init__(
        self,
        min: float | None = None,
        max: float | None = MAX_SECONDS,
        min_open: bool = False,
        max_open: bool = False,
    ) -> None:
        super().__init__(min=min, max=max, min_open=min_open, max_open=max_open)


class Count(click.IntRange):
    """A whole number in range, at most :data:`MAX_COUNT` unless ``max`` says (a 24-digit
    ``--nproc-per-node`` must not reach the planner)."""

    integer = True
    check = Number.check
    convert = Number.convert

    def __init__(self, min: int | None = None, max: int | None = MAX_COUNT) -> None:
        super().__init__(min=min, max=max)


class Checked(click.ParamType):
    """A value one of the record's checks holds (``RunSpec``'s field): the command refuses
    what the library refuses, with the library's message."""

    name = "text"

    def __init__(self, check: Callable[[Any], Any], name: str | None = None) -> None:
        self.check = check
        if name:
            self.name = name

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        from fleetctl.api.checks import Invalid

        try:
            return self.check(value)
        except Invalid as e:
            self.fail(str(e), param, ctx)


class CheckedChoice(click.Choice):
    """A word of a list (help shows ``[a|b]``), refused with the record's message."""

    def __init__(self, check: Any) -> None:
        super().__init__(check.words())
        self.check = check

    convert = Checked.convert


class Pairs(click.types.StringParamType):
    """``NAME=VALUE`` (``--env-var``): the record checks each name with its own message, and a
    value is any text (cli/guard.py leaves it alone)."""

    verbatim = True


def number_type(check: Any) -> click.ParamType:
    """The click type of a ``checks.Number``: its check, with click's help for ranges."""
    if check.integer:
        return Count(min=check.min, max=check.max)
    cls = Seconds if check.name == "seconds" else Number
    return cls(min=check.min, max=check.max, min_open=check.min_open, max_open=check.max_open)


def field_type(kw: str) -> click.ParamType:
    """The click type of ``RunSpec``'s field ``kw`` (its library keyword): its check, with
    click's help for ranges and choices."""
    from fleetctl.api import checks
    from fleetctl.api.runspec import field_of

    check = field_of(kw).metadata["check"]
    if isinstance(check, checks.Number):
        return number_type(check)
    if isinstance(check, checks.OneOf):
        return CheckedChoice(check)
    return Checked(check, field_of(kw).metadata.get("type_name"))


def _sub_option(s: Any) -> Callable[[F], F]:
    """The click option of one sub-option of a record-valued field (``--collective-size``:
    ``fleetctl.api.runspec_collective.Sub``)."""
    extra: dict[str, Any] = {"help": s.help, "metavar": s.metavar}
    if isinstance(s.default, bool):
        extra.update(is_flag=True)
    elif s.multiple:
        extra.update(multiple=True)
    else:
        extra.update(default=s.default, show_default=s.show_default or None)
        if s.check is not None and not s.text:
            extra.update(type=number_type(s.check))
    return click.option(s.flag, s.param, **extra)


def sub_options(kw: str) -> Callable[[F], F]:
    """The options of ``RunSpec``'s record-valued field ``kw`` (``collective``: ``--collective``
    and its ``--collective-*``; ``collect``: ``--collect-max``, ``--collect-exclude``), from
    the field's ``subs``: ``run``, ``check`` and ``collect`` share one definition;
    :func:`sub_record` makes the record of them."""
    from fleetctl.api.runspec import field_of

    options = [_sub_option(s) for s in field_of(kw).metadata["subs"]]

    def decorate(fn: F) -> F:
        for option in reversed(options):
            fn = option(fn)
        return fn

    return decorate


def sub_record(kw: str, params: dict[str, Any]) -> Any:
    """The record of field ``kw``'s :func:`sub_options` (removed from ``params``):
    ``CollectiveOptions`` (None without ``--collective``) or ``CollectOptions``."""
    from fleetctl.api.runspec import field_of
    from fleetctl.api.runspec_collective import collective_record

    values = {s.param: params.pop(s.param) for s in field_of(kw).metadata["subs"]}
    if kw == "collect":
        return collect_settings(values["collect_max"], values["collect_exclude"])
    return collective_record(values)


def _field_option(f: Any, unset: bool = False) -> Callable[[F], F]:
    """The click option of one ``RunSpec`` field, from its metadata (``fleetctl.api.runspec
    .option``): flags, parameter name, type and check, default, help. ``unset``: no default
    (None when not given: the command takes the value from elsewhere)."""
    from fleetctl.api.runspec import keyword

    m = f.metadata
    kw = keyword(f)
    decls = (*m["flags"], m.get("param") or kw)
    extra: dict[str, Any] = {"help": m.get("help") or None, "metavar": m.get("metavar")}
    cli = m.get("cli")
    if isinstance(f.default, bool):
        extra.update(is_flag=True)
    elif cli == "pairs":
        extra.update(multiple=True, type=Pairs())
    elif isinstance(f.default, tuple):
        extra.update(multiple=True, type=field_type(kw))
    elif cli == "dir":
        extra.update(type=click.Path(exists=True, file_okay=False), default=None)
    elif cli == "file":
        extra.update(type=click.Path(exists=True, dir_okay=False), default=None)
    elif cli == "regular":
        extra.update(type=RegularFile(), default=None)
    elif unset:
        extra.update(type=field_type(kw), default=None)
    else:
        extra.update(type=field_type(kw), default=f.default)
        if m.get("show_default"):
            extra.update(show_default=True)
    return click.option(*decls, **extra)


def field_option(kw: str) -> Callable[[F], F]:
    """The option of ``RunSpec``'s field ``kw`` alone (``--allow-secret`` for ``push``)."""
    from fleetctl.api.runspec import field_of

    return _field_option(field_of(kw))


def unset_options(kws: tuple[str, ...]) -> Callable[[F], F]:
    """The options of ``RunSpec``'s fields ``kws`` without defaults (``fleetctl monitor``'s
    limits: unset, the job's last monitor's); :func:`given_keywords` collects them."""
    from fleetctl.api.runspec import field_of

    options = [_field_option(field_of(kw), unset=True) for kw in kws]

    def decorate(fn: F) -> F:
        for option in reversed(options):
            fn = option(fn)
        return fn

    return decorate


def given_keywords(params: dict[str, Any], kws: tuple[str, ...]) -> dict[str, Any]:
    """The :func:`unset_options` the user gave, by keyword, removed from ``params``."""
    from fleetctl.api.runspec import field_of

    out = {kw: params.pop(field_of(kw).metadata.get("param") or kw) for kw in kws}
    return {kw: v for kw, v in out.items() if v is not None}


def spec_options(*groups: str) -> Callable[[F], F]:
    """The click options of ``RunSpec``'s fields in ``groups`` (``"program"``, ``"retry"``, …),
    in the record's order, generated from the fields' metadata: adding a field adds its
    option; a record-valued field adds its sub-options (:func:`sub_options`)."""
    from dataclasses import fields

    from fleetctl.api.runspec import GROUPS, keyword

    options = [
        sub_options(keyword(f)) if f.metadata.get("subs") else _field_option(f)
        for g in groups
        for f in fields(GROUPS[g])  # type: ignore[arg-type]
        if f.metadata.get("flags")
    ]

    def decorate(fn: F) -> F:
        for option in reversed(options):
            fn = option(fn)
        return fn

    return decorate


def spec_keywords(params: dict[str, Any], *groups: str) -> dict[str, Any]:
    """The command's parameters of ``RunSpec``'s fields in ``groups`` as the library's
    keywords (``no_check`` → ``check=False``, ``env_vars`` → ``env={…}``), removed from
    ``params``; what the user did not give is left to the record's default."""
    from dataclasses import fields

    from fleetctl.api.runspec import GROUPS, keyword

    out: dict[str, Any] = {}
    for g in groups:
        for f in fields(GROUPS[g]):  # type: ignore[arg-type]
            m = f.metadata
            name = m.get("param") or keyword(f)
            if not m.get("flags") or name not in params:
                continue
            if m.get("subs"):
                out[keyword(f)] = sub_record(keyword(f), params)
                continue
            value = params.pop(name)
            if isinstance(f.default, bool) and m["flags"][0].startswith("--no-"):
                value = not value
            elif m.get("cli") == "pairs":
                value = parse_env_vars(value, m["flags"][0])
            out[keyword(f)] = value
    return out


def parse_env_vars(items: tuple[str, ...], flag: str = "--env-var") -> dict[str, str]:
    """``K=V`` pairs (``=`` allowed in V); a later K wins. BadParameter names the bad item."""
    from fleetctl.api.checks import Invalid, env_name

    env: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        try:
            if not sep:
                raise Invalid(f"{item!r} is not NAME=VALUE")
            env[env_name(key)] = value
        except Invalid as e:
            raise click.BadParameter(str(e), param_hint=f"'{flag}'") from None
    return env


class RegularFile(click.Path):
    """An existing regular file (an env archive): a FIFO or a device would hang the hash that
    push takes of it, so it is refused here, one line, exit 2."""

    def __init__(self) -> None:
        super().__init__(exists=True, dir_okay=False, path_type=str)

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        import os
        import stat

        path = super().convert(value, param, ctx)
        if not stat.S_ISREG(os.stat(path).st_mode):
            self.fail(f"{path!r} is not a regular file", param, ctx)
        return path


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


@dataclass(frozen=True)
class SSHOptions:
    """How a command reaches its nodes: the SSH settings every phase shares, and the fan-out."""

    settings: SSHSettings
    fanout: int


def ssh_options(
    *, fanout_help: str | None = "Hosts connected and worked on at once."
) -> Callable[[F], F]:
    """``--accept-new``, ``--known-hosts``, ``--connect-timeout`` (and ``-f/--fanout`` unless
    ``fanout_help`` is None), handed to the command as one ``ssh: SSHOptions`` argument."""

    def decorate(fn: F) -> F:
        @functools.wraps(fn)
        def wrapper(
            *args: Any,
            accept_new: bool,
            known_hosts: str | None,
            connect_timeout: float,
            fanout: int = DEFAULT_FANOUT,
            **kwargs: Any,
        ) -> Any:
            settings = SSHSettings(
                known_hosts=known_hosts, accept_new=accept_new, connect_timeout=connect_timeout
            )
            return fn(*args, ssh=SSHOptions(settings, fanout), **kwargs)

        options = [
            click.option(
                "--accept-new",
                is_flag=True,
                help="Record unknown host keys (like ssh's accept-new); changed keys still fail.",
            ),
            click.option(
                "--known-hosts",
                type=click.Path(dir_okay=False),
                default=None,
                help="known_hosts file to verify host keys against "
                "(default: fleetctl_known_hosts, else ~/.ssh/known_hosts).",
            ),
            click.option(
                "--connect-timeout",
                type=Seconds(min=0, min_open=True),
                default=10.0,
                show_default=True,
                help="Seconds to wait for each host's SSH handshake.",
            ),
        ]
        if fanout_help is not None:
            options.append(
                click.option(
                    "-f",
                    "--fanout",
                    type=Count(min=1, max=10_000),
                    default=DEFAULT_FANOUT,
                    show_default=True,
                    help=fanout_help,
                )
            )
        for option in reversed(options):
            wrapper = option(wrapper)
        return wrapper  # type: ignore[return-value]

    return decorate


def _collect_max_flag() -> str:
    from fleetctl.api.runspec import field_of

    flag: str = field_of("collect").metadata["subs"][0].flag
    return flag


def collect_options(f: F) -> F:
    """``--collect-max SIZE`` and ``--collect-exclude GLOB`` (``RunSpec``'s ``collect``): what
    log collection brings home. The command gets ``collect_max`` (``None``: not given) and
    ``collect_exclude``; turn them into ``CollectOptions`` with :func:`collect_settings`."""
    return sub_options("collect")(f)


def collect_settings(
    collect_max: str | None, collect_exclude: tuple[str, ...], base: Any = None
) -> Any:
    """``CollectOptions`` from the options, over ``base`` (a run's recorded ones) or defaults."""
    from fleetctl.api.helpers import parse_size
    from fleetctl.api.types import CollectOptions

    base = base or CollectOptions()
    try:
        cap = base.max_bytes if collect_max is None else parse_size(collect_max)
    except UsageError as e:
        raise click.BadParameter(str(e), param_hint=_collect_max_flag()) from e
    exclude = tuple(collect_exclude) if collect_exclude else base.exclude
    return CollectOptions(max_bytes=cap, exclude=exclude)


def open_fleet(
    inventory: str | None, limit: str | None, ssh: SSHOptions, **options: Any
) -> ApiFleet:
    """The library's ``Fleet`` of the command's selection (``-i``/``--limit``, or this machine),
    reached with the command's SSH options; ``options``: more ``Fleet`` arguments."""
    from fleetctl.api import Fleet

    selected = load_selected(inventory, limit)
    s = ssh.settings
    return Fleet(
        list(selected.nodes),
        known_hosts=s.known_hosts,
        accept_new=s.accept_new,
        connect_timeout=s.connect_timeout,
        fanout=ssh.fanout,
        inventory=selected.path,
        limit=limit,
        **options,
    )


def collect_max_bytes(collect_max: str | None) -> int | None:
    """``--collect-max`` in bytes (None: not given, the run's cap stands)."""
    if collect_max is None:
        return None
    from fleetctl.api.helpers import parse_size

    try:
        return parse_size(collect_max)
    except UsageError as e:
        raise click.BadParameter(str(e), param_hint=_collect_max_flag()) from e
