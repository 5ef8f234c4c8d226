"""The supervisor's line protocol, as the controller reads it, and the run summary wording."""

from __future__ import annotations

import contextlib
import os
import select
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from fleetctl.api.runspec import Supervision
from fleetctl.cli.render import LiveLog, fold_ranks
from fleetctl.cli.render_summary import run_summary_lines
from fleetctl.job.records.result import JobResult, NodeOutcome
from fleetctl.phases.frames import Frame, FrameReader, parse_block, parse_frame
from fleetctl.phases.launch import exit_code_of, start_command


@pytest.mark.parametrize(
    ("line", "kind", "payload"),
    [
        (b"L hello world", "L", b"hello world"),
        (b"L ", "L", b""),
        (b"L", "L", b""),
        (b"H", "H", b""),
        (b"X 0", "X", b"0"),
        (b"X -9", "X", b"-9"),
        (b'S {"pid": 1}', "S", b'{"pid": 1}'),
        (b"E stopping job: x", "E", b"stopping job: x"),
        (b"L keeps\rcarriage\rinside", "L", b"keeps\rcarriage\rinside"),
        (b"L trailing cr\r", "L", b"trailing cr"),
        (b"Hello from .bashrc", "?", b"Hello from .bashrc"),
        (b"Z unknown kind", "?", b"Z unknown kind"),
        (b"", "?", b""),
    ],
)
def test_a_line_parses_into_its_frame(line: bytes, kind: str, payload: bytes) -> None:
    assert parse_frame(line) == Frame(kind, payload)


BLOCKS = [
    (b"L a\nL b\nL ", [Frame("L", b"a\nb\n")]),  # fast path: nothing but L lines
    (b"L a\nL\nL b", [Frame("L", b"a\n\nb")]),  # a bare "L" is an empty line
    (b"L a\r\nL b\rc", [Frame("L", b"a\nb\rc")]),  # trailing CR dropped, inner CR kept
    (b"L a\nH\nL b\nX 0", [Frame("L", b"a"), Frame("H"), Frame("L", b"b"), Frame("X", b"0")]),
    (b"noise\nL a\nL b", [Frame("?", b"noise"), Frame("L", b"a\nb")]),
    (b"L x\nLx", [Frame("L", b"x"), Frame("?", b"Lx")]),  # "Lx" is not an L frame
    (b"X 1", [Frame("X", b"1")]),
]


@pytest.mark.parametrize(("block", "frames"), BLOCKS)
def test_a_block_of_lines_merges_consecutive_output_lines(block: bytes, frames: list) -> None:
    assert parse_block(block) == frames
    # the same lines, frame by frame, say exactly the same thing
    flat = [parse_frame(x) for x in block.split(b"\n")]
    merged_back = []
    for f in frames:
        merged_back += [Frame("L", p) for p in f.payload.split(b"\n")] if f.kind == "L" else [f]
    assert merged_back == flat


def test_a_batching_reader_keeps_a_partial_line_for_the_next_chunk() -> None:
    r = FrameReader(batch_lines=True)
    assert r.feed(b"L one\nL tw") == [Frame("L", b"one")]
    assert r.feed(b"o\nL three\nX 0\n") == [Frame("L", b"two\nthree"), Frame("X", b"0")]
    assert r.feed(b"L tail") == [] and r.flush() == [Frame("L", b"tail")]


@pytest.mark.parametrize(
    ("payload", "code"), [(b"0", 0), (b"3", 3), (b"-15", -15), (b"", None), (b"x", None)]
)
def test_the_exit_frame_gives_the_code_or_minus_the_signal(payload: bytes, code: int) -> None:
    assert exit_code_of(Frame("X", payload)) == code


def test_a_line_split_across_chunks_is_delivered_whole_and_once() -> None:
    r = FrameReader()
    assert r.feed(b"L first li") == []
    assert r.feed(b"ne\nL sec") == [Frame("L", b"first line")]
    assert r.feed(b"ond\nH\nX 1") == [Frame("L", b"second"), Frame("H")]
    assert r.flush() == [Frame("X", b"1")]
    assert r.flush() == []


def test_utf8_split_inside_a_character_is_joined_before_decoding() -> None:
    data = "L naïve ✓\n".encode()
    r = FrameReader()
    frames = [f for i in range(len(data)) for f in r.feed(data[i : i + 1])]
    assert [f.text for f in frames] == ["naïve ✓"]


def test_the_start_command_quotes_paths_and_falls_back_to_the_loader() -> None:
    cmd = start_command("/opt/my env/bin/python", "/home/u/.fleetctl/bin/supervisor-abc.py")
    assert cmd.startswith("sh -c ")
    assert "'\"'\"'/opt/my env/bin/python'\"'\"'" in cmd  # quoted twice: sh -c inside the shell
    assert "supervisor-abc.py" in cmd and "run" in cmd


@pytest.mark.parametrize(
    ("ranks", "text"),
    [
        ([], ""),
        ([3], "3"),
        ([0, 2], "0,2"),
        ([0, 1], "0,1"),
        ([0, 1, 2], "0-2"),
        ([0, 1, 3, 4, 5, 6, 7], "0,1,3-7"),
        ([5, 1, 0], "0,1,5"),
    ],
)
def test_ranks_fold_into_short_lists(ranks: list[int], text: str) -> None:
    assert fold_ranks(ranks) == text


def _result(tmp_path: Path) -> JobResult:
    res = JobResult(job_id="j", folder=tmp_path, status="failed")
    res.nodes = [
        NodeOutcome(0, "node1", "10.0.0.2", state="stopped", signal=15),
        NodeOutcome(1, "node2", "10.0.0.3", "10.213.0.3", state="failed", exit_code=1),
        NodeOutcome(2, "node3", "10.0.0.4", state="stopped", signal=15),
    ]
    res.nodes[1].tail.extend(["step 1", "Traceback", "RuntimeError: boom"])
    res.first_failure = 1
    res.started = 1000.0
    res.failure_time = 1041.2
    return res


def test_the_summary_names_the_node_that_failed_first_and_the_stopped_ones(
    tmp_path: Path,
) -> None:
    lines = run_summary_lines(_result(tmp_path), tail_lines=2)
    assert lines[0] == (
        "Out of all 3 nodes, node 1 (node2 10.213.0.3) failed first: exit code 1 after 41.2 s;"
        " nodes 0,2 were stopped."
    )
    assert lines[1:4] == [
        "--- last 2 lines of node 1 (node2) ---",
        "Traceback",
        "RuntimeError: boom",
    ]
    assert lines[-1] == f"run folder: {tmp_path}"


def test_a_one_node_summary_names_the_node_instead_of_all_1_node(tmp_path: Path) -> None:
    res = JobResult(job_id="j", folder=tmp_path, status="succeeded")
    res.nodes = [NodeOutcome(0, "vm", "127.0.0.1", state="succeeded", exit_code=0)]
    res.started, res.ended = 1000.0, 1008.6
    assert run_summary_lines(res)[0] == "Node 0 (vm) succeeded in 8.6 s."
    res.status, res.nodes[0].state, res.nodes[0].exit_code = "failed", "failed", 1
    res.first_failure, res.failure_time = 0, 1003.0
    assert run_summary_lines(res)[0] == "Node 0 (vm 127.0.0.1) failed: exit code 1 after 3.0 s."
    res.status, res.first_failure, res.nodes[0].state = "interrupted", None, "stopped"
    assert (
        run_summary_lines(res)[0] == "Interrupted: job j stopped on its node (node 0 was stopped)."
    )


def test_the_summary_of_a_lost_node_says_lost(tmp_path: Path) -> None:
    res = _result(tmp_path)
    res.nodes[1].state, res.nodes[1].exit_code, res.nodes[1].reason = "lost", None, "no heartbeat"
    res.nodes[2].state = "lost"
    line = run_summary_lines(res)[0]
    assert "node 1 (node2 10.213.0.3) failed first: lost (no heartbeat) after 41.2 s" in line
    assert line.endswith("node 0 was stopped; node 2 was lost.")


def test_the_failed_node_tail_comes_from_the_collected_console_log(tmp_path: Path) -> None:
    res = _result(tmp_path)
    folder = tmp_path / "1-node2"
    folder.mkdir()
    (folder / "console.log").write_text("a\nb\nfrom the node\n")
    res.nodes[1].folder = str(folder)
    assert res.log_tail(1, 2) == ["b", "from the node"]
    assert f"node 1 logs: {folder}" in run_summary_lines(res)


def test_job_json_records_first_failure_and_every_node(tmp_path: Path) -> None:
    d = _result(tmp_path).to_dict()
    assert d["first_failure"]["rank"] == 1 and d["first_failure"]["after"] == 41.2
    assert d["first_failure"]["address"] == "10.213.0.3"
    assert [n["state"] for n in d["nodes"]] == ["stopped", "failed", "stopped"]
    assert d["nodes"][0]["signal"] == 15


class _Out:
    def __init__(self) -> None:
        self.writes: list[str] = []

    def write(self, s: str) -> None:
        self.writes.append(s)

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return False


@pytest.mark.parametrize(("tail", "shown"), [("all", [0, 1]), ("0", [0]), ("none", [])])
def test_live_lines_carry_the_node_prefix_and_follow_tail(tail: str, shown: list[int]) -> None:
    from fleetctl.job.records.result import JobEvent

    out, err = _Out(), _Out()
    live = LiveLog(tail=tail, colour=False, out=out, err=err)
    for rank in (0, 1):
        live(JobEvent("line", f"hello {rank}", rank, f"node{rank + 1}", time=time.time()))
    assert out.writes == [f"[{r} node{r + 1}] hello {r}\n" for r in shown]


def test_live_lines_are_coloured_per_node_on_request() -> None:
    from fleetctl.job.records.result import JobEvent

    out = _Out()
    live = LiveLog(colour=True, out=out, err=_Out())
    live(JobEvent("line", "x", 0, "a"))
    live(JobEvent("line", "y", 1, "b"))
    assert out.writes[0].startswith("\x1b[") and out.writes[0].endswith("[0 a]\x1b[0m x\n")
    assert out.writes[0][:5] != out.writes[1][:5]


def test_a_batch_of_lines_is_one_write_with_every_line_prefixed() -> None:
    from fleetctl.job.records.result import JobEvent

    out = _Out()
    live = LiveLog(colour=False, out=out, err=_Out())
    live(JobEvent("lines", rank=2, host="gpu03", lines=("step 1", "", "step 2")))
    assert out.writes == ["[2 gpu03] step 1\n[2 gpu03] \n[2 gpu03] step 2\n"]


def _node_run(stream: Any, rank: int = 0, name: str = "n1") -> Any:
    """A started node for the watch: its stream, nothing else of a real launch."""
    from fleetctl.node import Node
    from fleetctl.phases.launch import FrameReader, NodeRun

    return NodeRun(
        node=Node(name, "10.0.0.1"),
        rank=rank,
        conn=None,  # type: ignore[arg-type]
        stream=stream,
        reader=FrameReader(),
        python="python3",
        sup_path="s.py",
        run_dir="/r",
    )


class _ClosingStream:
    """A supervisor channel that has closed its write side: heartbeats fail, but its last
    lines and exit report are still buffered for us to read."""

    def __init__(self, data: bytes) -> None:
        self.chunks = [data[i : i + 7] for i in range(0, len(data), 7)]

    def send(self, data: bytes) -> None:
        raise OSError("channel closed")

    def recv(self, timeout: float) -> bytes | None:
        return self.chunks.pop(0) if self.chunks else b""

    def close(self) -> None:
        pass


def test_a_failed_heartbeat_still_delivers_the_buffered_tail_and_exit() -> None:
    from fleetctl.phases.watch import Watch

    lines = [f"line {i}" for i in range(50)]
    data = b"".join(f"L {x}\n".encode() for x in lines) + b"X 0\n"
    run = _node_run(_ClosingStream(data), 0, "n1")
    watch = Watch(Supervision(lost_timeout=2.0), heartbeat=0.05)
    watch.attach(run)
    events = []
    while not events or events[-1].kind != "exit":
        events.append(watch.events.get(timeout=5))
    watch.close()
    assert [x for e in events if e.kind == "lines" for x in e.lines] == lines
    assert events[-1].kind == "exit" and events[-1].code == 0
    assert watch.ended[0].kind == "exit"


def test_lines_arrive_in_one_event_per_chunk_in_the_node_order() -> None:
    """A chatty node costs one event per received chunk, and a notice or the exit between
    lines is never reordered around them."""
    from fleetctl.phases.watch import Watch

    run = _node_run(None, 0, "n1")
    watch = Watch()
    chunk = b"L a\nL b\nnoise from bashrc\nH\nE node says hi\nL c\nX 3\nL after exit\n"
    assert watch._handle(run, run.reader.feed(chunk)) is True
    got = []
    while not watch.events.empty():
        e = watch.events.get_nowait()
        got.append((e.kind, e.lines or e.text or e.code))
    assert got == [
        ("lines", ("a", "b", "noise from bashrc")),
        ("notice", "node says hi"),
        ("lines", ("c",)),
        ("exit", 3),
    ]


@pytest.mark.parametrize(
    ("line", "shown"),
    [
        ("\x1b[31mred\x1b[0m plain", "\x1b[31mred\x1b[0m plain"),  # colours pass
        ("\x1b[1;38;5;208mbold orange\x1b[m", "\x1b[1;38;5;208mbold orange\x1b[m"),
        ("a\x1b]52;c;ZXZpbA==\x07b", "a\\x1b]52;c;ZXZpbA==\\x07b"),  # OSC 52: clipboard write
        ("x\x1b]0;pwned\x1b\\y", "x\\x1b]0;pwned\\x1b\\y"),  # OSC 0 (title), ST-terminated
        ("\x1b[2J\x1b[Hcleared", "\\x1b[2J\\x1b[Hcleared"),  # clear screen, cursor home
        ("\x1bPq#0;2;0;0;0\x1b\\", "\\x1bPq#0;2;0;0;0\\x1b\\"),  # DCS (sixel)
        ("\x1bc reset", "\\x1bc reset"),  # full terminal reset
        ("bar 10%\rbar 50%\rbar 100%", "bar 100%"),  # what a terminal would show last
        ("done\r", "done"),
        ("bell\x07 nul\x00 del\x7f c1\x9b", "bell\\x07 nul\\x00 del\\x7f c1\\x9b"),
        ("tab\tstays, ünïcode stays", "tab\tstays, ünïcode stays"),
        ("", ""),
    ],
)
def test_job_output_reaches_the_terminal_with_colours_only(line: str, shown: str) -> None:
    from fleetctl.cli.render import terminal_safe

    assert terminal_safe(line) == shown


def test_live_output_is_made_safe_unless_raw_output_is_asked_for() -> None:
    import io

    from fleetctl.job.records.result import JobEvent

    line = "step 1 \x1b]0;owned\x07"
    for raw, want in ((False, "[0 n1] step 1 \\x1b]0;owned\\x07\n"), (True, f"[0 n1] {line}\n")):
        out = io.StringIO()
        live = LiveLog(colour=False, out=out, err=io.StringIO(), raw=raw)
        live(JobEvent("lines", rank=0, host="n1", lines=(line,)))
        assert out.getvalue() == want


class _PipeStream:
    """A supervisor channel as a pipe: selectable, heartbeats counted."""

    def __init__(self) -> None:
        self.r, self.w = os.pipe()
        self.beats = 0

    def fileno(self) -> int:
        return self.r

    def recv(self, timeout: float) -> bytes | None:
        ready, _, _ = select.select([self.r], [], [], timeout)
        return os.read(self.r, 65536) if ready else None

    def send(self, data: bytes) -> None:
        self.beats += data.count(b"h")

    def close(self) -> None:
        for fd in (self.r, self.w):
            with contextlib.suppress(OSError):
                os.close(fd)


def test_one_reader_thread_follows_64_nodes_and_a_silent_one_leaves_its_group() -> None:
    """130 nodes cost three reader threads, not 130; every node's lines and exit arrive and
    each is heartbeaten; a node that goes silent is handed to a thread of its own and lost."""
    from fleetctl.phases.watch import GROUP, Watch

    n = 2 * GROUP + 2
    streams = [_PipeStream() for _ in range(n)]
    runs = [_node_run(s, i, f"n{i}") for i, s in enumerate(streams)]
    watch = Watch(Supervision(lost_timeout=1.0), heartbeat=0.1)
    try:
        for run in runs:
            watch.attach(run)
        readers = [t for t in threading.enumerate() if t.name.startswith("watch-")]
        assert len(readers) == 3, [t.name for t in readers]
        time.sleep(0.3)
        for i, s in enumerate(streams[:-1]):  # the last node never says a word
            os.write(s.w, f"L hello {i}\nX 0\n".encode())
        assert watch.wait_ended(10.0) == []
        events = []
        while not watch.events.empty():
            events.append(watch.events.get_nowait())
        said = sorted(e.lines[0] for e in events if e.kind == "lines")
        assert said == sorted(f"hello {i}" for i in range(n - 1))
        assert {e.rank for e in events if e.kind == "exit"} == set(range(n - 1))
        [lost] = [e for e in events if e.kind == "lost"]
        assert lost.rank == n - 1 and lost.text.startswith("no heartbeat for")
        assert "watch-" + str(n - 1) in {t.name for t in watch._threads.values()}
        assert all(s.beats >= 1 for s in streams)
    finally:
        watch.close()
        for s in streams:
            s.close()


def _each_line(live: LiveLog, rank: int, host: str, lines: tuple[str, ...]) -> str:
    """The live view's text made one line at a time (terminal_safe, then the prefix): what
    the batch path must write."""
    from fleetctl.cli.render import _RANK_TAG, terminal_safe

    out = []
    for line in lines if live.raw else tuple(terminal_safe(x) for x in lines):
        m = _RANK_TAG.match(line)
        who = int(m.group(1)) if m else rank
        out.append(live._prefix(who, host, live.colour) + line[m.end() if m else 0 :])
    return "\n".join(out) + "\n"


BATCHES = [
    ("L3:0000001 " + "x" * 40, "L3:0000002 " + "x" * 40),  # a log flood's batch
    ("step 1", "", "step 2", ""),  # empty lines, one last
    ("[rank 5] loss 1.0", "launcher says hi", "[rank 12] loss 2.0", "[rank 5] done"),
    ("text [rank 5] not at the start", "[rank x] not a rank", "[rank 7]no space"),
    ("\x1b[31mred\x1b[0m", "plain"),  # a colour: the escaping path, kept as it is
    ("a\x1b]0;title\x07b", "bar 10%\rbar 90%", "nul\x00", "del\x7f"),
    ("ünïcode, ok", "c1 \x9b here", "nbsp\xa0and tab\tstay"),
    ("[rank 3] \x1b[2Jcleared", "two\nlines in one"),  # a newline inside a line
    ("[rank ３] fullwidth digit",),
    ("",),
]


@pytest.mark.parametrize("batch", BATCHES)
@pytest.mark.parametrize(("raw", "colour"), [(False, False), (False, True), (True, False)])
def test_a_batch_is_written_as_its_lines_one_at_a_time_would_be(
    batch: tuple[str, ...], raw: bool, colour: bool
) -> None:
    """The live view's batch path (C-level joins when nothing needs escaping) writes exactly
    what making each line terminal-safe and prefixing it one at a time writes."""
    from fleetctl.job.records.result import JobEvent

    out = _Out()
    live = LiveLog(colour=colour, out=out, err=_Out(), raw=raw)
    live(JobEvent("lines", rank=2, host="gpu03", lines=batch))
    assert out.writes == [_each_line(live, 2, "gpu03", batch)]


def test_a_batch_with_nothing_to_escape_is_never_escaped_line_by_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A log flood's batch (no control character, no rank tag) is made by joins alone:
    terminal_safe, ~3 µs a line, runs for no line of it; one odd line sends the batch the
    per-line way."""
    from fleetctl.cli import render
    from fleetctl.job.records.result import JobEvent

    calls: list[str] = []
    real = render.terminal_safe

    def counted(line: str) -> str:
        calls.append(line)
        return real(line)

    monkeypatch.setattr(render, "terminal_safe", counted)
    flood = tuple(f"L1:{i:07d} " + "x" * 40 for i in range(1000))
    live = LiveLog(colour=False, out=_Out(), err=_Out())
    live(JobEvent("lines", rank=1, host="n2", lines=flood))
    assert calls == []
    live(JobEvent("lines", rank=1, host="n2", lines=(*flood[:3], "bell\x07")))
    assert len(calls) == 4
