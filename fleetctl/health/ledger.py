"""The health ledger: the fleet remembers which nodes were sick, why, and until when.

One JSON file in the user's state folder (``$FLEETCTL_STATE_DIR``, else
``$XDG_STATE_HOME/fleetctl``, else ``~/.local/state/fleetctl``): ``health/ledger.json``,
0600, read and rewritten under an ``fcntl`` lock (``ledger.lock`` beside it) and replaced
atomically, so two fleetctl processes recording at once both land. Every sickness is an
entry: host, source (``gate``, ``collective``, ``slow``, ``lost``, ``failure``), reason,
evidence, job id, time, expiry (``ttl``, default 24 h, ``$FLEETCTL_HEALTH_TTL`` seconds).

Rules (``Ledger.status``): a host with an entry not yet expired is *sick*; a host recorded
twice within the window (default 72 h, ``$FLEETCTL_HEALTH_WINDOW``) stays out until cleared
(*pinned*), whatever the expiries. The same source and reason recorded again while its entry
is live refreshes that entry (a persisting fault seen by each check is one failure, not many).
``clear``/``clear_all`` forget. Also here, one file per host: the figures of its last check
(``health/last/<host>.json``) that "since the last check" compares with.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from fleetctl.errors import HealthLedgerError

VERSION = 1
DEFAULT_TTL = 24 * 3600.0
DEFAULT_WINDOW = 72 * 3600.0
SOURCES = ("gate", "collective", "slow", "lost", "failure", "manual")


def state_dir() -> Path:
    """The user's fleetctl state folder (not the cache: the ledger must survive a cleanup)."""
    env = os.environ.get("FLEETCTL_STATE_DIR")
    if env:
        return Path(env)
    base = os.environ.get("XDG_STATE_HOME") or os.path.expanduser("~/.local/state")
    return Path(base) / "fleetctl"


def _seconds(var: str, default: float) -> float:
    raw = os.environ.get(var)
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise HealthLedgerError(f"${var}={raw!r} is not a number of seconds") from None
    if value <= 0:
        raise HealthLedgerError(f"${var}={raw!r} must be more than 0 seconds")
    return value


@dataclass(frozen=True)
class Entry:
    """One sickness of one host."""

    host: str
    source: str
    reason: str
    evidence: str
    job_id: str | None
    at: float
    expires: float

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], where: str) -> Entry:
        try:
            job = d.get("job_id")
            return cls(
                host=_str(d["host"]),
                source=_str(d["source"]),
                reason=_str(d["reason"]),
                evidence=_str(d.get("evidence", "")),
                job_id=None if job is None else _str(job),
                at=float(d["at"]),
                expires=float(d["expires"]),
            )
        except (KeyError, TypeError, ValueError) as e:
            raise HealthLedgerError(f"{where}: an entry is malformed ({e!r})") from None


def _str(v: Any) -> str:
    if not isinstance(v, str):
        raise TypeError(f"expected a string, got {type(v).__name__}")
    return v


@dataclass(frozen=True)
class HostStatus:
    """What the ledger says of one host now: ``out`` (sick or pinned), why, until when."""

    host: str
    entries: tuple[Entry, ...]
    sick: bool
    pinned: bool

    @property
    def out(self) -> bool:
        return self.sick or self.pinned

    def why(self) -> str:
        last = self.entries[-1]
        if self.pinned:
            until = "until cleared (failed twice)"
        else:
            until = "until " + time.strftime("%Y-%m-%d %H:%M", time.localtime(last.expires))
        return f"{last.source}: {last.reason} ({until})"


class Ledger:
    """The ledger file at ``path`` (default: the state folder's)."""

    def __init__(self, path: Path | None = None, *, window: float | None = None) -> None:
        self.path = path or state_dir() / "health" / "ledger.json"
        self.window = window or _seconds("FLEETCTL_HEALTH_WINDOW", DEFAULT_WINDOW)

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            fd = os.open(self.path.with_suffix(".lock"), os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as e:
            raise HealthLedgerError(f"{self.path}: {e.strerror or e}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def _read(self) -> list[Entry]:
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            return []
        except OSError as e:
            raise HealthLedgerError(f"{self.path}: {e.strerror or e}") from None
        try:
            doc = json.loads(text)
        except ValueError as e:
            raise HealthLedgerError(f"{self.path}: not JSON ({e})") from None
        if not isinstance(doc, dict) or not isinstance(doc.get("entries"), list):
            raise HealthLedgerError(f"{self.path}: not a fleetctl health ledger")
        return [Entry.from_dict(d, str(self.path)) for d in doc["entries"]]

    def _write(self, entries: Sequence[Entry]) -> None:
        doc = {"version": VERSION, "entries": [asdict(e) for e in entries]}
        try:
            fd, tmp = tempfile.mkstemp(prefix=".ledger.", dir=self.path.parent)
            with os.fdopen(fd, "w") as f:  # mkstemp's file is 0600
                json.dump(doc, f, indent=1, sort_keys=True)
                f.write("\n")
            os.replace(tmp, self.path)
        except OSError as e:
            raise HealthLedgerError(f"{self.path}: {e.strerror or e}") from None

    def _keep(self, entries: Sequence[Entry], now: float) -> list[Entry]:
        """Entries still live or within the window (the rest can no longer matter)."""
        return [e for e in entries if e.expires > now or e.at >= now - self.window]

    def entries(self, now: float | None = None) -> list[Entry]:
        now = time.time() if now is None else now
        with self._locked():
            return self._keep(self._read(), now)

    def record(
        self,
        host: str,
        *,
        source: str,
        reason: str,
        evidence: str = "",
        job_id: str | None = None,
        ttl: float | None = None,
        now: float | None = None,
    ) -> Entry:
        """Record ``host`` sick (or refresh its live entry of the same source and reason)."""
        now = time.time() if now is None else now
        ttl = ttl if ttl is not None else _seconds("FLEETCTL_HEALTH_TTL", DEFAULT_TTL)
        entry = Entry(host, source, reason, evidence, job_id, now, now + ttl)
        with self._locked():
            entries = self._keep(self._read(), now)
            for i, e in enumerate(entries):
                if (e.host, e.source, e.reason) == (host, source, reason) and e.expires > now:
                    entries[i] = entry
                    break
            else:
                entries.append(entry)
            self._write(entries)
        return entry

    def clear(self, hosts: Sequence[str]) -> list[str]:
        """Forget every entry of ``hosts``; the hosts that had any."""
        with self._locked():
            entries = self._read()
            had = sorted({e.host for e in entries if e.host in hosts})
            self._write([e for e in entries if e.host not in hosts])
        return had

    def clear_all(self) -> int:
        with self._locked():
            n = len(self._read())
            self._write([])
        return n

    def status(self, now: float | None = None) -> dict[str, HostStatus]:
        """Every host the ledger holds, in the order first recorded."""
        now = time.time() if now is None else now
        by: dict[str, list[Entry]] = {}
        for e in self.entries(now):
            by.setdefault(e.host, []).append(e)
        out = {}
        for host, es in by.items():
            recent = [e for e in es if e.at >= now - self.window]
            sick = any(e.expires > now for e in es)
            out[host] = HostStatus(host, tuple(es), sick, pinned=len(recent) >= 2)
        return {h: s for h, s in out.items() if s.out}


def record_sick(
    host: str,
    *,
    source: str,
    reason: str,
    evidence: str = "",
    job_id: str | None = None,
    ttl: float | None = None,
) -> Entry:
    """Record ``host`` sick in the user's ledger: the one call every source of a verdict
    (the gate, the collective, a slow-node verdict, a lost node, a hardware first failure)
    makes. ``source`` is one of ``SOURCES``; ``ttl`` seconds (default 24 h)."""
    if source not in SOURCES:
        raise ValueError(f"source {source!r} is not one of {', '.join(SOURCES)}")
    return Ledger().record(
        host, source=source, reason=reason, evidence=evidence, job_id=job_id, ttl=ttl
    )


# ----------------------------------------------------------------- the last check's figures


def _last_path(host: str) -> Path:
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in host)
    return state_dir() / "health" / "last" / f"{safe}.json"


def load_last(host: str) -> dict[str, Any] | None:
    """The figures ``host``'s last check left (None: never checked, or unreadable: then the
    check judges as a first one)."""
    try:
        doc = json.loads(_last_path(host).read_text())
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def save_last(host: str, figures: Mapping[str, Any]) -> None:
    path = _last_path(host)
    try:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd, tmp = tempfile.mkstemp(prefix=".last.", dir=path.parent)
        with os.fdopen(fd, "w") as f:
            json.dump(dict(figures), f, sort_keys=True)
        os.replace(tmp, path)
    except OSError as e:
        raise HealthLedgerError(f"{path}: {e.strerror or e}") from None
