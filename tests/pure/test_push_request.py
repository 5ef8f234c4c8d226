"""One record of what a push ships and under which policy (``PushRequest``): ``run`` builds the
one ``push`` builds, and a key-like file it allows is let through alike by the code snapshot
here and by the checkpoint relay's scan on the node (a local node: the real helper, no SSH)."""

from __future__ import annotations

from pathlib import Path

import pytest

from fleetctl.api.runspec import RunSpec
from fleetctl.node import Node
from fleetctl.phases.codesync import SecretError
from fleetctl.phases.push import PushRequest
from fleetctl.phases.push.relay import RelaySource, RelayTarget, relay_checkpoints
from fleetctl.ssh.fanout import FanOut

PEM = "-----BEGIN " + "RSA PRIVATE KEY-----\nMIIB\n-----END RSA PRIVATE KEY-----\n"
KEY = "certs/server.pem"


def test_run_derives_the_record_push_is_given() -> None:
    spec = RunSpec.build("t.py", env_archive="env.tar.gz", allow_secrets=[KEY])
    assert spec.program.push_request("/code") == PushRequest("/code", "env.tar.gz", (KEY,))
    assert not PushRequest().asked() and PushRequest(env_archive="e.tar").asked()


def test_a_given_archive_wins_over_the_inventorys_and_says_whose_it_is() -> None:
    node = Node.localhost(env_archive="/inv/env.tar.gz")
    assert PushRequest().archive_of(node) == ("/inv/env.tar.gz", True)
    assert PushRequest(env_archive="/mine.tar").archive_of(node) == ("/mine.tar", False)


def _node(root: Path, name: str) -> tuple[Node, Path, Path]:
    snap = root / name / "code" / "d1"
    snap.mkdir(parents=True)
    (snap / "train.py").write_text("print('train')\n")
    work = root / name / "work" / "j1"
    work.mkdir(parents=True)
    return Node.localhost(name=name, workdir=str(root / name)), snap, work


@pytest.mark.parametrize("allowed", [False, True])
def test_the_snapshot_and_the_relay_let_the_same_key_through(tmp_path: Path, allowed: bool) -> None:
    policy = PushRequest(allow_secrets=(KEY,) if allowed else ())
    n1, snap1, work1 = _node(tmp_path, "n1")
    (work1 / "certs").mkdir()
    (work1 / KEY).write_text(PEM)
    (work1 / "snapshot.pt").write_bytes(b"epoch=3")
    n2, snap2, work2 = _node(tmp_path, "n2")
    here = PushRequest(work1, None, policy.allow_secrets)
    if allowed:
        assert KEY in here.snapshot().files
    else:
        with pytest.raises(SecretError):
            here.snapshot()
    with FanOut([n1, n2]) as fleet:
        report = relay_checkpoints(
            fleet,
            RelaySource(n1, str(work1), str(snap1)),
            [RelayTarget(n2, str(work2), str(snap2))],
            policy=policy,
        )
    assert (work2 / "snapshot.pt").read_bytes() == b"epoch=3"
    assert (work2 / KEY).exists() is allowed
    assert report.secrets == ([] if allowed else [KEY])
