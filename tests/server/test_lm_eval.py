"""EleutherAI's lm-evaluation-harness, ``local-completions`` backend, against `frame serve` on a small local
multiple-choice task: it runs to the end, and its accuracy (and every loglikelihood it logged) equals what frame's
own ``prompt_logprobs`` give for the same token ids.

lm-eval lives in a virtual environment of its own (it pins packages frame's tests do not need), made once under
frame's cache folder; it sees the test environment's packages (torch, transformers) through a ``.pth`` file. When
pip cannot install it the test is skipped, saying why.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import httpx
import pytest
from frame.paths import cache_root

pytestmark = pytest.mark.slow

LM_EVAL = "lm_eval[api]==0.4.13"
CONTEXT = "Question: What is the capital of {country}?\nAnswer:"
#: (country, choices, index of the right one): the task's documents.
DOCS = [
    ("France", ["Paris", "Berlin", "Madrid", "Rome"], 0),
    ("Germany", ["Vienna", "Berlin", "Prague", "Warsaw"], 1),
    ("Italy", ["Milan", "Naples", "Rome", "Turin"], 2),
    ("Spain", ["Lisbon", "Barcelona", "Seville", "Madrid"], 3),
    ("Japan", ["Tokyo", "Osaka", "Kyoto", "Seoul"], 0),
    ("Canada", ["Toronto", "Ottawa", "Vancouver", "Montreal"], 1),
    ("Australia", ["Sydney", "Melbourne", "Canberra", "Perth"], 2),
    ("Egypt", ["Alexandria", "Luxor", "Giza", "Cairo"], 3),
    ("Brazil", ["Brasilia", "Rio de Janeiro", "Sao Paulo", "Salvador"], 0),
    ("Turkey", ["Istanbul", "Ankara", "Izmir", "Antalya"], 1),
]
TASK = """task: frame_capitals
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "Question: What is the capital of {{{{country}}}}?\\nAnswer:"
doc_to_choice: choices
doc_to_target: answer
metric_list:
  - metric: acc
"""


def _lm_eval_python() -> Path:
    """The lm-eval environment's interpreter, made on first use; skips the test when pip cannot install it."""
    venv = cache_root() / "tests" / "lm-eval-0.4.13"
    python = venv / "bin" / "python"
    if (venv / ".ready").is_file():
        # Point it at this checkout's venv again: the cached one may have been made from a clone since deleted.
        next((venv / "lib").glob("python3*/site-packages")).joinpath("frame_tests.pth").write_text(
            sysconfig.get_paths()["purelib"] + "\n")
        return python
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
    site = next((venv / "lib").glob("python3*/site-packages"))
    (site / "frame_tests.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    pip = subprocess.run([str(python), "-m", "pip", "install", "-q", LM_EVAL], capture_output=True, text=True,
                         timeout=900)
    if pip.returncode != 0:
        pytest.skip(f"lm-eval could not be installed with pip ({LM_EVAL}): {pip.stderr.strip()[-300:]}")
    (venv / ".ready").touch()
    return python


def _frame_loglikelihoods(server, tokenizer, context: str, choices: list[str]) -> list[float]:
    """Each choice's loglikelihood as frame scores it (``prompt_logprobs``), tokenised as lm-eval does: the
    continuation's tokens are those the whole text has past the context's."""
    context_ids = tokenizer(context).input_ids
    out = []
    with server.client() as http:
        for choice in choices:
            whole = tokenizer(context + " " + choice).input_ids
            body = http.post("/v1/completions", json={"prompt": whole, "max_tokens": 1, "temperature": 0,
                                                      "prompt_logprobs": 0}).json()
            scored = body["choices"][0]["prompt_logprobs"]
            out.append(sum(scored[i][str(whole[i])]["logprob"] for i in range(len(context_ids), len(whole))))
    return out


def test_lm_eval_local_completions_accuracy_equals_frames_own(mp_server, smol_source, tmp_path):
    python = _lm_eval_python()
    data = tmp_path / "capitals.jsonl"
    data.write_text("".join(json.dumps({"country": c, "choices": ch, "answer": a}) + "\n" for c, ch, a in DOCS))
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    (tasks / "frame_capitals.yaml").write_text(TASK.format(data=data))
    tokenizer_dir = tmp_path / "tokenizer"
    smol_source.tokenizer.save_pretrained(tokenizer_dir)
    model = httpx.get(f"{mp_server.base_url}/v1/models").json()["data"][0]["id"]
    model_args = (f"base_url={mp_server.base_url}/v1/completions,model={model},tokenizer_backend=huggingface,"
                  f"tokenizer={tokenizer_dir},tokenized_requests=True,num_concurrent=1,max_retries=1")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    run = subprocess.run([str(python), "-m", "lm_eval", "--model", "local-completions", "--model_args", model_args,
                          "--tasks", "frame_capitals", "--include_path", str(tasks), "--output_path",
                          str(tmp_path / "out"), "--log_samples", "--batch_size", "1"],
                         capture_output=True, text=True, timeout=600, env=env)
    assert run.returncode == 0, run.stderr[-3000:]
    [results] = (tmp_path / "out").rglob("results_*.json")
    accuracy = json.loads(results.read_text())["results"]["frame_capitals"]["acc,none"]
    [samples] = (tmp_path / "out").rglob("samples_frame_capitals_*.jsonl")
    logged = {s["doc_id"]: [float(r[0]) for r in s["filtered_resps"]]  # lm-eval logs them as text
              for s in map(json.loads, samples.read_text().splitlines())}
    correct = 0
    for doc_id, (country, choices, answer) in enumerate(DOCS):
        mine = _frame_loglikelihoods(mp_server, smol_source.tokenizer, CONTEXT.format(country=country), choices)
        assert logged[doc_id] == pytest.approx(mine, abs=1e-3), country
        correct += max(range(len(choices)), key=mine.__getitem__) == answer
    assert accuracy == correct / len(DOCS)
    assert accuracy > 0.25  # the model knows some capitals: the task was really run and scored
