"""``frame generate``: completions for one prompt or several, run as one batch.

One prompt streams its completion to the terminal as tokens arrive. Several (``--prompt`` repeated, or
``--prompts-file``) run as one batch, so requests that share a prefix can share its KV, and their completions
print in order. ``-v`` prints, after the completions, each request's prompt, cached and generated token counts
and the engine's prefix-cache totals to stderr: what a cache plugin's author looks at to see a hit.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from frame.cli.engine_flags import add_engine_flags, config_from_args
from frame.errors import FrameUsageError
from frame.sampling_params import SamplingParams

if TYPE_CHECKING:
    from frame.llm import LLM
    from frame.outputs import RequestOutput

#: A prompt's first line is cut here in the header above its completion.
_HEADER_CHARS = 72


def add_sampling_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("sampling")
    group.add_argument("--max-tokens", type=int, default=128, help="most new tokens")
    group.add_argument("--temperature", type=float, default=0.0, help="0 is greedy")
    group.add_argument("--top-p", type=float, default=1.0)
    group.add_argument("--top-k", type=int, default=None)
    group.add_argument("--request-seed", type=int, default=None, dest="sampling_seed", help="seed of this request")
    group.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")


def sampling_from_args(args: argparse.Namespace) -> SamplingParams:
    return SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature, top_p=args.top_p,
                          top_k=args.top_k, seed=args.sampling_seed, stop=args.stop)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--prompt", action="append", default=[], help="a prompt (repeatable; several run as a batch)")
    parser.add_argument("--prompts-file", default=None, help="a text file of prompts, one per line (blank lines: none)")
    parser.add_argument("--raw", action="store_true", help="send the prompts as they are, without the chat template")
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="then print each request's prompt, cached and generated tokens to stderr")
    add_sampling_flags(parser)
    add_engine_flags(parser, model_positional=True)


def read_prompts(args: argparse.Namespace) -> list[str]:
    """The ``--prompt`` values, then the ``--prompts-file`` lines; a usage error when there are none."""
    prompts = list(args.prompt)
    if args.prompts_file is not None:
        path = Path(args.prompts_file)
        if not path.is_file():
            raise FrameUsageError(f"Prompts file {path} does not exist; pass a text file with one prompt per line.",
                                  param="prompts_file")
        prompts += [line for line in path.read_text().splitlines() if line.strip()]
    if not prompts:
        raise FrameUsageError("frame generate needs a prompt: pass --prompt TEXT (repeatable) or --prompts-file FILE.",
                              param="prompt")
    return prompts


def _engine_prompt(llm: LLM, text: str, raw: bool) -> str | dict[str, Any]:
    tokenizer = llm.get_tokenizer()
    if raw or not tokenizer.chat_template:
        return text
    ids = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                        tokenize=True, return_dict=False)
    return {"prompt_token_ids": list(ids)}


def _stream(llm: LLM, prompt: str | dict[str, Any], params: SamplingParams) -> None:
    for delta in llm.stream(prompt, params):
        sys.stdout.write(delta.text)
        sys.stdout.flush()
    sys.stdout.write("\n")


def _print_batch(prompts: list[str], results: list[RequestOutput]) -> None:
    for index, (prompt, result) in enumerate(zip(prompts, results, strict=True), 1):
        if len(results) > 1:
            first = prompt.splitlines()[0]
            cut = first if len(first) <= _HEADER_CHARS else first[: _HEADER_CHARS - 3] + "..."
            print(f"\n[{index}] {cut}" if index > 1 else f"[{index}] {cut}")
        print(result.outputs[0].text)


def _print_kv_pool(llm: LLM) -> None:
    """The KV pool's size and dtype, with its bytes per token (what ``--kv-cache-dtype`` changes)."""
    from frame.engine.core.engine_core import EngineCore
    from frame.engine.core.loop import ready_message
    from frame.summary import kv_dtype_line, kv_tokens, pool_size

    if isinstance(llm.engine, EngineCore):  # data-parallel cores report theirs in the server's summary only
        ready = ready_message(llm.engine, 0)
        print(f"KV pool: {pool_size(ready)}, {kv_tokens(ready)} tokens ({ready.num_blocks} blocks); KV dtype "
              f"{kv_dtype_line(ready)}", file=sys.stderr)


def _print_cache_use(llm: LLM, results: list[RequestOutput]) -> None:
    for index, result in enumerate(results, 1):
        out = result.outputs[0]
        print(f"request {index}: {len(result.prompt_token_ids)} prompt tokens, {result.num_cached_tokens} of them "
              f"cached; {len(out.token_ids)} generated ({out.finish_reason})", file=sys.stderr)
    stats = llm.stats()
    print(f"prefix cache: {stats.prefix_hit_tokens} of {stats.prefix_query_tokens} prompt tokens reused; "
          f"{stats.preemptions} preemptions", file=sys.stderr)


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    from frame.llm import LLM

    prompts = read_prompts(args)  # before the engine is built, so a missing prompt costs nothing
    config = config_from_args(args)
    # Loading takes seconds: a terminal is told what is happening (on stderr; nothing when it is not a terminal).
    stderr = Console(stderr=True)
    with stderr.status(f"loading {config.model or 'the bundled SmolLM2-135M-Instruct'} and starting the engine"):
        llm = LLM(**config.model_dump(exclude_unset=True))
    if args.verbose:
        _print_kv_pool(llm)
    inputs = [_engine_prompt(llm, text, args.raw) for text in prompts]
    params = sampling_from_args(args)
    if len(inputs) == 1 and not args.verbose:
        _stream(llm, inputs[0], params)
        return 0
    results = llm.generate(inputs, params, use_tqdm=stderr.is_terminal)
    _print_batch(prompts, results)
    if args.verbose:
        _print_cache_use(llm, results)
    return 0
