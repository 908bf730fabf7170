"""A pickle read as a tree of plain values, without pickle's machinery: nothing is imported, called
or mutated.

Where it sits: under checkpoint/metadata_guard.py, at resume and in `checkpoint.verify`, before the
optimizer state is loaded. torch.distributed.checkpoint keeps the index of a sharded state as a
pickle. Rather than hand pickle an allow-list (whose classes pickle's BUILD opcode could still
mutate), this module decodes the opcode stream (`pickletools.genops`, a pure decoder) and runs a
small stack machine of its own over it: a global becomes a `Global(module, name)` token, REDUCE and
NEWOBJ a `Call(func, args)` node, BUILD fills a fresh `Call` node's `state` once. The caller then
builds the real objects from the tree, checking each value (metadata_guard.py).

Bounded: the byte size (the caller's cap), the number of opcodes, the wall time; dict keys may only
be strings, ints or `Call` nodes (a tuple key of shared sub-tuples hashes in exponential time);
every failure is a `PickleRefused` with a short message.
"""

from __future__ import annotations

import io
import pickletools
import time
from dataclasses import dataclass, field
from typing import Any

MAX_OPS = 8_000_000
MAX_SECONDS = 30.0
_MARK = object()


class PickleRefused(ValueError):
    """The stream is not a pickle this reader accepts (the message is short and holds no raw bytes)."""


@dataclass(frozen=True)
class Global:
    module: str
    name: str


@dataclass(eq=False)
class Call:
    """`func(*args)` as written in the file, never performed; `state` is what BUILD gave it."""

    func: Any
    args: tuple[Any, ...]
    state: Any = None
    built: bool = field(default=False)


def short(value: Any, limit: int = 60) -> str:
    """A bounded description of a value for messages (never a deep repr)."""
    if isinstance(value, (str, int, float, bool)) or value is None:
        text = repr(value)
        return text if len(text) <= limit else text[: limit - 3] + "..."
    if isinstance(value, Global):
        return short(f"{value.module}.{value.name}", limit)
    if isinstance(value, Call):
        return f"a call of {short(value.func, limit)}"
    return f"a {type(value).__name__}"


_STRING_OPS = {
    "SHORT_BINUNICODE", "BINUNICODE", "BINUNICODE8", "UNICODE", "STRING", "BINSTRING",
    "SHORT_BINSTRING",
}  # fmt: skip
_VALUE_OPS = _STRING_OPS | {"INT", "BININT", "BININT1", "BININT2", "LONG", "LONG1", "LONG4"}
_VALUE_OPS |= {"BINFLOAT", "FLOAT", "BINBYTES", "SHORT_BINBYTES", "BINBYTES8"}
_CONSTANTS = {"NONE": None, "NEWTRUE": True, "NEWFALSE": False}
_TUPLE_N = {"EMPTY_TUPLE": 0, "TUPLE1": 1, "TUPLE2": 2, "TUPLE3": 3}


def _key(k: Any) -> Any:
    if isinstance(k, bool) or not isinstance(k, (str, int, Call)):
        raise PickleRefused(f"a mapping key is {short(k)}, not a string, an int or an object")
    return k


class _Machine:
    def __init__(self) -> None:
        self.stack: list[Any] = []
        self.memo: dict[int, Any] = {}

    def pop_mark(self) -> list[Any]:
        for i in range(len(self.stack) - 1, -1, -1):
            if self.stack[i] is _MARK:
                items = self.stack[i + 1 :]
                del self.stack[i:]
                return items
        raise PickleRefused("an opcode wants a MARK that is not there")

    def pop(self) -> Any:
        if not self.stack or self.stack[-1] is _MARK:
            raise PickleRefused("an opcode pops from an empty stack")
        return self.stack.pop()

    def top(self, kind: type) -> Any:
        if not self.stack or not isinstance(self.stack[-1], kind):
            raise PickleRefused(f"an opcode needs a {kind.__name__} on the stack")
        return self.stack[-1]

    def step(self, name: str, arg: Any) -> None:  # noqa: C901 - one branch per opcode, flat
        s = self.stack
        if name in _VALUE_OPS:
            s.append(arg)
        elif name in _CONSTANTS:
            s.append(_CONSTANTS[name])
        elif name in _TUPLE_N:
            n = _TUPLE_N[name]
            items = [self.pop() for _ in range(n)][::-1]
            s.append(tuple(items))
        elif name == "TUPLE":
            s.append(tuple(self.pop_mark()))
        elif name == "MARK":
            s.append(_MARK)
        elif name == "EMPTY_LIST":
            s.append([])
        elif name == "LIST":
            s.append(self.pop_mark())
        elif name == "APPEND":
            item = self.pop()
            self.top(list).append(item)
        elif name == "APPENDS":
            items = self.pop_mark()
            self.top(list).extend(items)
        elif name == "EMPTY_DICT":
            s.append({})
        elif name in ("DICT", "SETITEMS"):
            items = self.pop_mark()
            if len(items) % 2:
                raise PickleRefused("a mapping has a key without a value")
            target = {} if name == "DICT" else self.top(dict)
            for k, v in zip(items[::2], items[1::2]):
                target[_key(k)] = v
            if name == "DICT":
                s.append(target)
        elif name == "SETITEM":
            v, k = self.pop(), self.pop()
            self.top(dict)[_key(k)] = v
        elif name in ("MEMOIZE", "PUT", "BINPUT", "LONG_BINPUT"):
            if not s or s[-1] is _MARK:
                raise PickleRefused("a memo entry of nothing")
            self.memo[len(self.memo) if name == "MEMOIZE" else int(arg)] = s[-1]
        elif name in ("GET", "BINGET", "LONG_BINGET"):
            if int(arg) not in self.memo:
                raise PickleRefused(f"a memo reference to nothing ({short(arg)})")
            s.append(self.memo[int(arg)])
        elif name in ("GLOBAL", "STACK_GLOBAL"):
            if name == "GLOBAL":
                module, _, attr = str(arg).partition(" ")
            else:
                attr, module = self.pop(), self.pop()
            if not isinstance(module, str) or not isinstance(attr, str):
                raise PickleRefused("a global named by something other than strings")
            s.append(Global(module, attr))
        elif name in ("REDUCE", "NEWOBJ"):
            args, func = self.pop(), self.pop()
            if not isinstance(args, tuple):
                raise PickleRefused("a call whose arguments are not a tuple")
            s.append(Call(func, args))
        elif name == "BUILD":
            state = self.pop()
            node = self.top(Call)
            if node.built:  # BUILD only fills a fresh object, once
                raise PickleRefused("an object is built twice")
            node.state, node.built = state, True
        elif name == "POP":
            self.pop() if s and s[-1] is not _MARK else self.pop_mark()
        elif name == "POP_MARK":
            self.pop_mark()
        elif name == "DUP":
            s.append(self.pop())
            s.append(s[-1])
        elif name not in ("PROTO", "FRAME", "STOP"):
            raise PickleRefused(f"it uses the {name} opcode, which checkpoint metadata never does")


def parse(data: bytes, max_ops: int = MAX_OPS, max_seconds: float = MAX_SECONDS) -> Any:
    """The tree of plain values, `Global` and `Call` nodes the pickle `data` describes. Raises
    PickleRefused for anything else, whatever went wrong (decoding included)."""
    machine, deadline = _Machine(), time.monotonic() + max_seconds
    stopped = False
    try:
        for n, (op, arg, _) in enumerate(pickletools.genops(io.BytesIO(data))):
            if n >= max_ops or (n % 4096 == 0 and time.monotonic() > deadline):
                raise PickleRefused(f"it is longer than {max_ops} opcodes or {max_seconds:.0f} s to read")
            machine.step(op.name, arg)
            stopped = op.name == "STOP"
    except PickleRefused:
        raise
    except Exception as err:  # decoding errors, memory, anything: a refusal with its kind only
        raise PickleRefused(f"it does not decode as a pickle ({type(err).__name__})") from None
    if not stopped or len(machine.stack) != 1 or machine.stack[0] is _MARK:
        raise PickleRefused("it does not end with exactly one value")
    return machine.stack[0]
