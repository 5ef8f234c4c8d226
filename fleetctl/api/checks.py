"""The checks a run option's value passes, shared by the command's option parsers and the
library's :class:`~fleetctl.api.runspec.RunSpec`: one check, one message, whoever gives the value.

A check is a callable ``value -> value`` (normalized: ``"5"`` → ``5.0`` for seconds) that raises
:class:`Invalid` with the message click would print after ``Invalid value for '--opt':``. The
command's option types (``fleetctl.cli.options``) call them from ``convert``; the record calls them
in ``__post_init__`` and raises ``UsageError("Invalid value for '--opt': …")``: the same line.

Pure and cheap to import (no click): the library must not pay for the command line.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from fleetctl.plan.userinput import MAX_COUNT, MAX_NPROC, MAX_SECONDS

# a variable name; \A…\Z, not ^…$: ``$`` matches before a trailing newline ("A\n" passed)
ENV_NAME_RE = re.compile(r"\A[A-Za-z_][A-Za-z0-9_]*\Z")
_CONTROL_RE = re.compile(r"[\x00-\x1f\x7f]")


class Invalid(ValueError):
    """A value a check refuses; the message names the value, not the option."""


def _text(value: Any) -> str:
    """The value as the command line would have given it: ``nan`` → ``'nan'`` in messages,
    so the library's message is the command's. A bool is no number (``'True'`` is refused)."""
    return value if isinstance(value, str) else str(value)


@dataclass(frozen=True)
class Number:
    """A finite number in range (``integer``: a whole one). click's own FloatRange lets
    ``nan`` pass every bound and takes ``inf`` and ``1e309``; those then disable a timeout
    silently or overflow a socket call. ``name`` is what the message calls the type."""

    min: float | None = None
    max: float | None = None
    min_open: bool = False
    max_open: bool = False
    integer: bool = False
    name: str = "number"

    def __call__(self, value: Any) -> Any:
        text = _text(value)
        try:
            n: float = int(text) if self.integer else float(text)
        except ValueError:
            raise Invalid(f"{text!r} is not a valid {self.name}.") from None
        if not self.integer and not math.isfinite(n):
            raise Invalid(f"{text!r} is not a finite number")
        low = self.min is not None and (n <= self.min if self.min_open else n < self.min)
        high = self.max is not None and (n >= self.max if self.max_open else n > self.max)
        if low or high:
            raise Invalid(f"{n} is not in the range {self.describe()}.")
        return n

    def describe(self) -> str:
        """The range as click's help shows it: ``1<=x<=60``, ``x>=0``."""
        if self.min is None:
            return f"x{'<' if self.max_open else '<='}{self.max}"
        if self.max is None:
            return f"x{'>' if self.min_open else '>='}{self.min}"
        lop, rop = ("<" if self.min_open else "<="), ("<" if self.max_open else "<=")
        return f"{self.min}{lop}x{rop}{self.max}"


def seconds(
    min: float | None = None,
    max: float | None = MAX_SECONDS,
    *,
    min_open: bool = False,
) -> Number:
    """A duration in seconds: finite, at most a year unless ``max`` says."""
    return Number(min=min, max=max, min_open=min_open, name="seconds")


def count(min: int | None = None, max: int | None = MAX_COUNT) -> Number:
    """A whole number in range, at most :data:`MAX_COUNT` unless ``max`` says."""
    return Number(min=min, max=max, integer=True, name="integer range")


@dataclass(frozen=True)
class OneOf:
    """One of a fixed list of words (``choices``: the tuple, or a function giving it, so
    that the list loads only when a value is checked)."""

    choices: tuple[str, ...] | Callable[[], tuple[str, ...]]

    def words(self) -> tuple[str, ...]:
        return self.choices() if callable(self.choices) else self.choices

    def __call__(self, value: Any) -> Any:
        words = self.words()
        if value not in words:
            raise Invalid(f"{value!r} is not one of {', '.join(map(repr, words))}.")
        return value


@dataclass(frozen=True)
class Text:
    """A string that may reach a shell line, an argv or an ``#SBATCH`` line on a node: no
    control character (a newline there ends the line and starts another command)."""

    def __call__(self, value: Any) -> Any:
        if not isinstance(value, str):
            raise Invalid(f"{value!r} is not a string")
        bad = _CONTROL_RE.search(value)
        if bad:
            raise Invalid(f"{value!r} holds a control character ({bad.group()!r})")
        return value


TEXT = Text()


def regex(value: Any) -> str:
    """A job's own progress regex (``--progress-regex``): it compiles and has a group for
    the count (:func:`fleetctl.remote.kit.progress.compile_own`)."""
    from fleetctl.remote.kit.progress import compile_own

    text: str = TEXT(value)
    try:
        compile_own(text)
    except ValueError as e:
        raise Invalid(str(e)) from None
    return text


def image(value: Any) -> str:
    """A container image (``--image``): :func:`fleetctl.plan.userinput.image_problem`."""
    from fleetctl.plan.userinput import image_problem

    text: str = TEXT(value)
    why = image_problem(text)
    if why:
        raise Invalid(why)
    return text


def nproc(value: Any) -> int | str:
    """``--nproc-per-node``: a positive integer or ``auto`` (one per GPU, 1 without GPUs)."""
    if isinstance(value, int) and not isinstance(value, bool):
        n = value
    elif _text(value).strip().lower() == "auto":
        return "auto"
    else:
        try:
            n = int(_text(value))
        except ValueError:
            raise Invalid(f"{value!r} is neither a positive integer nor 'auto'") from None
    if n < 1:
        raise Invalid(f"{_text(value)!r} is not a positive integer")
    if n > MAX_NPROC:
        raise Invalid(f"{_text(value)!r} is more than {MAX_NPROC} processes per node")
    return n


def env_name(name: Any) -> str:
    """An environment variable's name (``--env-var NAME=VALUE``, ``env={NAME: VALUE}``)."""
    if not isinstance(name, str) or not ENV_NAME_RE.match(name):
        raise Invalid(f"{name!r} is not a valid variable name")
    return name


def env_map(value: Any) -> dict[str, str]:
    """``env``: names checked, values strings (they reach the node's environment as given)."""
    if not isinstance(value, Mapping):
        raise Invalid(f"{value!r} is not a mapping of NAME to VALUE")
    out: dict[str, str] = {}
    for k, v in value.items():
        if not isinstance(v, str):
            raise Invalid(f"{k}={v!r}: the value is not a string")
        out[env_name(k)] = v
    return out


def runtime(value: Any) -> str:
    """A container runtime's name (``--container-runtime``): one fleetctl knows (the runtime
    table loads only here)."""
    from fleetctl.plan.runtimes import ORDER

    if value not in ORDER:
        raise Invalid(f"unknown container runtime {value!r} (known: {', '.join(ORDER)})")
    return str(value)


def launchers() -> tuple[str, ...]:
    from fleetctl.plan.launchers import LAUNCHER_NAMES

    return tuple(LAUNCHER_NAMES)


def backends() -> tuple[str, ...]:
    from fleetctl.plan.rankplan import BACKENDS

    return tuple(BACKENDS)


def host_port(value: Any) -> str:
    """``HOST:PORT`` to listen on (``--metrics-addr``): an IP or a name, ``[::1]:9400`` for
    IPv6, a port 1-65535; nothing is bound here (the run binds it before reaching a node)."""
    text = _text(value).strip()
    host, sep, port = text.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not sep or not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise Invalid(f"{text!r} is not HOST:PORT (e.g. 127.0.0.1:9400)")
    if _CONTROL_RE.search(host) or any(ch.isspace() for ch in host):
        raise Invalid(f"{text!r} is not HOST:PORT (e.g. 127.0.0.1:9400)")
    return f"[{host}]:{port}" if ":" in host else f"{host}:{int(port)}"


# ------------------------------------------------- checks of RunSpec's path and record fields


def path(value: Any) -> str:
    try:
        out: str = os.fspath(value)
    except TypeError:
        raise Invalid(f"{value!r} is not a path") from None
    return out


def before(value: Any) -> Any:
    """``--before``: a callable (a library call's) as it is, else its text."""
    return value if callable(value) else TEXT(value)
