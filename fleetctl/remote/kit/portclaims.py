"""Which folder holds this user's port claims on this host: the one rule that the port probe
(which claims) and the supervisor (which adopts and frees) both follow.

The claims of every run of a user on a host must meet in one folder, whoever starts the run
(an SSH session, a Slurm step, a detached job's later commands), so the folder is host-local
and chosen the same way every time:

- not the home: it may be one NFS folder shared by every host;
- not the runtime folder (``$XDG_RUNTIME_DIR``, ``/run/user/UID``): it exists only while the
  user has a logind session on the host, so a Slurm step (no session) and an SSH run would
  claim in two folders, and logind removes it with the user's last session, under a detached
  job that still holds its claims;
- ``/tmp/fleetctl-ports-UID``, or, when that name is taken by something that is not a
  private folder of this user (another user may create it first: sticky /tmp lets nobody
  else remove it), the first of ``…-UID.1``, ``…-UID.2``, … up to ``TRIES`` names that is.
  Every run looks at the names in the same order and uses the first that is this user's
  folder; it makes one (the first free name) only when none is, so runs never split between
  two folders. Only squatting all ``TRIES`` names blocks the claims, and then the run is
  refused naming the folders.

``FLEETCTL_PORT_CLAIMS`` replaces ``/tmp/fleetctl-ports-UID`` as the first name (tests, odd
hosts). Node module: stdlib only, Python >= 3.8.
"""

from __future__ import annotations

import os
import stat

TRIES = 32  # names looked at: /tmp/fleetctl-ports-UID, then .1 … .31


class ClaimsUnusable(Exception):
    """No claim folder of this user can be made or used on this host: nothing is claimed."""


def names() -> list[str]:
    """The claim folder's names, in the order every run looks at them."""
    first = os.environ.get("FLEETCTL_PORT_CLAIMS") or f"/tmp/fleetctl-ports-{os.getuid()}"
    return [first] + [f"{first}.{i}" for i in range(1, TRIES)]


def _mine(path: str) -> bool | None:
    """True: a folder (not a link) of this user; None: nothing there; False: anything else."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid()


def _private(path: str) -> str:
    """``path`` (a folder of this user) with nobody else able to write in it."""
    if os.lstat(path).st_mode & 0o077:
        os.chmod(path, 0o700)
    return path


def existing_claims_folder() -> str | None:
    """The first of :func:`names` that is a folder of this user; None when none is (then
    this user has no claims on this host)."""
    return next((n for n in names() if _mine(n)), None)


def claims_folder() -> str:
    """This user's claim folder, made 0700 at the first free name if there is none yet;
    ClaimsUnusable when every name is taken by something else or none can be made."""
    for _ in range(TRIES + 1):  # a name taken between the look and the mkdir: look again
        found = existing_claims_folder()
        if found is not None:
            return _private(found)
        free = next((n for n in names() if _mine(n) is None), None)
        if free is None:
            break
        try:
            os.mkdir(free, 0o700)
        except FileExistsError:
            continue
        except OSError as e:
            raise ClaimsUnusable(
                f"port claim folder {free} cannot be made: {e.strerror or e}"
            ) from None
        return _private(free)
    first = names()[0]
    raise ClaimsUnusable(
        f"port claim folders {first} and {first}.1 … .{TRIES - 1} are all taken by other "
        f"users or are not folders (uid {os.getuid()}); remove them"
    )
