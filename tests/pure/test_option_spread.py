"""A run option is named in at most 5 files of ``fleetctl/`` (issue 35): its field in
``api/runspec.py``, ``Fleet.run``'s typed keyword (``api/fleet.py``), and its consumers; layers
that only forward pass the option's group (``RunOptions.supervision``/``.retry``/``.hosts``,
``JobRequest.observe``)
and derived values are methods of the group (``Supervision.startup_limit``). Adding an option
then touches the record, its consumer and a test (docs/api.md, "Adding a run option").

Counted: every ``RunSpec`` field whose name is distinctive (it has an underscore, or is on
:data:`DISTINCTIVE`), as a word in a file's text, in every file but those of :data:`NOT_COUNTED`.
A name that must stay in more files is an exception below, with why and the count it may not
pass."""

from __future__ import annotations

import functools
import re
from dataclasses import fields
from pathlib import Path

from fleetctl.api.runspec import GROUPS

PACKAGE = Path(__file__).resolve().parents[2] / "fleetctl"
LIMIT = 5
DISTINCTIVE = ("deadman",)  # one word, but no other meaning in fleetctl
# Folders whose files are not counted, each a separate program that cannot take the record:
# remote/ is shipped to the nodes as source and runs there on Python 3.8, stdlib only
# (tests/remote/test_programs_py38.py); it names the fields of its own wire records
# (``remote/records.py``: the supervisor's spec), which the controller fills from the group.
NOT_COUNTED = ("remote",)

# name -> (the most files it may be in, why it is more than LIMIT)
# (none left: post_mortem, the last, is in 5 since a phase event carries its JobPhase and the
# metrics no longer map event texts to their labels)
EXCEPTIONS: dict[str, tuple[int, str]] = {}


def distinctive_options() -> list[str]:
    """The names the guard counts: every RunSpec field with an underscore, or listed."""
    names = [f.name for cls in GROUPS.values() for f in fields(cls)]  # type: ignore[arg-type]
    return [n for n in names if "_" in n or n in DISTINCTIVE]


def files_naming(name: str, root: Path) -> list[str]:
    """The ``.py`` files under ``root`` whose text has ``name`` as a word (as ``grep -lw``:
    ``stall_timeout`` but not ``--stall-timeout`` or ``stall_timeouts``)."""
    return sorted(path for path, words in _words(root) if name in words)


@functools.lru_cache(maxsize=4)
def _words(root: Path) -> tuple[tuple[str, frozenset[str]], ...]:
    """Each file's words, read once (one set per file: a name is then a lookup)."""
    return tuple(
        (str(p.relative_to(root)), frozenset(re.findall(r"\w+", p.read_text())))
        for p in root.rglob("*.py")
        if p.relative_to(root).parts[0] not in NOT_COUNTED
    )


def spread(root: Path, names: list[str]) -> dict[str, list[str]]:
    """Every name over its allowance (LIMIT, or its exception's count), with its files."""
    out = {}
    for name in names:
        found = files_naming(name, root)
        allowed = EXCEPTIONS.get(name, (LIMIT, ""))[0]
        if len(found) > allowed:
            out[name] = found
    return out


def test_no_run_option_is_named_in_more_than_five_files() -> None:
    over = spread(PACKAGE, distinctive_options())
    assert not over, "\n".join(
        f"{name}: {len(found)} files (allowed {EXCEPTIONS.get(name, (LIMIT,))[0]}): "
        + " ".join(found)
        for name, found in over.items()
    )


def test_every_exception_is_a_run_option_still_over_the_limit() -> None:
    """An exception whose name went or came back under the limit is removed, so none hides
    a new spread; its count is the ceiling (lower it when a file stops naming it)."""
    names = distinctive_options()
    for name, (allowed, why) in EXCEPTIONS.items():
        assert name in names and why, name
        assert LIMIT < len(files_naming(name, PACKAGE)) <= allowed, name


def test_the_counter_finds_a_planted_spread(tmp_path: Path) -> None:
    """The guard can fail: a sixth file naming an option is caught, a flag or a longer name
    is not a mention, and five files pass."""
    for i in range(5):
        (tmp_path / f"m{i}.py").write_text(f"x = options.stall_timeout  # {i}\n")
    (tmp_path / "flag.py").write_text('FLAG = "--stall-timeout"; stall_timeouts = 1\n')
    (tmp_path / "remote").mkdir()  # a node program's own record: not counted
    (tmp_path / "remote" / "records.py").write_text("stall_timeout: float = 0.0\n")
    assert spread(tmp_path, ["stall_timeout"]) == {}
    sub = tmp_path / "job"
    sub.mkdir()
    (sub / "planted.py").write_text("def f(stall_timeout: float) -> None: ...\n")
    _words.cache_clear()
    over = spread(tmp_path, ["stall_timeout"])
    assert list(over) == ["stall_timeout"] and len(over["stall_timeout"]) == 6
    assert "job/planted.py" in over["stall_timeout"]
