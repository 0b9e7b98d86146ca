"""Full context (issue 31): an 8,000-token prompt on the bundled SmolLM2 (context 8,192) is prefilled in chunks and
gives transformers' greedy tokens in float32, through a real `frame serve` (hashchain, cpu_paged) and the offline
engine (radix, sdpa); the prefix cache hits on the long prompt the second time; one token past the context is a 400.

The transformers reference (about 30 s on two cores) is computed once for the module.
"""

from __future__ import annotations

import random

import openai
import pytest
import torch
from frame import LLM, SamplingParams

pytestmark = pytest.mark.slow

PROMPT_TOKENS = 8000
CONTEXT = 8192  # SmolLM2-135M's max_position_embeddings
NEW_TOKENS = 16
#: A 2,048-token step budget (frame serve's default) prefills the prompt in four chunks.
CHUNK = 2048
#: Enough blocks of 16 for one full context, and a little over.
KV_BLOCKS = 600
#: A seed whose greedy continuation has no near tie in transformers' float32 scores (the smallest top-1/top-2 gap
#: among the 16 tokens is 0.18 nats), so the comparison tests the long-context path, not rounding.
SEED = 32


def delivery_log_prompt(tokenizer, length: int = PROMPT_TOKENS, seed: int = SEED) -> list[int]:
    """A chat-templated question about a long, seeded delivery log, cut to exactly ``length`` tokens."""
    rng = random.Random(seed)
    names = ["Ada", "Bruno", "Chen", "Dalia", "Emeka", "Farah", "Goran", "Hana", "Ivo", "Jun"]
    items = ["crates of apples", "bags of rice", "boxes of books", "barrels of oil", "rolls of cloth", "sacks of flour"]
    cities = ["Lisbon", "Oslo", "Nairobi", "Lima", "Hanoi", "Quebec", "Perth", "Tbilisi"]
    log = "\n".join(f"Day {day}: {rng.choice(names)} delivered {rng.randint(2, 90)} {rng.choice(items)} to "
                    f"{rng.choice(cities)}." for day in range(1, length // 8))
    question = ("Here is the delivery log of a trading company.\n\n@LOG@\n\nWho is the company's most frequent "
                "courier, and which city do they serve most? Answer in two sentences.")
    text = tokenizer.apply_chat_template([{"role": "user", "content": question}], add_generation_prompt=True,
                                         tokenize=False)
    before, after = (tokenizer.encode(part) for part in text.split("@LOG@"))
    return before + tokenizer.encode(log)[: length - len(before) - len(after)] + after


@pytest.fixture(scope="module")
def long_prompt(smol_source) -> list[int]:
    ids = delivery_log_prompt(smol_source.tokenizer)
    assert len(ids) == PROMPT_TOKENS
    return ids


@pytest.fixture(scope="module")
def reference(hf_reference, long_prompt) -> list[int]:
    """transformers' greedy continuation of the long prompt, float32."""
    with torch.inference_mode():
        out = hf_reference.generate(torch.tensor([long_prompt]), max_new_tokens=NEW_TOKENS, do_sample=False,
                                    pad_token_id=0)
    return out[0, PROMPT_TOKENS:].tolist()


@pytest.fixture(scope="module")
def full_context_server(tmp_path_factory, serve_tools):
    """`frame serve` at the model's own context, float32, dense (transformers is the reference), hashchain and cpu_paged
    (flags after the shared ones win)."""
    start_serve, stop_serve = serve_tools
    server = start_serve(tmp_path_factory.mktemp("long"), "--max-model-len", str(CONTEXT), "--num-kv-blocks",
                         str(KV_BLOCKS), "--platform-opt", "threads=2", "--cache", "hashchain", "--attn", "cpu_paged",
                         "--max-num-batched-tokens", str(CHUNK), "--quantization", "none")
    yield server
    stop_serve(server)


def test_served_full_context_prompt_equals_transformers_and_hits_the_prefix_cache(
        full_context_server, smol_source, long_prompt, reference) -> None:
    client = openai.OpenAI(base_url=f"{full_context_server.base_url}/v1", api_key="unused", max_retries=0,
                           timeout=600)
    expected = smol_source.tokenizer.decode(reference, skip_special_tokens=True)
    cached = []
    for _ in range(2):
        resp = client.completions.create(model="SmolLM2-135M-Instruct", prompt=long_prompt, max_tokens=NEW_TOKENS,
                                         temperature=0, extra_body={"ignore_eos": True})
        assert resp.usage.prompt_tokens == PROMPT_TOKENS
        assert resp.usage.completion_tokens == NEW_TOKENS
        assert resp.choices[0].text == expected
        cached.append(resp.usage.prompt_tokens_details.cached_tokens)
    assert cached[0] == 0
    # hashchain shares whole blocks, and the last prompt token is always computed (its logits are sampled).
    assert cached[1] == (PROMPT_TOKENS - 1) // 16 * 16


def test_one_token_past_the_context_is_a_400_naming_both_numbers(full_context_server, long_prompt) -> None:
    client = openai.OpenAI(base_url=f"{full_context_server.base_url}/v1", api_key="unused", max_retries=0)
    prompt = (long_prompt * 2)[: CONTEXT + 1]
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(model="SmolLM2-135M-Instruct", prompt=prompt, max_tokens=1)
    assert err.value.status_code == 400
    assert (f"This model's maximum context length is {CONTEXT} tokens, but the prompt has {CONTEXT + 1} tokens"
            in err.value.message)
    fits = client.completions.create(model="SmolLM2-135M-Instruct", prompt=prompt[:CONTEXT - 1], max_tokens=1)
    assert fits.usage.prompt_tokens == CONTEXT - 1 and fits.usage.completion_tokens == 1


def test_offline_radix_sdpa_full_context_prompt_equals_transformers(long_prompt, reference) -> None:
    llm = LLM(dtype="float32", cache="radix", attn="sdpa", max_num_batched_tokens=CHUNK, num_kv_blocks=KV_BLOCKS,
              platform_options={"threads": 2}, quantization="none")
    params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True)
    first = llm.generate({"prompt_token_ids": long_prompt}, params)[0]
    assert first.outputs[0].token_ids == reference
    assert first.num_cached_tokens == 0
    # The same long prefix under a new question: radix matches it to the token.
    shared = PROMPT_TOKENS - 40
    again = llm.generate({"prompt_token_ids": long_prompt[:shared] + long_prompt[-40:][::-1]}, params)[0]
    assert again.num_cached_tokens == shared
