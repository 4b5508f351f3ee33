"""Prometheus metrics of the server (one registry per app): requests, latency, queue, batches."""

from __future__ import annotations

from typing import Any

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
TOKEN_BUCKETS = (16, 64, 256, 1024, 2048, 4096, 8192, 16384, 32768, 65536)
COUNT_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096)


class Metrics:
    """The server's counters, gauges and histograms, in their own registry."""

    def __init__(self) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics

        disable_created_metrics()

        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "cramkit_requests", "HTTP requests by route and status", ["route", "status"], registry=r
        )
        self.latency = Histogram(
            "cramkit_request_duration_seconds",
            "request latency by route",
            ["route"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.inputs = Counter("cramkit_inputs", "inputs received by model and task", ["model", "task"], registry=r)
        self.queue_depth = Gauge("cramkit_queue_depth", "inputs waiting in the queue", ["model"], registry=r)
        self.inference_seconds = Histogram(
            "cramkit_inference_seconds",
            "time of one merged forward call by model and task",
            ["model", "task"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.batch_tokens = Histogram(
            "cramkit_batch_tokens", "tokens per merged call", ["model"], buckets=TOKEN_BUCKETS, registry=r
        )
        self.batch_inputs = Histogram(
            "cramkit_batch_inputs", "inputs per merged call", ["model"], buckets=COUNT_BUCKETS, registry=r
        )
        self.batch_requests = Histogram(
            "cramkit_batch_requests", "requests per merged call", ["model"], buckets=COUNT_BUCKETS, registry=r
        )
        self.rejected = Counter("cramkit_rejected", "requests refused by reason", ["reason"], registry=r)

    def render(self) -> tuple[bytes, str]:
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        return generate_latest(self.registry), CONTENT_TYPE_LATEST

    def observe(self, route: str, status: int, seconds: float) -> None:
        self.requests.labels(route, str(status)).inc()
        self.latency.labels(route).observe(seconds)

    def __getattr__(self, name: str) -> Any:  # pragma: no cover - a clear message for a typo
        raise AttributeError(f"Metrics has no metric {name!r}")
