"""``fleetctl push --image`` with podman on 3 lab hosts: this machine's image reaches the two
hosts that lack it (each gets an image store of its own through ``CONTAINERS_STORAGE_CONF``
in its shell; node1 shares this machine's store and has it), through the peer relay so the
controller sends it once; the same id everywhere after, no temp archive left, and
``fleetctl run --image`` then runs on all 3. A missing local image is exit 2, a node whose load
fails is named, exit 3.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from fleetctl.lab import Lab
from fleetctl.testing.cli_runner import run_cli
from fleetctl.testing.images import BASE_IMAGE, ImageUnavailable, base_image
from fleetctl.testing.pytest_plugin import skip_or_fail

pytestmark = pytest.mark.lab

IMAGE = BASE_IMAGE
CONF = "/tmp/own-storage.conf"  # each lab host's private /tmp is its host dir's tmp/
OWN = (
    '[storage]\ndriver = "vfs"\n'
    'graphroot = "/tmp/own-store/graph"\nrunroot = "/tmp/own-store/run"\n'
)
SHOW = 'import os\nprint("in-image", os.environ["FLEET_NODE_RANK"], flush=True)\n'


def _podman(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["podman", *args], capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def image() -> str:
    """The test image in this machine's store (``fleetctl.testing.images``: built from Debian
    packages once per machine, imported when the store lacks it)."""
    try:
        return base_image()
    except ImageUnavailable as e:
        skip_or_fail(str(e))


@pytest.fixture(scope="module")
def lab(make_lab_module: Callable[..., Lab], image: str) -> Iterator[Lab]:
    """node2 and node3 with image stores of their own (empty), node1 with this machine's."""
    lab = make_lab_module(3)
    saved = {}
    for host in ("node2", "node3"):
        hd = lab.host_dir(host)
        if not (hd / "bashrc").is_file():
            skip_or_fail(f"{host} has no .bashrc of its own (the lab keeps the machine's)")
        (hd / "tmp" / "own-storage.conf").write_text(OWN)
        saved[host] = (hd / "bashrc").read_text()
        (hd / "bashrc").write_text(saved[host] + f"export CONTAINERS_STORAGE_CONF={CONF}\n")
    try:
        yield lab
    finally:
        for host, text in saved.items():
            hd = lab.host_dir(host)
            (hd / "bashrc").write_text(text)
            shutil.rmtree(hd / "tmp" / "own-store", ignore_errors=True)


def on_node(lab: Lab, host: str, script: str) -> str:
    got = run_cli("exec", "-i", str(lab.inventory_path), "--limit", host, "--", "sh", "-c", script)
    assert got.exit_code == 0, got.stdout + got.stderr
    return "\n".join(line.partition(": ")[2] for line in got.stdout.splitlines())


def image_ids(lab: Lab) -> dict[str, str]:
    fmt = "'{{.Id}}'"
    return {
        h: on_node(lab, h, f"podman image inspect --format {fmt} {IMAGE} 2>/dev/null || true")
        for h in ("node1", "node2", "node3")
    }


def temp_archives(lab: Lab) -> str:
    got = run_cli(
        "exec", "-i", str(lab.inventory_path), "--", "sh", "-c", "ls -A ~/.fleetctl/envs || true"
    )
    assert got.exit_code == 0, got.stderr
    return "\n".join(line for line in got.stdout.splitlines() if ".tmp-" in line)


def test_push_image_loads_it_where_it_is_missing_then_run_uses_it(
    lab: Lab, image: str, tmp_path: Path
) -> None:
    ours = _podman("image", "inspect", "--format", "{{.Id}}", IMAGE).stdout.strip()
    before = image_ids(lab)
    assert before == {"node1": ours, "node2": "", "node3": ""}, before

    inv = str(lab.inventory_path)
    r = run_cli("push", "-i", inv, "--image", IMAGE, "--json")
    assert r.exit_code == 0, r.stderr
    doc = json.loads(r.stdout)
    nodes = doc["nodes"]
    assert nodes["node1"]["status"] == "present" and nodes["node1"]["bytes_sent"] == 0
    assert {nodes[h]["status"] for h in ("node2", "node3")} == {"loaded"}, nodes
    assert sorted(nodes[h]["via"] for h in ("node2", "node3")) == ["peer", "sftp"], nodes
    assert doc["image_id"] == ours and doc["peer_fetches"] == 1
    assert 0 < doc["controller_bytes"] <= 1.2 * doc["archive_bytes"], doc
    assert image_ids(lab) == {"node1": ours, "node2": ours, "node3": ours}
    assert temp_archives(lab) == ""

    again = run_cli("push", "-i", inv, "--image", IMAGE, "--json")
    assert again.exit_code == 0, again.stderr
    doc = json.loads(again.stdout)
    assert {n["status"] for n in doc["nodes"].values()} == {"present"}
    assert doc["controller_bytes"] == 0 and doc["archive_bytes"] == 0

    code = tmp_path / "code"
    code.mkdir()
    (code / "show.py").write_text(SHOW)
    runs = tmp_path / "runs"
    r = run_cli(
        "run", "-i", inv, "--launcher", "plain", "--runs-dir", str(runs), "--code-dir",
        str(code), "--image", IMAGE, "show.py", cwd=code,
    )  # fmt: skip
    assert r.exit_code == 0, r.stderr
    (folder,) = list(runs.iterdir())
    for rank, host in enumerate(("node1", "node2", "node3")):
        console = (folder / f"{rank}-{host}" / "console.log").read_text()
        assert f"in-image {rank}" in console, console


def test_a_missing_local_image_is_one_line_exit_2_and_nothing_sent(lab: Lab) -> None:
    r = run_cli("push", "-i", str(lab.inventory_path), "--image", "fleetctl-test:absent")
    assert r.exit_code == 2, r.stderr
    assert r.stderr.strip().splitlines() == [
        "fleetctl: error: image fleetctl-test:absent is not present on this machine (podman)"
    ], r.stderr
    assert r.stdout == ""


def test_a_node_whose_load_fails_is_named_exit_3_and_no_archive_is_left(lab: Lab) -> None:
    """node3's store is one podman cannot write (its graph root is a file): its load fails,
    node2 still gets the image from the controller."""
    hd = lab.host_dir("node3")
    broken = OWN.replace("/tmp/own-store/graph", "/tmp/not-a-folder/graph")
    (hd / "tmp" / "not-a-folder").write_text("")
    (hd / "tmp" / "own-storage.conf").write_text(broken)
    on_node(lab, "node2", f"podman rmi -f {IMAGE} >/dev/null 2>&1 || true")
    try:
        r = run_cli("push", "-i", str(lab.inventory_path), "--image", IMAGE)
    finally:
        (hd / "tmp" / "own-storage.conf").write_text(OWN)
        (hd / "tmp" / "not-a-folder").unlink()
    assert r.exit_code == 3, r.stderr
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith(
        f"fleetctl: error: image {IMAGE} did not reach node3: podman load failed (exit 125): "
    ), last
    rows = {line.split()[0]: line for line in r.stdout.splitlines() if line.startswith("  node")}
    assert " present " in rows["node1"] and " loaded, sftp " in rows["node2"], r.stdout
    assert " failed: node3" in rows["node3"], r.stdout
    ours = _podman("image", "inspect", "--format", "{{.Id}}", IMAGE).stdout.strip()
    assert image_ids(lab)["node2"] == ours
    assert temp_archives(lab) == ""


def test_nodes_that_got_the_image_serve_the_next_wave(lab: Lab, image: str) -> None:
    """All 3 hosts lack it (node1 too gets a store of its own); one fetcher per holder a wave
    (``peer_fanout=1``): node1 is the seed (SFTP), node2 fetches from node1, then node3 from
    node2 (the newest holder serves first), so the controller sends the image once and node2
    relays it. No archive is left on any node."""
    from fleetctl.api.fleet import Fleet as ApiFleet
    from fleetctl.api.runspec import Container
    from fleetctl.phases.push.image import push_image
    from fleetctl.ssh.fanout import FanOut

    hd = lab.host_dir("node1")
    bashrc = hd / "bashrc"
    original = bashrc.read_text()
    (hd / "tmp" / "own-storage.conf").write_text(OWN)
    bashrc.write_text(original + f"export CONTAINERS_STORAGE_CONF={CONF}\n")
    try:
        for host in ("node2", "node3"):
            on_node(lab, host, f"podman rmi -f {IMAGE} >/dev/null 2>&1 || true")
        assert image_ids(lab) == {"node1": "", "node2": "", "node3": ""}
        api = ApiFleet.from_inventory(str(lab.inventory_path))
        with FanOut(api.nodes, api.settings) as fleet:
            report = push_image(fleet, Container(image=IMAGE), peer_fanout=1)
        nodes = report.nodes
        got = {h: (nodes[h].status, nodes[h].via, nodes[h].source) for h in nodes}
        assert got == {
            "node1": ("loaded", "sftp", None),
            "node2": ("loaded", "peer", "node1"),
            "node3": ("loaded", "peer", "node2"),
        }, got
        assert report.controller_bytes == report.archive_bytes > 0, report
        assert report.peer_fetches == 2
        ours = _podman("image", "inspect", "--format", "{{.Id}}", IMAGE).stdout.strip()
        assert image_ids(lab) == {"node1": ours, "node2": ours, "node3": ours}
        assert temp_archives(lab) == ""
    finally:
        bashrc.write_text(original)
        shutil.rmtree(hd / "tmp" / "own-store", ignore_errors=True)
