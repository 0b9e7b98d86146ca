"""What of each request's block tables the step plan carries: the whole tables when the runner first sees the
request (or gets it back after a preemption), only the blocks added since otherwise; one table per KV group
(:mod:`frame.interfaces.kv_groups`), group 0's in the plan's ``block_ids`` fields, the others' beside them."""

from __future__ import annotations

from frame.interfaces.cache import KVCacheStrategy


def table_diff(cache: KVCacheStrategy, seq_id: str, held: list[int] | None,
               whole: bool) -> tuple[list[int], list[list[int]], list[int]]:
    """``(group 0's block ids, the other groups' block ids, each table's length)`` to send for ``seq_id``, whose
    tables the runner holds ``held`` entries of (None: none); ``whole`` sends whole tables (a resumed request)."""
    tables = [cache.block_table(seq_id, g) for g in range(cache.num_groups)]
    if held is None or whole:
        diffs = [list(table) for table in tables]
    else:
        diffs = [list(table[count:]) for table, count in zip(tables, held, strict=True)]
    return diffs[0], diffs[1:], [len(table) for table in tables]
