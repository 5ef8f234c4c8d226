"""Code that runs on the nodes (stdlib only, Python >= 3.8), and the controller's installer.

``programs/`` holds what runs on a node (the supervisor, the check's probe, the push helper, …),
``kit/`` the modules they import. A node program and the kit modules it imports ship as one
bundle, installed once per content hash under ``W/bin/<name>_<sha12>/`` (``INSTALLER``; two
entrances: argv and stdin), or run from memory with ``python -c`` (:func:`inline`). The
controller imports this module and a few kit modules (the wire format, the supervisor's
records, the /proc reader, …: ``tests/pure/test_layering.py``); never a program.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import json
import posixpath
import re
import shlex
import textwrap
import zlib
from pathlib import Path

HERE = Path(__file__).resolve().parent

# On a node this folder is the package ``remote`` (its own ``__init__`` empty: the installer
# stays home), so node modules import each other one way, relatively, there and here.
NODE_PACKAGE = "remote"
# Where the programs are, in that package: ``W/bin/<name>_<sha12>/remote/programs/<name>.py``.
PROGRAMS = f"{NODE_PACKAGE}.programs"

# Node programs are stdlib only, so their python skips ``site`` (``-S``): its .pth files cost
# every start ~36 ms of CPU with this machine's python (an editable install's finder, certifi),
# more in a big conda env, and a no-op run starts several node programs on every node. Not for
# what runs the user's packages: the launcher-module import, envinfo, the job itself.
NO_SITE = "-S"


def path(name: str) -> Path:
    """The file of node program ``name`` (e.g. ``"supervisor.py"``)."""
    return HERE.joinpath(*PROGRAMS.split(".")[1:], name)


def source(name: str) -> bytes:
    """The source of node program ``name``, as shipped to nodes."""
    return path(name).read_bytes()


# ``python -c`` puts the current folder first on sys.path, and a node program starts in the
# login's home: a user's ~/json.py or ~/queue.py would replace the stdlib module the program
# imports (3.11's -P, for any python). Every program sent with -c drops that entry first.
_DROP_CWD = 'import sys\nif sys.path and sys.path[0] == "":\n    del sys.path[0]\n'


# Runs ``mods`` ([dotted name, source] pairs, each after the modules it imports; a package's
# source is None) as modules from memory: a bundle run without installing it. No import hook
# (importlib.util costs every exec's start milliseconds): each is put in sys.modules and run,
# in that order, with its ``__package__``, so its relative imports find the others.
_MEMORY = (
    "for k, v in mods:\n"
    "    m = type(sys)(k)\n"
    "    m.__file__ = 'fleetctl-' + k + '.py'\n"
    "    m.__package__ = k.rpartition('.')[0]\n"
    "    sys.modules[k] = m\n"
    "    if v is None:\n"
    "        m.__path__, m.__package__ = [], k\n"
    "    else:\n"
    "        exec(compile(v, m.__file__, 'exec'), m.__dict__)\n"
)


# Linux's limit on ONE argument (MAX_ARG_STRLEN, 32 pages): ``python -c CODE`` and the ssh
# command line that carries it (``sh -c``) each fail with E2BIG past it. ARG_MARGIN: how close
# any argument a node program travels in may come (``argument_sizes``; a pure test guards it).
MAX_ARG_STRLEN = 128 * 1024
ARG_MARGIN = 8 * 1024

# A program whose -c code is over COMPRESS_OVER goes compressed: zlib, then base64 (no quotes,
# so ``shlex.quote`` adds nothing), unpacked by a line before it. Plain, the supervisor's came
# within a few hundred bytes of MAX_ARG_STRLEN; compressed it is ~40% of that. Not below: the
# unpacking imports binascii and zlib (~1.5 ms of CPU at each start on a pyenv 3.8, where both
# are shared libraries; bench/by_hand.md), which the small, frequent ones (exec's timeout
# wrapper, the port probe) need not pay. Its first line names the program in clear, as the
# plain form's compile() does: `ps`, an operator and the tests find a node program by
# ``fleetctl-NAME`` in its command line.
COMPRESS_OVER = 32 * 1024
# zlib's level for bundles and packed inline code, made at every command's start (a bundle's
# bytes are its name): 6, zlib's default, is half level 9's CPU (the supervisor: ~4.7 vs ~10 ms,
# ~23 vs ~11 ms for every program) for 0.4% more bytes (tests/pure/test_inline_room.py: room)
ZLEVEL = 6
_UNPACK = "# {}\nimport binascii, zlib\nexec(zlib.decompress(binascii.a2b_base64({!r})))\n"


@functools.cache
def inline(name: str) -> str:
    """Node program ``name`` as ``python -c`` code that cannot import from the current folder,
    run from memory with the node modules it imports (nothing installed); compressed when
    large (``COMPRESS_OVER``).

    Compiled inside the -c code so that the program's ``from __future__`` line stays its first
    statement; run in the -c module's own namespace, as -c would run it.
    """
    mods, me = modules(name), module_name(name)
    rest: list[list[str | None]] = [[k, v] for k, v in mods.items() if k != me]
    serve = ""
    if rest:  # the program's relative imports, from the -c module: its package is PROGRAMS
        rest = [[k, None] for k in packages(mods)] + rest
        serve = f"mods = {rest!r}\n" + _MEMORY + f"__package__ = {PROGRAMS!r}\n"
    code = serve + f"exec(compile({mods[me]!r}, {'fleetctl-' + name!r}, 'exec'))\n"
    if len(code.encode("utf-8")) > COMPRESS_OVER:
        packed = base64.b64encode(zlib.compress(code.encode("utf-8"), ZLEVEL)).decode("ascii")
        code = _UNPACK.format("fleetctl-" + name, packed)
    return _DROP_CWD + code


def argument_sizes(name: str) -> dict[str, int]:
    """The bytes of each single argument node program ``name`` travels in: its inline code
    (also shell-quoted, as an ssh command line carries it), the argv entrance's code and
    bundle, the stdin entrance's code. Each must stay ``ARG_MARGIN`` under MAX_ARG_STRLEN."""
    return {
        "inline code": len(inline(name).encode()),
        "inline code, shell-quoted": len(shlex.quote(inline(name)).encode()),
        "argv entrance code": len(argv_entrance().encode()),
        "argv entrance bundle": len(packed(name)),
        "stdin entrance code": len(stdin_entrance().encode()),
    }


def guarded(code: str) -> str:
    """Short ``python -c`` code (not a node program file) that cannot import from the current
    folder either: the launcher-module import, the probe's bootstrap."""
    return _DROP_CWD + code


# --------------------------------------------------------------------------- the installer
#
# Run by INSTALLER right after it installed a new hash of ``main`` into ``d``: the program's
# folders of other hashes are removed once they are older than PRUNE_DAYS, except the newest
# PRUNE_KEEP of them (going back a version finds its bytecode). Nothing else would ever remove
# them, and every upgrade of fleetctl leaves one per program. A folder's mtime is when it was
# installed; a supervisor still running from a removed one has imported its modules already
# (its later imports are stdlib). Never fatal: the program runs whatever happens here.
PRUNE_DAYS = 7
PRUNE_KEEP = 2
_PRUNE = (
    "try:\n"
    "    import time\n"
    "    old = []\n"
    "    for x in os.listdir(d):\n"
    "        q, h = os.path.join(d, x), x[len(main) + 1 :]\n"
    "        if x[: len(main) + 1] == main + '_' and len(h) == 12 and h.isalnum() and q != p:\n"
    "            old.append((os.path.getmtime(q), q))\n"
    f"    for m, q in sorted(old)[:-{PRUNE_KEEP}]:\n"
    f"        if m < time.time() - {PRUNE_DAYS * 86400}:\n"
    "            __import__('shutil').rmtree(q, True)\n"
    "except OSError:\n"
    "    pass\n"
)

# A node program and the kit modules it imports (``from ..kit.x import …``, the same line on a
# node) travel as one bundle: zlib of ``{"main": stem, "packages": [...], "modules": {dotted
# name: source}, "order": [...]}``, named by its sha256 (12 hex). INSTALLER puts the bundle's
# files, as the package ``remote``, into ``W/bin/<stem>_<sha12>/`` once and imports the program
# from there, so every later start runs cached bytecode
# (``__pycache__`` next to the files, per python version). Not a zip run by zipimport: that
# compiles every module at every start (zipimport never writes .pyc), ~12 ms of CPU for the
# supervisor alone. The folder is made under a name of its own and renamed into place (nodes
# of one shared home may do it at once); a workdir that cannot take it runs the bundle from
# memory this time and the program says what is wrong with the workdir. Two entrances feed
# it: ARGV (the bundle in argv, base64) and STDIN (``U``, then ``<length>\n<bundle>`` on
# stdin, checked against the folder's name). Expects ``BUNDLE()``; parseable by Python 2
# (the probe's bootstrap, which tells old pythons apart, ends with it).
INSTALLER = (
    "import os\n"
    "p = os.path.expanduser(sys.argv.pop(1))\n"
    "d, n = os.path.split(p)\n"
    "main = n.rsplit('_', 1)[0]\n"
    "mods = None\n"
    "if not os.path.isdir(p):\n"
    "    import json, zlib\n"
    "    b = json.loads(zlib.decompress(BUNDLE()).decode('utf-8'))\n"
    "    mods, main, pkgs = b['modules'], b['main'], b['packages']\n"
    "    t = '%s.%d.%s.part' % (p, os.getpid(), os.urandom(4).hex())\n"
    "    try:\n"
    "        os.makedirs(d, 0o700, exist_ok=True)\n"
    "        os.mkdir(t, 0o700)\n"
    "        for k in pkgs:\n"
    "            os.mkdir(os.path.join(t, *k.split('.')), 0o700)\n"
    "        for k in pkgs + list(mods):\n"
    "            f = os.path.join(t, *k.split('.')) + ('/__init__' if k in pkgs else '') + '.py'\n"
    "            fd = os.open(f, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)\n"
    "            with os.fdopen(fd, 'w', encoding='utf-8') as f:\n"
    "                f.write(mods.get(k, ''))\n"
    "        try:\n"
    "            os.rename(t, p)\n"
    "        except OSError:\n"
    "            if not os.path.isdir(p):\n"
    "                raise\n"
    "            __import__('shutil').rmtree(t, True)\n"
    "        else:\n" + textwrap.indent(_PRUNE, " " * 12) + "        mods = None\n"
    "    except OSError:\n"
    "        __import__('shutil').rmtree(t, True)\n"
    "        mods = [[k, mods.get(k)] for k in b['order']]\n"
    "if sys.argv[1:] == ['--install-only']:\n"
    "    sys.exit(0 if mods is None else 1)\n"
    "if mods is None:\n"
    # a hand-off: the probe's own package is in sys.modules, under the same name
    f"    for k in [k for k in sys.modules if k.split('.')[0] == {NODE_PACKAGE!r}]:\n"
    "        del sys.modules[k]\n"
    "    sys.path.insert(0, p)\n"
    "else:\n"
    + textwrap.indent(_MEMORY, "    ")
    + f"__import__({PROGRAMS + '.'!r} + main, None, None, ['program']).program()\n"
)

# The ARGV entrance: ``python -c ARGV <install folder> <base64 bundle> ARGS…``.
ARGV_HEAD = (
    "import sys\n"
    "_B = sys.argv.pop(2)\n"
    "def BUNDLE():\n"
    "    import base64\n"
    "    return base64.b64decode(_B)\n"
)

# The STDIN entrance: ``python -c STDIN <install folder> ARGS…``; only a missing folder asks
# (``U``) for the bundle, so a start costs one remote command whether or not it was there.
STDIN_HEAD = (
    "import sys\n"
    "def _read(n):\n"
    "    import os\n"
    "    data = b''\n"
    "    while len(data) < n:\n"
    "        chunk = os.read(0, n - len(data))\n"
    "        if not chunk:\n"
    "            sys.exit(98)\n"
    "        data += chunk\n"
    "    return data\n"
    "def BUNDLE():\n"
    "    import hashlib, os\n"
    "    os.write(1, b'U\\n')\n"
    "    h = b''\n"
    "    while not h.endswith(b'\\n'):\n"
    "        h += _read(1)\n"
    "    data = _read(int(h))\n"
    "    if hashlib.sha256(data).hexdigest()[:12] != p.rsplit('_', 1)[1]:\n"
    "        os.write(1, b'F node program upload corrupted\\nX 127\\n')\n"
    "        sys.exit(97)\n"
    "    return data\n"
)


# Runs an installed program folder (``W/bin/<stem>_<sha12>/``) without installing it: the
# one-shot modes of a supervisor that is there (the start line put it there). Its folder takes
# the place of the current folder on sys.path; the module's ``program()`` runs it.
RUN_FILE = (
    "import sys\n"
    "p = sys.argv.pop(1).rstrip('/')\n"
    "if sys.path and sys.path[0] == '':\n"
    "    sys.path[0] = p\n"
    "else:\n"
    "    sys.path.insert(0, p)\n"
    f"__import__({PROGRAMS + '.'!r} + p.rsplit('/', 1)[-1].rsplit('_', 1)[0], None, None,"
    " ['program']).program()\n"
)


def file_argv(python: str, path: str, *args: str) -> list[str]:
    """argv that runs the node program installed at ``path`` (its folder)."""
    return [python, NO_SITE, "-c", RUN_FILE, path, *args]


def argv_entrance() -> str:
    """``python -c`` code of the ARGV entrance (see ``INSTALLER``)."""
    return _DROP_CWD + ARGV_HEAD + INSTALLER


def stdin_entrance() -> str:
    """``python -c`` code of the STDIN entrance (see ``INSTALLER``)."""
    return _DROP_CWD + STDIN_HEAD + INSTALLER


# ``from .x import …`` / ``from ..kit.x import …`` at a line's start (the one form node modules
# import each other by). A pattern, not ``ast``: launch threads ask at once, and Python 3.11.7's
# ast.parse is not safe across threads ("AST constructor recursion depth mismatch", gh-106905).
_RELATIVE = re.compile(r"^[ \t]*from (\.+)([\w.]+) import ", re.M)


def module_name(name: str) -> str:
    """Node program ``name``'s module on a node (``"supervisor.py"``:
    ``remote.programs.supervisor``)."""
    return ".".join((NODE_PACKAGE, *path(name).relative_to(HERE).with_suffix("").parts))


def _imported(module: str, src: str) -> list[str]:
    """The node modules ``module`` (dotted, on a node) imports, relative ones resolved."""
    package = module.split(".")[:-1]
    return [
        ".".join([*package[: len(package) - len(dots) + 1], rel])
        for dots, rel in _RELATIVE.findall(src)
    ]


@functools.cache
def modules(name: str) -> dict[str, str]:
    """Node program ``name`` and every node module it imports, transitively: dotted name on a
    node -> source, each after the modules it imports (the program last)."""
    out: dict[str, str] = {}

    def visit(module: str) -> None:
        if module not in out:
            src = HERE.joinpath(*module.split(".")[1:]).with_suffix(".py").read_text("utf-8")
            out[module] = ""  # taken: an import cycle ends here
            for dep in _imported(module, src):
                visit(dep)
            out[module] = out.pop(module) or src

    visit(module_name(name))
    return out


def node_file(name: str) -> str:
    """Node program ``name``'s file in its install folder: ``remote/programs/supervisor.py``."""
    return module_name(name).replace(".", "/") + ".py"


def packages(mods: dict[str, str]) -> list[str]:
    """The packages holding ``mods`` (dotted names), each before those inside it."""
    return sorted({m.rsplit(".", i)[0] for m in mods for i in range(1, m.count(".") + 1)})


@functools.cache
def bundle(name: str) -> bytes:
    """Node program ``name``'s bundle (see ``INSTALLER``): the bytes its hash names."""
    mods, stem = modules(name), name[: -len(".py")]
    # ``python W/bin/<stem>_<sha12>/ MODE …`` runs it too (a folder's __main__.py)
    main = f"from {PROGRAMS} import {stem}\n\n{stem}.program()\n"
    pkgs = packages(mods)
    doc = {
        "main": stem,
        "packages": pkgs,
        "modules": {**mods, "__main__": main},
        "order": [*pkgs, *mods],
    }
    return zlib.compress(json.dumps(doc, sort_keys=True).encode("utf-8"), ZLEVEL)


@functools.cache
def packed(name: str) -> str:
    """The bundle as the ARGV entrance carries it (base64)."""
    return base64.b64encode(bundle(name)).decode("ascii")


@functools.cache
def digest(name: str) -> str:
    """Node program ``name``'s content hash (12 hex): its install folder's name carries it."""
    return hashlib.sha256(bundle(name)).hexdigest()[:12]


def installed_path(workdir: str, name: str) -> str:
    """Node program ``name``'s install folder under a workdir (``~/…`` left unexpanded)."""
    stem = name[: -len(".py")]
    return posixpath.join(workdir, "bin", f"{stem}_{digest(name)}")


def upload(name: str) -> bytes:
    """What the STDIN entrance reads after its ``U``: ``<length>\n<bundle>``."""
    data = bundle(name)
    return b"%d\n" % len(data) + data


def cached_argv(python: str, workdir: str, name: str, *args: str) -> list[str]:
    """argv that runs node program ``name`` with ``args`` from its install folder under
    ``workdir``, installed on the way (ARGV entrance). The program defines ``program()``,
    run in place of its ``__main__`` block."""
    path = installed_path(workdir, name)
    return [python, NO_SITE, "-c", argv_entrance(), path, packed(name), *args]


def stdin_argv(python: str, path: str, *args: str) -> list[str]:
    """argv that runs the node program installed at ``path``, asking for it on stdin first
    when missing (STDIN entrance; answer ``U`` with :func:`upload`)."""
    return [python, NO_SITE, "-c", stdin_entrance(), path, *args]
