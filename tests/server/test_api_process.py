"""``frame serve``'s API process does not import torch: the engine process checks the plugins and the model itself
(issue 32), so the server starts without paying for torch; and constraints are checked in the server's constraint
worker (issue 36), so the first structured-output request does not load it either (xgrammar imports torch)."""

from __future__ import annotations

from pathlib import Path

import httpx


def _maps(pid: int) -> str:
    return (Path("/proc") / str(pid) / "maps").read_text()


def test_the_api_process_maps_no_torch_library_while_the_engine_does(serve_tools, tmp_path: Path) -> None:
    start_serve, stop_serve = serve_tools
    server = start_serve(tmp_path)
    try:
        assert server.proc is not None
        assert "libtorch" not in _maps(server.proc.pid)
        assert "libtorch" in _maps(server.engine_pid())  # the check sees torch where it is loaded
        resp = httpx.post(f"{server.base_url}/v1/completions", timeout=120, json={
            "model": "SmolLM2-135M-Instruct", "prompt": "Pick:", "max_tokens": 2,
            "structured_outputs": {"choice": ["yes", "no"]}})
        assert resp.status_code == 200, resp.text
        assert "libtorch" not in _maps(server.proc.pid)
    finally:
        stop_serve(server)
