"""``--image``: before launch, on every node that runs in a container, the runtime (named, or
the first of podman, docker, apptainer found), the image present, a trivial container started,
NCCL inside the image where the job uses GPUs, and the same image (by id) on every node that
names it. Anything else stops the run (exit 3) with one line naming the hosts and the image.

The trivial container costs a whole container start (about what the job's own costs), so a
node remembers that one of this image id started with this runtime (a marker under
``W/containers/started/``) and later checks skip it (``--recheck``: never skipped).
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from fleetctl import remote
from fleetctl.errors import CheckError
from fleetctl.node import Node
from fleetctl.plan.rankplan import NodeFacts, Plan, container_python
from fleetctl.plan.runtimes import ORDER, runtime
from fleetctl.results import FleetResult
from fleetctl.ssh.fleet import Fleet

TIMEOUT = 120.0  # a runtime's first start on a node may set up its storage


@dataclass(frozen=True)
class ImageFacts:
    """One node's answer: the runtime it will use, the image's id there, a failure."""

    runtime: str | None
    image_id: str | None = None
    problem: str | None = None


def wanted(
    nodes: Sequence[Node],
    image: str | None,
    rt: str | None,
    facts: Mapping[str, NodeFacts] | None = None,
    backend: str | None = None,
) -> dict[str, tuple]:
    """host -> (image, runtime or None, the image's python where NCCL must be in it, else
    None) for the nodes that run in a container."""
    out = {}
    for n in nodes:
        img = image or n.vars.get("fleetctl_image")
        if img:
            named = rt or n.vars.get("fleetctl_container_runtime")
            gpus = uses_gpus(n, (facts or {}).get(n.name), backend)
            py = container_python(n) if gpus else None
            out[n.name] = (str(img), None if named is None else str(named), py)
    return out


def uses_gpus(node: Node, facts: NodeFacts | None, backend: str | None) -> bool:
    """The job uses GPUs on ``node``, so its image needs NCCL: ``fleetctl_gpus`` lists some,
    or the check found some (without a check, the inventory's count). A gloo job never."""
    if backend == "gloo":
        return False
    if node.gpu_ids:
        return True
    count = facts.gpu_count if facts is not None and facts.gpu_count is not None else node.gpus
    return int(count or 0) > 0


def script(
    image: str, named: str | None, nccl_python: str | None = None, marks: str | None = None
) -> str:
    """The node's side, in POSIX sh: one ``key value`` line per fact. ``nccl_python``: look
    for NCCL inside the image with that python (``remote/image_nccl.py``). ``marks``: the
    node's folder (a shell word) of markers of image ids that started: the probe is skipped
    for those (``probe 0 cached``) and a marker written after one starts."""
    cases = []
    for name in ORDER:
        r = runtime(name)
        nccl = ""
        if nccl_python:
            argv = r.exec_argv(image, [nccl_python, "-c", remote.inline("image_nccl.py")])
            nccl = f"; nccl() {{ {shlex.join(argv)}; }}"
        cases.append(
            f"  {name}) id=$({shlex.join(r.image_id_argv(image))} 2>/dev/null | cut -d' ' -f1)"
            f"; probe() {{ {shlex.join(r.probe_argv(image))}; }}{nccl} ;;"
        )
    look = []
    if nccl_python:
        look = [
            '[ "$rc" = 0 ] || exit 0',
            "out=$(nccl 2>&1 </dev/null); rc=$?",
            'echo "nccl $rc $(printf "%s" "$out" | tail -n 1)"',
        ]
    pick = " ".join(ORDER)
    return "\n".join(
        [
            f"rt={shlex.quote(named or '')}",
            'if [ -z "$rt" ]; then',
            f'  for c in {pick}; do command -v "$c" >/dev/null 2>&1 && {{ rt=$c; break; }}; done',
            'elif ! command -v "$rt" >/dev/null 2>&1; then echo "missing $rt"; exit 0; fi',
            '[ -n "$rt" ] || { echo "missing -"; exit 0; }',
            'echo "runtime $rt"',
            'case "$rt" in',
            *cases,
            "esac",
            '[ -n "$id" ] || { echo "image -"; exit 0; }',
            'echo "image $id"',
            *(_probe_once(marks) if marks else _PROBE),
            *look,
        ]
    )


_PROBE = [
    "out=$(probe 2>&1 </dev/null); rc=$?",
    'echo "probe $rc $(printf "%s" "$out" | tail -n 1)"',
]


def _probe_once(marks: str) -> list[str]:
    return [
        f'm={marks}/"$rt-$(printf %s "$id" | tr -c "A-Za-z0-9._-" _)"',
        'if [ -f "$m" ]; then rc=0; echo "probe 0 cached"; else',
        *_PROBE,
        '[ "$rc" != 0 ] || { mkdir -p "${m%/*}" && : >"$m"; } 2>/dev/null',
        "fi",
    ]


def shell_dir(path: str) -> str:
    """``path`` as one shell word, a leading ``~`` still the login's home."""
    if path == "~" or path.startswith("~/"):
        return '"$HOME"' + (shlex.quote(path[1:]) if len(path) > 1 else "")
    return shlex.quote(path)


def parse(stdout: str, image: str, nccl_python: str | None = None) -> ImageFacts:
    facts = dict(line.split(" ", 1) for line in stdout.splitlines() if " " in line)
    if "missing" in facts:
        which = facts["missing"]
        if which == "-":
            return ImageFacts(None, problem=f"no container runtime found ({', '.join(ORDER)})")
        return ImageFacts(None, problem=f"container runtime {which} not found")
    rt = facts.get("runtime")
    if facts.get("image", "-") == "-":
        return ImageFacts(rt, problem=f"image {image} is not present ({rt})")
    code, _, last = facts.get("probe", "? ").partition(" ")
    if code != "0":
        why = f": {last.strip()}" if last.strip() else ""
        return ImageFacts(rt, facts["image"], f"{rt} cannot start a container of {image}{why}")
    if nccl_python:
        code, _, found = facts.get("nccl", "? ").partition(" ")
        found = found.strip()
        if code != "0" or not found:
            why = f": {found}" if found else ""
            return ImageFacts(
                rt, facts["image"], f"cannot look for NCCL in image {image} ({nccl_python}){why}"
            )
        if found == "-":
            return ImageFacts(
                rt,
                facts["image"],
                f"image {image} has no NCCL (no libnccl in it; the job uses GPUs)",
            )
    return ImageFacts(rt, facts["image"])


def check_images(
    fleet: Fleet, want: Mapping[str, tuple], *, recheck: bool = False
) -> dict[str, str]:
    """host -> the runtime it uses; raises CheckError naming every host that cannot run.
    ``recheck``: start the trivial container even where one of the image id started."""
    nodes = [n for n in fleet.nodes if n.name in want]

    def one(node: Node, conn) -> ImageFacts:
        image, named, py = (*want[node.name], None)[:3]
        marks = None if recheck else shell_dir(f"{node.workdir.rstrip('/')}/containers/started")
        res = conn.run(["sh", "-c", script(image, named, py, marks)], timeout=TIMEOUT)
        return parse(res.stdout, image, py)

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
    return {h: f.runtime for h, f in result.items()}  # type: ignore[union-attr]


def mismatches(want: Mapping[str, tuple], ids: Mapping[str, str | None]) -> list[str]:
    """Nodes whose build of an image is not the one most nodes have, each named with both ids."""
    out = []
    for image in sorted({w[0] for w in want.values()}):
        hosts = [h for h in want if want[h][0] == image]
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
