"""A model's chat template rendered once, in a child process, under a time and memory budget.

Where it sits: at start-up, after the tokenizer loads and before any prompt is rendered (train and
resume in run/setup.py, eval per model). A chat template is Jinja code shipped in the model's
folder: the sandbox keeps it from running Python, but nested loops or huge string products can
still hang or exhaust the process, and every training question is rendered with it. So it is
rendered first with a sample question in a forked child that is killed after TIME_S and limited
to MEMORY_BYTES above what the parent maps; a template that cannot, or renders more than
MAX_CHARS, is refused with one line before anything else is built.
"""

from __future__ import annotations

import os
import resource
import select
import signal
import time
from typing import TYPE_CHECKING, Any

from exgrpo_cli.data.types import Question
from exgrpo_cli.errors import UsageError
from exgrpo_cli.host import SELF_STATUS, proc_bytes

if TYPE_CHECKING:
    from exgrpo_cli.data.templates import Template

TIME_S = 10.0
MEMORY_BYTES = 2 * 2**30
MAX_CHARS = 1 << 20
_SAMPLE = Question(uid="template-check", question="What is 12 + 30?", answer="42")


class TemplateRefused(UsageError):
    """The model's chat template does not render within its budget."""


def _child(template: Template, tokenizer: Any, write_fd: int) -> None:
    vm = proc_bytes(SELF_STATUS, "VmSize")
    if vm:
        resource.setrlimit(resource.RLIMIT_AS, (vm + MEMORY_BYTES, vm + MEMORY_BYTES))
    try:
        text = template.render(_SAMPLE, tokenizer)
        msg = b"ok" if len(text) <= MAX_CHARS else f"renders {len(text)} characters".encode()
    except MemoryError:
        msg = f"needs more than {MEMORY_BYTES >> 30} GiB".encode()
    except BaseException as err:  # noqa: BLE001 - the parent reports it in one line
        msg = f"fails ({type(err).__name__}: {str(err)[:200]})".encode()
    os.write(write_fd, msg[:400])


def check_template(template: Template, tokenizer: Any, where: str) -> None:
    """Raise TemplateRefused when `tokenizer`'s chat template (as `template` uses it) does not
    render a sample question within TIME_S, MEMORY_BYTES and MAX_CHARS. No-op for plain templates."""
    if not template.chat:
        return
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: render, report, exit without running any of the parent's cleanup
        os.close(read_fd)
        try:
            _child(template, tokenizer, write_fd)
        finally:
            os._exit(0)
    os.close(write_fd)
    try:
        ready, _, _ = select.select([read_fd], [], [], TIME_S)
        msg = os.read(read_fd, 400).decode("utf-8", "replace") if ready else ""
    finally:
        os.close(read_fd)
        if not ready:
            os.kill(pid, signal.SIGKILL)
        _reap(pid)
    if not ready:
        msg = f"does not render within {TIME_S:.0f} s"
    elif not msg:
        msg = "killed the process that rendered it (out of memory)"
    if msg != "ok":
        raise TemplateRefused(f"the chat template of {where} {msg}; it was not used")


def _reap(pid: int) -> None:
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done:
            return
        time.sleep(0.01)
