"""Before a retry: wait for the hosts the failed attempt lost to answer SSH again.

A host lost mid-run has often rebooted (a kernel panic, a watchdog, a power cycle) and answers
again minutes later. Reached at once, it refuses SSH or times out while it boots, so the retry
would fail before launch and ``--max-retries 1`` would be spent on a host that was coming back.
So each such host is dialled again and again (short tries: a host coming back answers the next
one) until it runs a command (``true``: on a VM still booting under qemu, SSH answered 4 min
after the reset but a session channel still timed out) or ``--reboot-timeout`` passes. A host
that does not come back is left to the retry, whose check or push then names it as usual: the
wait never fails a run itself.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from fleetctl.errors import FleetctlError

if TYPE_CHECKING:
    from fleetctl.node import Node

DEFAULT_REBOOT_TIMEOUT = 300.0
TRY = 5.0  # s for one try (TCP, banner, auth): a booting host may take its SYNs unanswered
PAUSE = 1.0  # s between rounds: a refused connection answers at once


def await_hosts(
    nodes: Sequence[Node],
    timeout: float,
    dial: Callable[[Node, float], None],
    *,
    say: Callable[[str], None] = lambda _m: None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> dict[str, float | None]:
    """Dial each of ``nodes`` (``dial(node, seconds)`` raises FleetctlError when it does not
    answer) until it answers or ``timeout`` s passed. Returns each host's seconds until it
    answered, None for one that did not; ``say`` hears the wait start and each host's end."""
    pending = list(nodes)
    back: dict[str, float | None] = {}
    if not pending or timeout <= 0:
        return {n.name: None for n in pending}
    t0 = clock()
    deadline = t0 + timeout
    names = ", ".join(n.name for n in pending)
    say(f"waiting up to {timeout:g}s for {names} to answer SSH again (a reboot?)")
    while pending:
        for node in list(pending):
            left = deadline - clock()
            if left <= 0:
                break
            try:
                dial(node, max(0.5, min(TRY, left)))
            except FleetctlError:
                continue
            pending.remove(node)
            back[node.name] = round(clock() - t0, 1)
            say(f"{node.name}: answers SSH again after {back[node.name]:g}s")
        left = deadline - clock()
        if not pending or left <= 0:
            break
        sleep(min(PAUSE, left))
    for node in pending:
        back[node.name] = None
        say(f"{node.name}: no answer over SSH within {timeout:g}s; the retry goes on")
    return back
