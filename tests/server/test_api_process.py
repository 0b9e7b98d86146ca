"""``frame serve``'s API process does not import torch to start: the engine process checks the plugins and the model
itself (issue 32), so the server starts without paying for torch. (The first structured-output request loads it
later: the server validates constraints with xgrammar, which imports torch.)"""

from __future__ import annotations

from pathlib import Path


def _maps(pid: int) -> str:
    return (Path("/proc") / str(pid) / "maps").read_text()


def test_a_fresh_api_process_maps_no_torch_library_while_the_engine_does(serve_tools, tmp_path: Path) -> None:
    start_serve, stop_serve = serve_tools
    server = start_serve(tmp_path)
    try:
        assert server.proc is not None
        assert "libtorch" not in _maps(server.proc.pid)
        assert "libtorch" in _maps(server.engine_pid())  # the check sees torch where it is loaded
    finally:
        stop_serve(server)
