"""Prometheus metrics of one server: request latencies measured here, engine gauges read at scrape time.

Histograms (time to first token, time per output token, end-to-end latency) and token counters are updated as
requests finish. Running and waiting sequences, KV-cache usage and blocks, and the prefix-cache counters come
from an :class:`EngineStats` snapshot taken when ``/metrics`` is scraped. Each app has its own registry, so
several servers can live in one process (tests).
"""

from __future__ import annotations

import time
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from frame.engine.protocol import EngineStats

_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0)
_TOKEN_BUCKETS = (0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.5)


class _EngineCollector(Collector):
    """Reports the last EngineStats snapshot."""

    def __init__(self) -> None:
        self.stats: EngineStats | None = None

    def collect(self) -> Iterator[Metric]:
        s = self.stats or EngineStats()
        gauges = {
            "frame_num_requests_running": ("sequences running in the engine", s.num_running),
            "frame_num_requests_waiting": ("sequences waiting in the engine", s.num_waiting),
            "frame_kv_cache_usage_perc": ("share of KV blocks in use (0 to 1)", s.kv_usage),
            "frame_kv_cache_blocks_in_use": ("KV blocks in use", s.blocks_in_use),
            "frame_kv_cache_blocks_total": ("KV blocks in the pool", s.num_blocks),
        }
        for name, (doc, value) in gauges.items():
            yield GaugeMetricFamily(name, doc, value=value)
        counters = {
            "frame_prefix_cache_queries": ("prompt tokens looked up in the prefix cache", s.prefix_query_tokens),
            "frame_prefix_cache_hits": ("prompt tokens found in the prefix cache", s.prefix_hit_tokens),
            "frame_preemptions": ("sequences preempted", s.preemptions),
            "frame_engine_steps": ("engine steps run", s.steps),
        }
        for name, (doc, value) in counters.items():
            yield CounterMetricFamily(name, doc, value=value)


class ServerMetrics:
    """The metrics of one server and the registry that renders them."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.engine = _EngineCollector()
        self.registry.register(self.engine)
        r = self.registry
        self.prompt_tokens = Counter("frame_prompt_tokens", "prompt tokens of finished requests", registry=r)
        self.generation_tokens = Counter("frame_generation_tokens", "generated tokens", registry=r)
        self.requests = Counter("frame_request_success", "finished requests", ["finished_reason"], registry=r)
        self.rejected = Counter("frame_request_rejected", "requests refused before the engine", ["status"],
                                registry=r)
        self.engine_restarts = Counter("frame_engine_restarts", "engines started again after one died", registry=r)
        self.in_flight = Gauge("frame_server_requests_in_flight", "requests the server is handling", registry=r)
        self.ttft = Histogram("frame_time_to_first_token_seconds", "time to first token", buckets=_LATENCY_BUCKETS,
                              registry=r)
        self.tpot = Histogram("frame_time_per_output_token_seconds", "time per output token after the first",
                              buckets=_TOKEN_BUCKETS, registry=r)
        self.e2e = Histogram("frame_e2e_request_latency_seconds", "end-to-end request latency",
                             buckets=_LATENCY_BUCKETS, registry=r)

    def render(self, stats: EngineStats | None) -> bytes:
        if stats is not None:
            self.engine.stats = stats
        return generate_latest(self.registry)


class RequestTimer:
    """Times one prompt's request and reports it to ServerMetrics when it ends."""

    def __init__(self, metrics: ServerMetrics, num_prompt_tokens: int) -> None:
        self.metrics = metrics
        self.num_prompt_tokens = num_prompt_tokens
        self.start = time.monotonic()
        self.first: float | None = None
        self.num_tokens = 0

    def tokens(self, count: int) -> None:
        if count and self.first is None:
            self.first = time.monotonic()
            self.metrics.ttft.observe(self.first - self.start)
        self.num_tokens += count

    def finish(self, reasons: list[str]) -> None:
        end = time.monotonic()
        m = self.metrics
        m.e2e.observe(end - self.start)
        if self.first is not None and self.num_tokens > 1:
            m.tpot.observe((end - self.first) / (self.num_tokens - 1))
        m.prompt_tokens.inc(self.num_prompt_tokens)
        m.generation_tokens.inc(self.num_tokens)
        for reason in reasons:
            m.requests.labels(finished_reason=reason).inc()
