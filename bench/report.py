"""docs/benchmarks.md from measured ``Result`` rows. Formats numbers; never makes one up."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from common import Result

FLEETCTL = "fleetctl exec"

SECTIONS: list[tuple[str, str, str]] = [
    (
        "fanout",
        "1. Fan-out: `hostname` on N hosts",
        "Wall time of one invocation from process start to exit, every host checked to answer "
        "with its own name. Cold: every tool opens fresh SSH connections (ansible's "
        "ControlPersist is off so repetitions cannot reuse masters). `× fleetctl` = the tool's "
        "median / fleetctl exec's median at the same N (above 1: fleetctl is faster). "
        "`client CPU` = user+sys of the tool's processes (getrusage of children); the sshd and "
        "shell work on the hosts share the same 2 cores but are not in it. The in-process row is "
        "the floor for later phases of one `fleetctl run`: the same command over connections "
        "that are already open.",
    ),
    (
        "startup",
        "SSH layer profile: process start-up",
        "A fresh interpreter doing only the import named (what every CLI invocation pays).",
    ),
    (
        "handshake",
        "SSH layer profile: one handshake, no contention",
        "TCP connect → key exchange → auth, sequential against node1; `CPU` = this process's "
        "user+sys for the handshake. `kex` = what paramiko negotiated (from its debug log).",
    ),
    (
        "openssh",
        "SSH layer profile: OpenSSH client, one connection + `true`",
        "Client CPU of the OpenSSH client by key exchange (the CLI tools above use OpenSSH).",
    ),
    (
        "remote",
        "SSH layer profile: one remote command over an open connection",
        "sshd starts the user's shell for every command; its rc files run each time.",
    ),
    (
        "teardown",
        "2. Teardown latency (N = 8)",
        "`fleetctl run` of a script that fails on rank 1 while the others sleep: from rank 1's "
        "failing exit to the last process of the job gone on every node, from the run folder's "
        "own timestamps.",
    ),
    (
        "lost",
        "3. Lost-node latency",
        "`fleetctl run` on healthy nodes, then the lab cuts one node's link: from the cut to "
        "teardown finished on every other node.",
    ),
    (
        "push",
        "4. Push",
        "Code push (no-op and a 200 MB change) and env-archive distribution vs parallel rsync/"
        "scp; controller bytes sent from the push report or from the tools' own counters.",
    ),
    (
        "logs",
        "5. Log streaming",
        "16 nodes × 5,000 lines/s × 10 s through `fleetctl run`; lines counted in the collected "
        "logs; controller CPU and peak RSS of the `fleetctl` process.",
    ),
    (
        "pipeline",
        "6. Whole pipeline (no-op job, N = 8)",
        "`fleetctl run` of a script that exits 0 at once, split by phase from the run folder.",
    ),
]


def _s(x: float | None) -> str:
    return "—" if x is None else f"{x:.3f}"


def _extra_cell(values: Any) -> str:
    if isinstance(values, list):
        nums = [v for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]
        if nums and len(nums) == len(values):
            med = statistics.median(nums)
            return (
                f"{med:.3f}"
                if isinstance(med, float) and not float(med).is_integer()
                else f"{med:g}"
            )
        return ", ".join(str(v) for v in dict.fromkeys(values))
    return str(values)


def _fanout_summary(rows: list[Result]) -> list[str]:
    sizes = sorted({r.n for r in rows if r.n is not None})
    tools = list(dict.fromkeys(r.tool for r in rows))
    base = {r.n: r.median for r in rows if r.tool == FLEETCTL}
    head = "| tool | " + " | ".join(f"N={n} median s (× fleetctl)" for n in sizes) + " |"
    out = [head, "|---|" + "---|" * len(sizes)]
    for tool in tools:
        cells = []
        for n in sizes:
            r = next((x for x in rows if x.tool == tool and x.n == n), None)
            if r is None:
                cells.append("—")
            elif r.failed:
                cells.append(r.failed if r.failed.startswith("not measured") else "failed")
            else:
                ratio = f" ({r.median / base[n]:.2f}×)" if base.get(n) else ""
                cells.append(f"{_s(r.median)}{ratio}")
        out.append(f"| {tool} | " + " | ".join(cells) + " |")
    return out


def _table(rows: list[Result], ratio: bool) -> list[str]:
    keys: list[str] = []
    for r in rows:
        for k in r.extra:
            if k not in keys:
                keys.append(k)
    base = {r.n: r.median for r in rows if r.tool == FLEETCTL}
    head = ["measurement", "N", "median s", "min s", "max s"]
    if ratio:
        head.append("× fleetctl")
    head += [f"{k} (median)" if k != "note" else k for k in keys] + ["samples", "notes"]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        st = r.stats()
        cells = [r.tool, "" if r.n is None else str(r.n)]
        if st is None:
            cells += ["—", "—", "—"]
        else:
            cells += [_s(st[0]), _s(st[1]), _s(st[2])]
        if ratio:
            cells.append(f"{st[0] / base[r.n]:.2f}" if st and base.get(r.n) else "—")
        cells += [_extra_cell(r.extra[k]) if k in r.extra else "—" for k in keys]
        cells.append(str(len(r.samples)))
        notes = "; ".join(x for x in (r.note, r.failed or "") if x)
        cells.append(notes.replace("|", "/"))
        out.append("| " + " | ".join(cells) + " |")
    return out


def write_report(
    path: Path,
    meta: dict[str, Any],
    facts: dict[str, str],
    results: list[Result],
    skipped: dict[str, str],
) -> None:
    lines = [
        "# fleetctl benchmarks",
        "",
        f"Generated by `{meta['command']}` on {meta['date']} — every number below was measured "
        "in that run (rerun the command to refresh; do not edit by hand). "
        f"Samples per row: {meta['repeat']}{' (quick smoke run)' if meta['quick'] else ''}; "
        "median, min and max in seconds unless a column says otherwise.",
        "",
        "## Machine and tools",
        "",
        "| fact | value |",
        "|---|---|",
        *[f"| {k} | {v} |" for k, v in facts.items()],
        "",
        "The lab: one network namespace per host with its own sshd (ed25519 host key, key-only "
        "auth) on a bridge of this machine; controller, every sshd and every remote shell share "
        "the CPUs above.",
        "",
    ]
    measure_of = {
        "fanout": "fanout",
        "startup": "ssh",
        "handshake": "ssh",
        "openssh": "ssh",
        "remote": "ssh",
        "teardown": "teardown",
        "lost": "lost",
        "push": "push",
        "logs": "logs",
        "pipeline": "pipeline",
    }
    for group, title, intro in SECTIONS:
        rows = [r for r in results if r.group == group]
        lines += [f"## {title}", ""]
        why = skipped.get(measure_of[group])
        if not rows:
            lines += [f"{why or 'not measured: no result'}", ""]
            continue
        lines += [intro, ""]
        if group == "fanout":
            lines += [*_fanout_summary(rows), ""]
        lines += [*_table(rows, ratio=group == "fanout"), ""]
        if why:
            lines += [f"Partly {why}", ""]
    lines += ["## Raw samples (seconds)", "", "```"]
    for r in results:
        n = f" N={r.n}" if r.n is not None else ""
        lines.append(
            f"{r.group}: {r.tool}{n}: {[round(x, 4) for x in r.samples]}"
            + (f" FAILED {r.failed}" if r.failed else "")
        )
    lines += ["```", ""]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines))
