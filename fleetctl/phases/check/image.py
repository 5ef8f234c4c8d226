"""``--image``: before launch, on every node that runs in a container, the runtime (named, or
the first of podman, docker, apptainer found), the image present, and ONE throwaway container
that runs the job's python of the image with ``remote/programs/image_probe.py``: the launcher's
module imported for real (the host check leaves it to this: the host's python only runs the
supervisor), torch's version (the plan's facts) and NCCL where the job uses GPUs. A job that
needs no python in the image (a plain shell script) starts ``true`` instead. Every node naming
the same image must have the same build (by id). Anything else stops the run (exit 3) with one
line naming the hosts and the image.

The container costs a whole start (about what the job's own costs), so a node keeps the answer
of one that passed under ``W/containers/started/``, keyed by the runtime, the image id (which
pins the image's content) and what was asked (python, module, NCCL, the program's hash); later
checks read it instead (``--recheck``: never). A failure is never kept.
"""

from __future__ import annotations

import hashlib
import json
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from fleetctl import remote
from fleetctl.errors import CheckError
from fleetctl.node import Node
from fleetctl.plan.launchers.base import SHELL, kind_of
from fleetctl.plan.rankplan import NodeFacts, Plan, container_python
from fleetctl.results import FleetResult
from fleetctl.ssh.fanout import FanOut

if TYPE_CHECKING:
    from fleetctl.plan.rankplan import JobSpec

TIMEOUT = 120.0  # a runtime's first start on a node may set up its storage
ID_TIMEOUT = 30.0  # s for the runtime to say the image's id (a hung runtime never does)
PROBE_TIMEOUT = 100.0  # s for the probe's container (inside TIMEOUT: the answer still comes)
HUNG = ("124", "137")  # timeout(1)'s codes: TERM at the limit, KILL 5 s later
PROGRAM = "image_probe.py"
_SRC_WORD = "__fleetctl_image_probe_source__"  # a shell-safe word: shlex leaves it bare


@dataclass(frozen=True)
class ImageWant:
    """What one node's check asks of its image: ``python`` (the image's, None: run ``true``)
    imports ``module`` (None: nothing) and looks for NCCL when ``nccl``; ``gpus``: the trial
    container gets the node's GPUs with the launch's flags (a runtime that cannot hand them
    over fails here, not at launch with exit 126)."""

    image: str
    runtime: str | None = None
    python: str | None = None
    module: str | None = None
    nccl: bool = False
    gpus: bool = False

    def key(self) -> str:
        """What the answer depends on besides the runtime and the image id: the marker's."""
        parts = [self.python, self.module, self.nccl, remote.digest(PROGRAM)]
        blob = json.dumps([*parts, True] if self.gpus else parts)
        return hashlib.sha256(blob.encode()).hexdigest()[:12]


@dataclass(frozen=True)
class ImageFacts:
    """One node's answer: the runtime it will use, the image's id there, the image's torch
    version ('' none, None: not asked), a failure."""

    runtime: str | None
    image_id: str | None = None
    problem: str | None = None
    torch: str | None = None


def image_of(node: Node, image: str | None) -> str | None:
    """The image ``node`` runs its launcher in: ``image`` (the command line's or the job
    file's), else its ``fleetctl_image``; None: on the host."""
    img = image or node.vars.get("fleetctl_image")
    return str(img) if img else None


def entry(spec: JobSpec) -> tuple[str | None, bool]:
    """(the launcher's module, whether the image's python must run) for ``spec``: a launcher
    module needs its import; a plain job needs the python, unless its entry is a shell
    script (``bash SCRIPT``: no python in the image at all)."""
    from fleetctl.plan.launchers import launcher_for

    module = launcher_for(spec.launcher).module
    return module, module is not None or (spec.kind or kind_of(spec.script)) != SHELL


def wanted(
    nodes: Sequence[Node],
    spec: JobSpec,
    facts: Mapping[str, NodeFacts] | None = None,
    *,
    module: str | None = None,
    python: bool = False,
) -> dict[str, ImageWant]:
    """host -> what its check asks, for the nodes that run in a container (``spec``'s image
    and runtime, else the node's). ``module``: the launcher's, imported in the image;
    ``python``: the image's python must run (``entry``); NCCL is looked for where the job uses
    GPUs (and not the gloo backend)."""
    out = {}
    for n in nodes:
        img = image_of(n, spec.container.image)
        if img:
            has = has_gpus(n, (facts or {}).get(n.name))
            nccl = has and spec.backend != "gloo"
            run_py = python or module is not None or nccl
            out[n.name] = ImageWant(
                img,
                spec.container.runtime_for(n),
                container_python(n) if run_py else None,
                module,
                nccl,
                has,
            )
    return out


def uses_gpus(node: Node, facts: NodeFacts | None, backend: str | None) -> bool:
    """The job's collectives use GPUs on ``node``, so its image needs NCCL. A gloo job never."""
    return backend != "gloo" and has_gpus(node, facts)


def has_gpus(node: Node, facts: NodeFacts | None) -> bool:
    """``node`` has GPUs for the job (its container gets them, as the plan's does):
    ``fleetctl_gpus`` lists some, or the check found some (without a check, the inventory's
    count)."""
    if node.gpu_ids:
        return True
    count = facts.gpu_count if facts is not None and facts.gpu_count is not None else node.gpus
    return int(count or 0) > 0


def script(
    want: ImageWant,
    marks: str | None = None,
    id_timeout: float = ID_TIMEOUT,
    container_timeout: float = PROBE_TIMEOUT,
) -> str:
    """The node's side, in POSIX sh: one ``key value`` line per fact, the probe's answer last
    (``probe <rc> <its D frame or last line>``). ``marks``: the node's folder (a shell word) of
    markers: an answer kept there is said again (``probe 0 …``) without a container, and a
    passing one is kept. Each runtime call is bounded (``timeout``, where the node has it): a
    hung runtime is ``hung image|probe``, said in time, not a cut shell line at the SSH
    timeout, and its client is killed. ``container_timeout``: the probe's container's own
    limit (not ``--probe-timeout``, the node python's: the image's python is asked here)."""
    from fleetctl.plan.runtimes import ORDER, runtime  # containers only: not at a plain run's start

    cases = []
    for name in ORDER:
        r = runtime(name)
        if want.python:  # the program once, in $src, whichever runtime runs it
            args = json.dumps({"module": want.module, "nccl": want.nccl}, sort_keys=True)
            inner = [want.python, "-c", _SRC_WORD, args]
            argv = r.exec_argv(want.image, inner, want.gpus)
            probe = shlex.join(argv).replace(_SRC_WORD, '"$src"')
        else:
            probe = shlex.join(r.probe_argv(want.image, want.gpus))
        cases.append(
            f"  {name}) id=$(b {id_timeout:g} {shlex.join(r.image_id_argv(want.image))}"
            f" 2>/dev/null); hung; probe() {{ b {container_timeout:g} {probe}; }} ;;"
        )
    pick = " ".join(ORDER)
    if want.python:
        run = _answer_once(marks, want.key()) if marks else _ANSWER
    else:
        run = _probe_once(marks) if marks else _PROBE
    return "\n".join(
        [
            f"rt={shlex.quote(want.runtime or '')}",
            'if [ -z "$rt" ]; then',
            f'  for c in {pick}; do command -v "$c" >/dev/null 2>&1 && {{ rt=$c; break; }}; done',
            'elif ! command -v "$rt" >/dev/null 2>&1; then echo "missing $rt"; exit 0; fi',
            '[ -n "$rt" ] || { echo "missing -"; exit 0; }',
            'echo "runtime $rt"',
            # a bounded runtime call; the id query's own end: a hung runtime says so and stops
            'b() { d=$1; shift; if command -v timeout >/dev/null 2>&1; then timeout -k 5 "$d" "$@";'
            ' else "$@"; fi; }',
            'hung() { case $? in 124|137) echo "hung image"; exit 0 ;; esac;'
            " id=$(printf '%s\\n' \"$id\" | head -n 1 | cut -d' ' -f1); }",
            *([f"src={shlex.quote(remote.inline(PROGRAM))}"] if want.python else []),
            'case "$rt" in',
            *cases,
            "esac",
            '[ -n "$id" ] || { echo "image -"; exit 0; }',
            'echo "image $id"',
            *run,
        ]
    )


_HUNG_PROBE = 'case $rc in 124|137) echo "hung probe"; exit 0 ;; esac'
_PROBE = [
    "out=$(probe 2>&1 </dev/null); rc=$?",
    _HUNG_PROBE,
    'echo "probe $rc $(printf "%s" "$out" | tail -n 1)"',
]
# the program's frame, else (the runtime or the python failed) the output's last line
_ANSWER = [
    "out=$(probe 2>&1 </dev/null); rc=$?",
    _HUNG_PROBE,
    """d=$(printf '%s\\n' "$out" | grep '^D {' | tail -n 1)""",
    """[ -n "$d" ] || d=$(printf '%s' "$out" | tail -n 1)""",
    'printf \'probe %s %s\\n\' "$rc" "$d"',  # not echo: dash's reads the JSON's backslashes
]


def _marker(marks: str, suffix: str = "") -> str:
    return f'm={marks}/"$rt-$(printf %s "$id" | tr -c "A-Za-z0-9._-" _){suffix}"'


def _probe_once(marks: str) -> list[str]:
    return [
        _marker(marks),
        'if [ -f "$m" ]; then rc=0; echo "probe 0 cached"; else',
        *_PROBE,
        '[ "$rc" != 0 ] || { mkdir -p "${m%/*}" && : >"$m"; } 2>/dev/null',
        "fi",
    ]


def _answer_once(marks: str, key: str) -> list[str]:
    return [
        _marker(marks, "-" + key),
        'd=$(cat "$m" 2>/dev/null)',
        'case "$d" in "D {"*) printf \'probe 0 %s\\n\' "$d" ;; *)',
        *_ANSWER,
        '[ "$rc" != 0 ] || case "$d" in "D {"*) { mkdir -p "${m%/*}" &&'
        ' printf \'%s\\n\' "$d" >"$m.$$" && mv -f "$m.$$" "$m"; } 2>/dev/null ;; esac',
        ";; esac",
    ]


def shell_dir(path: str) -> str:
    """``path`` as one shell word, a leading ``~`` still the login's home."""
    if path == "~" or path.startswith("~/"):
        return '"$HOME"' + (shlex.quote(path[1:]) if len(path) > 1 else "")
    return shlex.quote(path)


def parse(stdout: str, want: ImageWant) -> ImageFacts:
    from fleetctl.plan.runtimes import ORDER

    image = want.image
    facts = dict(line.split(" ", 1) for line in stdout.splitlines() if " " in line)
    if "missing" in facts:
        which = facts["missing"]
        if which == "-":
            return ImageFacts(None, problem=f"no container runtime found ({', '.join(ORDER)})")
        return ImageFacts(None, problem=f"container runtime {which} not found")
    rt = facts.get("runtime")
    if facts.get("hung") == "image":
        return ImageFacts(
            rt,
            problem=f"{rt} did not say the id of image {image} within {ID_TIMEOUT:g} s: the "
            f"runtime hangs (try `{rt} info`; a stuck storage lock or daemon)",
        )
    if facts.get("hung") == "probe":
        return ImageFacts(
            rt,
            facts.get("image"),
            f"{rt} did not start a container of {image} within {PROBE_TIMEOUT:g} s: the "
            f"runtime hangs (try `{rt} run --rm {image} true` on the node)",
        )
    if facts.get("image", "-") == "-":
        return ImageFacts(rt, problem=f"image {image} is not present ({rt})")
    image_id = facts["image"]
    code, _, last = facts.get("probe", "? ").partition(" ")
    last = last.strip()
    data = _data(last) if want.python else None
    if data is None:
        if code != "0" or want.python:
            what = f" ({want.python})" if want.python else ""
            why = f": {last}" if last else ""
            hint = gpu_hint(rt, last) if want.gpus else ""
            problem = f"{rt} cannot start a container of {image}{what}{why}{hint}"
            return ImageFacts(rt, image_id, problem)
        return ImageFacts(rt, image_id)
    return ImageFacts(rt, image_id, _problem(data, want), str(data.get("torch") or ""))


# what a runtime says when it cannot hand a node's GPUs to a container, and what to do
GPU_HINTS = (
    (
        ("CDI", "nvidia.com/gpu"),
        " (no CDI spec for the node's GPUs: on the node, `nvidia-ctk cdi generate "
        "--output=/etc/cdi/nvidia.yaml` from the NVIDIA Container Toolkit; or --backend gloo "
        "and no GPUs)",
    ),
    (
        ("device driver", "capabilities: [[gpu]]", "nvidia-container-cli"),
        " (the runtime has no NVIDIA hook: install the NVIDIA Container Toolkit and run "
        "`nvidia-ctk runtime configure` on the node)",
    ),
)


def gpu_hint(rt: str | None, last: str) -> str:
    """What to do when ``rt`` refused the node's GPUs (its last line ``last``); '' otherwise."""
    for words, hint in GPU_HINTS:
        if any(w in last for w in words):
            return hint
    return ""


def _data(line: str) -> dict | None:
    if not line.startswith("D {"):
        return None
    try:
        data = json.loads(line[2:])
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


def _problem(data: Mapping, want: ImageWant) -> str | None:
    if data.get("error"):
        return f"cannot import {want.module} in image {want.image} ({want.python}): {data['error']}"
    if want.nccl and data.get("nccl") == "-":
        return (
            f"image {want.image} has no NCCL (no libnccl in it; the job uses GPUs): use an "
            "image with NCCL (torch's CUDA wheels carry it), or --backend gloo"
        )
    if want.nccl and not data.get("nccl"):
        return f"cannot look for NCCL in image {want.image} ({want.python})"
    return None


def check_images(
    fleet: FanOut, want: Mapping[str, ImageWant], *, recheck: bool = False
) -> dict[str, ImageFacts]:
    """host -> what its image check found (the runtime it uses, the image's torch); raises
    CheckError naming every host that cannot run. ``recheck``: run the probe's container even
    where an answer for the image id is kept."""
    nodes = [n for n in fleet.nodes if n.name in want]

    def one(node: Node, conn) -> ImageFacts:
        w = want[node.name]
        marks = None if recheck else shell_dir(f"{node.workdir.rstrip('/')}/containers/started")
        res = conn.run(["sh", "-c", script(w, marks)], timeout=TIMEOUT)
        return parse(res.stdout, w)

    result: FleetResult[ImageFacts] = fleet.map(one, timeout=TIMEOUT + 30.0, nodes=nodes)
    problems = []
    for host, got in result.items():
        if isinstance(got, BaseException):
            problems.append(f"{host}: {got}")
        elif got.problem:
            problems.append(f"{host}: {got.problem}")
    if not problems:
        problems = mismatches(want, {h: f.image_id for h, f in result.items()})  # type: ignore[union-attr]
    if problems:
        raise CheckError("; ".join(problems), result)
    return result.succeeded


def with_image_torch(
    facts: Mapping[str, NodeFacts], found: Mapping[str, ImageFacts]
) -> dict[str, NodeFacts]:
    """The plan's facts with each image node's torch version the image's (the host's python
    is not the job's there); nodes whose probe asked no python keep theirs."""
    out = dict(facts)
    for host, f in found.items():
        if f.torch is not None:
            out[host] = replace(out.get(host) or NodeFacts(), torch=f.torch or None)
    return out


def mismatches(want: Mapping[str, ImageWant], ids: Mapping[str, str | None]) -> list[str]:
    """Nodes whose build of an image is not the one most nodes have, each named with both ids."""
    out = []
    for image in sorted({w.image for w in want.values()}):
        hosts = [h for h in want if want[h].image == image]
        counts: dict[str | None, int] = {}
        for h in hosts:
            counts[ids[h]] = counts.get(ids[h], 0) + 1
        common = max(counts, key=lambda i: (counts[i], -hosts.index(_first(hosts, ids, i))))
        ref = _first(hosts, ids, common)
        for h in hosts:
            if ids[h] != common:
                out.append(f"{h}: image {image} is another build: {ids[h]} (on {ref}: {common})")
    return out


def _first(hosts: Sequence[str], ids: Mapping[str, str | None], image_id: str | None) -> str:
    return next(h for h in hosts if ids[h] == image_id)


def with_runtimes(plan: Plan, runtimes: Mapping[str, str]) -> Plan:
    """The plan with each container's runtime the one the check found on its node."""
    nodes = tuple(
        replace(np, container={**np.container, "runtime": runtimes[np.host]})
        if np.container and np.host in runtimes
        else np
        for np in plan.nodes
    )
    return replace(plan, nodes=nodes)
