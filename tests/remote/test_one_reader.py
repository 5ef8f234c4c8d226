"""One /proc reader (``remote/kit/procfs.py``) and one frame writer (``remote/kit/framing.py``):
guards that fail when a second parser or writer appears, and the writer run by Python 3.8.

The guards read source text, as a reviewer would grep: /proc/PID/stat and /proc/PID/environ
are opened, and /proc is listed, only in procfs.py (anywhere under fleetctl/); a node program
writes to stdout only through framing.py, except the few named below with their reason.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

from conftest import node_tree

from fleetctl import remote
from fleetctl.remote.kit.framing import dumps, line

ROOT = Path(remote.__file__).resolve().parent.parent.parent  # the checkout
#: what only procfs.py may do: open a process's stat or environ, list /proc
PROC_PARSERS = re.compile(r"""/(stat|environ)["']|listdir\(\s*["']/proc["']""")
#: node programs that write their stdout themselves, and why
OWN_STDOUT = {
    "bootstrap.py": "tells pythons too old for the programs apart: it must parse as Python 2",
    "envinfo.py": "run by a pushed env's python, whatever its version: one self-contained file",
    "collective.py": "raw text frames from several threads under its own lock, around torch",
}


def _sources(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(ROOT)): p.read_text(encoding="utf-8")
        for p in sorted(folder.rglob("*.py"))
        if "__pycache__" not in p.parts
    }


def test_only_procfs_parses_proc_stat_or_environ_or_lists_proc() -> None:
    found = {
        name: sorted({m.group(0).strip() for m in PROC_PARSERS.finditer(src)})
        for name, src in _sources(ROOT / "fleetctl").items()
        if name != "fleetctl/remote/kit/procfs.py" and PROC_PARSERS.search(src)
    }
    assert found == {}, "use fleetctl/remote/kit/procfs.py, the one /proc reader"


def test_the_guard_would_see_a_second_parser() -> None:
    for text in ('open(f"/proc/{pid}/stat", "rb")', "open('/proc/' + n + '/environ')"):
        assert PROC_PARSERS.search(text), text
    assert PROC_PARSERS.search('for name in os.listdir("/proc"):')
    assert not PROC_PARSERS.search('open("/proc/self/mountinfo")')


def test_node_programs_write_frames_only_through_framing() -> None:
    # a statement that writes stdout (code in string literals, shipped elsewhere, is not one)
    writers = re.compile(r"^[ \t]*(sys\.stdout\.write\(|print\((?![^\n]*file=sys\.stderr))", re.M)
    found = {
        name: len(writers.findall(src))
        for name, src in _sources(remote.HERE).items()
        if Path(name).name not in {"framing.py", "__init__.py", *OWN_STDOUT} and writers.search(src)
    }
    assert found == {}, "write frames with fleetctl/remote/kit/framing.py"
    assert all(remote.path(name).is_file() for name in OWN_STDOUT)


#: values the node programs send: nested, unicode, floats, None, sorted or not
VALUES = [
    {"b": [1, 2.5, None, True], "a": {"z": "é", "y": ""}},
    ["x", {"n": -1, "f": 1e-09}],
    "plain",
]


def test_python_3_8_writes_frames_as_json_would(py38: str) -> None:
    """framing.dumps (json's C encoder) gives json.dumps's bytes on the node's oldest python."""
    code = (
        "import json, sys; sys.path.insert(0, sys.argv[1]); "
        "from remote.kit import framing\n"
        "vals = json.loads(sys.stdin.read())\n"
        "for v in vals:\n"
        "    for s in (False, True):\n"
        "        assert framing.dumps(v, s) == json.dumps(v, sort_keys=s), (v, s)\n"
        "    framing.frame('D', v, sort_keys=True)\n"
        "sys.stdout.buffer.write(framing.line('L', b'a line') + framing.line('H'))\n"
    )
    res = subprocess.run(
        [py38, "-S", "-c", code, node_tree()],
        input=json.dumps(VALUES).encode(),
        capture_output=True,
        timeout=60,
    )
    assert res.returncode == 0, res.stderr.decode()
    want = [f"D {json.dumps(v, sort_keys=True)}" for v in VALUES] + ["L a line", "H"]
    assert res.stdout.decode().splitlines() == want
    assert [dumps(v) for v in VALUES] == [json.dumps(v) for v in VALUES]
    assert line("E", b"x") == b"E x\n"
