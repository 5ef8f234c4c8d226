"""A run's metrics as Prometheus text, served (``--metrics-addr``) and written
(``--metrics-textfile``) by the official ``prometheus_client``.

Imported only when a run asks for metrics: ``prometheus_client`` is an optional dependency
(the ``metrics`` extra) and the controller never pays for it otherwise. Every scrape renders
one :class:`~fleetctl.job.monitor.metrics.JobSample` through :func:`families` (pure: a sample in,
metric families out; ``tests/pure/test_metrics_exposition.py`` holds its golden text), from a
private ``CollectorRegistry`` (never the library's global one, so nothing else a program
registered leaks in). The names are documented in docs/metrics.md.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from fleetctl.errors import UsageError
from fleetctl.job.records.state import NodeState

if TYPE_CHECKING:
    from wsgiref.simple_server import WSGIServer

    from prometheus_client.metrics_core import Metric
    from prometheus_client.registry import CollectorRegistry

    from fleetctl.api.runspec import Observe
    from fleetctl.job.monitor.metrics import JobMetrics, JobSample

GB = 1e9  # the collective's GB/s (fleetctl.phases.check.collective_judge.GB), as bytes/s
TEXTFILE_EVERY = 5.0  # s between --metrics-textfile writes while the run lasts
STOP_WAIT = 5.0  # s for the server's thread to end


def _import() -> None:
    try:
        import prometheus_client  # noqa: F401
    except ImportError:
        raise UsageError(
            "--metrics-addr/--metrics-textfile need prometheus-client: "
            "pip install 'fleetctl[metrics]'"
        ) from None


def families(s: JobSample) -> list[Metric]:
    """The sample as metric families: job-wide gauges labelled ``job_id``, and per node one
    series of each family labelled ``job_id``, ``host`` and ``node_rank``."""
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    job = [s.job_id]
    out: list[Metric] = []

    def gauge(name: str, doc: str, value: float, **labels: str) -> None:
        g = GaugeMetricFamily(name, doc, labels=["job_id", *labels])
        g.add_metric([*job, *labels.values()], value)
        out.append(g)

    gauge("fleetctl_job_phase", "The run's current phase (one series, value 1).", 1, phase=s.phase)
    gauge("fleetctl_job_status", "The job's status (one series, value 1).", 1, status=s.status)
    gauge("fleetctl_job_attempt", "The attempt running now (1: the first).", s.attempt)
    gauge("fleetctl_job_max_attempts", "Attempts the retry policy allows.", s.max_attempts)
    gauge("fleetctl_job_retries", "Retries taken so far (attempt - 1).", max(0, s.attempt - 1))
    gauge("fleetctl_job_ranks_alive", "Rank processes on nodes that run the job.", s.ranks_alive)
    if s.started is not None:
        gauge("fleetctl_job_start_time_seconds", "When the run began (Unix time).", s.started)
    since = s.last_progress if s.last_progress is not None else s.started
    if since is not None:
        gauge(
            "fleetctl_job_last_progress_age_seconds",
            "Seconds since any node's last output line or progress touch (since the run "
            "began, before the first).",
            max(0.0, s.now - since),
        )
    counts = GaugeMetricFamily(
        "fleetctl_job_nodes", "Nodes of the attempt by state.", labels=["job_id", "state"]
    )
    for state in NodeState:
        counts.add_metric([*job, state.value], s.count(state.value))
    out.append(counts)

    node_labels = ["job_id", "host", "node_rank"]

    Family = GaugeMetricFamily | CounterMetricFamily

    def per_node(kind: type[Family], name: str, doc: str, extra: list[str] | None = None) -> Family:
        m = kind(name, doc, labels=node_labels + (extra or []))
        out.append(m)
        return m

    node_state = per_node(
        GaugeMetricFamily, "fleetctl_node_state", "The node's state (value 1).", ["state"]
    )
    lines = per_node(CounterMetricFamily, "fleetctl_node_lines", "Output lines streamed.")
    nbytes = per_node(CounterMetricFamily, "fleetctl_node_bytes", "Output bytes streamed.")
    age = per_node(
        GaugeMetricFamily, "fleetctl_node_last_line_age_seconds", "Seconds since its last line."
    )
    busbw = per_node(
        GaugeMetricFamily,
        "fleetctl_node_collective_busbw_bytes_per_second",
        "The last collective benchmark's bus bandwidth for the host.",
    )
    slow = per_node(
        GaugeMetricFamily,
        "fleetctl_node_slow_score",
        "The slow-node watcher's score (0 until it reports; higher: slower).",
    )
    for n in s.nodes:
        key = [*job, n.host, str(n.node_rank)]
        node_state.add_metric([*key, n.state], 1)
        lines.add_metric(key, n.lines)
        nbytes.add_metric(key, n.bytes)
        if n.last_line is not None:
            age.add_metric(key, max(0.0, s.now - n.last_line))
        if n.busbw is not None:
            busbw.add_metric(key, n.busbw * GB)
        slow.add_metric(key, n.slow_score)
    return out


def render(s: JobSample) -> bytes:
    """The sample as Prometheus text exposition (what ``/metrics`` answers)."""
    from prometheus_client import generate_latest

    return generate_latest(_registry(lambda: s))


def _registry(sample: Callable[[], JobSample]) -> CollectorRegistry:
    from prometheus_client.registry import CollectorRegistry

    class _Collector:
        def collect(self) -> Iterator[Metric]:
            yield from families(sample())

    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Collector())
    return registry


def endpoint_for(observe: Observe, metrics: Callable[[], JobMetrics]) -> MetricsEndpoint | None:
    """The endpoint ``--metrics-addr``/``--metrics-textfile`` ask for, not started yet, of
    the ``metrics`` made only then (None: neither asked)."""
    if observe.metrics_addr is None and observe.metrics_textfile is None:
        return None
    return MetricsEndpoint(metrics(), observe.metrics_addr, observe.metrics_textfile)


class MetricsEndpoint:
    """The run's metrics served at ``addr`` and/or written to ``textfile``, from
    :meth:`start` (before any node is reached: a busy address or an unwritable file is a
    one-line error then) to :meth:`stop` (in the run's ``finally``; the file is written a
    last time with the job's final state)."""

    def __init__(self, metrics: JobMetrics, addr: str | None, textfile: str | None) -> None:
        _import()
        self.metrics, self.addr, self.textfile = metrics, addr, textfile
        self.registry = _registry(metrics.sample)
        self._server: WSGIServer | None = None
        self._threads: list[threading.Thread] = []
        self._stop = threading.Event()

    @property
    def port(self) -> int | None:
        """The port served (``:0`` asks the kernel for one)."""
        return None if self._server is None else int(self._server.server_address[1])

    def start(self) -> MetricsEndpoint:
        if self.textfile is not None:
            self.write()  # a folder that is not there says so now, not at the end
        if self.addr is not None:
            from prometheus_client import start_http_server

            host, port = _split_host_port(self.addr)
            try:
                self._server, t = start_http_server(port, addr=host, registry=self.registry)
            except OSError as e:  # in use, not an address of this machine, a privileged port
                raise UsageError(
                    f"--metrics-addr {self.addr}: cannot listen there: {e.strerror or e}"
                ) from None
            self._threads.append(t)
        if self.textfile is not None:
            t = threading.Thread(target=self._write_loop, daemon=True, name="metrics-textfile")
            t.start()
            self._threads.append(t)
        return self

    def write(self) -> None:
        """Write the textfile once (atomically: a temp file renamed over it)."""
        from prometheus_client import write_to_textfile

        assert self.textfile is not None
        path = Path(self.textfile)
        try:
            write_to_textfile(str(path), self.registry)
        except OSError as e:
            why = e.strerror or e
            raise UsageError(f"--metrics-textfile {path}: cannot write it: {why}") from None

    def _write_loop(self) -> None:
        while not self._stop.wait(TEXTFILE_EVERY):
            with contextlib.suppress(UsageError):  # a full disk now: the next write may pass
                self.write()

    def stop(self) -> None:
        """Stop serving (the port is free once this returns) and write the last textfile."""
        self._stop.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        for t in self._threads:
            t.join(STOP_WAIT)
        if self.textfile is not None:
            with contextlib.suppress(UsageError):
                self.write()

    def __enter__(self) -> MetricsEndpoint:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _split_host_port(text: str) -> tuple[str, int]:
    """A checked ``HOST:PORT`` (``--metrics-addr``, by ``api.checks.host_port``, which this
    layer is below) as (host, port); IPv6 without brackets."""
    host, _, port = text.rpartition(":")
    return host.strip("[]"), int(port)


__all__ = ["MetricsEndpoint", "families", "render"]
