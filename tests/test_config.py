"""Engine configuration: YAML and flags merge (flags win); bad keys and values name the fix."""

from __future__ import annotations

from pathlib import Path

import pytest
from frame.cli.engine_flags import config_from_args
from frame.cli.main import build_parser
from frame.config import build_config, load_yaml, resolve_plugin_options
from frame.errors import ConfigError


def test_flags_override_the_config_file(tmp_path: Path) -> None:
    path = tmp_path / "engine.yaml"
    path.write_text("cache: radix\nblock_size: 32\nmax_num_seqs: 8\ncache_options: {}\n")
    args = build_parser().parse_args(["generate", "--prompt", "x", "--config", str(path), "--block-size", "8"])
    config = config_from_args(args)
    assert (config.cache, config.block_size, config.max_num_seqs) == ("radix", 8, 8)


def test_unknown_key_names_the_key_and_a_close_match() -> None:
    with pytest.raises(ConfigError) as err:
        build_config({"blok_size": 16})
    assert str(err.value).startswith("Unknown config key 'blok_size'; did you mean 'block_size'? valid keys: model,")


def test_mistyped_value_names_the_key() -> None:
    with pytest.raises(ConfigError) as err:
        build_config({"max_num_seqs": "many"})
    assert str(err.value) == (
        "Invalid config value for 'max_num_seqs': Input should be a valid integer, unable to parse string as an "
        "integer."
    )


def test_out_of_range_value() -> None:
    with pytest.raises(ConfigError, match="Invalid config value for 'kv_cache_fraction'"):
        build_config(kv_cache_fraction=1.5)


def test_missing_config_file() -> None:
    with pytest.raises(ConfigError) as err:
        load_yaml("/nonexistent/engine.yaml")
    assert str(err.value) == (
        "Config file /nonexistent/engine.yaml does not exist; pass an existing YAML file to --config."
    )


def test_plugin_options_are_validated_against_the_plugins_model() -> None:
    from pydantic import BaseModel

    class Options(BaseModel, extra="forbid"):
        max_waiting: int = 4

    assert resolve_plugin_options("scheduler", "lpm", {"max_waiting": 7}, Options).max_waiting == 7
    with pytest.raises(ConfigError) as err:
        resolve_plugin_options("scheduler", "lpm", {"max_wait": 7}, Options)
    assert str(err.value) == (
        "Unknown scheduler 'lpm' option key 'max_wait'; did you mean 'max_waiting'? valid keys: max_waiting."
    )
    with pytest.raises(ConfigError) as err:
        resolve_plugin_options("cache", "none", {"x": 1}, None)
    assert str(err.value) == "The cache plugin 'none' takes no options, but got: x."


def test_key_value_flag_syntax() -> None:
    args = build_parser().parse_args(["generate", "--prompt", "x", "--sched-opt", "oops"])
    with pytest.raises(ConfigError, match="--sched-opt expects key=value, got 'oops'"):
        config_from_args(args)
