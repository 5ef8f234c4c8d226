"""Bounded reading of files the user names (inventories, vars files, job files, ``@file``
limits): a FIFO, ``/dev/zero`` or a huge file must be refused in one line, never hang or eat
memory; and the YAML alias guard (a few lines of ``&a [*b, *b, …]`` stand for billions of
values) that every YAML document fleetctl reads goes through. Pure: no printing."""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Callable
from typing import Any, Literal, get_args

MAX_INPUT_BYTES = 32 << 20  # 32 MiB: a 10,000-host inventory with vars is well under 5 MiB
MAX_YAML_VALUES = 1_000_000  # values a document stands for once its aliases are expanded
MAX_YAML_DEPTH = 200
# Numbers the user gives, on the command line or in a job file, are held to the same bounds
MAX_SECONDS = 366 * 86400.0  # a year: every wait fleetctl has is shorter; bigger overflows
MAX_COUNT = 1_000_000  # hosts, processes, lines, snapshots: past any real fleet
MAX_NPROC = 4096  # per node: a typo's world size must not reach the planner
MAX_RETRIES = 100
MAX_BACKOFF = 300.0  # s between attempts
# s for a node's python to print its facts in the check; a loaded node (an sbatch allocation at
# load ~13) may need more: --probe-timeout, up to PROBE_TIMEOUT_MAX. Here, not in the check's
# modules, so the CLI's option table reads them without importing the check.
PROBE_TIMEOUT = 30.0
PROBE_TIMEOUT_MAX = 600.0
# run --on-slow: what a node the others wait for (fleetctl.job.diagnose.pace) makes the run do
OnSlow = Literal["warn", "stop", "off"]
ON_SLOW: tuple[OnSlow, ...] = get_args(OnSlow)
# --slow-rounds: rounds of pace reports (every ~2 s) of the last WINDOW that must name the same
# node, and no other, before it is called slow (named ~8-12 s after it shows); the judge is
# fleetctl.job.diagnose.pace, whose import the option table need not pay
AGREE = 4
WINDOW = 6


def read_user_file(
    path: str | os.PathLike[str],
    what: str,
    error: Callable[[str], Exception],
    *,
    limit: int | None = None,
) -> bytes:
    """The bytes of ``path`` if it is a regular file of at most ``limit`` bytes
    (default :data:`MAX_INPUT_BYTES`).

    Checked on the open descriptor before reading (opened non-blocking, so a FIFO cannot
    hang the open); ``error(message)`` builds the exception raised otherwise (the caller names
    the file), the message naming ``what`` the file is ("inventory", "job file").
    """
    limit = MAX_INPUT_BYTES if limit is None else limit
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except IsADirectoryError as e:
        raise error(f"{what} is a directory, expected a file") from e
    except OSError as e:
        raise error(f"cannot read {what}: {e.strerror or e}") from e
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise error(f"{what} is a directory, expected a file")
        if not stat.S_ISREG(st.st_mode):
            raise error(
                f"{what} is not a regular file ({_kind(st.st_mode)}); fleetctl reads only files"
            )
        if st.st_size > limit:
            raise error(
                f"{what} is {st.st_size} bytes, more than the {limit >> 20} MiB fleetctl reads"
            )
        chunks: list[bytes] = []
        got = 0
        while got <= limit:  # the size can grow after the fstat: read at most limit + 1
            chunk = os.read(fd, min(1 << 20, limit + 1 - got))
            if not chunk:
                break
            chunks.append(chunk)
            got += len(chunk)
        if got > limit:
            raise error(f"{what} grew past the {limit >> 20} MiB fleetctl reads")
        return b"".join(chunks)
    except OSError as e:
        raise error(f"cannot read {what}: {e.strerror or e}") from e
    finally:
        os.close(fd)


def _kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return name
    return "not a file"


class YamlTooBig(Exception):
    """A YAML document that expands past :data:`MAX_YAML_VALUES` or nests too deep."""

    def __init__(self, message: str, line: int) -> None:
        super().__init__(message)
        self.line = line


def check_yaml_size(node: Any) -> None:
    """Refuse a composed YAML node graph whose alias expansion is too big (an alias bomb), in
    time linear in the document; call between compose and construct. Raises YamlTooBig."""
    import yaml

    def size_of(node: Any, memo: dict[int, int], depth: int) -> int:
        # computed once per node: aliases share node objects, so this is linear in the
        # document, not in its expansion
        key = id(node)
        if key in memo:
            return memo[key]
        if depth > MAX_YAML_DEPTH:
            raise YamlTooBig(
                f"YAML nests deeper than {MAX_YAML_DEPTH} levels", node.start_mark.line + 1
            )
        memo[key] = MAX_YAML_VALUES + 1  # a node inside itself (recursive alias): too big
        size = 1
        if isinstance(node, yaml.SequenceNode):
            for child in node.value:
                size += size_of(child, memo, depth + 1)
        elif isinstance(node, yaml.MappingNode):
            for k, v in node.value:
                size += size_of(k, memo, depth + 1) + size_of(v, memo, depth + 1)
        size = min(size, MAX_YAML_VALUES + 1)
        memo[key] = size
        return size

    if node is not None and size_of(node, {}, 0) > MAX_YAML_VALUES:
        raise YamlTooBig(
            f"YAML aliases expand to more than {MAX_YAML_VALUES} values "
            "(an alias bomb?); write the values out",
            node.start_mark.line + 1,
        )


_IMAGE_RE = re.compile(r"\A[A-Za-z0-9_.][A-Za-z0-9_.:/@+=-]*\Z")


def image_problem(text: str) -> str | None:
    """Why ``text`` is no container image, or None: a registry reference
    (``ghcr.io/org/img:tag``, ``img@sha256:…``) or an apptainer path or URI (``/opt/img.sif``,
    ``docker://img``). It reaches the runtime's argv: no space, control character or leading
    ``-``, no empty tag or name part. One rule for ``--image``, ``image:`` and
    ``fleetctl_image``."""
    ref = text.split("://", 1)[1] if "://" in text else text
    ref = ref.lstrip("/") if ref.startswith("/") else ref  # an apptainer image file
    if not _IMAGE_RE.match(ref) or "" in re.split(r"[:/@]", ref):
        return f"{text!r} is not an image name (NAME[:TAG], REGISTRY/NAME@DIGEST, a path)"
    return None
