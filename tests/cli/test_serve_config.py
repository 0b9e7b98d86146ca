"""`frame serve`'s own defaults: a smaller step budget than the offline engine's and decode graphs recorded at start,
unless the user sets them."""

from __future__ import annotations

from pathlib import Path

import pytest
from frame.cli.main import build_parser
from frame.cli.serve import SERVE_MAX_NUM_BATCHED_TOKENS, serve_config
from frame.config import EngineConfig


def _config(*argv: str) -> EngineConfig:
    return serve_config(build_parser().parse_args(["serve", *argv]))


def test_serve_steps_are_smaller_than_the_offline_engines() -> None:
    offline = EngineConfig.model_fields["max_num_batched_tokens"].default
    assert offline > SERVE_MAX_NUM_BATCHED_TOKENS
    assert _config().max_num_batched_tokens == SERVE_MAX_NUM_BATCHED_TOKENS


@pytest.mark.parametrize("argv", [["--max-num-batched-tokens", "8192"], ["--config", "{file}"]])
def test_a_budget_the_user_sets_is_kept(tmp_path: Path, argv: list[str]) -> None:
    file = tmp_path / "engine.yaml"
    file.write_text("max_num_batched_tokens: 8192\n")
    assert _config(*(a.format(file=file) for a in argv)).max_num_batched_tokens == 8192


def test_without_chunked_prefill_a_step_keeps_the_engines_budget() -> None:
    config = _config("--no-enable-chunked-prefill", "--max-model-len", "4096")
    assert config.max_num_batched_tokens == EngineConfig.model_fields["max_num_batched_tokens"].default


def test_a_server_records_its_decode_graphs_at_start_unless_told_not_to(tmp_path: Path) -> None:
    assert EngineConfig().record_graphs_at_start is False  # offline: each bucket on its first use
    assert _config().record_graphs_at_start is True
    assert _config("--no-record-graphs-at-start").record_graphs_at_start is False
    file = tmp_path / "engine.yaml"
    file.write_text("record_graphs_at_start: false\n")
    assert _config("--config", str(file)).record_graphs_at_start is False
