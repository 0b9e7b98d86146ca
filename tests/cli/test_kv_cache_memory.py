"""``--kv-cache-memory`` (config key ``kv_cache_memory``): a byte size that sets the KV pool's size, printed at start;
a bad value or one too small for a sequence is one sentence naming the fix (exit 2)."""

from __future__ import annotations

import re

import pytest
from frame.cli.main import main
from frame.config import build_config
from frame_platform_cpu import probe
from frame_platform_cpu.platform import KV_SHARE_OF_AVAILABLE, CpuPlatform

# SmolLM2 with a bfloat16 pool: 30 layers x 3 KV heads x (K, V) x 64 dims x 2 bytes, 16 tokens a block.
BYTES_PER_BLOCK = 30 * 3 * 2 * 64 * 2 * 16
ARGS = ["generate", "--prompt", "Hi", "--max-tokens", "2", "--max-model-len", "256", "--kv-cache-dtype", "bfloat16"]


def _pool_line(err: str) -> re.Match[str]:
    found = re.search(r"KV pool: ([\d.]+)MiB, (\d+) tokens \((\d+) blocks\)", err)
    assert found is not None, err
    return found


@pytest.mark.parametrize("size", ["8MiB", "8388608", "8 mib"])
def test_the_flag_sizes_the_pool_and_it_is_printed_at_start(size: str, capsys) -> None:
    assert main([*ARGS, "--kv-cache-memory", size, "-v"]) == 0
    found = _pool_line(capsys.readouterr().err)
    blocks = (8 << 20) // BYTES_PER_BLOCK
    assert int(found.group(3)) == blocks and int(found.group(2)) == blocks * 16
    assert float(found.group(1)) == pytest.approx(blocks * BYTES_PER_BLOCK / (1 << 20), abs=0.05)


def test_the_config_key_does_the_same(tmp_path, capsys) -> None:
    config = tmp_path / "engine.yaml"
    config.write_text("kv_cache_memory: 6MB\n")
    assert main([*ARGS, "--config", str(config), "-v"]) == 0
    assert int(_pool_line(capsys.readouterr().err).group(3)) == 6_000_000 // BYTES_PER_BLOCK


@pytest.mark.parametrize("size", ["2 gigs", "0", "-1GiB"])
def test_a_value_that_is_no_byte_size_is_one_sentence(size: str, capsys) -> None:
    assert main([*ARGS, f"--kv-cache-memory={size}"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"error: Invalid config value for 'kv_cache_memory': {size!r} is not a byte size above 0; give one such as "
        "2GiB, 512MB or 1073741824."]


def test_a_pool_too_small_for_one_sequence_names_the_size_that_fits(capsys) -> None:
    assert main([*ARGS, "--kv-cache-memory", "1MiB"]) == 2
    # 256 tokens need 16 blocks of 368,640 bytes: 5.625 MiB.
    assert capsys.readouterr().err.splitlines() == [
        "error: The KV pool holds 2 blocks of 16 tokens (0.8MiB), fewer than one sequence of max_model_len 256 "
        "needs (16); raise --kv-cache-memory to at least 5.7MiB or lower max_model_len."]


def test_the_config_parses_byte_sizes_and_num_kv_blocks_still_wins(capsys) -> None:
    assert build_config(kv_cache_memory="512MB").kv_cache_memory == 512_000_000
    assert build_config(kv_cache_memory="2GiB").kv_cache_memory == 2 << 30
    assert build_config().kv_cache_memory is None
    assert main([*ARGS, "--kv-cache-memory", "8MiB", "--num-kv-blocks", "17", "-v"]) == 0
    assert int(_pool_line(capsys.readouterr().err).group(3)) == 17


def test_the_cpu_default_is_a_share_of_the_memory_available() -> None:
    budget = CpuPlatform().kv_cache_budget_bytes(0.9, 0)
    # Available memory moves with the other processes on the machine: compare with a fresh reading, loosely.
    assert 0 < budget <= KV_SHARE_OF_AVAILABLE * probe.total_memory_bytes()
    assert budget == pytest.approx(KV_SHARE_OF_AVAILABLE * probe.available_memory_bytes(), rel=0.2)


@pytest.mark.parametrize("where", ["flag", "config"])
def test_the_old_cpu_option_kv_cache_gib_points_to_the_flag(where: str, tmp_path, capsys) -> None:
    if where == "flag":
        given = ["--platform-opt", "kv_cache_gib=4"]
    else:
        config = tmp_path / "engine.yaml"
        config.write_text("platform: cpu\nplatform_options: {kv_cache_gib: 4}\n")
        given = ["--config", str(config)]
    assert main([*ARGS, *given]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "error: The platform 'cpu' option 'kv_cache_gib' was replaced by --kv-cache-memory (config key "
        "kv_cache_memory, a byte size such as 4GiB); set that instead and drop 'kv_cache_gib'."]
