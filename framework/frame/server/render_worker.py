"""The chat-template worker: ``python -m frame.server.render_worker`` renders conversations for the API server.

A Jinja template is a small program: two nested loops or ``'x' * 10**9`` cost seconds or gigabytes, and a thread
running one cannot be stopped. So templates render here, in a child process the server can kill when a render
passes its time limit (:class:`~frame.server.render_pool.RenderPool`), with its address space capped so a huge
string fails with MemoryError instead of growing the host's memory. The worker holds no tokenizer: the server
sends the model's template and special tokens once (:class:`Init`), then one :class:`Render` per conversation;
the rendered text goes back and the server tokenises it.

The messages are :mod:`frame.engine.wire.render`'s, as length-prefixed frames of the one codec on stdin and
stdout (no pickle). Anything a library prints goes to stderr, never into the frames.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

from frame.engine.process import serve_piped
from frame.engine.wire.render import Init, Ready, Refused, Render, Rendered, ToRenderWorker

#: Longest error message sent back (a template error may quote its whole input).
MAX_MESSAGE_CHARS = 300


def _cap_memory(extra_bytes: int) -> None:
    """Let this process grow by at most ``extra_bytes`` of address space beyond what it has now (Linux)."""
    try:
        with open("/proc/self/status") as f:
            size_kb = next(int(line.split()[1]) for line in f if line.startswith("VmSize:"))
    except (OSError, StopIteration):
        return
    import resource  # POSIX only; /proc above already made this Linux

    limit = size_kb * 1024 + extra_bytes
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))


def _short(err: BaseException) -> str:
    text = str(err) or type(err).__name__
    return text if len(text) <= MAX_MESSAGE_CHARS else text[:MAX_MESSAGE_CHARS] + "..."


def render(init: Init, job: Render) -> Rendered | Refused:
    """Render one conversation; every failure becomes a Refused with one sentence."""
    from transformers.utils.chat_template_utils import render_jinja_template

    template = job.template if job.template is not None else init.template
    if template is None:
        return Refused("This model has no chat template; use /v1/completions.", "no_chat_template")
    try:
        rendered, _ = render_jinja_template(conversations=[job.messages], chat_template=template,
                                            add_generation_prompt=job.add_generation_prompt,
                                            **{**init.variables, **job.variables})
    except MemoryError:
        return Refused(f"The chat template needed more than this server's {init.memory_bytes >> 20} MiB to render; "
                       "send a shorter conversation.", "template_too_large")
    except Exception as err:  # jinja raises for conversations a template refuses (raise_exception, bad syntax)
        return Refused(f"The chat template refused these messages: {_short(err)}.", "template_error")
    text = rendered[0]
    if len(text) > job.max_chars:
        return Refused(f"The chat template rendered {len(text)} characters, over this server's limit of "
                       f"{job.max_chars} (--max-prompt-chars); send a shorter conversation.", "template_too_large")
    return Rendered(text)


def main(argv: list[str] | None = None) -> int:
    def start(init: Init | Render) -> tuple[Ready, Callable[[Init | Render], Rendered | Refused | None]]:
        if not isinstance(init, Init):
            raise SystemExit("render worker: the first message must be init")
        import transformers.utils.chat_template_utils  # noqa: F401 - loaded before the cap, so the cap is all headroom

        _cap_memory(init.memory_bytes)
        return Ready(), lambda job: render(init, job) if isinstance(job, Render) else None

    # A request's own template can run to --tokenize-timeout; at the engine's priority it takes a core from the
    # engine's compute threads, which wait for each other at every step (valid requests' p99 rose 10x in the soak).
    # The model's own template renders in milliseconds, which a lower priority stretches little.
    os.nice(10)
    return serve_piped("frame-render-worker", argv, ToRenderWorker, start)


if __name__ == "__main__":
    sys.exit(main())
