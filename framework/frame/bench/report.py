"""Experiment results: JSON lines, a markdown table, PNG plots and a rich table on the terminal."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.table import Table

#: (row key, column title, format) of the experiment tables.
TABLE_COLUMNS = [
    ("output_tok_s", "out tok/s", "{:.1f}"),
    ("total_tok_s", "total tok/s", "{:.0f}"),
    ("ttft_p50_ms", "TTFT p50 ms", "{:.0f}"),
    ("ttft_p99_ms", "TTFT p99 ms", "{:.0f}"),
    ("prefix_hit_rate", "hit rate", "{:.1%}"),
    ("prompt_tokens_computed", "prefill computed", "{:d}"),
    ("prompt_tokens", "prompt tokens", "{:d}"),
    ("peak_blocks_in_use", "peak blocks", "{:d}"),
    ("evictions", "evictions", "{:d}"),
    ("preemptions", "preemptions", "{:d}"),
    ("spec_acceptance", "drafts kept", "{:.1%}"),
    ("routed", "routed per rank", "{}"),
]

#: (row key, axis label) of the plots, one PNG each.
PLOTS = [
    ("output_tok_s", "output tokens/s (higher is better)"),
    ("ttft_p50_ms", "TTFT p50, ms (lower is better)"),
    ("prefix_hit_rate", "prefix hit rate (prompt tokens reused / prompt tokens)"),
    ("prompt_tokens_computed", "prefill tokens computed (lower is better)"),
]


def _cell(row: dict[str, Any], key: str, fmt: str) -> str:
    value = row.get(key)
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    if isinstance(value, list):  # one number per data-parallel rank
        return " / ".join(str(v) for v in value)
    return fmt.format(int(value) if fmt == "{:d}" else value)


def write_jsonl(rows: Sequence[dict[str, Any]], path: Path) -> None:
    path.write_text("".join(json.dumps({k: v for k, v in r.items() if k != "traceback"}) + "\n" for r in rows))


def markdown_table(rows: Sequence[dict[str, Any]]) -> str:
    head = ["workload", "cell", *(title for _k, title, _f in TABLE_COLUMNS), "error"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [r["workload"], r["label"], *(_cell(r, k, f) for k, _t, f in TABLE_COLUMNS), r["error"] or ""]
        lines.append("| " + " | ".join(str(c).replace("|", "\\|") for c in cells) + " |")
    return "\n".join(lines) + "\n"


#: The columns the terminal table leaves out to fit (they are in the markdown and JSON lines).
_TERMINAL_SKIP = {"total_tok_s", "prompt_tokens", "routed"}


def rich_table(rows: Sequence[dict[str, Any]], title: str) -> Table:
    """The terminal table; a failed cell shows ``failed`` here and its error below the table."""
    table = Table(title=title)
    table.add_column("workload", no_wrap=True)
    table.add_column("cell", no_wrap=True)
    columns = [c for c in TABLE_COLUMNS if c[0] not in _TERMINAL_SKIP]
    for _k, col_title, _f in columns:
        table.add_column(col_title, justify="right")
    for r in rows:
        values = [_cell(r, k, f) for k, _t, f in columns] if not r["error"] else ["[red]failed"] + [""] * (
            len(columns) - 1)
        table.add_row(r["workload"], r["label"], *values)
    return table


def failures(rows: Sequence[dict[str, Any]]) -> list[str]:
    """One line per failed cell: which cell, and its error."""
    return [f"{r['workload']} [{r['label']}]: {r['error']}" for r in rows if r["error"]]


def plot(rows: Sequence[dict[str, Any]], out_dir: Path, title: str) -> list[Path]:
    """Grouped bar charts (x: workload, bars: cell) of each metric in :data:`PLOTS`; returns the PNG paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [r for r in rows if not r["error"]]
    workloads = list(dict.fromkeys(r["workload"] for r in ok))
    labels = list(dict.fromkeys(r["label"] for r in ok))
    by_key = {(r["workload"], r["label"]): r for r in ok}
    width = 0.8 / max(1, len(labels))
    paths = []
    for key, axis in PLOTS:
        fig, ax = plt.subplots(figsize=(max(6.0, 1.6 * len(workloads) + 2), 3.6), dpi=80)
        for i, label in enumerate(labels):
            values = [by_key.get((w, label), {}).get(key, math.nan) for w in workloads]
            ax.bar([x + i * width for x in range(len(workloads))], values, width, label=label)
        ax.set_xticks([x + width * (len(labels) - 1) / 2 for x in range(len(workloads))], workloads)
        ax.set_ylabel(axis, fontsize=8)
        ax.set_title(f"{title}: {key}", fontsize=9)
        ax.legend(fontsize=6, ncol=2)
        fig.tight_layout()
        path = out_dir / f"{key}.png"
        fig.savefig(path)
        plt.close(fig)
        paths.append(path)
    return paths


def write_all(rows: Sequence[dict[str, Any]], out_dir: Path, title: str) -> dict[str, Path]:
    """Write ``results.jsonl``, ``results.md`` and the plots into ``out_dir``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    write_jsonl(rows, out_dir / "results.jsonl")
    (out_dir / "results.md").write_text(f"# {title}\n\n{markdown_table(rows)}")
    paths = {"jsonl": out_dir / "results.jsonl", "markdown": out_dir / "results.md"}
    paths.update({p.stem: p for p in plot(rows, out_dir, title)})
    return paths
