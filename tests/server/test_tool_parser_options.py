"""A tool parser's options reach it: ``--tool-parser-opt KEY=VALUE`` and ``tool_parser_options`` in a config file,
through the real server and the openai client; an option the parser does not take stops `frame serve` in one line.

The parser is the `frame new-plugin --kind tool_parser` skeleton (its options are the tags around a call),
installed for the server process as a wheel is: its folder and a ``.dist-info`` with its entry point on the
``PYTHONPATH``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import openai
import pytest
from frame.cli.new_plugin import write_skeleton

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                          "required": ["city"]}}}


@pytest.fixture(scope="module")
def env(tmp_path_factory) -> dict[str, str]:
    """The environment in which the skeleton parser 'tagged' is installed."""
    folder = write_skeleton("tool_parser", "tagged", tmp_path_factory.mktemp("parser"))
    info = folder / "frame_tool_parser_tagged-0.1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: frame-tool-parser-tagged\nVersion: 0.1.0\n")
    (info / "entry_points.txt").write_text("[frame.tool_parsers]\ntagged = frame_tool_parser_tagged.plugin\n")
    return {"PYTHONPATH": os.pathsep.join(filter(None, [str(folder), os.environ.get("PYTHONPATH")]))}


@pytest.fixture(scope="module")
def server(serve_tools, env, tmp_path_factory):
    start_serve, stop_serve = serve_tools
    tmp = tmp_path_factory.mktemp("serve")
    config = tmp / "serve.yaml"
    config.write_text("tool_parser_options:\n  open_tag: <fn>\n")  # the config key, and the flag beside it
    server = start_serve(tmp, "--tool-parser", "tagged", "--config", str(config), "--tool-parser-opt",
                         "close_tag=</fn>", env=env)
    yield server
    stop_serve(server)


@pytest.mark.parametrize("stream", [False, True])
def test_the_parser_finds_calls_in_the_tags_its_options_name(server, stream: bool) -> None:
    client = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0, timeout=600)
    # The model's text is scripted with a regex constraint: "Sure." and one call between the configured tags.
    script = r'Sure\. <fn>\{"name": "get_weather", "arguments": \{"city": "(Paris|Rome)"\}\}</fn>'
    kwargs = dict(model="SmolLM2-135M-Instruct", messages=[{"role": "user", "content": "Weather in Paris?"}],
                  tools=[WEATHER], tool_choice="auto", max_tokens=60, temperature=0,
                  extra_body={"structured_outputs": {"regex": script}})
    if not stream:
        message = client.chat.completions.create(**kwargs).choices[0].message
        content, calls = message.content, message.tool_calls
    else:
        content, calls = "", []
        for chunk in client.chat.completions.create(stream=True, **kwargs):
            if chunk.choices:
                content += chunk.choices[0].delta.content or ""
                calls += chunk.choices[0].delta.tool_calls or []
    assert content.strip() == "Sure." and len(calls) == 1, (content, calls)
    assert calls[0].function.name == "get_weather"
    assert json.loads(calls[0].function.arguments)["city"] in ("Paris", "Rome")


def test_an_option_the_parser_does_not_take_is_one_line(env, tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, "-m", "frame.cli.main", "serve", "--tool-parser", "tagged",
                          "--tool-parser-opt", "open_tga=<fn>"], env={**os.environ, **env}, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 2
    [line] = out.stderr.strip().splitlines()
    assert line.startswith("error: ") and "open_tga" in line and "open_tag" in line, line
