"""Derived-cache housekeeping: folders record their checkpoint file, and those whose file is gone or changed go."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from frame import derived_cache
from frame.cli.main import main
from frame.derived_cache import SOURCE_FILE, entries, record_and_sweep, sweep, why_stale
from frame.paths import gguf_cache_folder
from frame.weights import cache, open_weights

from tests.test_weights_cache import _write


@pytest.fixture
def root(cache_dir: Path) -> Path:
    return cache_dir


def _converted(path: Path, seed: int) -> Path:
    """Write a GGUF at ``path`` and read it once through the weights cache; its cache folder."""
    _write(path, seed)
    dict(open_weights(path).tensors())
    return gguf_cache_folder(path)


def test_a_converted_file_records_its_source(tmp_path: Path, root: Path) -> None:
    folder = _converted(tmp_path / "a.gguf", seed=1)
    record = json.loads((folder / SOURCE_FILE).read_text())
    assert record["path"] == str((tmp_path / "a.gguf").resolve())
    assert record["size"] == (tmp_path / "a.gguf").stat().st_size
    assert why_stale(folder) is None


def test_a_new_folder_sweeps_those_whose_file_is_gone_or_changed(tmp_path: Path, root: Path) -> None:
    gone = _converted(tmp_path / "gone.gguf", seed=1)
    changed = _converted(tmp_path / "changed.gguf", seed=2)
    kept = _converted(tmp_path / "kept.gguf", seed=3)
    (tmp_path / "gone.gguf").unlink()
    _write(tmp_path / "changed.gguf", seed=4)
    os.utime(tmp_path / "changed.gguf", ns=(1, 1))
    assert why_stale(gone) == "file gone" and why_stale(changed) == "file changed"
    fresh = _converted(tmp_path / "new.gguf", seed=5)
    assert not gone.exists() and not changed.exists()
    assert kept.is_dir() and fresh.is_dir()


def test_reading_a_cached_file_again_sweeps_nothing(tmp_path: Path, root: Path) -> None:
    folder = _converted(tmp_path / "a.gguf", seed=1)
    other = _converted(tmp_path / "b.gguf", seed=2)
    (tmp_path / "b.gguf").unlink()
    assert isinstance(open_weights(tmp_path / "a.gguf"), cache.CachedGGUFWeights)
    assert record_and_sweep(folder, tmp_path / "a.gguf") == []  # the folder is not new: no sweep
    assert other.is_dir()


def test_another_machines_folders_are_left_to_it(tmp_path: Path, root: Path) -> None:
    folder = _converted(tmp_path / "a.gguf", seed=1)
    record = json.loads((folder / SOURCE_FILE).read_text())
    (folder / SOURCE_FILE).write_text(json.dumps({**record, "host": "another-machine"}))
    (tmp_path / "a.gguf").unlink()
    assert why_stale(folder) is None and sweep(folder.parent) == []
    (folder / SOURCE_FILE).write_text(json.dumps(record))
    assert why_stale(folder) == "file gone"


def test_unrecorded_and_staging_folders_are_kept_until_they_age(root: Path) -> None:
    kind = root / "gguf"
    young, old = kind / "young", kind / "old"
    staging_young, staging_old = kind / ".staging-a", kind / ".staging-b"
    for folder in (young, old, staging_young, staging_old):
        folder.mkdir(parents=True)
    long_ago = time.time() - derived_cache.UNRECORDED_GRACE_S - 60
    os.utime(old, (long_ago, long_ago))
    os.utime(staging_old, (long_ago, long_ago))
    assert set(sweep(kind)) == {old, staging_old}
    assert young.is_dir() and staging_young.is_dir()


def test_an_export_made_by_another_transformers_is_stale(tmp_path: Path, root: Path) -> None:
    (tmp_path / "m.gguf").write_bytes(b"GGUF")
    folder = root / "hf-export" / "x"
    derived_cache.write_record(folder, tmp_path / "m.gguf", transformers="0.1")
    assert why_stale(folder, {"transformers": "0.1"}) is None
    assert why_stale(folder, {"transformers": "9.9"}) == "made with transformers 0.1"
    assert sweep(folder.parent, {"transformers": "9.9"}) == [folder]


def test_frame_cache_lists_prunes_and_clears(tmp_path: Path, root: Path, capsys: pytest.CaptureFixture,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "400")  # rich would fold the table's columns at 80
    live = _converted(tmp_path / "live.gguf", seed=1)
    stale = _converted(tmp_path / "stale.gguf", seed=2)
    (tmp_path / "stale.gguf").unlink()
    assert main(["cache"]) == 0
    out = capsys.readouterr().out
    assert live.name in out and stale.name in out and "file gone" in out and "frame cache --prune" in out
    assert "Also: kernels" not in out  # nothing built in this cache
    assert main(["cache", "--prune"]) == 0
    assert "removed 1 stale folder(s) and 0 kernel build(s)" in capsys.readouterr().out
    assert [e.folder for e in entries(root / "gguf")] == [live]
    assert main(["cache", "--clear"]) == 0
    assert not (root / "gguf").exists()


def test_kernel_builds_unused_for_a_month_go(root: Path) -> None:
    kernels = root / "kernels"
    used, unused, unmarked = kernels / "lib-1", kernels / "lib-2", kernels / "lib-3"
    for build in (used, unused, unmarked):
        build.mkdir(parents=True)
        derived_cache.mark_used(build)
    long_ago = time.time() - derived_cache.UNUSED_BUILD_S - 60
    os.utime(unused / derived_cache.USED_MARK, (long_ago, long_ago))
    (unmarked / derived_cache.USED_MARK).unlink()
    os.utime(unmarked, (long_ago, long_ago))
    assert set(derived_cache.sweep_unused_builds(kernels)) == {unused, unmarked}
    assert used.is_dir()

