"""Prompt logprobs over HTTP with the official openai client: ``echo`` with ``logprobs`` (``max_tokens: 0`` too) in
OpenAI's shape, vLLM's ``prompt_logprobs`` field, and ``logit_bias`` steering the draw."""

from __future__ import annotations

import openai
import pytest

PROMPT = "The capital of France is Paris, and the capital of Italy is"


@pytest.fixture(scope="module")
def api(mp_server) -> tuple[openai.OpenAI, str]:
    """The openai client on the shared server, and the served model's name."""
    client = openai.OpenAI(base_url=f"{mp_server.base_url}/v1", api_key="unused", max_retries=0, timeout=120)
    return client, client.models.list().data[0].id


@pytest.fixture(scope="module")
def scored(api):
    """The prompt scored by vLLM's field: ``prompt_logprobs`` of each choice, by token id text."""
    client, model = api
    out = client.completions.create(model=model, prompt=PROMPT, max_tokens=1, temperature=0,
                                    extra_body={"prompt_logprobs": 2})
    return out.choices[0].model_extra["prompt_logprobs"]


def test_echo_with_logprobs_and_no_tokens_scores_the_prompt(api, scored):
    client, model = api
    out = client.completions.create(model=model, prompt=PROMPT, max_tokens=0, echo=True, logprobs=1, temperature=0)
    choice = out.choices[0]
    assert choice.text == PROMPT and out.usage.completion_tokens == 0 and choice.finish_reason == "length"
    lp = choice.logprobs
    n = out.usage.prompt_tokens
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == n == len(scored)
    assert "".join(lp.tokens) == PROMPT
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None and scored[0] is None
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(n)]
    for i in range(1, n):
        own = next(v for v in scored[i].values() if v["decoded_token"] == lp.tokens[i])
        assert lp.token_logprobs[i] == pytest.approx(own["logprob"], abs=1e-3)
        best = max(scored[i].values(), key=lambda v: v["logprob"])
        assert best["rank"] == 1 and lp.top_logprobs[i][best["decoded_token"]] == pytest.approx(best["logprob"],
                                                                                                abs=1e-3)
        assert lp.token_logprobs[i] <= best["logprob"] + 1e-3 and -30 < lp.token_logprobs[i] <= 0


def test_echo_with_logprobs_continues_over_the_completion(api):
    client, model = api
    plain = client.completions.create(model=model, prompt=PROMPT, max_tokens=3, logprobs=1, temperature=0)
    echoed = client.completions.create(model=model, prompt=PROMPT, max_tokens=3, echo=True, logprobs=1,
                                       temperature=0)
    n = echoed.usage.prompt_tokens
    assert echoed.choices[0].text == PROMPT + plain.choices[0].text and echoed.usage.completion_tokens == 3
    lp = echoed.choices[0].logprobs
    assert lp.tokens[n:] == plain.choices[0].logprobs.tokens
    assert lp.token_logprobs[n:] == pytest.approx(plain.choices[0].logprobs.token_logprobs, abs=1e-3)
    assert lp.text_offset[n] == len(PROMPT)


def test_prompt_logprobs_field_has_vllms_shape(scored):
    assert scored[0] is None
    for position in scored[1:]:
        ranks = sorted(v["rank"] for v in position.values())
        assert ranks[:2] == [1, 2] and len(position) in (2, 3)  # the top two, and the prompt's token if apart
        assert all(k.isdigit() and isinstance(v["decoded_token"], str) for k, v in position.items())


def test_logit_bias_forces_a_token(api):
    client, model = api
    tok = client.completions.create(model=model, prompt=PROMPT, max_tokens=4, temperature=0,
                                    logit_bias={"42": 100})
    again = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Hi"}], max_tokens=3,
                                           temperature=0, logit_bias={"42": 100})
    text = client.completions.create(model=model, prompt=[42], max_tokens=0, echo=True).choices[0].text
    assert tok.choices[0].text == text * 4 and again.choices[0].message.content == text * 3
