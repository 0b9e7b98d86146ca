"""Per-request timings and the summary numbers every benchmark reports."""

from __future__ import annotations

import math
import resource
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field


@dataclass
class RequestTiming:
    """One request's clock readings (``time.perf_counter`` seconds) and its tokens."""

    num_prompt_tokens: int
    added: float
    first_token: float | None = None
    finished: float | None = None
    output_token_ids: list[int] = field(default_factory=list)
    num_cached_tokens: int = 0

    @property
    def ttft(self) -> float | None:
        return None if self.first_token is None else self.first_token - self.added

    @property
    def tpot(self) -> float | None:
        """Mean time between output tokens after the first (None for fewer than two tokens)."""
        n = len(self.output_token_ids)
        if n < 2 or self.first_token is None or self.finished is None:
            return None
        return (self.finished - self.first_token) / (n - 1)


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0-100) by linear interpolation; NaN for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100
    lo, hi = math.floor(pos), math.ceil(pos)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def summarize(timings: Sequence[RequestTiming], elapsed: float) -> dict[str, float]:
    """Throughput and latency numbers of one run that took ``elapsed`` seconds of wall time."""
    prompt = sum(t.num_prompt_tokens for t in timings)
    output = sum(len(t.output_token_ids) for t in timings)
    ttfts = [t.ttft for t in timings if t.ttft is not None]
    tpots = [t.tpot for t in timings if t.tpot is not None]
    cached = sum(t.num_cached_tokens for t in timings)
    return {
        "requests": len(timings),
        "prompt_tokens": prompt,
        "output_tokens": output,
        "elapsed_s": elapsed,
        "output_tok_s": output / elapsed if elapsed > 0 else math.nan,
        "total_tok_s": (prompt + output) / elapsed if elapsed > 0 else math.nan,
        "ttft_p50_ms": percentile(ttfts, 50) * 1e3,
        "ttft_p99_ms": percentile(ttfts, 99) * 1e3,
        "tpot_ms": (sum(tpots) / len(tpots) * 1e3) if tpots else math.nan,
        "prompt_tokens_cached": cached,
        "prefix_hit_rate": cached / prompt if prompt else 0.0,
    }


def peak_rss_mib() -> float:
    """This process's peak resident set size in MiB (ru_maxrss is KiB on Linux, bytes on macOS)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (1024 * 1024) if sys.platform == "darwin" else peak / 1024
