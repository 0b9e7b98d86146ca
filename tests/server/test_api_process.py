"""``frame serve``'s API process never imports torch: the engine process checks the plugins and the model itself
(issue 32), so the server starts without paying for torch and its memory holds no copy of it."""

from __future__ import annotations

from pathlib import Path


def _maps(pid: int) -> str:
    return (Path("/proc") / str(pid) / "maps").read_text()


def test_the_api_process_maps_no_torch_library_while_the_engine_does(mp_server) -> None:
    assert mp_server.proc is not None
    assert "libtorch" not in _maps(mp_server.proc.pid)
    assert "libtorch" in _maps(mp_server.engine_pid())  # the check can see torch where it is loaded
