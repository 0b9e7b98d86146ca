"""Short requests beside a long prefill: the TTFT of an 8,000-token prompt, and of 16 short chats sent while it runs.

    .venv/bin/python benchmarks/long_prefill.py [--rounds 1] [--variant off=--long-prefill-token-threshold=0] \
        [--variant default=] [--variant 128=--long-prefill-token-threshold=128]

Each variant starts `frame serve` (bundled model, default flags plus the variant's, space-separated), then runs
``--rounds`` rounds: one streamed completion of a ``--long-tokens`` prompt (a new one each round, so the prefix
cache cannot serve it), and ``--delay`` s later ``--shorts`` short chat requests (16 tokens out), one every
``--interval`` s. It reports the long prompt's TTFT, the short requests' median, p90 and worst TTFT, and how many
of them had their first token before the long prompt had its own. Variants run one after the other, each on its own
server; nothing else should run meanwhile (on a shared machine, say so beside the numbers).
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import statistics
import sys
import tempfile
import time
from importlib import resources
from pathlib import Path

import httpx
from compare_serve import Server
from frame.bench.serve import Result, _one
from rich.console import Console
from rich.table import Table

TOPICS = ["a river", "a mountain", "a star", "a cloud", "bread", "a violin", "a glacier", "a desert"]


def long_prompt(tokenizer, length: int, round_index: int) -> list[int]:
    """``length`` token ids of the bundled declaration text, repeated, headed by the round (so no two rounds share a
    cached prefix)."""
    text = resources.files("frame.bench").joinpath("texts/declaration.txt").read_text()
    ids = tokenizer.encode(f"Round {round_index}. Summarise this text.\n\n")
    body = tokenizer.encode(text)
    while len(ids) < length:
        ids += body
    return ids[:length]


async def one_round(base_url: str, model: str, prompt: list[int], args: argparse.Namespace) -> dict[str, object]:
    """The long request and the short ones, timed from the long one's start."""
    limits = httpx.Limits(max_connections=args.shorts + 4)
    async with httpx.AsyncClient(base_url=base_url, timeout=900, limits=limits) as client:
        start = time.perf_counter()
        long_task = asyncio.create_task(_one(client, "/v1/completions", {
            "model": model, "prompt": prompt, "max_tokens": 1, "temperature": 0.0, "stream": True}))
        await asyncio.sleep(args.delay)
        shorts: list[asyncio.Task[Result]] = []
        sent: list[float] = []
        for i in range(args.shorts):
            question = f"Question {i}: in one short sentence, what is {TOPICS[i % len(TOPICS)]}?"
            sent.append(time.perf_counter() - start)
            shorts.append(asyncio.create_task(_one(client, "/v1/chat/completions", {
                "model": model, "messages": [{"role": "user", "content": question}], "max_tokens": 16,
                "ignore_eos": True, "temperature": 0.0, "stream": True})))
            await asyncio.sleep(args.interval)
        long_result = await long_task
        short_results = await asyncio.gather(*shorts)
    failed = [r.error for r in (long_result, *short_results) if not r.ok]
    if failed:
        raise RuntimeError(f"{len(failed)} requests failed; the first: {failed[0]}")
    ttfts = sorted(r.ttft for r in short_results)
    long_ttft = long_result.ttft
    return {
        "long_ttft": long_ttft,
        "short_p50": statistics.median(ttfts),
        "short_p90": ttfts[int(0.9 * (len(ttfts) - 1))],
        "short_max": ttfts[-1],
        "before_long": sum(at + r.ttft < long_ttft for at, r in zip(sent, short_results, strict=True)),
    }


async def warm_up(base_url: str, model: str) -> None:
    """One short request, so that the first round measures no warm-up."""
    async with httpx.AsyncClient(base_url=base_url, timeout=300) as client:
        await _one(client, "/v1/completions", {"model": model, "prompt": "Hello", "max_tokens": 2, "stream": True})


def run_variant(name: str, flags: list[str], args: argparse.Namespace, folder: Path, tokenizer) -> list[dict]:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    cmd = [sys.executable, "-m", "frame.cli.main", "serve", "--port", str(port), *args.serve_arg, *flags]
    server = Server(name, cmd, port, {}, folder / f"serve-{name}.log")
    try:
        server.wait_ready()
        model = httpx.get(f"{server.base_url}/v1/models", timeout=30).json()["data"][0]["id"]
        asyncio.run(warm_up(server.base_url, model))
        rows = []
        for index in range(args.rounds):
            prompt = long_prompt(tokenizer, args.long_tokens, index)
            rows.append(asyncio.run(one_round(server.base_url, model, prompt, args)))
        return rows
    finally:
        server.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--variant", action="append", default=[], metavar="NAME=FLAGS",
                        help="a server configuration: a name and its extra `frame serve` flags, space-separated "
                             "(default: one variant, 'default', with no extra flags)")
    parser.add_argument("--serve-arg", action="append", default=[], help="a flag every variant's server gets")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--long-tokens", type=int, default=8000)
    parser.add_argument("--shorts", type=int, default=16)
    parser.add_argument("--delay", type=float, default=2.0, help="seconds between the long request and the first "
                        "short one")
    parser.add_argument("--interval", type=float, default=0.5, help="seconds between two short requests")
    args = parser.parse_args(argv)
    from frame.model_source import ModelSource

    tokenizer = ModelSource.open(None).tokenizer
    variants = [v.partition("=") for v in args.variant or ["default="]]
    table = Table(title=f"{args.long_tokens}-token prompt, {args.shorts} short chats sent during it "
                        f"(from {args.delay:g} s, every {args.interval:g} s)")
    for column in ("variant", "round", "long TTFT", "short TTFT p50", "p90", "max", "shorts first before long"):
        table.add_column(column)
    with tempfile.TemporaryDirectory() as tmp:
        for name, _, flags in variants:
            for index, row in enumerate(run_variant(name, flags.split(), args, Path(tmp), tokenizer)):
                table.add_row(name, str(index + 1), f"{row['long_ttft']:.2f} s", f"{row['short_p50']:.2f} s",
                              f"{row['short_p90']:.2f} s", f"{row['short_max']:.2f} s",
                              f"{row['before_long']}/{args.shorts}")
    Console().print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
