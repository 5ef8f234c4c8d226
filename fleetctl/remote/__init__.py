"""Programs that run on the nodes: stdlib only, Python >= 3.8, shipped as source.

Nothing here is imported by a node: the controller reads each file with :func:`source` and
sends it with ``python -c`` (:func:`inline`), or once per content hash into the node's workdir
(then run by :func:`file_argv`).
"""

from __future__ import annotations

import functools
import hashlib
import posixpath
from pathlib import Path

HERE = Path(__file__).resolve().parent

# Node programs are stdlib only, so their python skips ``site`` (``-S``): its .pth files cost
# every start ~36 ms of CPU with this machine's python (an editable install's finder, certifi),
# more in a big conda env, and a no-op run starts several node programs on every node. Not for
# what runs the user's packages: the launcher-module import, envinfo, the job itself.
NO_SITE = "-S"


def path(name: str) -> Path:
    """The file of node program ``name`` (e.g. ``"supervisor.py"``)."""
    return HERE / name


def source(name: str) -> bytes:
    """The source of node program ``name``, as shipped to nodes."""
    return path(name).read_bytes()


# ``python -c`` puts the current folder first on sys.path, and a node program starts in the
# login's home: a user's ~/json.py or ~/queue.py would replace the stdlib module the program
# imports (3.11's -P, for any python). Every program sent with -c drops that entry first.
_DROP_CWD = 'import sys\nif sys.path and sys.path[0] == "":\n    del sys.path[0]\n'


def inline(name: str) -> str:
    """Node program ``name`` as ``python -c`` code that cannot import from the current folder.

    Compiled inside the -c code so that the program's ``from __future__`` line stays its first
    statement; run in the -c module's own namespace, as -c would run it.
    """
    src = source(name).decode("utf-8")
    return _DROP_CWD + f"exec(compile({src!r}, {'fleetctl-' + name!r}, 'exec'))\n"


def guarded(code: str) -> str:
    """Short ``python -c`` code (not a node program file) that cannot import from the current
    folder either: the launcher-module import, the probe's bootstrap."""
    return _DROP_CWD + code


# Runs an installed node program file as a module, so its bytecode is cached next to it
# (``__pycache__``, per python version): run as a script, the supervisor's 70 KB source is
# compiled at every start (~12 ms of CPU here, on every node, for every launch). Its folder
# takes the place of the current folder on sys.path, as it would for a script; the module's
# ``program()`` runs it as its ``__main__`` block would.
RUN_FILE = (
    "import sys\n"
    "p = sys.argv.pop(1)\n"
    "d, n = p.rsplit('/', 1)\n"
    "if sys.path and sys.path[0] == '':\n"
    "    sys.path[0] = d\n"
    "else:\n"
    "    sys.path.insert(0, d)\n"
    "__import__(n[:-3]).program()\n"
)


def file_argv(python: str, path: str, *args: str) -> list[str]:
    """argv that runs the node program installed at ``path`` (``<folder>/<module>.py``)."""
    return [python, NO_SITE, "-c", RUN_FILE, path, *args]


# INSTALLER: runs a node program from its installed file (``W/bin/<stem>_<sha12>.py``,
# imported so its bytecode is cached: no compile of its source at every start) or, the first
# time, installs it there from the source it carries. The decision is made in Python, not by
# the login shell: one plain command line that csh and fish pass on as sh does. The file is
# written atomically under a name of its own (nodes on one shared home may do this at once,
# with equal pids). A workdir that cannot take it (read-only, full) runs it from the source
# this time; the program itself then says what is wrong with the workdir. Expects ``SOURCE()``
# and ``NAME`` defined before it; stays parseable by Python 2 (the probe's bootstrap, which
# tells old pythons apart, ends with it).
INSTALLER = (
    "import os\n"
    "p = os.path.expanduser(sys.argv.pop(1))\n"
    "d, n = os.path.split(p)\n"
    "m = None\n"
    "if p and os.path.isfile(p):\n"
    "    sys.path.insert(0, d)\n"
    "    m = __import__(n[:-3])\n"
    "elif p:\n"
    "    t = '%s.%d.%s.part' % (p, os.getpid(), os.urandom(4).hex())\n"
    "    try:\n"
    "        os.makedirs(os.path.dirname(d) or '.', 0o700, exist_ok=True)\n"
    "        os.makedirs(d, 0o700, exist_ok=True)\n"
    "        fd = os.open(t, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)\n"
    "        with os.fdopen(fd, 'w', encoding='utf-8') as f:\n"
    "            f.write(SOURCE())\n"
    "        os.replace(t, p)\n"
    "    except OSError:\n"
    "        try:\n"
    "            os.unlink(t)\n"
    "        except OSError:\n"
    "            pass\n"
    "    else:\n"
    "        sys.path.insert(0, d)\n"
    "        m = __import__(n[:-3])\n"
    "if m is None:\n"
    "    exec(compile(SOURCE(), NAME, 'exec'))\n"
    "else:\n"
    "    m.program()\n"
)


@functools.cache
def digest(name: str) -> str:
    """Node program ``name``'s content hash (12 hex): its installed file's name carries it."""
    return hashlib.sha256(source(name)).hexdigest()[:12]


def installed_path(workdir: str, name: str) -> str:
    """Where node program ``name`` is installed under a workdir (``~/…`` left unexpanded)."""
    stem = name[: -len(".py")]
    return posixpath.join(workdir, "bin", f"{stem}_{digest(name)}.py")


@functools.cache
def install_inline(name: str) -> str:
    """``python -c`` code that runs node program ``name`` installed at ``sys.argv[1]``,
    installing it there first when it is missing (``INSTALLER``)."""
    src = source(name).decode("utf-8")
    head = f"def SOURCE():\n    return {src!r}\n\nNAME = {'fleetctl-' + name!r}\n"
    return _DROP_CWD + head + INSTALLER


def cached_argv(python: str, workdir: str, name: str, *args: str) -> list[str]:
    """argv that runs node program ``name`` with ``args`` from its file under ``workdir``,
    installed on the way when it is not there yet. The program defines ``program()``, run in
    place of its ``__main__`` block."""
    return [python, NO_SITE, "-c", install_inline(name), installed_path(workdir, name), *args]
