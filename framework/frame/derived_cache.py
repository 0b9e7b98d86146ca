"""Housekeeping for the folders frame derives from a checkpoint file: each records its file, and folders whose file
is gone or changed are removed when a new one is made.

The folders under ``$FRAME_CACHE_DIR/gguf`` (config, tokenizer, converted weights) and ``hf-export`` (a GGUF as a
Hugging Face folder) are keyed by the source file's resolved path, size and modification time, so once that file is
deleted, moved or rewritten its folder can never be read again. Left alone they pile up: each new virtual
environment is a new path for the bundled model, and each one left half a gigabyte of converted weights behind.
So every folder holds ``source.json`` (the file's path, size and modification time, and whatever else its key
covers), and making a new folder sweeps the others of its kind. ``frame cache`` lists them and prunes on demand.
The record names the machine too: a cache folder shared by several machines (a home directory on NFS under a Ray
cluster) holds files whose paths only their own machine can check, so each judges only its own folders.

Built kernels (``kernels/<name>-<digest>``, :mod:`frame.native`) have no source file to check: each load marks its
folder used, and a new build removes the builds of any library not loaded for a month (an older frame's, or a
``FRAME_CPU_DISABLE`` stand-in's).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

SOURCE_FILE = "source.json"
#: A folder without a record (made before records existed, or being filled this moment) is kept this long.
UNRECORDED_GRACE_S = 14 * 24 * 3600
#: A staging folder (a write in progress) older than this was left by a process that died.
STAGING_GRACE_S = 24 * 3600
#: A kernel build no process has loaded for this long is removed when another is built.
UNUSED_BUILD_S = 30 * 24 * 3600
USED_MARK = "last-used"
#: The kinds of derived folders, each a folder under the cache root.
KINDS = ("gguf", "hf-export")


def current_key(kind: str) -> dict[str, str]:
    """What else a folder of ``kind`` is keyed by today: an export holds transformers' own dequantisation."""
    if kind == "hf-export":
        try:
            return {"transformers": metadata.version("transformers")}
        except metadata.PackageNotFoundError:
            return {}
    return {}


def source_record(source: Path, **key: str) -> dict[str, object]:
    """What ``source.json`` holds for ``source``: its resolved path, size and modification time, plus ``key``
    (other things the folder's key covers, a library's version say)."""
    path = source.resolve()
    stat = path.stat()
    return {"path": str(path), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns, "host": socket.gethostname(), **key}


def write_record(folder: Path, source: Path, **key: str) -> bool:
    """Write ``folder/source.json`` for ``source`` unless it is there; True when it was written (a new folder)."""
    file = folder / SOURCE_FILE
    if file.is_file():
        return False
    folder.mkdir(parents=True, exist_ok=True)
    tmp = file.with_name(f".{SOURCE_FILE}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(source_record(source, **key)))
    os.replace(tmp, file)
    return True


def record_and_sweep(folder: Path, source: Path, **key: str) -> list[Path]:
    """Record ``source`` in ``folder``; when the folder is new, remove the stale folders beside it (returned)."""
    try:
        if not write_record(folder, source, **key):
            return []
        return sweep(folder.parent, current=key)
    except OSError:  # a read-only or full cache only costs disk space
        return []


@dataclass(frozen=True)
class Entry:
    """One derived folder: where it is, its size, the file it came from and why it is stale (None when live)."""

    folder: Path
    bytes: int
    source: str | None
    stale: str | None


def why_stale(folder: Path, current: Mapping[str, str] | None = None) -> str | None:
    """Why ``folder`` can never be read again (its file is gone, changed, or a keyed version moved on), or None."""
    try:
        record = json.loads((folder / SOURCE_FILE).read_text())
    except FileNotFoundError:
        age = time.time() - folder.stat().st_mtime
        return "unrecorded and unused for two weeks" if age > UNRECORDED_GRACE_S else None
    except (OSError, ValueError):
        return "unreadable record"
    if not isinstance(record, dict):
        return "unreadable record"
    if record.get("host", socket.gethostname()) != socket.gethostname():
        return None  # another machine's file: only that machine can tell whether it is still there
    try:
        stat = Path(record["path"]).stat()
    except FileNotFoundError:
        return "file gone"
    except (OSError, KeyError, TypeError):
        return "unreadable record"
    if stat.st_size != record.get("size") or stat.st_mtime_ns != record.get("mtime_ns"):
        return "file changed"
    for name, value in (current or {}).items():
        if name in record and record[name] != value:
            return f"made with {name} {record[name]}"
    return None


def folder_bytes(folder: Path) -> int:
    """The bytes of every file under ``folder``."""
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())


def _folders(root: Path) -> Iterator[Path]:
    """The derived folders directly under ``root``, staging folders (a write in progress) left out."""
    if root.is_dir():
        yield from (f for f in sorted(root.iterdir()) if f.is_dir() and not f.name.startswith("."))


def entries(root: Path, current: Mapping[str, str] | None = None) -> Iterator[Entry]:
    """The derived folders of one kind (``root``), with their sizes, files and staleness."""
    for folder in _folders(root):
        try:
            source = json.loads((folder / SOURCE_FILE).read_text()).get("path")
        except (OSError, ValueError, AttributeError):
            source = None
        yield Entry(folder, folder_bytes(folder), source, why_stale(folder, current))


def sweep(root: Path, current: Mapping[str, str] | None = None) -> list[Path]:
    """Remove the stale folders of one kind (``root``) and staging folders a dead process left; the folders removed."""
    removed = [folder for folder in _folders(root) if why_stale(folder, current)]
    if root.is_dir():
        now = time.time()
        removed += [f for f in root.glob(".staging-*") if f.is_dir() and now - f.stat().st_mtime > STAGING_GRACE_S]
    for folder in removed:
        shutil.rmtree(folder, ignore_errors=True)
    return removed


def mark_used(build: Path) -> None:
    """Note that a kernel build was loaded now (its ``last-used`` file's time)."""
    with contextlib.suppress(OSError):  # a read-only cache: its builds are never swept
        (build / USED_MARK).touch()


def sweep_unused_builds(root: Path) -> list[Path]:
    """Remove the kernel builds under ``root`` not loaded for :data:`UNUSED_BUILD_S`; the folders removed."""
    now = time.time()
    removed = []
    for build in _folders(root):
        mark = build / USED_MARK
        try:
            used = (mark if mark.exists() else build).stat().st_mtime
        except OSError:
            continue
        if now - used > UNUSED_BUILD_S:
            shutil.rmtree(build, ignore_errors=True)
            removed.append(build)
    return removed
