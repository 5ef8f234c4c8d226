"""The file that carries ``run --slurm``'s job to the run inside the allocation.

Why a file: an option's value on the batch script's command line (``--env-var=TOKEN=…``) is on
the batch node's process list for every user to read. The batch script runs ``fleetctl run
--spec FILE`` instead, and FILE (0600, in the 0700 run folder) holds the inside run's
arguments. Only this module knows the file's content (for now the argv as JSON; a typed run
request may replace it), so the writer and the reader change together.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence

from fleetctl.errors import UsageError

SPEC_FILE = "run-spec.json"  # in the run folder (without a shared filesystem: the batch host's)
FORMAT = "fleetctl-run-argv/1"


def dumps(argv: Sequence[str]) -> str:
    """One line of ASCII (no control character, no newline): safe in a shell here-document."""
    if not all(isinstance(a, str) for a in argv):
        raise TypeError("run spec: every argument must be a str")
    return json.dumps({"format": FORMAT, "argv": list(argv)}, ensure_ascii=True)


def write(path: str | os.PathLike[str], argv: Sequence[str]) -> None:
    """A new 0600 file (never through a link, never over another file)."""
    text = dumps(argv) + "\n"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w", encoding="ascii") as f:
        f.write(text)


def loads(text: str, where: str) -> list[str]:
    """The argv of a spec's text; UsageError naming ``where`` when it is not one."""
    try:
        doc = json.loads(text)
    except ValueError as e:
        raise UsageError(f"--spec {where}: not a fleetctl run spec ({e})") from None
    argv = doc.get("argv") if isinstance(doc, dict) else None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise UsageError(f"--spec {where}: not a fleetctl run spec (format {FORMAT} expected)")
    if not isinstance(argv, list) or not all(isinstance(a, str) for a in argv):
        raise UsageError(f"--spec {where}: 'argv' must be a list of strings")
    return argv


def read(path: str | os.PathLike[str]) -> list[str]:
    """The inside run's argv from ``path``; UsageError (one line) when it cannot be read."""
    where = os.fspath(path)
    try:
        with open(path, encoding="ascii") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as e:
        raise UsageError(f"--spec {where}: cannot read it ({e})") from None
    return loads(text, where)
