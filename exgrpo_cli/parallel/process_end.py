"""How a process that joined a process group ends: its Python exit handlers run, then C's
`exit(code)`, which runs the C and C++ exit handlers; the interpreter's own teardown never runs.

Where it sits: around the whole work of a rank, outside the train step: the CLI's command
(cli/main.py, which covers torchrun's ranks), each rank `trainer.nproc` starts (run/launch.py),
and the tests' worker scripts.

Why: gloo runs every collective on two worker threads of its own, and such a thread lets go of
the collective's tensors (Python objects: it takes the GIL for that) only after the rank has
already been told the collective is done. If the rank's interpreter is tearing down by then, the
thread's attempt to take the GIL ends it inside C++ code that may not be unwound, and the whole
process aborts ("terminate called without an active exception", SIGABRT, exit -6), after every
line of the run has succeeded; torchrun then reports the rank as failed. `destroy_process_group`
prevents it only when it can free the group, which joins the threads: once FSDP2 has wrapped a
model, DTensor's sharding caches keep the group's device mesh alive and the threads with it
(measured with torch 2.13 on gloo: four threads before and after destroy_process_group). A
two-rank gloo script of three lines that all-reduces once and returns aborted in 4 of 20 runs
here, and in 0 of 20 when it called destroy_process_group (no FSDP2); CI saw two test workers
abort that way. Skipping the teardown is the only end without a race: exit handlers (atexit,
wandb's among them) run before it while the interpreter is whole, and the rank's own code has
closed its logger, engine, reward workers and process group before it returns.

Why C's `exit` and not `os._exit`: libraries free what outlives the process in their C++ exit
handlers. vLLM's CPU tensor-parallel groups unlink their shared-memory segments (named after the
group, `/dev/shm/-tp:0-[0-1]-cpushm_<rank>`) there; after `os._exit` they stayed, and the next
run's engines failed to create them (errno 17, EEXIST), as CI saw. `exit` is called through
ctypes.PyDLL, which keeps the GIL held: a destructor that touches Python objects finds it taken
(through CDLL, which lets it go, the process died with "PyThreadState_Get: the function must be
called with the GIL held"), and a gloo thread that asks for it waits until the process is gone.
"""

from __future__ import annotations

import atexit
import logging
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

T = TypeVar("T")

_state = {"group_opened": False}


def note_group_opened() -> None:
    """Called by `init_distributed` once it has created a process group in this process."""
    _state["group_opened"] = True


def group_opened() -> bool:
    """True once this process has had a process group (ours, or one a caller created itself)."""
    if _state["group_opened"]:
        return True
    tdist = sys.modules.get("torch.distributed")  # not imported: no group (and no torch to load)
    return tdist is not None and tdist.is_available() and tdist.is_initialized()


def exit_code(stop: SystemExit) -> int:
    """The exit code Python gives a `SystemExit`: None is 0, a number itself, anything else
    (a message, which Python prints) 1."""
    if stop.code is None:
        return 0
    return stop.code if isinstance(stop.code, int) else 1


@contextmanager
def ends_without_teardown() -> Iterator[None]:
    """Around the whole work of a process: if a process group was opened inside, the process
    ends with the block's exit code (0, a SystemExit's, 1 for any other exception) through C's
    `exit`, once the Python exit handlers have run. A traceback is still printed first, by Python
    or by torch's launcher. Without a process group nothing changes."""
    try:
        yield
    except SystemExit as stop:
        _end_at_exit(exit_code(stop))
        raise
    except BaseException:
        _end_at_exit(1)
        raise
    else:
        _end_at_exit(0)


def call_then_end(fn: Callable[..., T], *args: Any) -> T:
    """`fn(*args)` inside `ends_without_teardown`: the entry of a rank that torch's launcher
    starts in a fresh process (it must be a module-level function there)."""
    with ends_without_teardown():
        return fn(*args)


def _end_at_exit(code: int) -> None:
    if group_opened():
        atexit.register(_end, code)  # the last one registered: the first one run


def _end(code: int) -> None:
    """The other exit handlers (registered before this one: logging's, wandb's, multiprocessing's)
    while the interpreter is whole, then out without its teardown."""
    atexit.unregister(_end)
    try:
        atexit._run_exitfuncs()
    finally:
        logging.shutdown()
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):  # a closed or broken pipe: nothing left to say
                pass
        _exit_without_finalizing(code)


def _exit_without_finalizing(code: int) -> None:
    """C's exit(code) with the GIL held (the module docstring says why not os._exit)."""
    import ctypes

    ctypes.PyDLL(None).exit(code)
    os._exit(code)  # not reached: exit does not return
