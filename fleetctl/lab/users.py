"""The lab's login user (``lab up --user``): made on this machine when missing (the hosts share
its /etc/passwd), with subordinate id ranges (rootless podman), and removed by ``down`` once no
other lab logs in as it. Its state (what the lab made: ``created_user``, ``created_home``,
``added_subids``) is the store's."""

from __future__ import annotations

import contextlib
import os
from typing import TYPE_CHECKING

from fleetctl.lab import net
from fleetctl.lab.registry import _entry_live, _registry_entries

if TYPE_CHECKING:
    from fleetctl.lab.store import LabStore

SUBID_START = 100000  # where useradd starts subordinate ids (login.defs SUB_UID_MIN)
SUBID_COUNT = 65536
SUBID_FILES = ("/etc/subuid", "/etc/subgid")


def ensure_user(store: LabStore) -> None:
    """The login user exists on this machine, and the mountpoint of each host's home."""
    import pwd

    user, home = store.user, store.home
    assert user is not None
    try:
        pwd.getpwnam(user)
    except KeyError:
        # "*": no password, but not locked (sshd refuses a locked account even with a key)
        net.run(["useradd", "-M", "-d", home, "-s", "/bin/sh", "-U", "-p", "*", user])
        store.state["created_user"] = True
    ensure_subids(store)
    if not os.path.isdir(home):  # the mountpoint of each host's home
        os.makedirs(home, mode=0o755)
        store.state["created_home"] = True
    with store.dirlock():
        store.save()


def ensure_subids(store: LabStore) -> None:
    """Subordinate uid and gid ranges for the login user (/etc/subuid, /etc/subgid), which
    rootless podman maps into its user namespace (newuidmap, package uidmap). useradd gives
    them where the files exist; a user made before them gets the next free range here, taken
    back by ``down`` (``added_subids``)."""
    user = store.user
    assert user is not None
    texts = []
    for path in SUBID_FILES:
        if not os.path.exists(path):  # usermod refuses to add to a missing file
            with open(path, "a"):
                os.chmod(path, 0o644)
        with open(path) as f:
            texts.append(f.read())
    args = subid_grant(user, *texts)
    if not args:
        return
    # best effort: without ranges only rootless podman fails, and says so
    if net.run(["usermod", *args, user], check=False).returncode != 0:
        return
    if not store.state.get("created_user"):  # userdel takes a made user's ranges with it
        store.state["added_subids"] = args


def subid_grant(user: str, subuid: str, subgid: str) -> list[str]:
    """usermod's arguments that give ``user`` a range in each of /etc/subuid and /etc/subgid
    (their texts) lacking one: the same 65536 ids in both, past every range either holds
    (from 100000, as useradd). [] when the user has both."""
    flags: list[str] = []
    top = SUBID_START
    for text, flag in ((subuid, "--add-subuids"), (subgid, "--add-subgids")):
        mine = False
        for line in text.splitlines():
            parts = line.strip().split(":")
            if len(parts) == 3 and parts[1].isdigit() and parts[2].isdigit():
                top = max(top, int(parts[1]) + int(parts[2]))
                mine = mine or parts[0] == user
        if not mine:
            flags.append(flag)
    span = f"{top}-{top + SUBID_COUNT - 1}"
    return [x for f in flags for x in (f, span)]


def remove_user(store: LabStore) -> list[str]:
    """The user this lab made, unless another lab still logs in as it; what was removed."""
    user = store.user
    if user is None:
        return []
    others = [e for e in _registry_entries() if e.get("user") == user and _entry_live(e)]
    if others:  # another lab still logs in as this user
        return []
    added = store.state.pop("added_subids", None)
    if added:  # ranges this lab gave a user it did not make
        net.run(["usermod", *(a.replace("--add-", "--del-") for a in added), user], check=False)
    if not store.state.get("created_user"):
        return []
    net.run(["userdel", user], check=False)
    if store.state.pop("created_home", False):
        with contextlib.suppress(OSError):
            os.rmdir(store.home)
    store.state["created_user"] = False
    return [f"user {user}"]
