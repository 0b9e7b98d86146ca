"""Incremental detokenisation: text deltas from token ids, one token at a time.

Decoding token by token breaks multi-byte characters and word-initial spaces; decoding the whole sequence every
step is quadratic. Like Hugging Face's streamers, this keeps a short window: it decodes the tokens since
``prefix_offset`` and emits only text past what the window decoded before, holding back a trailing U+FFFD (an
incomplete UTF-8 sequence) until the next token completes it.
"""

from __future__ import annotations

from transformers import PreTrainedTokenizerBase


class IncrementalDetokenizer:
    """Turns a growing list of output token ids into text deltas."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, prompt_token_ids: list[int],
                 skip_special_tokens: bool = True) -> None:
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        # A few prompt tokens of context make the first output token decode with its leading space.
        context = prompt_token_ids[-4:]
        self.token_ids: list[int] = list(context)
        self.prefix_offset = 0
        self.read_offset = len(context)
        self.text = ""

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens,
                                     clean_up_tokenization_spaces=False)

    def add(self, token_ids: list[int]) -> str:
        """Append tokens; return the new text they complete (possibly empty)."""
        self.token_ids.extend(token_ids)
        prefix = self._decode(self.token_ids[self.prefix_offset : self.read_offset])
        full = self._decode(self.token_ids[self.prefix_offset :])
        if len(full) > len(prefix) and not full.endswith("\ufffd"):
            delta = full[len(prefix) :]
            self.prefix_offset = self.read_offset
            self.read_offset = len(self.token_ids)
            self.text += delta
            return delta
        return ""
