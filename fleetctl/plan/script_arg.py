"""``fleetctl run``'s SCRIPT: what it is and where in the code it runs, settled before any node
is reached.

``python train.py`` runs in the folder it was started from, which for a third-party script is
the script's own folder (``data/`` beside it); ``python -m pkg.train`` looks the module up from
the current folder. So the job's folder (``JobSpec.folder``, inside the pushed code) is the
script's folder, or for ``-m`` the current folder (the code dir's top when that is outside it).
What SCRIPT is (``JobSpec.kind``): ``.py`` is Python, ``.sh``/``.bash`` a shell script (run
with ``bash``); another name is read: a ``#!`` line naming python or a shell decides, else a
file that compiles as Python is Python. Anything else, or a launcher that cannot start it (a
shell script under paddle), is refused here, one line, exit 2. A module not in the code may be
installed on the nodes (``-m accelerate.commands.launch``): the check looks it up there, and a
node whose python cannot find it fails the check naming it.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

from fleetctl.errors import PlanError, UsageError
from fleetctl.plan.launchers import check_program
from fleetctl.plan.launchers.base import MODULE, PYTHON, SHELL, SHELL_SUFFIXES

_SHELLS = ("sh", "bash", "dash", "ksh", "zsh")
_READ = 1 << 20  # bytes of an unnamed script read to tell Python from the rest


@dataclass(frozen=True)
class Program:
    """SCRIPT settled: ``script`` relative to the code dir (a module: its name), its kind, the
    job's folder relative to the code dir, the script's args, the code dir."""

    script: str
    kind: str
    folder: str
    args: tuple[str, ...]
    code_dir: str


def resolve(
    script: str,
    args: tuple[str, ...],
    code_dir: str | None,
    launcher: str,
) -> Program:
    """SCRIPT ARGS (or ``-m MODULE ARGS``) as the plan takes them; UsageError (exit 2) for
    anything that could not run on any node (its --launcher-arg values: ``RunSpec``'s rules)."""
    if script == "-m" or (script.startswith("-m") and not script.startswith("--")):
        module = script[2:] or (args[0] if args else "")
        rest = args if script[2:] else args[1:]
        if not module:
            raise UsageError("-m needs a MODULE (fleetctl run [OPTIONS] -m MODULE [ARGS]...)")
        here = Path.cwd()
        code = code_dir if code_dir is not None else str(default_code_dir(here))
        root = Path(code).resolve()
        try:
            folder = here.resolve().relative_to(root).as_posix()
        except ValueError:
            folder = "."
        _require_module(module)
        _check(launcher, MODULE, module)
        return Program(module, MODULE, "" if folder == "." else folder, rest, code)
    if script.startswith("-"):
        raise UsageError(f"unknown option {script!r} (fleetctl options go before SCRIPT)")
    _no_symlink_loop(script)
    code = code_dir if code_dir is not None else str(default_code_dir(script))
    rel = _in_code_dir(script, code)
    kind = script_kind(Path(script))
    _check(launcher, kind, rel)
    folder = os.path.dirname(rel)
    return Program(rel, kind, folder, args, code)


def default_code_dir(script: str | Path) -> Path:
    """What ``fleetctl run train.py`` ships: the git work tree holding the script, else its dir."""
    path = Path(script).resolve()
    here = path if path.is_dir() else path.parent
    try:
        top = subprocess.run(
            ["git", "-C", str(here), "rev-parse", "--show-toplevel"],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return here
    if top.returncode == 0 and top.stdout.strip():
        return Path(top.stdout.strip())
    return here


def script_kind(path: Path) -> str:
    """PYTHON or SHELL for an existing file; UsageError naming it when it is neither."""
    if path.suffix == ".py":
        return PYTHON
    if path.name.endswith(SHELL_SUFFIXES):
        return SHELL
    try:
        with path.open("rb") as f:
            head = f.read(_READ)
    except OSError as e:
        raise UsageError(f"cannot read script {path}: {e.strerror or e}") from e
    if head.startswith(b"#!"):
        words = head[2:].split(b"\n", 1)[0].decode("utf-8", "replace").split()
        names = [os.path.basename(w) for w in words[:2]]  # /usr/bin/env python3
        if any(n.startswith("python") for n in names):
            return PYTHON
        if any(n in _SHELLS for n in names):
            return SHELL
        why = f"its #! line runs {' '.join(words[:2]) or 'nothing'}"
    elif b"\0" in head:
        why = "it is a binary file"
    elif len(head) == _READ:  # too long to parse here: text without #!, as python reads it
        return PYTHON
    else:
        try:
            compile(head, str(path), "exec", dont_inherit=True)
            return PYTHON
        except (SyntaxError, ValueError):
            why = "it does not parse as Python and has no #! line"
    raise UsageError(
        f"script {path} is neither a Python file nor a shell script ({why}); "
        "name it .py or .sh, or give it a #!python / #!/bin/bash line"
    )


def _check(launcher: str, kind: str, script: str) -> None:
    try:
        check_program(launcher, kind, script)
    except PlanError as e:
        raise UsageError(str(e)) from e


def _no_symlink_loop(script: str) -> None:
    """A SCRIPT whose links go round in circles: one line (``Path.resolve`` raises
    RuntimeError for it before Python 3.13, a traceback)."""
    import errno

    try:
        os.stat(script)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise UsageError(f"script {script}: a symlink loop ({e.strerror})") from None
    except ValueError:  # a NUL in the name
        raise UsageError(f"script {script!r}: not a file name") from None


def _in_code_dir(script: str, code_dir: str) -> str:
    """SCRIPT as a POSIX path relative to the code dir that push ships; UsageError if outside."""
    root = Path(code_dir).resolve()
    path = Path(script)
    full = (path if path.is_absolute() else Path.cwd() / path).resolve()
    if not full.is_file():
        raise UsageError(f"script not found: {script}")
    try:
        rel = full.relative_to(root)
    except ValueError as e:
        raise UsageError(f"script {script} is outside the code dir {root} (see --code-dir)") from e
    return rel.as_posix()


def _require_module(module: str) -> None:
    """A dotted module name; one not in the pushed code is looked for installed by the check."""
    if not all(p.isidentifier() for p in module.split(".")):
        raise UsageError(f"-m {module}: not a module name (dotted Python identifiers)")


def module_in_code(module: str, where: Path) -> bool:
    """Whether ``python -m MODULE`` run in ``where`` (the job's folder of the pushed code) finds
    it there, before anything installed: ``MODULE.py`` or ``MODULE/__main__.py``."""
    base = where.joinpath(*module.split("."))
    return base.with_suffix(".py").is_file() or (base / "__main__.py").is_file()


def installed_module(
    kind: str, script: str, code_dir: str | Path | None, folder: str
) -> str | None:
    """``run -m MODULE`` of a module not in the pushed code (``accelerate.commands.launch``, a
    pip-installed trainer): the module the node python must find installed (the check asks);
    None for a script, or a module of the code."""
    if kind != MODULE or code_dir is None:
        return None
    return None if module_in_code(script, Path(code_dir) / (folder or ".")) else script
