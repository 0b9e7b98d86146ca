"""XGrammarBackend: structured-output constraints compiled by xgrammar, matched per request.

JSON schemas, any JSON object, regexes, choice lists (compiled as an alternation of the escaped strings), EBNF
grammars and structural tags (xgrammar's JSON format). Counts past what xgrammar holds in 32 bits are refused first
(:mod:`frame_grammar_xgrammar.bounds`), since xgrammar would wrap them. xgrammar's errors carry a C++ source
location; the message a user sees keeps only the reason and names the field.
"""

from __future__ import annotations

import json
import re
from typing import Any

import numpy as np
import torch
import xgrammar as xgr
from frame.errors import InvalidSamplingError
from frame.interfaces.grammar import GrammarBackend, GrammarMatcher
from frame.sampling_params import StructuredOutputs
from pydantic import BaseModel, ConfigDict, Field

from frame_grammar_xgrammar.bounds import MAX_COUNT, MAX_SCHEMA_DEPTH, check_repetitions, check_schema_counts

#: "[13:44:38] /project/cpp/regex_converter.cc:94: " before xgrammar's own message.
_LOCATION = re.compile(r"^\[[0-9:]+\] [^ ]+:\d+: ")


class XGrammarOptions(BaseModel):
    """Options of ``--grammar-backend xgrammar`` (``--grammar-opt key=value``)."""

    model_config = ConfigDict(extra="forbid")

    any_whitespace: bool = Field(False, description="let JSON output put any whitespace between tokens (off: one "
                                 "space after ':' and ',', which keeps small models from looping on whitespace)")
    max_threads: int = Field(2, ge=1, description="threads xgrammar compiles with")
    max_repeat: int = Field(MAX_COUNT, ge=1, le=MAX_COUNT, description="largest repetition count in a regex or "
                            "an EBNF grammar (xgrammar keeps one node per repetition; its 32-bit bound by default)")
    max_pattern_repeat: int = Field(1000, ge=1, le=MAX_COUNT, description="largest repetition count in a JSON "
                                    "schema's pattern (expanded there: a{2000} compiles in 0.4 s, a{12000} in minutes)")
    max_schema_depth: int = Field(MAX_SCHEMA_DEPTH, ge=1, le=1000, description="deepest nesting of a JSON schema "
                                  "(compile time grows fast with depth)")


class XGrammarMatcher(GrammarMatcher):
    """One request's xgrammar matcher; masks are filled through a one-row torch view of the caller's array."""

    def __init__(self, matcher: xgr.GrammarMatcher) -> None:
        self._matcher = matcher

    def accept(self, token_id: int) -> bool:
        return bool(self._matcher.accept_token(token_id))

    def fill_bitmask(self, bitmask: np.ndarray) -> None:
        self._matcher.fill_next_token_bitmask(torch.from_numpy(bitmask).view(1, -1), 0)

    def rollback(self, num_tokens: int) -> None:
        if num_tokens:
            self._matcher.rollback(num_tokens)

    def is_terminated(self) -> bool:
        return bool(self._matcher.is_terminated())


class XGrammarBackend(GrammarBackend):
    """A compiler for one tokenizer's vocabulary."""

    def __init__(self, tokenizer: Any, vocab_size: int, stop_token_ids: list[int],
                 options: XGrammarOptions | None = None) -> None:
        self.options = options or XGrammarOptions()
        info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size,
                                                  stop_token_ids=stop_token_ids or None)
        # frame caches compiled grammars itself (bounded in bytes); xgrammar's own cache would keep every one.
        self._compiler = xgr.GrammarCompiler(info, max_threads=self.options.max_threads, cache_enabled=False)
        self._max_rollback = 32  # drafts are checked ahead, at most num_speculative_tokens (<= 16) at a time

    def compile(self, spec: StructuredOutputs) -> xgr.CompiledGrammar:
        field = f"structured_outputs.{spec.kind}"
        try:
            if spec.json is not None:
                schema = json.loads(spec.json)
                opts = self.options
                check_schema_counts(schema, field, opts.max_schema_depth, opts.max_pattern_repeat)
                return self._compiler.compile_json_schema(schema, any_whitespace=self.options.any_whitespace)
            if spec.json_object:  # OpenAI's json_object: an object, not any JSON value
                return self._compiler.compile_json_schema({"type": "object"},
                                                          any_whitespace=self.options.any_whitespace)
            if spec.regex is not None:
                check_repetitions(spec.regex, field, limit=self.options.max_repeat)
                return self._compiler.compile_regex(spec.regex)
            if spec.choice is not None:
                return self._compiler.compile_regex("|".join(re.escape(choice) for choice in spec.choice))
            if spec.structural_tag is not None:
                return self._compiler.compile_structural_tag(spec.structural_tag)
            check_repetitions(spec.grammar or "", field, ebnf=True, limit=self.options.max_repeat)
            return self._compiler.compile_grammar(spec.grammar or "")
        except json.JSONDecodeError as err:
            raise InvalidSamplingError(f"{field} is not valid JSON: {err.msg} at position {err.pos}.",
                                       param=field) from None
        except (RuntimeError, ValueError, TypeError) as err:
            reason = _LOCATION.sub("", str(err).strip().splitlines()[0]).rstrip(".")
            raise InvalidSamplingError(f"{field} cannot be compiled: {reason}.", param=field) from None

    def memory_bytes(self, compiled: xgr.CompiledGrammar) -> int:
        return int(compiled.memory_size_bytes)

    def matcher(self, compiled: xgr.CompiledGrammar) -> XGrammarMatcher:
        return XGrammarMatcher(xgr.GrammarMatcher(compiled, max_rollback_tokens=self._max_rollback))
