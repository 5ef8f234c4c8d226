"""``fleetctl/remote/programs/image_load.py`` (``push --image``'s node side) run by Python 3.8
against a fake ``podman`` on PATH, with the argv the controller's podman builder makes: the query
finds the runtime and the image's id, a load takes the archive (uploaded, or fetched from push's
``serve`` on a peer), answers the new id and leaves no archive behind, a failing load says why
and leaves none either."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from pathlib import Path

from fleetctl import remote
from fleetctl.phases.frames import last_data
from fleetctl.plan.runtimes import runtime

IMAGE = "fleetctl-test:py3"
#: podman's ``image inspect --format {{.Id}}`` and ``load -i FILE`` over one state file: the
#: id is the sha256 of the last archive loaded; an archive starting with ``bad`` fails.
FAKE = """\
import hashlib, os, sys
state = os.environ["FAKE_PODMAN_STATE"]
args = sys.argv[1:]
if args[:2] == ["image", "inspect"]:
    if not os.path.exists(state):
        sys.stderr.write("Error: " + args[-1] + ": image not known\\n")
        sys.exit(125)
    print(open(state).read())
elif args[:2] == ["load", "-i"]:
    data = open(args[2], "rb").read()
    if data.startswith(b"bad"):
        sys.stderr.write("Error: payload does not match any of the supported image formats\\n")
        sys.exit(125)
    open(state, "w").write(hashlib.sha256(data).hexdigest())
"""


def _env(py38: str, tmp_path: Path) -> dict[str, str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    fake = bin_dir / "podman"
    fake.write_text(f"#!{py38}\n{FAKE}")
    fake.chmod(0o755)
    return {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "FAKE_PODMAN_STATE": str(tmp_path / "state"),
    }


def _call(py38: str, mode: str, cfg: dict, env: dict[str, str]) -> tuple[int, dict]:
    p = subprocess.run(
        [py38, remote.NO_SITE, "-c", remote.inline("image_load.py"), mode],
        input=json.dumps(cfg).encode() + b"\n",
        capture_output=True,
        env=env,
        timeout=60,
    )
    out = last_data(p.stdout.decode())
    assert isinstance(out, dict), p.stderr
    return p.returncode, out


def _load_cfg(w: Path, name: str, data: bytes) -> dict:
    pod = runtime("podman")
    return {
        "workdir": str(w),
        "archive": name,
        "sha": hashlib.sha256(data).hexdigest(),
        "size": len(data),
        "load_argv": ["podman", "load", "-i"],
        "id_argv": pod.image_id_argv(IMAGE),
        "timeout": 30,
    }


def test_the_image_loader_queries_loads_and_leaves_no_archive(py38: str, tmp_path: Path) -> None:
    env = _env(py38, tmp_path)
    w = tmp_path / "w"
    query = {
        "workdir": str(w),
        "runtimes": ["docker-absent", "podman"],
        "id_argv": {
            "docker-absent": ["docker-absent", "image", "inspect", IMAGE],
            "podman": runtime("podman").image_id_argv(IMAGE),
        },
    }
    code, out = _call(py38, "query", query, env)
    assert code == 0 and out["runtime"] == "podman" and out["image_id"] is None, out
    assert out["workdir"] == str(w) and out["free"] > 0

    data = os.urandom(200_000)
    (w / "envs" / ".tmp-image-a.tar").write_bytes(data)
    code, out = _call(py38, "load", _load_cfg(w, ".tmp-image-a.tar", data), env)
    assert code == 0 and out["image_id"] == hashlib.sha256(data).hexdigest(), out
    assert os.listdir(w / "envs") == []
    code, out = _call(py38, "query", query, env)
    assert out["image_id"] == hashlib.sha256(data).hexdigest()

    bad = b"bad" + os.urandom(1000)
    (w / "envs" / ".tmp-image-b.tar").write_bytes(bad)
    code, out = _call(py38, "load", _load_cfg(w, ".tmp-image-b.tar", bad), env)
    assert code == 3 and out["stage"] == "load", out
    assert out["error"].startswith("podman load failed (exit 125): Error: payload"), out
    assert os.listdir(w / "envs") == []

    (w / "envs" / ".tmp-image-c.tar").write_bytes(data + b"x")
    code, out = _call(py38, "load", _load_cfg(w, ".tmp-image-c.tar", data), env)
    assert code == 3 and "sha256 does not match" in out["error"], out
    assert os.listdir(w / "envs") == []


def test_a_node_fetches_the_image_from_a_peer_and_the_seed_keeps_it_until_cleanup(
    py38: str, tmp_path: Path
) -> None:
    seed_env = _env(py38, tmp_path / "seed")
    node_env = _env(py38, tmp_path / "node")
    data = os.urandom(300_000)
    w1, w2 = tmp_path / "seed" / "w", tmp_path / "node" / "w"
    (w1 / "envs").mkdir(parents=True)
    (w1 / "envs" / ".tmp-image-s.tar").write_bytes(data)
    seed_cfg = {**_load_cfg(w1, ".tmp-image-s.tar", data), "keep_archive": True}
    code, out = _call(py38, "load", seed_cfg, seed_env)
    assert code == 0 and (w1 / "envs" / ".tmp-image-s.tar").exists(), out
    token = "t" * 64
    serve = subprocess.Popen(
        [py38, remote.NO_SITE, "-c", remote.inline("push_helper.py"), "serve"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    try:
        assert serve.stdin is not None and serve.stdout is not None
        srv = {
            "path": str(w1 / "envs" / ".tmp-image-s.tar"),
            "sha": seed_cfg["sha"],
            "token": token,
            "bind": "127.0.0.1",
            "timeout": 60,
        }
        serve.stdin.write(json.dumps(srv).encode() + b"\n")
        serve.stdin.flush()
        port = last_data(serve.stdout.readline().decode(), "A")["port"]
        peer = {"name": "node1", "host": "127.0.0.1", "port": port, "token": token}
        cfg = {**_load_cfg(w2, ".tmp-image-f.tar", data), "fetch": {"peers": [peer]}}
        code, out = _call(py38, "load", cfg, node_env)
        assert code == 0 and out["peer"] == "node1", out
        assert out["image_id"] == hashlib.sha256(data).hexdigest()
        assert os.listdir(w2 / "envs") == []
        wrong = {**peer, "token": "u" * 64}
        cfg = {**_load_cfg(w2, ".tmp-image-g.tar", data), "fetch": {"peers": [wrong]}}
        code, out = _call(py38, "load", cfg, node_env)
        assert code == 3 and out["stage"] == "fetch" and "HTTP 403" in out["error"], out
        assert os.listdir(w2 / "envs") == []
    finally:
        serve.stdin.close()  # type: ignore[union-attr]
        serve.wait(30)
    code, out = _call(
        py38, "cleanup", {"workdir": str(w1), "archive": ".tmp-image-s.tar"}, seed_env
    )
    assert code == 0 and os.listdir(w1 / "envs") == []
    code, out = _call(py38, "cleanup", {"workdir": str(w1), "archive": "../x"}, seed_env)
    assert code == 3 and "not an archive name" in out["error"]
