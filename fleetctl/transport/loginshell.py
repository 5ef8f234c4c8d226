"""The node's login shell: sshd hands every remote command to it.

fleetctl's command lines are POSIX sh (``shlex`` quoting, multi-line ``python -c`` programs,
``if``/``exec``). A csh/tcsh login shell cannot parse them at all ("Unmatched '''."), and fish
reads ``\\\\`` inside single quotes as an escape, which corrupts programs silently. For such
nodes (``ansible_shell_type: csh`` or ``fish``, as Ansible wants them declared) each command
travels base64-encoded inside a line every login shell reads the same way, and runs under
``/bin/sh``.
"""

from __future__ import annotations

import base64

from fleetctl.node import WRAPPED_SHELLS

# One line, no backslash, no "!" and nothing between double quotes that csh or fish would
# expand: the login shell passes the single-quoted script and the base64 word to /bin/sh as
# they are; sh decodes the word ($0) and runs it. Needs only sh and coreutils' base64.
_WRAP = 'exec /bin/sh -c \'eval "$(printf %s "$0" | base64 -d)"\' '


def for_login_shell(line: str, shell_type: str | None) -> str:
    """``line`` as the node's login shell must receive it (unchanged for POSIX shells)."""
    if shell_type not in WRAPPED_SHELLS:
        return line
    return _WRAP + base64.b64encode(line.encode("utf-8")).decode("ascii")


def declared_type(login_shell: str) -> str | None:
    """The ``ansible_shell_type`` a node whose login shell is ``login_shell`` (a path, as sshd
    sets ``SHELL``) must declare; None for shells that read POSIX command lines."""
    name = login_shell.rsplit("/", 1)[-1]
    return "csh" if name in ("csh", "tcsh") else "fish" if name == "fish" else None
