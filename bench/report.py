"""docs/benchmarks.md from measured ``Result`` rows. Formats numbers; never makes one up."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from common import Result

FLEETCTL = "fleetctl exec"
STARTUP_BASE = "python -c pass (interpreter)"
# The row each section's medians are divided by, and its column label.
RATIO_TO = {"fanout": (FLEETCTL, "fleetctl"), "startup": (STARTUP_BASE, "python -c pass")}
PARTIAL = " — PARTIAL: the run was still going when this was written"

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
        "A fresh interpreter doing only the import named (what every CLI invocation pays); "
        "`× python -c pass` = the row's median / the bare interpreter's. `fleetctl` commands "
        "import only their own module (fleetctl.cli.lazy): `--version` loads click alone, "
        "`exec` its inventory and SSH layer.",
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
        "2. Teardown latency",
        "`fleetctl run` (8 hosts; fewer with --quick) of a script that fails on rank 1 while the "
        "others sleep (each with a child `sleep`): from rank 1's own exit timestamp to the "
        "`teardown verified` event, i.e. every node scanned and no process carrying the job's "
        "FLEET_JOB_ID left (an upper bound on 'last process gone'). Default --grace 5.",
    ),
    (
        "lost",
        "3. Lost-node latency",
        "`fleetctl run` (8 hosts) with every rank sleeping; the lab cuts the last host's link: "
        "from the cut to teardown finished on every other node (the `stopping` event plus the "
        "teardown call's own duration). Default --lost-timeout 5.",
    ),
    (
        "elastic",
        "3a. A lost node: a hot spare (`run --elastic`) vs a full retry",
        "`fleetctl run --nodes 3` on 4 hosts (`--hosts 4`) of a torchrun DDP job (gloo, one rank "
        "per node) that keeps its step in its working folder and prints it with the time after "
        "every step; at step 8 the lab cuts node rank 2's link. `--elastic`: the spare joins the "
        "same rendezvous while the other two nodes' agents run on; `--max-retries 1`: the "
        "attempt ends, every node is torn down and attempt 2 starts on the two and the spare. "
        "Timing: from the cut to every rank's first step after it (the slowest rank's), from "
        "the job's own clocks; `--lost-timeout 3`. One sample each on a shared 2-core machine.",
    ),
    (
        "stall",
        "3b. Hung job: stall detection",
        "`fleetctl run --stall-timeout 3` (8 hosts) of a script whose every rank prints one "
        "line and then waits silently in a function: from the stall threshold (the last line "
        "any rank printed + 3 s) to fleetctl's exit, with every process's stack dumped (py-spy "
        "shipped to the nodes), the teardown verified and the logs collected. Goal ≤ 5 s.",
    ),
    (
        "push",
        "4. Push",
        "`fleetctl push` to 16 hosts (fewer with --quick) vs parallel `rsync -a` over ssh: a "
        "no-op push (both already hold the tree: 201 files), then a fresh incompressible 200 MB "
        "file per sample; env-archive distribution vs parallel `scp`. `controller MB (bridge)` = "
        "transmit counter of the lab bridge on this machine (every byte this machine sent to any "
        "lab host, headers included; host-to-host peer traffic is not in it); `payload MB` = what "
        "fleetctl's push report counts.",
    ),
    (
        "logs",
        "5. Log streaming",
        "Every node prints numbered lines at a fixed rate through `fleetctl run --tail all` "
        "(16 nodes × 5,000 lines/s × 10 s; tiny with --quick). Lost = numbered lines missing from "
        "fleetctl's live output, and from the collected console.log files. Controller CPU: "
        "getrusage of the `fleetctl` process (wait4, its children included); peak RSS: VmHWM of "
        "the fleetctl process itself, polled every 50 ms.",
    ),
    (
        "before",
        "5b. A `--before` task's output",
        "`fleetctl run --before fab.py:prepare` where the Fabric task prints 20 MB of 100-byte "
        "lines on each of 4 nodes (`yes … | head`): every line reaches the terminal with its "
        "node prefix and the node's `before.log` (a sample that loses one fails). Before the "
        "fix, invoke scanned everything captured so far on every 1000-byte read: ~0.1 MB/s.",
    ),
    (
        "pipeline",
        "6. Whole pipeline (no-op job)",
        "`fleetctl run` (8 hosts) of a script that exits 0 at once, after one untimed run so the "
        "code push is a no-op; the check runs in every sample (a check cache of its own per "
        "sample: a passing check is otherwise reused for 120 s); split by phase from events.log "
        "timestamps.",
    ),
    (
        "containers",
        "6b. Containers: start overhead per node, image push",
        "`fleetctl run` (8 hosts) of a no-op script with `--image fleetctl-test:py3` (podman) "
        "vs without an image, and a bare `podman run --rm` of the same image on every node at "
        "once, each timed by its node (the slowest; the lab's hosts share two cores): "
        "the image's cost to a job minus the bare start is the overhead (goal ≤ 0.5 s). "
        "`fleetctl push --image` to 16 hosts lacking it (peer waves) vs a parallel `podman "
        "save | ssh HOST podman load`: the controller's egress per image (goal ≤ 1.2).",
    ),
    (
        "slurm",
        "6c. Slurm: fleetctl over bare sbatch and srun",
        "A real Slurm on the lab (munged, slurmctld, one slurmd per host), a no-op job on 3 "
        "nodes, rows taking turns: a bare `sbatch -W` of `srun python3 -c pass` vs `fleetctl "
        "run --slurm --nodes 3` (goal ≤ 1.5 s more); inside `salloc -N3 --no-shell`, a bare "
        "`srun -N3` vs `fleetctl run` (check, push, launch, teardown by srun steps).",
    ),
    (
        "scale",
        "7. Large fleets: listing and planning N hosts",
        "No lab and no network: an INI inventory of N hosts (`gpu0 … gpuN-1`, `ansible_host` "
        "10.0.x.y, 8 GPUs, one NIC) listed by `fleetctl inventory` and planned by `fleetctl run "
        "--dry-run` (torchrun), each as the table and as `--json`; `--full` prints every node's "
        "env and argv whole, the form plan.json records (the default `--json` writes long "
        "fleet-wide values such as FLEET_NODE_IPS once, under `shared`). stdout goes to a file; "
        "time = the whole process, `CPU` and `peak RSS` from wait4 of that process, `output MB` "
        "= bytes it printed. A sample whose output lacks a node counts as failed.",
    ),
    (
        "fleet",
        "8. A fleet of 64 and 128 hosts: the check, a cut link, a no-op run",
        "One lab per size (two networks: SSH on one, the mesh on the data network; the lab's "
        "minimal shell rc files). `fleetctl check` of the healthy lab must pass, and with one "
        "host's data link cut must fail naming that host alone (`check --mesh auto`: sparse past "
        "32 hosts, each host tests its ring neighbours and 3 seeded random peers). The no-op "
        "`fleetctl run` (check included, push a no-op after one untimed run) is split by phase "
        "from job.json's `phases`: wall seconds, and the controller's own CPU per node in ms "
        "(getrusage of the fleetctl process at each phase start; its ssh/rsync children are in "
        "`controller CPU s (with children)`). Every lab host shares the two cores with the "
        "controller, so at 128 hosts the remote side costs ~N× what it would on real hosts: "
        "the wall times are upper bounds, the CPU per node is the controller's own cost. "
        "`remote CPU ms per node`: what the lab hosts' own processes used (sshd, shells, "
        "the probe, the supervisor, the job), read from each host's init and sshd listener, "
        "which reap them all; a real host spends it on its own cores, so with 64 hosts on two "
        "cores it sets a floor of N × (remote + controller CPU per node) / 2 on the wall time.",
    ),
]


def _s(x: float | None) -> str:
    return "—" if x is None else f"{x:.3f}"


WORST = ("lost in live stream", "lost in collected logs")  # must be 0: show the worst sample
EVERY = ("fleetctl exit code",)  # show every distinct value


def _label(key: str) -> str:
    if key in WORST:
        return f"{key} (worst sample)"
    if key in EVERY:
        return f"{key} (each sample)"
    return f"{key} (median)"


def _extra_cell(values: Any, key: str = "") -> str:
    if isinstance(values, list):
        if key in EVERY:
            return ", ".join(str(v) for v in values)
        nums = [v for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]
        if nums and len(nums) == len(values):
            med = max(nums) if key in WORST else statistics.median(nums)
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


def _table(rows: list[Result], ratio_to: tuple[str, str] | None) -> list[str]:
    """The rows as a markdown table; with ``ratio_to`` (tool, label), each median over that
    tool's at the same N."""
    keys: list[str] = []
    for r in rows:
        for k in r.extra:
            if k not in keys:
                keys.append(k)
    base = {r.n: r.median for r in rows if ratio_to and r.tool == ratio_to[0]}
    head = ["measurement", "N", "median s", "min s", "max s"]
    if ratio_to:
        head.append(f"× {ratio_to[1]}")
    head += [_label(k) for k in keys] + ["samples", "notes"]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        st = r.stats()
        cells = [r.tool, "" if r.n is None else str(r.n)]
        if st is None:
            cells += ["—", "—", "—"]
        else:
            cells += [_s(st[0]), _s(st[1]), _s(st[2])]
        if ratio_to:
            cells.append(f"{st[0] / base[r.n]:.2f}" if st and base.get(r.n) else "—")
        cells += [_extra_cell(r.extra[k], k) if k in r.extra else "—" for k in keys]
        cells.append(str(len(r.samples)))
        notes = "; ".join(x for x in (r.note, r.failed or "") if x)
        cells.append(notes.replace("|", "/"))
        out.append("| " + " | ".join(cells) + " |")
    return out


def _row(results: list[Result], group: str, tool: str, n: int | None = None) -> Result | None:
    for r in results:
        if r.group == group and r.tool.startswith(tool) and (n is None or r.n == n) and r.median:
            return r
    return None


def _cpu(r: Result, key: str) -> float | None:
    v = r.extra.get(key)
    return statistics.median(v) if isinstance(v, list) and v else None


def _findings(results: list[Result]) -> list[str]:
    """A few sentences whose every number is read from a measured row (absent rows: no line)."""
    out: list[str] = []
    sizes = sorted({r.n for r in results if r.group == "fanout" and r.n})
    for n in sizes:
        fl = _row(results, "fanout", FLEETCTL, n)
        if fl is None:
            continue
        peers = []
        for tool in ("pdsh", "clush", "ansible -m raw -f 64", "fabric", "asyncssh"):
            r = _row(results, "fanout", tool, n)
            if r is not None and r.median:
                peers.append(f"{tool.split(' ')[0]} {r.median:.2f} s ({r.median / fl.median:.2f}×)")
        floor = _row(results, "fanout", "fleetctl, connections already open", n)
        tail = f"; over open connections {floor.median:.3f} s" if floor else ""
        out.append(f"- N={n}: fleetctl exec {fl.median:.2f} s; " + ", ".join(peers) + tail + ".")
    for n in sizes:
        fast, slow = (
            _row(results, "fanout", FLEETCTL, n),
            _row(results, "fanout", "fleetctl exec, normal", n),
        )
        if fast and slow:
            cf, cs = _cpu(fast, "client CPU s"), _cpu(slow, "client CPU s")
            cpu = (
                f" (client CPU {cs:.3f} → {cf:.3f} s)" if cf is not None and cs is not None else ""
            )
            out.append(
                f"- Fast exit (os._exit after flushing, skipping module teardown), N={n}: "
                f"{slow.median:.3f} s → {fast.median:.3f} s median{cpu}."
            )
    bare = _row(results, "startup", STARTUP_BASE)
    starts = [_row(results, "startup", t) for t in ("fleetctl --version", "fleetctl exec --help")]
    if bare and any(starts):
        out.append(
            f"- Start-up over a bare interpreter ({bare.median * 1000:.0f} ms): "
            + ", ".join(
                f"`{r.tool}` {r.median * 1000:.0f} ms ({r.median / bare.median:.2f}×)"
                for r in starts
                if r
            )
            + "."
        )
    d = _row(results, "openssh", "ssh node1 true, kex default")
    c = _row(results, "openssh", "ssh node1 true, kex curve25519")
    if d and c and _cpu(d, "CPU s") is not None and _cpu(c, "CPU s") is not None:
        out.append(
            f"- OpenSSH client CPU per connection: default kex {_cpu(d, 'CPU s') * 1000:.0f} ms "
            f"vs curve25519-sha256 {_cpu(c, 'CPU s') * 1000:.0f} ms (ssh + true, wall "
            f"{d.median:.3f} vs {c.median:.3f} s); pdsh/clush/ansible/ssh pay the default."
        )
    p = _row(results, "handshake", "paramiko default kex")
    q = _row(results, "handshake", "paramiko curve25519")
    if p and q:
        out.append(
            f"- paramiko: default kex list {p.median * 1000:.0f} ms vs curve25519 only "
            f"{q.median * 1000:.0f} ms per handshake ({p.note or 'kex unknown'}: this OpenSSH "
            "has no mlkem768x25519, so paramiko's preference changes nothing here)."
        )
    rsa = _row(results, "handshake", "paramiko default kex, RSA")
    if p and rsa and _cpu(rsa, "CPU s") is not None and _cpu(p, "CPU s") is not None:
        out.append(
            f"- Client key type: RSA-3072 costs {_cpu(rsa, 'CPU s') * 1000:.0f} ms of client CPU "
            f"per handshake vs {_cpu(p, 'CPU s') * 1000:.0f} ms with ed25519."
        )
    t = _row(results, "teardown", "fleetctl run")
    if t:
        out.append(
            f"- Teardown (N={t.n}): rank 1's failing exit → verified nothing left on any node: "
            f"median {t.median:.3f} s (min {min(t.samples):.3f}, max {max(t.samples):.3f})."
        )
    lost = _row(results, "lost", "fleetctl run")
    if lost:
        det = _cpu(lost, "cut → lost detected s")
        out.append(
            f"- Lost node (N={lost.n}): link cut → teardown finished on the others: median "
            f"{lost.median:.2f} s" + (f", of which {det:.2f} s to declare it lost." if det else ".")
        )
    st = _row(results, "stall", "fleetctl run")
    if st:
        dump = _cpu(st, "stack dump, all nodes in parallel s")
        out.append(
            f"- Hung job (N={st.n}): stall threshold → fleetctl exited with every rank's stack: "
            f"median {st.median:.2f} s (goal ≤ 5 s)"
            + (f"; the stack dump itself {dump:.2f} s on all nodes in parallel." if dump else ".")
        )
    for what in ("no-op code push", "env archive"):
        rows = [r for r in results if r.group == "push" and r.tool.startswith(what) and r.median]
        fl = next((r for r in rows if "fleetctl" in r.tool), None)
        peer = next((r for r in rows if "fleetctl" not in r.tool), None)
        if fl and peer:
            fb, pb = _cpu(fl, "controller MB (bridge)"), _cpu(peer, "controller MB (bridge)")
            bytes_ = f"; controller sent {fb:.1f} vs {pb:.1f} MB" if fb is not None and pb else ""
            out.append(
                f"- {fl.tool} (N={fl.n}): {fl.median:.2f} s vs {peer.tool.split(': ')[-1]} "
                f"{peer.median:.2f} s{bytes_}."
            )
    for r in results:
        if r.group == "logs" and r.samples:
            ls, lc = r.extra.get("lost in live stream"), r.extra.get("lost in collected logs")
            exp = _cpu(r, "lines expected")
            codes = r.extra.get("fleetctl exit code") or []
            if ls and lc and exp:
                bad = sum(1 for c in codes if c != 0)
                runs = f"{len(r.samples)} runs" + (
                    f", {bad} exited {codes}" if bad else ", all exit 0"
                )
                out.append(
                    f"- Log streaming, {r.tool.split(' via')[0]} ({runs}): lines lost in the "
                    f"worst run {max(ls):.0f} of {exp:.0f} in the live stream, {max(lc):.0f} in "
                    f"the collected logs; controller CPU {_cpu(r, 'controller CPU s') or 0:.1f} s,"
                    f" peak RSS {_cpu(r, 'fleetctl peak RSS MB') or 0:.0f} MB (medians)."
                )
    pl = _row(results, "pipeline", "fleetctl run")
    if pl:
        parts = ", ".join(
            f"{k.removesuffix(' s')} {statistics.median(v):.2f}"
            for k, v in pl.extra.items()
            if isinstance(v, list) and v
        )
        out.append(f"- No-op `fleetctl run` on {pl.n} hosts: {pl.median:.2f} s ({parts}).")
    out += _scale_findings(results)
    out += _fleet_findings(results)
    rc = _row(results, "remote", "one command over an open connection: true (lab")
    heavy = _row(results, "remote", "one command over an open connection: true (this")
    if rc:
        more = (
            f", {heavy.median * 1000:.0f} ms with this machine's own ~/.bashrc (pyenv init)"
            if heavy
            else ""
        )
        out.append(
            f"- One remote command over an open connection: {rc.median * 1000:.0f} ms with the "
            f"lab's minimal ~/.bashrc{more}: sshd starts the login shell, which reads its rc "
            "files, for every command, so phases batch their work into one command per node."
        )
    early = _row(results, "remote", "command closing its stdout")
    if early and _cpu(early, "client CPU s") is not None:
        out.append(
            f"- A remote command that closes its stdout and runs 0.5 s more costs the client "
            f"{_cpu(early, 'client CPU s') * 1000:.0f} ms CPU (it waits on the exit status)."
        )
    return out


def _why(r: Result) -> str:
    return (r.failed or "")[:160]


def _fleet_findings(results: list[Result]) -> list[str]:
    """Per lab size: the check's time, whether a cut link was named, the no-op run by phase."""
    out: list[str] = []
    for n in sorted({r.n for r in results if r.group == "fleet" and r.n}):
        rows = [r for r in results if r.group == "fleet" and r.n == n]
        check = next((r for r in rows if r.tool.startswith("fleetctl check (healthy")), None)
        cut = next((r for r in rows if "cut" in r.tool), None)
        run = next((r for r in rows if r.tool.startswith("fleetctl run")), None)
        parts = []
        if check is not None:
            parts.append(
                f"check {check.median:.2f} s" if check.median else f"check FAILED ({_why(check)})"
            )
        if cut is not None:
            parts.append(
                f"a cut data link named alone in {cut.median:.2f} s"
                if cut.median
                else f"cut link NOT named ({_why(cut)})"
            )
        if run is not None and run.median:
            cpu = {
                k.removesuffix(" CPU ms/node"): statistics.median(v)
                for k, v in run.extra.items()
                if k.endswith("CPU ms/node") and v
            }
            per = ", ".join(f"{k} {v:.1f}" for k, v in cpu.items())
            remote = run.extra.get("remote CPU ms per node")
            lab = (
                f"; the lab hosts' own CPU {statistics.median(remote):.0f} ms per node, which "
                "they share with the controller here: at least "
                f"{n * (statistics.median(remote) + sum(cpu.values())) / 2000:.1f} s of the "
                "two cores"
                if remote
                else ""
            )
            parts.append(f"no-op run {run.median:.2f} s (controller CPU ms per node: {per}{lab})")
        elif run is not None:
            parts.append(f"no-op run FAILED ({_why(run)})")
        if parts:
            out.append(f"- {n} lab hosts: " + "; ".join(parts) + ".")
    return out


def _scale_findings(results: list[Result]) -> list[str]:
    """Per size: the tables' and the dry-run JSON's time and size; how the JSON grows."""
    out: list[str] = []
    sizes = sorted({r.n for r in results if r.group == "scale" and r.n})

    def get(tool: str, n: int) -> Result | None:
        return next(
            (r for r in results if r.group == "scale" and r.tool == tool and r.n == n), None
        )

    mb: dict[tuple[str, int], float] = {}
    for n in sizes:
        inv = get("fleetctl inventory (table)", n)
        plan = get("fleetctl run --dry-run (table)", n)
        js, full = (
            get("fleetctl run --dry-run --json", n),
            get("fleetctl run --dry-run --json --full", n),
        )
        for key, r in (("json", js), ("full", full)):
            size = _cpu(r, "output MB") if r and r.median else None
            if size is not None:
                mb[key, n] = size
        parts = [
            f"`{r.tool.removeprefix('fleetctl ')}` {r.median:.2f} s"
            for r in (inv, plan)
            if r is not None and r.median
        ]
        if js and js.median and ("json", n) in mb:
            parts.append(f"`run --dry-run --json` {mb['json', n]:.1f} MB in {js.median:.2f} s")
        if full and full.median and ("full", n) in mb:
            parts.append(f"`--full` {mb['full', n]:.1f} MB in {full.median:.2f} s")
        if parts:
            out.append(f"- {n:,} hosts: " + "; ".join(parts) + ".")
    if len(sizes) >= 2:
        a, b = sizes[0], sizes[-1]
        for key, what in (("json", "`--dry-run --json`"), ("full", "`--full`")):
            if (key, a) in mb and (key, b) in mb and mb[key, a]:
                out.append(
                    f"- {what} output, {b:,} vs {a:,} hosts ({b / a:g}× the nodes): "
                    f"{mb[key, b] / mb[key, a]:.1f}× the bytes."
                )
    return out


def write_report(
    path: Path,
    meta: dict[str, Any],
    facts: dict[str, str],
    results: list[Result],
    skipped: dict[str, str],
) -> None:
    remeasured: dict[str, str] = meta.get("remeasured") or {}
    later = (
        " except the sections marked *re-measured*, whose rows come from the later run named there"
        if remeasured
        else ""
    )
    lines = [
        "# fleetctl benchmarks",
        "",
        f"Generated by `{meta['command']}` on {meta['date']} — every number below was measured "
        f"in that run{later} (rerun the command to refresh; do not edit by hand). "
        f"Samples per row: {meta['repeat']}{' (quick smoke run)' if meta['quick'] else ''}"
        f"{PARTIAL if meta.get('partial') else ''}; "
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
        "the CPUs above, and so does whatever else ran on the machine meanwhile (see the load "
        "averages): compare rows of one run, not runs of different days.",
        "",
        "Reproduce (root, ~30 min): `python bench/run.py --hosts 32 --out docs/benchmarks.md`; "
        "smoke: `--quick --hosts 2`; one part: `--only fanout,ssh` (fanout, ssh, teardown, lost, "
        "elastic (4 hosts), stall, push, logs, pipeline, containers, slurm, scale, fleet; scale "
        "needs no lab and no root, fleet brings up labs of 64 and 128 hosts of its own, "
        "`--fleet-sizes 8` to change). "
        "Raw results: the `.json` next to this file; `--render docs/benchmarks.json` rewrites "
        "this page from them without measuring; `--merge docs/benchmarks.json` re-measures the "
        "parts named by `--only` into it.",
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
        "elastic": "elastic",
        "stall": "stall",
        "push": "push",
        "logs": "logs",
        "before": "before",
        "pipeline": "pipeline",
        "containers": "containers",
        "slurm": "slurm",
        "scale": "scale",
        "fleet": "fleet",
    }
    noted: set[str] = set()
    for group, title, intro in SECTIONS:
        rows = [r for r in results if r.group == group]
        lines += [f"## {title}", ""]
        why = skipped.get(measure_of[group])
        if not rows:
            lines += [f"{why or 'not measured: no result'}", ""]
            continue
        lines += [intro, ""]
        if measure_of[group] in remeasured and measure_of[group] not in noted:
            noted.add(measure_of[group])  # once per measurement (ssh spans four sections)
            lines += [f"*Re-measured:* {remeasured[measure_of[group]]}", ""]
        if group == "fanout":
            lines += [*_fanout_summary(rows), ""]
        lines += [*_table(rows, ratio_to=RATIO_TO.get(group)), ""]
        if why:
            lines += [f"Partly {why}", ""]
    # sections measured by hand with their own scripts (bench/collective.py): kept verbatim
    by_hand = Path(__file__).with_name("by_hand.md")
    if by_hand.is_file():
        lines += [by_hand.read_text().rstrip("\n"), ""]
    found = _findings(results)
    if found:
        lines += ["## Findings (computed from the rows above)", "", *found, ""]
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
