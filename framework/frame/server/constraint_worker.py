"""The constraint worker: ``python -m frame.server.constraint_worker`` compiles constraints for the API server.

A constraint can take seconds or minutes to compile (a long choice string, a deep schema), and a thread compiling
one cannot be stopped. So the API server checks constraints here, in a child process at a lower priority (nice 10)
that it kills when a compile passes ``--grammar-compile-timeout`` of CPU time
(:class:`~frame.server.constraints.ConstraintChecker`), and starts another. The worker builds the same grammar backend
as the engine (from :class:`~frame.engine.wire.constraint.CheckInit`), compiles each
:class:`~frame.engine.wire.constraint.Check` and keeps nothing: the answer says only whether it compiled, so no
compiled grammar (tens of megabytes for a 20,000-branch regex) crosses a process, and the API process itself never
loads the backend (xgrammar imports torch).

Frames of the one codec on stdin and stdout (no pickle); anything a library prints goes to stderr.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Callable

from frame.engine.process import serve_piped
from frame.engine.wire.constraint import Check, Checked, CheckInit, ToConstraintWorker
from frame.engine.wire.render import Ready
from frame.errors import InvalidSamplingError
from frame.interfaces.grammar import GrammarBackend

log = logging.getLogger("frame.server")


def build_backend(init: CheckInit) -> GrammarBackend:
    """The grammar backend the engine config names, for its model's tokenizer."""
    from frame.config import EngineConfig, resolve_plugin_options
    from frame.model_source import ModelSource
    from frame.plugins.hooks import PluginHooks
    from frame.plugins.registry import PluginRegistry

    config = EngineConfig.model_validate_json(init.config_json)
    tokenizer = ModelSource.open(config.model, config.tokenizer, config.trust_remote_code).tokenizer
    hooks = PluginHooks(PluginRegistry())
    name = config.grammar_backend
    hooks.registry.load("grammar", name)
    options = resolve_plugin_options("grammar", name, config.grammar_options, hooks.options_model("grammar", name))
    return hooks.create_grammar_backend(name, tokenizer, init.vocab_size, init.stop_token_ids, options)


def check(backend: GrammarBackend, job: Check) -> Checked:
    """Compile one constraint; a refusal is the backend's sentence, any other failure one naming the backend."""
    started = time.perf_counter()
    try:
        backend.compile(job.spec)
    except InvalidSamplingError as err:
        return Checked(time.perf_counter() - started, err.message, err.param)
    except Exception as err:  # a backend bug on odd input: the request's 400, logged here with its traceback
        log.exception("the grammar backend failed on a constraint")
        field = f"structured_outputs.{job.spec.kind}"
        return Checked(time.perf_counter() - started, f"{field} could not be compiled by the grammar backend "
                       f"({type(err).__name__}); send a simpler constraint.", field)
    return Checked(time.perf_counter() - started)


def main(argv: list[str] | None = None) -> int:
    def start(init: CheckInit | Check) -> tuple[Ready, Callable[[CheckInit | Check], Checked | None]]:
        if not isinstance(init, CheckInit):
            raise SystemExit("constraint worker: the first message must be check_init")
        backend = build_backend(init)
        return Ready(), lambda job: check(backend, job) if isinstance(job, Check) else None

    # A costly compile yields the cores to the engine and the API server: at the same priority it stalled every
    # decode step (the engine's threads wait for each other), and valid requests' p99 rose 13x during a soak.
    # The time limit counts this process's CPU seconds, so a compile slowed by a busy engine is not refused for it.
    os.nice(10)
    return serve_piped("frame-constraint-worker", argv, ToConstraintWorker, start)


if __name__ == "__main__":
    sys.exit(main())
