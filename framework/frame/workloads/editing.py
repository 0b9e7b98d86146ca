"""A copy-heavy workload: rewrite a given text with small edits, where most output tokens repeat the prompt.

What prompt-lookup speculative decoding is for (editing documents and code, answering from a passage): the
model copies long runs of its prompt, so the last few tokens of its output usually occurred in the prompt, with
the right continuation after them. The passages are public-domain prose (Jane Austen, Herman Melville, Mark
Twain, the Gettysburg Address) and the edits are small substitutions, chosen per request by the seed.
"""

from __future__ import annotations

from typing import Any

from frame.interfaces.workload import Workload, WorkloadContext, WorkloadRequest
from frame.sampling_params import SamplingParams

PASSAGES = [
    "It is a truth universally acknowledged, that a single man in possession of a good fortune, must be in want of "
    "a wife. However little known the feelings or views of such a man may be on his first entering a "
    "neighbourhood, this truth is so well fixed in the minds of the surrounding families, that he is considered "
    "the rightful property of some one or other of their daughters.",
    "Call me Ishmael. Some years ago, never mind how long precisely, having little or no money in my purse, and "
    "nothing particular to interest me on shore, I thought I would sail about a little and see the watery part of "
    "the world. It is a way I have of driving off the spleen and regulating the circulation.",
    "Four score and seven years ago our fathers brought forth on this continent, a new nation, conceived in "
    "Liberty, and dedicated to the proposition that all men are created equal. Now we are engaged in a great civil "
    "war, testing whether that nation, or any nation so conceived and so dedicated, can long endure.",
    "You don't know about me without you have read a book by the name of The Adventures of Tom Sawyer; but that "
    "ain't no matter. That book was made by Mr. Mark Twain, and he told the truth, mainly. There was things which "
    "he stretched, but mainly he told the truth.",
]
EDITS = [("man", "woman"), ("the", "THE"), ("and", "&"), ("truth", "fact"), ("years", "winters"), ("book", "novel")]


def _copy_edit(ctx: WorkloadContext, p: dict[str, Any]) -> list[WorkloadRequest]:
    head, tail = ctx.chat_frame()
    requests = []
    for index in range(p["num_requests"]):
        passages = ctx.rng.sample(PASSAGES, k=min(p["num_passages"], len(PASSAGES)))
        old, new = ctx.rng.choice(EDITS)
        ask = (f"Rewrite the following text exactly, word for word, but replace every '{old}' with '{new}'. "
               f"Output only the rewritten text.\n\n" + "\n\n".join(passages))
        # The model stops where its rewrite ends: past it, with ignore_eos, it would chat about something else and
        # the run would measure that instead. Speculation never changes greedy tokens, so both arms of a
        # comparison still do the same work.
        params = SamplingParams(temperature=0.0, max_tokens=p["max_tokens"])
        # One request per wave: a single stream, rewrite after rewrite.
        requests.append(WorkloadRequest(tuple(head + ctx.encode(ask) + tail), params, wave=index))
    return requests


EDITING_WORKLOADS = [
    Workload("copy_edit", "one stream rewriting public-domain passages, one after another, with one word "
             "substituted, each stopping where its rewrite ends: output mostly copies the prompt (speculative "
             "decoding's home ground)", {"num_requests": 4, "num_passages": 1, "max_tokens": 128}, _copy_edit,
             {"num_requests": "rewrites, one after another (one wave each)",
              "num_passages": "passages in each text to rewrite (at most 4)",
              "max_tokens": "new tokens at most per rewrite (greedy; it stops where the rewrite ends)"}),
]
