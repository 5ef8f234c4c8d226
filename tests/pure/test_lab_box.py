"""`fleetctl lab box`'s recipe and the files it writes into the box, without building it
(tests/vms builds and boots it)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from fleetctl.lab import box

ROOT = Path(__file__).resolve().parents[2]


def test_the_cache_entry_is_named_by_the_recipe(monkeypatch: pytest.MonkeyPatch) -> None:
    first = box.recipe_hash()
    assert re.fullmatch(r"[0-9a-f]{16}", first)
    assert box.recipe_hash() == first
    monkeypatch.setattr(box, "PACKAGES", (*box.PACKAGES, "strace"))
    assert box.recipe_hash() != first


def test_the_box_boots_its_own_kernel_on_plain_qemu_with_its_own_key() -> None:
    entry = Path("/var/cache/fleetctl/box/0123456789abcdef")
    text = box.box_vagrantfile(entry)
    assert 'lv.driver = "qemu"' in text  # TCG: KVM does not work on the machines tested
    assert f'lv.kernel = "{entry}/vmlinuz"' in text
    assert f'lv.initrd = "{entry}/initrd.img"' in text
    assert f'lv.cmd_line = "{box.CMDLINE}"' in text and "root=/dev/vda" in box.CMDLINE
    assert f'config.ssh.private_key_path = ["{entry}/box_key"]' in text
    assert "config.ssh.insert_key = false" in text
    assert "insecure" not in text


def test_the_image_has_what_fleetctl_and_the_vagrantfile_need() -> None:
    for pkg in ("openssh-server", "python3", "rsync", "iproute2", "sudo", "ifupdown",
                "linux-image-amd64"):  # fmt: skip
        assert pkg in box.PACKAGES
    # no build-time host keys shared by every VM; no password login for vagrant
    assert 'rm -f "$R"/etc/ssh/ssh_host_*' in box.CUSTOMIZE
    assert "NOPASSWD" in box.CUSTOMIZE and "passwd" not in box.CUSTOMIZE.replace("NOPASSWD", "")


def test_box_needs_root(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(box.os, "geteuid", lambda: 1000)
    with pytest.raises(box.LabError, match="needs root"):
        box.build_box(tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_the_vagrantfile_uses_the_box_and_isolated_libvirt_networks() -> None:
    text = (ROOT / "Vagrantfile").read_text()
    assert 'config.vm.box = "fleetctl/bookworm64"' in text
    assert box.BOX_NAME == "fleetctl/bookworm64"
    assert 'lv.management_network_mode = "none"' in text
    assert text.count('libvirt__forward_mode: "none"') == 2
    assert not re.search(r"\bnat\b", re.sub(r"#.*", "", text), re.I)
