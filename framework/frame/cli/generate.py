"""``frame generate``: one prompt, its completion streamed to the terminal as tokens arrive."""

from __future__ import annotations

import argparse
import sys

from frame.cli.engine_flags import add_engine_flags, config_from_args
from frame.sampling_params import SamplingParams


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
    parser.add_argument("--prompt", required=True, help="the prompt text")
    parser.add_argument("--raw", action="store_true", help="send the prompt as is, without the chat template")
    add_sampling_flags(parser)
    add_engine_flags(parser)


def run(args: argparse.Namespace) -> int:
    from frame.llm import LLM

    config = config_from_args(args)
    llm = LLM(**config.model_dump(exclude_unset=True))
    prompt: str | dict = args.prompt
    if not args.raw and llm.get_tokenizer().chat_template:
        ids = llm.get_tokenizer().apply_chat_template([{"role": "user", "content": args.prompt}],
                                                      add_generation_prompt=True, tokenize=True, return_dict=False)
        prompt = {"prompt_token_ids": list(ids)}
    for delta in llm.stream(prompt, sampling_from_args(args)):
        sys.stdout.write(delta.text)
        sys.stdout.flush()
    sys.stdout.write("\n")
    return 0
