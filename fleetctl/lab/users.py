"""The lab's login user (``lab up --user``): made on this machine when missing (the hosts share
its /etc/passwd) and removed by ``down`` once no other lab logs in as it. Its state (what the
lab made: ``created_user``, ``created_home``) is the store's."""

from __future__ import annotations

import contextlib
import os
from typing import TYPE_CHECKING

from fleetctl.lab import net
from fleetctl.lab.registry import _entry_live, _registry_entries

if TYPE_CHECKING:
    from fleetctl.lab.store import LabStore


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
    if not os.path.isdir(home):  # the mountpoint of each host's home
        os.makedirs(home, mode=0o755)
        store.state["created_home"] = True
    with store.dirlock():
        store.save()


def remove_user(store: LabStore) -> list[str]:
    """The user this lab made, unless another lab still logs in as it; what was removed."""
    user = store.user
    if not store.state.get("created_user") or user is None:
        return []
    others = [e for e in _registry_entries() if e.get("user") == user and _entry_live(e)]
    if others:  # another lab still logs in as this user
        return []
    net.run(["userdel", user], check=False)
    if store.state.pop("created_home", False):
        with contextlib.suppress(OSError):
            os.rmdir(store.home)
    store.state["created_user"] = False
    return [f"user {user}"]
