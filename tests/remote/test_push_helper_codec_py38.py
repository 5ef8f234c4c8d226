"""The push helper's JSON through json's C half (``loads``/``dumps``), by Python 3.8: the same
text and values as the json module, and the json module itself where the C half is missing."""

from __future__ import annotations

import json
import subprocess

from conftest import node_tree

VALUES = [
    {"workdir": "/home/u/.fleetctl", "digest": "d1", "keep": 2, "allow": None, "x": True},
    {"path": "caf\u00e9/\u6f22\u5b57/\U0001f600", "bad": "a\udcffb", "ctl": 't\tn\n\x00q"\\'},
    {"f": 1.5, "big": 10**30, "neg": -3, "e": 1e-300, "list": [[], {}, [1, [2, {"a": []}]]]},
    [],
    "plain",
]

PROGRAM = """
import sys
sys.path.insert(0, sys.argv[1])
if sys.argv[2] == "no-c":
    sys.modules["_json"] = None  # import _json fails: the fallback
from remote.kit import pushbase  # the push helper's codec
values = pushbase.loads(sys.stdin.read())
texts = [pushbase.dumps(v) for v in values]
used_json = "json" in sys.modules  # the C half alone needs no json module
import json
out = [used_json]
for v, text in zip(values, texts):
    out.append([text, text == json.dumps(v), pushbase.loads(text) == v,
                pushbase.loads(" \\n" + json.dumps(v, indent=1) + "\\n") == v])
for bad in ('{"a": 1} x', '{"a": }', ''):
    try:
        pushbase.loads(bad)
        out.append("accepted " + repr(bad))
    except ValueError as e:
        out.append(type(e).__name__)
print(json.dumps(out))
"""


def test_the_push_helper_codec_matches_json_with_and_without_the_c_half(py38: str) -> None:
    folder = node_tree()
    for mode in ("c", "no-c"):
        res = subprocess.run(
            [py38, "-S", "-c", PROGRAM, folder, mode],
            input=json.dumps(VALUES),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert res.returncode == 0, res.stderr
        used_json, *rows, e1, e2, e3 = json.loads(res.stdout)
        assert used_json is (mode == "no-c")
        assert [r[1:] for r in rows] == [[True, True, True]] * len(VALUES), (mode, rows)
        assert [r[0] for r in rows] == [json.dumps(v) for v in VALUES]
        assert (e1, e2, e3) == ("JSONDecodeError",) * 3
