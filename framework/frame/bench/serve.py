"""``frame bench serve``: an async load generator against a running OpenAI-compatible server.

Seeded prompts are streamed to ``/v1/completions`` (or chat) with ``ignore_eos``, either ``--concurrency`` at a
time or arriving as a Poisson process at ``--request-rate`` per second (or both). ``--dataset`` picks them:

- ``words`` (default): ``--input-len`` random words, ``--output-len`` new tokens;
- ``random``: ``--input-len`` random token ids and ``--output-len`` new tokens, as vLLM's ``random`` dataset;
- the name of any frame workload (``multi_turn``, ``shared_prefix``, ``mixed_batch``, ``copy_edit`` ...), with
  ``--dataset-opt KEY=VALUE`` for its parameters: its prompts, lengths and waves (a multi-turn chat's turn ``k``
  is sent once every turn ``k-1`` has finished, so it finds the conversation so far in the server's cache).

Token-id datasets go to the completions endpoint as token ids (exactly those tokens) and to chat as their text;
``--tokenizer`` names the model folder or GGUF whose tokenizer makes them (default: the bundled model).
Reported: request and output-token throughput, and TTFT, TPOT and ITL (inter-token latency, between streamed
chunks) at p50/p90/p99, plus failed requests.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import httpx
from rich.console import Console
from rich.table import Table

from frame.bench.metrics import percentile
from frame.config import parse_key_values
from frame.errors import FrameUsageError

_WORD_TEXT = ("time year people way day man thing woman life child world school state family student group country "
          "problem hand part place case week company system program question work government number night point "
          "home water room mother area money story fact month lot right study book eye job word business issue "
          "side kind head house service friend father power hour game line end member law car city community name "
          "president team minute idea kid body information back parent face others level office door health person "
          "art war history party result change morning reason research girl guy moment air teacher force education "
          "river mountain garden window paper music light color market energy field table letter voice window")
_WORDS = tuple(_WORD_TEXT.split())


@dataclass
class Result:
    """One request: its clock readings (seconds since it was sent) and what came back."""

    ok: bool = False
    ttft: float | None = None
    latency: float = 0.0
    chunk_times: list[float] = field(default_factory=list)
    output_tokens: int = 0
    error: str = ""

    @property
    def tpot(self) -> float | None:
        if self.ttft is None or self.output_tokens < 2:
            return None
        return (self.latency - self.ttft) / (self.output_tokens - 1)

    @property
    def itls(self) -> list[float]:
        return [b - a for a, b in zip(self.chunk_times, self.chunk_times[1:], strict=False)]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--base-url", default="http://127.0.0.1:8000", help="the server's address")
    parser.add_argument("--model", default=None, help="model name to send (default: the server's first)")
    parser.add_argument("--api-key", default=None, help="API key (default: $FRAME_API_KEY)")
    parser.add_argument("--endpoint", choices=("completions", "chat"), default="completions")
    parser.add_argument("--num-prompts", type=int, default=64, help="requests to send")
    parser.add_argument("--concurrency", type=int, default=None, help="most requests in flight at once")
    parser.add_argument("--request-rate", type=float, default=math.inf,
                        help="mean requests per second (Poisson arrivals); default: all at once")
    parser.add_argument("--dataset", default="words",
                        help="words, random, or a frame workload name (multi_turn, shared_prefix, ...)")
    parser.add_argument("--dataset-opt", action="append", default=[], metavar="KEY=VALUE",
                        help="a parameter of the workload named by --dataset (repeatable)")
    parser.add_argument("--tokenizer", default=None,
                        help="model folder or GGUF whose tokenizer builds token-id datasets (default: bundled)")
    parser.add_argument("--input-len", type=int, default=64, help="words (words) or tokens (random) per prompt")
    parser.add_argument("--output-len", type=int, default=32, help="tokens to generate per request")
    parser.add_argument("--seed", type=int, default=0, help="seed of prompts and arrival times")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds one request may take")
    parser.add_argument("--json", default=None, metavar="PATH", help="write the results as JSON ('-': stdout)")


@dataclass(frozen=True)
class Job:
    """One request to send: its prompt (text, or token ids with their text), new tokens, and wave."""

    text: str
    max_tokens: int
    token_ids: tuple[int, ...] | None = None
    wave: int = 0


def synthetic_prompts(num: int, words: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(_WORDS) for _ in range(words)) for _ in range(num)]


def build_jobs(args: argparse.Namespace) -> list[Job]:
    """The requests of ``--dataset``, in sending order."""
    options = parse_key_values(args.dataset_opt, "--dataset-opt")
    if args.dataset == "words":
        if options:
            raise FrameUsageError("--dataset-opt applies to token-id datasets; drop it or pick one with "
                                  "--dataset.", param="dataset_opt")
        return [Job(p, args.output_len) for p in synthetic_prompts(args.num_prompts, args.input_len, args.seed)]
    from frame.model_source import ModelSource
    from frame.workloads import load_workloads

    if args.dataset == "random":  # vLLM's random dataset: fixed lengths, no sharing
        name, options = "no_sharing", {"num_requests": args.num_prompts, "max_tokens": args.output_len,
                                       "prompt_len": [args.input_len, args.input_len], **options}
    else:
        name = args.dataset
    workload = load_workloads().get(name)
    tokenizer = ModelSource.open(args.tokenizer).tokenizer
    return [Job(tokenizer.decode(r.prompt_token_ids), r.params.max_tokens or args.output_len,
                tuple(r.prompt_token_ids), r.wave)
            for r in workload.generate(tokenizer, args.seed, **options)]


def _payload(args: argparse.Namespace, model: str, job: Job) -> tuple[str, dict[str, Any]]:
    common = {"model": model, "max_tokens": job.max_tokens, "ignore_eos": True, "temperature": 0.0,
              "stream": True, "stream_options": {"include_usage": True}}
    if args.endpoint == "chat":
        return "/v1/chat/completions", {**common, "messages": [{"role": "user", "content": job.text}]}
    return "/v1/completions", {**common, "prompt": list(job.token_ids) if job.token_ids else job.text}


async def _one(client: httpx.AsyncClient, path: str, payload: dict[str, Any]) -> Result:
    result, start = Result(), time.perf_counter()
    try:
        async with client.stream("POST", path, json=payload) as resp:
            if resp.status_code != 200:
                result.error = f"HTTP {resp.status_code}: {(await resp.aread()).decode()[:200]}"
                return result
            async for line in resp.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                data = json.loads(line[6:])
                if "error" in data:
                    result.error = data["error"].get("message", "error event")
                    return result
                if data.get("usage"):
                    result.output_tokens = data["usage"]["completion_tokens"]
                if data.get("choices"):
                    now = time.perf_counter() - start
                    result.ttft = now if result.ttft is None else result.ttft
                    result.chunk_times.append(now)
        result.latency = time.perf_counter() - start
        result.ok = result.ttft is not None
        result.error = "" if result.ok else "no tokens streamed"
    except httpx.HTTPError as err:
        result.error = f"{type(err).__name__}: {err}"
    return result


async def _server_model(client: httpx.AsyncClient) -> str:
    resp = await client.get("/v1/models")
    if resp.status_code != 200:
        raise FrameUsageError(f"GET /v1/models answered {resp.status_code}: {resp.text[:200]}", param="base_url")
    return resp.json()["data"][0]["id"]


async def bench(args: argparse.Namespace) -> dict[str, Any]:
    """Run the load and return the summary (what --json writes)."""
    key = args.api_key or os.environ.get("FRAME_API_KEY")
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    limits = httpx.Limits(max_connections=args.concurrency, max_keepalive_connections=None)
    async with httpx.AsyncClient(base_url=args.base_url, headers=headers, timeout=args.timeout,
                                 limits=limits) as client:
        try:
            model = args.model or await _server_model(client)
        except httpx.HTTPError as err:
            raise FrameUsageError(f"Cannot reach {args.base_url}: {err}; start `frame serve` first.",
                                  param="base_url") from None
        jobs = build_jobs(args)
        rng = random.Random(args.seed + 1)
        gate = asyncio.Semaphore(args.concurrency or len(jobs))

        async def limited(job: Job) -> Result:
            async with gate:
                return await _one(client, *_payload(args, model, job))

        start = time.perf_counter()
        results: list[Result] = []
        for wave in sorted({job.wave for job in jobs}):
            tasks = []
            for job in (j for j in jobs if j.wave == wave):
                tasks.append(asyncio.create_task(limited(job)))
                if math.isfinite(args.request_rate):
                    await asyncio.sleep(rng.expovariate(args.request_rate))
            results += await asyncio.gather(*tasks)
        elapsed = time.perf_counter() - start
    return summarize(results, elapsed, args, model)


def summarize(results: list[Result], elapsed: float, args: argparse.Namespace, model: str) -> dict[str, Any]:
    good = [r for r in results if r.ok]
    out_tokens = sum(r.output_tokens for r in good)
    summary: dict[str, Any] = {
        "model": model, "endpoint": args.endpoint, "dataset": args.dataset, "num_prompts": len(results),
        "completed": len(good),
        "failed": len(results) - len(good), "concurrency": args.concurrency, "request_rate": args.request_rate,
        "input_len": args.input_len, "output_len": args.output_len, "duration_s": elapsed,
        "request_throughput": len(good) / elapsed, "output_throughput": out_tokens / elapsed,
        "output_tokens": out_tokens, "errors": sorted({r.error for r in results if r.error})[:5],
    }
    series = {"ttft": [r.ttft for r in good if r.ttft is not None],
              "tpot": [r.tpot for r in good if r.tpot is not None],
              "itl": [x for r in good for x in r.itls]}
    for name, values in series.items():
        summary[f"mean_{name}_ms"] = sum(values) / len(values) * 1e3 if values else math.nan
        for q in (50, 90, 99):
            summary[f"p{q}_{name}_ms"] = percentile(values, q) * 1e3
    return summary


def render(summary: dict[str, Any], console: Console) -> None:
    table = Table(title=f"frame bench serve: {summary['model']} ({summary['endpoint']}, {summary['dataset']})")
    table.add_column("metric")
    table.add_column("value", justify="right")
    table.add_row("requests completed / failed", f"{summary['completed']} / {summary['failed']}")
    table.add_row("duration (s)", f"{summary['duration_s']:.2f}")
    table.add_row("request throughput (req/s)", f"{summary['request_throughput']:.2f}")
    table.add_row("output throughput (tok/s)", f"{summary['output_throughput']:.1f}")
    for name in ("ttft", "tpot", "itl"):
        values = " / ".join(f"{summary[f'p{q}_{name}_ms']:.1f}" for q in (50, 90, 99))
        table.add_row(f"{name.upper()} p50 / p90 / p99 (ms)", values)
    console.print(table)
    for error in summary["errors"]:
        console.print(f"[red]error:[/red] {error}")


def run(args: argparse.Namespace) -> int:
    if args.num_prompts < 1 or (args.concurrency is not None and args.concurrency < 1):
        raise FrameUsageError("--num-prompts and --concurrency must be at least 1.", param="num_prompts")
    summary = asyncio.run(bench(args))
    if args.json == "-":
        print(json.dumps(summary, indent=2))
    else:
        render(summary, Console())
        if args.json:
            with open(args.json, "w") as f:
                json.dump(summary, f, indent=2)
    return 0 if summary["failed"] == 0 else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="frame bench serve", description=__doc__)
    add_arguments(parser)
    try:
        return run(parser.parse_args(argv))
    except FrameUsageError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
