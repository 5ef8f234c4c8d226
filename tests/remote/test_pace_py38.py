"""The slow-node sampler (``remote/kit/pace.py``) run by Python 3.8 on real processes: a rank
that computes reads busy, one asleep (as in a collective's wait) reads idle, and a cpu
cgroup's throttling is read from its cpu.stat."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from conftest import node_tree

SAMPLE = """
import json, os, subprocess, sys, time
sys.path.insert(0, sys.argv[1])
from remote.kit import pace
busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
# the asleep rank says when it reaches its sleep: its start-up before that computes or waits for
# a CPU (seconds of it on a loaded box) and rightly reads busy
idle = subprocess.Popen(
    [sys.executable, "-c", "import sys, time; sys.stdout.write('up'); sys.stdout.flush(); "
     "time.sleep(120)"], stdout=subprocess.PIPE)

def stat(pid):
    with open("/proc/%d/stat" % pid) as f:
        rest = f.read().rsplit(")", 1)[1].split()
    return rest[0], int(rest[11]) + int(rest[12])  # state, utime + stime (ticks)

try:
    deadline = time.time() + 40
    assert idle.stdout.read(2) == b"up"
    while stat(idle.pid)[0] != "S" and time.time() < deadline:  # now in its sleep
        time.sleep(0.01)
    s = pace.PaceSampler(lambda: {"0": busy.pid, "1": idle.pid}, cgroup_root=sys.argv[2])
    time.sleep(0.3)
    assert s.report() is None  # the first sight of each rank: nothing to compare with yet
    ran = stat(busy.pid)[1]
    # the supervisor's interval: the kernel adds a wait for a CPU to the account only when it
    # ends, so one wait under way at a read is missing (~0.2 s at load 20: a quarter of 0.8 s)
    time.sleep(pace.REPORT)
    while stat(busy.pid)[1] - ran < 3 and time.time() < deadline:  # a loaded box: it had a CPU
        time.sleep(0.1)
    with open(sys.argv[3], "w") as f:  # the cgroup throttled in 30 of 40 more periods
        f.write("nr_periods 50\\nnr_throttled 35\\nthrottled_time 9\\n")
    print(json.dumps(s.report()))
finally:
    busy.kill(); idle.kill(); busy.wait(); idle.wait()
"""


def _cgroup_of_self() -> str:
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, ctls, path = line.split(":", 2)
        if "cpu" in ctls.split(","):
            return path
    return next(ln.split(":", 2)[2] for ln in Path("/proc/self/cgroup").read_text().splitlines())


def test_the_pace_sampler_tells_a_computing_rank_from_a_waiting_one(
    py38: str, tmp_path: Path
) -> None:
    """The busy rank runs (or waits for a CPU) nearly all the time and the sleeping one almost
    never; the throttled share is the cgroup's new throttled periods over its new periods."""
    rel = _cgroup_of_self().lstrip("/")
    v1 = Path("/proc/self/cgroup").read_text().count(":cpu") > 0
    folder = tmp_path / ("cpu" if v1 else "") / rel
    folder.mkdir(parents=True, exist_ok=True)
    stat = folder / "cpu.stat"
    stat.write_text("nr_periods 10\nnr_throttled 5\nthrottled_time 1\n")
    out = subprocess.run(
        [py38, "-c", SAMPLE, node_tree(), str(tmp_path), str(stat)],
        capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    said = json.loads(out.stdout)
    assert said["ranks"]["0"]["busy"] > 0.8, said
    assert said["ranks"]["1"]["busy"] < 0.1, said
    assert said["ranks"]["0"]["cpu"] > said["ranks"]["1"]["cpu"] == 0.0, said  # low when loaded
    assert said["throttled"] == 0.75, said


FILE = """
import json, sys
sys.path.insert(0, sys.argv[1])
from remote.kit import pace
send = pace.pace_file(sys.argv[2])
send(b'{"ranks": {"0": {"busy": 0.9}}, "throttled": null}')
send(b'{"ranks": {"0": {"busy": 0.2}}, "throttled": 0.5}')
again = pace.pace_file(sys.argv[2])  # a supervisor that restarted
again(b'{"ranks": {}, "throttled": null}')
print(open(sys.argv[2] + "/pace.json").read())
"""


def test_a_detached_supervisor_keeps_its_latest_pace_report_for_status(
    py38: str, tmp_path: Path
) -> None:
    """Detached (no channel), each report replaces the last in pace.json with a sequence
    number that only grows, which ``status`` answers for the job monitor."""
    out = subprocess.run(
        [py38, "-c", FILE, node_tree(), str(tmp_path)],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    got = json.loads(out.stdout)
    assert got == {"seq": 3, "report": {"ranks": {}, "throttled": None}}
    assert (tmp_path / "pace.json").stat().st_mode & 0o077 == 0
