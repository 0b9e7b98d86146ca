"""Template of the data-parallel router kind: a complete router that sends each request to the live engine core
holding the fewest requests, so the skeleton passes the router conformance suite as written."""

from __future__ import annotations

from frame.plugin_templates.kind import KindTemplate

ROUTER = KindTemplate(
    module="router",
    plugin='''"""The {name} router plugin: its hooks."""

from __future__ import annotations

from frame import hookimpl
from frame.interfaces.router import Router
from pydantic import BaseModel

from {package}.router import {class_name}

FRAME_API_VERSION = {api_version}


@hookimpl
def frame_router_create(num_ranks: int, block_size: int, options: BaseModel | None) -> Router:
    """A {class_name} over ``num_ranks`` engine cores."""
    return {class_name}(num_ranks)
''',
    implementation='''"""{class_name}: the {name} data-parallel router."""

from __future__ import annotations

from collections.abc import Sequence

from frame.interfaces.router import RankLoad, Router, RouteRequest


class {class_name}(Router):
    """Sends each request to the live core holding the fewest requests, ties in turn; change the policy here
    (set ``uses_prefix_digests = True`` to read ``request.block_digests``, the prompt's leading block digests)."""

    def __init__(self, num_ranks: int) -> None:
        super().__init__(num_ranks)
        self.last = -1

    def route(self, request: RouteRequest, ranks: Sequence[RankLoad]) -> int:
        fewest = min(load.num_requests for load in ranks)
        tied = [load.rank for load in ranks if load.num_requests == fewest]
        self.last = next((rank for rank in tied if rank > self.last), tied[0])
        return self.last

    def rank_reset(self, rank: int) -> None:
        """Nothing is remembered per core here; a router that remembers prefixes forgets ``rank``'s now."""
''',
    tests='''"""frame's router conformance suite, run against this router and through its hooks."""

import pytest
from frame.testing.router import RouterConformance

from {package} import plugin
from {package}.router import {class_name}


class Test{class_name}(RouterConformance):
    plugin_module = plugin
    plugin_name = "{name}"

    @pytest.fixture
    def make_router(self):
        return {class_name}
''',
    test_requires=(),
    select="`frame serve --data-parallel-size 2 --router {name}`, `router: {name}` in a config file, or "
           "`LLM(router=\"{name}\")` with `data_parallel_size` of 2 or more.",
    runs="In the API server (or the offline `LLM`'s process), once per request, before the request reaches an "
         "engine core: keep it to bookkeeping (no torch), microseconds per call.",
)
