"""`frame generate` runs several prompts as one batch and, with -v, shows each request's cached tokens."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from frame.cli.main import main

QUESTION = "What is the capital of France?"


def completions(out: str) -> list[str]:
    """The completion under each ``[n] prompt`` header of `frame generate`'s stdout."""
    return [part.strip() for part in re.split(r"^\[\d\] .*$", out, flags=re.MULTILINE)[1:]]


def test_several_prompts_run_as_one_batch_and_a_repeat_hits_the_cache(tmp_path: Path, capsys) -> None:
    prompts = tmp_path / "prompts.txt"
    prompts.write_text(f"{QUESTION}\n\nName a prime number.\n")
    code = main(["generate", "--prompt", QUESTION, "--prompts-file", str(prompts), "--max-tokens", "8",
                 "--dtype", "float32", "--max-model-len", "256", "-v"])
    out, err = capsys.readouterr()
    assert code == 0, err
    headers = [line for line in out.splitlines() if re.fullmatch(r"\[\d\] .*", line)]
    assert headers == [f"[1] {QUESTION}", f"[2] {QUESTION}", "[3] Name a prime number."]
    # The bundled GGUF runs packed, whose answer is the file's own ("L'Étoile, la ...", as llama.cpp's; dense says
    # Paris): the repeat, its prompt served by the prefix cache but for its last tokens, answers the same.
    answers = completions(out)
    assert answers[0] and answers[1] == answers[0]
    counts = re.findall(r"request (\d): (\d+) prompt tokens, (\d+) of them cached; (\d+) generated", err)
    assert [c[0] for c in counts] == ["1", "2", "3"]
    (_, first_len, first_cached, _), (_, second_len, second_cached, _) = counts[:2]
    # The repeat waits one step for the first one's prefill, then reuses its full blocks (16 tokens each).
    assert first_len == second_len and first_cached == "0"
    assert int(second_cached) == int(second_len) // 16 * 16 > 0
    assert re.search(rf"prefix cache: {second_cached} of \d+ prompt tokens reused", err)


@pytest.mark.parametrize(("argv", "message"), [
    ([], "error: frame generate needs a prompt: pass --prompt TEXT (repeatable) or --prompts-file FILE."),
    (["--prompts-file", "/nonexistent/prompts.txt"],
     "error: Prompts file /nonexistent/prompts.txt does not exist; pass a text file with one prompt per line."),
])
def test_no_prompt_is_one_line_before_any_engine_is_built(argv: list[str], message: str, capsys) -> None:
    assert main(["generate", *argv]) == 2
    assert capsys.readouterr().err.splitlines() == [message]


def test_a_terminal_sees_the_load_and_the_batch_progress_on_stderr(tmp_path: Path) -> None:
    """stderr a terminal (a pty): the load's status line and the batch's progress show there; stdout keeps only
    the completions."""
    import os
    import pty
    import subprocess
    import sys

    leader, follower = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "frame.cli.main", "generate", "--prompt", QUESTION, "--prompt",
                             "Name a prime number.", "--max-tokens", "8", "--dtype", "float32", "--max-model-len",
                             "256"], stdout=subprocess.PIPE, stderr=follower, text=True,
                            env={**os.environ, "COLUMNS": "120", "TERM": "xterm"})
    os.close(follower)
    seen = b""
    while True:
        try:
            chunk = os.read(leader, 4096)
        except OSError:  # the child closed its end
            break
        if not chunk:
            break
        seen += chunk
    out = proc.communicate(timeout=300)[0]
    os.close(leader)
    assert proc.returncode == 0
    text = seen.decode(errors="replace")
    assert "loading the bundled SmolLM2-135M-Instruct and starting the engine" in text
    assert "generating" in text
    assert "loading" not in out and "generating" not in out
    assert [bool(answer) for answer in completions(out)] == [True, True]
