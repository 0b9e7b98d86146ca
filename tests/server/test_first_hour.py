"""A newcomer's first hour (issue 37) with real servers: a Hub id given positionally serves from a Hugging Face
cache with HF_HUB_OFFLINE=1, vLLM's flag names do what they say through the openai client, the start-up summary
names what runs, and SIGTERM or Ctrl-C stops a server that is still starting."""

from __future__ import annotations

import hashlib
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import openai
import pytest

HUB_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
#: A chat template unlike SmolLM2's own, so the prompt's token count tells which one rendered it.
TEMPLATE = "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}[assistant] "
LONG_PROMPT = "Tell me about rivers. " * 20


def hub_cache(home: Path, repo_id: str, folder: Path) -> Path:
    """``folder``'s files laid out as huggingface_hub's cache holds a download of ``repo_id`` under ``home``: blobs,
    a snapshot of links to them, and refs/main naming the snapshot."""
    repo = home / "hub" / f"models--{repo_id.replace('/', '--')}"
    revision = hashlib.sha1(repo_id.encode()).hexdigest()
    snapshot = repo / "snapshots" / revision
    snapshot.mkdir(parents=True)
    (repo / "blobs").mkdir()
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(revision)
    for file in folder.iterdir():
        if file.is_file():
            blob = repo / "blobs" / hashlib.sha256(file.name.encode()).hexdigest()
            blob.symlink_to(file.resolve())  # the export is large: a link, not a copy
            (snapshot / file.name).symlink_to(os.path.relpath(blob, snapshot))
    return snapshot


@pytest.fixture(scope="module")
def hf_env(tmp_path_factory, smol_source) -> dict[str, str]:
    """HF_HOME holding the bundled SmolLM2 as the Hub's HuggingFaceTB/SmolLM2-135M-Instruct, offline."""
    import torch
    from frame.bench.hf_export import export_folder

    home = tmp_path_factory.mktemp("hf-home")
    hub_cache(home, HUB_ID, export_folder(smol_source, torch.float32))
    return {"HF_HOME": str(home), "HF_HUB_OFFLINE": "1"}


@pytest.fixture(scope="module")
def hub_server(tmp_path_factory, serve_tools, hf_env):
    start_serve, stop_serve = serve_tools
    server = start_serve(tmp_path_factory.mktemp("hub"), HUB_ID, "--no-enable-prefix-caching", "--enforce-eager",
                         "--chat-template", TEMPLATE, env=hf_env)
    yield server
    stop_serve(server)


def _client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0, timeout=120)


def test_a_hub_id_given_positionally_serves_from_the_cache_offline(hub_server) -> None:
    client = _client(hub_server)
    assert [m.id for m in client.models.list().data] == [HUB_ID]
    reply = client.chat.completions.create(model=HUB_ID, messages=[{"role": "user", "content": "Say hello."}],
                                           max_tokens=8, temperature=0)
    assert reply.choices[0].message.content


def test_chat_template_renders_the_conversation(hub_server, smol_source) -> None:
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    usage = _client(hub_server).chat.completions.create(model=HUB_ID, messages=messages, max_tokens=1).usage
    tokenizer = smol_source.tokenizer
    ours = tokenizer("[user] What is the capital of France?\n[assistant] ", add_special_tokens=False).input_ids
    own = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
    assert usage.prompt_tokens == len(ours) != len(own)


def test_no_enable_prefix_caching_reuses_nothing(hub_server) -> None:
    client = _client(hub_server)
    for _ in range(2):
        usage = client.completions.create(model=HUB_ID, prompt=LONG_PROMPT, max_tokens=1).usage
        assert usage.prompt_tokens > 64
        assert usage.prompt_tokens_details.cached_tokens == 0


def test_the_startup_summary_names_what_runs(hub_server) -> None:
    log = hub_server.log_text()
    block = log[log.index("frame is ready:"):].splitlines()[:14]
    rows = {line.split("  ", 2)[1].strip(): line.split("  ", 2)[2].strip() for line in block[1:] if line.strip()}
    assert list(rows) == ["model", "dtype", "quantization", "platform", "ISA path", "attention", "cache", "scheduler",
                          "ranks", "KV pool", "KV dtype", "max concurrency", "decode graphs"]
    assert rows["model"] == f"{HUB_ID} (family llama, max_model_len 1024)"
    assert rows["dtype"] == "float32"
    assert rows["quantization"] == "none (dense float32 weights)"
    assert rows["platform"].startswith("CPU (1 thread")
    assert rows["attention"] in ("cpu_paged", "sdpa")
    assert rows["cache"] == "none (no prefix caching), block size 16"
    assert rows["scheduler"].startswith("fcfs, at most 256 sequences and 2048 tokens a step")
    assert rows["ranks"].startswith("1 engine core (mp, pid ") and rows["ranks"].endswith(
        "x 1 tensor-parallel rank; no router (one core)")
    assert re.fullmatch(r"[\d.]+[KMG]iB, 8192 tokens \(512 blocks\) per core; set by --num-kv-blocks", rows["KV pool"])
    assert re.fullmatch(r"float32, \d+ bytes per token", rows["KV dtype"])
    assert rows["max concurrency"] == "8.00 requests of 1024 tokens at once"
    assert rows["decode graphs"] == "off (--enforce-eager / --no-cuda-graphs)"


def test_generate_takes_a_hub_id_positionally(hf_env) -> None:
    out = subprocess.run([sys.executable, "-m", "frame.cli.main", "generate", HUB_ID, "--prompt", "Say hi.",
                          "--max-tokens", "3", "--dtype", "float32", "--max-model-len", "256"],
                         capture_output=True, text=True, timeout=300, env={**os.environ, **hf_env})
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip()


def _children(pid: int) -> set[int]:
    """The live child processes of ``pid`` (the engine core, the chat-template workers)."""
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True)
    return {int(line) for line in out.stdout.split()}


def _alive(pid: int) -> bool:
    try:
        return (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_stops_a_server_that_is_still_starting(tmp_path: Path, sig: signal.Signals) -> None:
    log = tmp_path / "serve.log"
    with open(log, "w") as f:
        proc = subprocess.Popen([sys.executable, "-m", "frame.cli.main", "serve", "--port", "0", "--platform-opt",
                                 "threads=1"], stdout=f, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120
        while not _children(proc.pid):  # the lifespan has begun: the engine and template workers are starting
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.2)
        children = _children(proc.pid)
        proc.send_signal(sig)
        proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode in (-sig, 128 + sig), log.read_text()
    assert "stopped while starting: the engine was shut down before it was ready" in log.read_text()
    assert "frame is ready" not in log.read_text()
    deadline = time.monotonic() + 10
    while any(_alive(child) for child in children) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not any(_alive(child) for child in children)
