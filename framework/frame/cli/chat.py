"""``frame chat``: an interactive conversation; each reply streams as it is generated."""

from __future__ import annotations

import argparse
import sys

from frame.cli.engine_flags import add_engine_flags, config_from_args
from frame.cli.generate import add_sampling_flags, sampling_from_args


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--system", default=None, help="a system message")
    add_sampling_flags(parser)
    add_engine_flags(parser, model_positional=True)


def run(args: argparse.Namespace) -> int:
    from frame.llm import LLM

    llm = LLM(**config_from_args(args).model_dump(exclude_unset=True))
    tokenizer = llm.get_tokenizer()
    messages = [{"role": "system", "content": args.system}] if args.system else []
    params = sampling_from_args(args)
    print("Type a message; an empty line or Ctrl-D ends the chat.", file=sys.stderr)
    while True:
        try:
            line = input("> ")
        except EOFError:
            break
        if not line.strip():
            break
        messages.append({"role": "user", "content": line})
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
        reply = []
        for delta in llm.stream({"prompt_token_ids": list(ids)}, params):
            reply.append(delta.text)
            sys.stdout.write(delta.text)
            sys.stdout.flush()
        sys.stdout.write("\n")
        messages.append({"role": "assistant", "content": "".join(reply)})
    return 0
