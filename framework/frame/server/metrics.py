"""Prometheus metrics of one server: request latencies measured here, engine gauges read at scrape time.

Histograms (time to first token, time per output token, end-to-end latency) and token counters are updated as
requests finish. Running and waiting sequences, KV-cache usage and blocks, and the prefix-cache counters come
from each engine core's :class:`EngineStats` snapshot taken when ``/metrics`` is scraped, labelled with the
core's data-parallel ``rank``. Each app has its own registry, so
several servers can live in one process (tests).
"""

from __future__ import annotations

import time
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from frame.engine.client.base import RankState
from frame.engine.wire.requests import EngineStats

_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0)
_TOKEN_BUCKETS = (0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.5)


class _EngineCollector(Collector):
    """Reports the last EngineStats snapshot of every engine core, each sample labelled with its data-parallel
    ``rank`` (``"0"`` for a lone core), and whether each core serves."""

    def __init__(self) -> None:
        self.stats: dict[int, EngineStats] = {}
        self.ranks: list[RankState] = []

    def collect(self) -> Iterator[Metric]:
        up = GaugeMetricFamily("frame_engine_up", "1 while this rank's engine core serves, else 0", labels=["rank"])
        routed = CounterMetricFamily("frame_router_requests", "prompts the router sent to this rank", labels=["rank"])
        for state in self.ranks:
            up.add_metric([str(state.rank)], 1.0 if state.status == "ok" else 0.0)
            if state.routed is not None:
                routed.add_metric([str(state.rank)], state.routed)
        yield up
        if routed.samples:
            yield routed
        families = [(GaugeMetricFamily(name, doc, labels=["rank"]), attr) for name, (doc, attr) in _GAUGES.items()]
        families += [(CounterMetricFamily(name, doc, labels=["rank"]), attr) for name, (doc, attr) in _COUNTERS.items()]
        groups = GaugeMetricFamily("frame_kv_cache_group_blocks_in_use", "KV blocks live requests hold per KV group "
                                   "(layers of one window: 'full' or 'window W')", labels=["rank", "group", "window"])
        for rank, stats in sorted(self.stats.items()):
            for family, attr in families:
                family.add_metric([str(rank)], getattr(stats, attr))
            for g, (kind, count) in enumerate(zip(stats.kv_groups, stats.group_blocks_in_use, strict=False)):
                groups.add_metric([str(rank), str(g), kind], count)
        for family, _ in families:
            yield family
        yield groups


#: Per-rank gauges and counters: name -> (help text, EngineStats attribute).
_GAUGES = {
    "frame_num_requests_running": ("sequences running in the engine", "num_running"),
    "frame_num_requests_waiting": ("sequences waiting in the engine", "num_waiting"),
    "frame_kv_cache_usage_perc": ("share of KV blocks in use (0 to 1)", "kv_usage"),
    "frame_kv_cache_blocks_in_use": ("KV blocks in use", "blocks_in_use"),
    "frame_kv_cache_blocks_total": ("KV blocks in the pool", "num_blocks"),
    "frame_spec_decode_acceptance_rate": ("drafts kept / drafts verified (speculative decoding)",
                                          "spec_acceptance_rate"),
    "frame_spec_decode_mean_accepted_length": ("tokens a verification step emits on average",
                                               "spec_mean_accepted_length"),
    "frame_grammar_cache_entries": ("compiled grammars the engine keeps", "grammar_cache_entries"),
    "frame_grammar_cache_bytes": ("bytes of compiled grammars the engine keeps (--grammar-cache-bytes bounds it)",
                                  "grammar_cache_bytes"),
}
_COUNTERS = {
    "frame_prefix_cache_queries": ("prompt tokens looked up in the prefix cache", "prefix_query_tokens"),
    "frame_prefix_cache_hits": ("prompt tokens found in the prefix cache", "prefix_hit_tokens"),
    "frame_preemptions": ("sequences preempted", "preemptions"),
    "frame_engine_steps": ("engine steps run", "steps"),
    "frame_engine_prompt_tokens_computed": ("prompt tokens the model ran (recomputation included)",
                                            "prompt_tokens_computed"),
    "frame_engine_generation_tokens": ("tokens the engine generated", "generation_tokens"),
    "frame_spec_decode_draft_tokens": ("draft tokens verified", "spec_draft_tokens"),
    "frame_spec_decode_accepted_tokens": ("draft tokens the target kept", "spec_accepted_tokens"),
    "frame_grammar_cache_evictions": ("compiled grammars the engine dropped from its cache (or never kept: larger "
                                      "than the bound)", "grammar_cache_evictions"),
    "frame_engine_grammar_compile_seconds": ("seconds the engine spent compiling grammars",
                                             "grammar_compile_seconds"),
}


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
        self.grammar_compilations = Counter(
            "frame_grammar_compilations", "constraints the server compiled ('compiled', 'failed'), found compiled "
            "('cached'), refused for passing --grammar-compile-timeout ('timed_out'), or skipped because the client "
            "had left ('skipped_disconnected')", ["outcome"], registry=r)
        self.grammar_seconds = Histogram("frame_grammar_compile_seconds", "seconds the server took to compile each "
                                         "constraint it checked", buckets=_LATENCY_BUCKETS, registry=r)
        self.engine_restarts = Counter("frame_engine_restarts", "engines started again after one died", registry=r)
        self.in_flight = Gauge("frame_server_requests_in_flight", "requests the server is handling", registry=r)
        self.ttft = Histogram("frame_time_to_first_token_seconds", "time to first token", buckets=_LATENCY_BUCKETS,
                              registry=r)
        self.tpot = Histogram("frame_time_per_output_token_seconds", "time per output token after the first",
                              buckets=_TOKEN_BUCKETS, registry=r)
        self.e2e = Histogram("frame_e2e_request_latency_seconds", "end-to-end request latency",
                             buckets=_LATENCY_BUCKETS, registry=r)

    def render(self, stats: dict[int, EngineStats], ranks: list[RankState]) -> bytes:
        """The text of ``/metrics``: ``stats`` of the cores that answered, by rank (a rank that did not answer keeps
        its last snapshot while it serves, and is left out while it does not)."""
        serving = {r.rank for r in ranks if r.status == "ok"}
        self.engine.stats = {rank: s for rank, s in {**self.engine.stats, **stats}.items() if rank in serving}
        self.engine.ranks = ranks
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
