"""Answer extraction: from a model's response text to the short answer string that gets verified.

Sits in the reward stage of the train step (after rollouts, before the replay buffer update): the
scorer calls `extract_answer` (or an `AnswerRule`) on every response in the parent process, then
only the short extracted string travels to a verification worker (`pool.py`). Everything here is
pure string work, linear-time in the response length, with no recursion and no regex that can
backtrack catastrophically, so that megabyte-long or deeply nested model outputs cost at most a
second or so.

An `AnswerRule` says where the answer is read; `extract_answer(response, requires_think)` is the
training reward's rule:

1. Think tags (`AnswerRule.think`):
   - "first" (think templates, `requires_think=True`; the official training reward,
     math_verify_reward.py): no `</think>` means no answer (None); otherwise only the text
     between the FIRST `</think>` and the next `</think>` (or the end) is read.
   - "last" (other templates, `requires_think=False`): whenever `</think>` is present, only the
     text after the LAST `</think>` is read; otherwise the whole response.
   - "first_or_whole" (the official eval for a prompt that opens a think block): as "first", but
     a response without `</think>` is read whole.
   - "whole": the whole response (the official eval for any other prompt).
2. Boxed answer. The last `\\boxed{...}` or `\\fbox{...}` command decides: its content, with
   balanced braces (escaped `\\{` / `\\}` do not count as structure), stripped. If that last box
   is never closed (a truncated response) or is empty, the answer is None; an earlier box does
   not stand in for it. `\\boxed 5` (no braces) gives the token after the space.
3. Fallback when there is no box command at all: the text after the last "answer is" /
   "answer:" (case-insensitive) up to the end of that line or sentence, with `$`, `\\(...\\)` and
   `**` wrappers and a trailing full stop removed; if that is empty, the last number (integer,
   decimal, `a/b`, optional sign and thousands commas) in the final characters of the text.
4. Otherwise None.

With `AnswerRule.boxed_only` (the official eval, oat_math_grader.py) steps 2-3 become
`last_boxed_strict`: the last occurrence of `\\boxed` decides, and only when `{` follows it at once
and closes; `\\fbox`, bare `\\boxed 5` and the fallbacks give no answer.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

THINK_CLOSE = "</think>"
_BOXED = "\\boxed"
_BOX_COMMANDS = (_BOXED, "\\fbox")
_CHUNK = 4096  # brace matching skips whole chunks that cannot close the box (C-speed str.count)
_LINE_CAP = 2000  # the "answer is" fallback reads at most this many characters of its line
_NUMBER_WINDOW = 2000  # the last-number fallback looks at the final characters first

_WS = re.compile(r"\s*")
# a backslash escape (so `\{`, `\}` and `\\` are skipped as a unit) or a structural brace
_BRACE_TOKEN = re.compile(r"\\.|[{}]", re.S)
_BRACE = re.compile(r"[{}]")
_BARE_BOX_TOKEN = re.compile(r"[^\s$]+")
_ANSWER_CUE = re.compile(r"answer\s*(?:is|:)\s*:?", re.I)
_SENTENCE_END = re.compile(r"\n|\.\s")
# optional sign (not when it is a binary minus), digits with optional thousands groups, decimals,
# a fraction; every part is possessive in effect (no nested quantifiers over the same characters)
_NUMBER = re.compile(r"(?:(?<![\w)\]}])-)?\d+(?:,\d{3})*(?:\.\d+)?(?:/\d+)?")
_SPACING = re.compile(r"\\[,!;:]")
_WRAPPERS = (("$$", "$$"), ("$", "$"), ("\\(", "\\)"), ("\\[", "\\]"), ("**", "**"))
_TEXT_CMD = re.compile(r"\\(?:text|textbf|textrm|mathrm|mathbf|mbox)\s*\{([^{}]*)\}")
_CHOICE = re.compile(r"\(\s*([A-J])\s*\)|([A-J])(?:[).:]|$)", re.I)


ThinkRule = Literal["first", "last", "first_or_whole", "whole"]
THINK_RULES: tuple[ThinkRule, ...] = ("first", "last", "first_or_whole", "whole")


def think_part(response: str, think: ThinkRule) -> str | None:
    """The part of `response` that holds the answer under the think rule `think` (see the module
    docstring); None when the rule needs a `</think>` that is missing."""
    if think == "whole":
        return response
    if think == "last":
        cut = response.rfind(THINK_CLOSE)
        return response if cut < 0 else response[cut + len(THINK_CLOSE) :]
    first = response.find(THINK_CLOSE)
    if first < 0:
        return None if think == "first" else response
    start = first + len(THINK_CLOSE)
    end = response.find(THINK_CLOSE, start)
    return response[start:] if end < 0 else response[start:end]


def strip_think(response: str, requires_think: bool = False) -> str | None:
    """The training reward's think cut: rule "first" with `requires_think` (None when `</think>`
    is missing: the model never finished thinking), else rule "last"."""
    return think_part(response, "first" if requires_think else "last")


def _match_brace(text: str, open_pos: int) -> int:
    """Index of the `}` closing the `{` at `open_pos`, or -1 if it never closes. Linear, iterative."""
    depth, i, n = 1, open_pos + 1, len(text)
    while i < n:
        end = min(i + _CHUNK, n)
        closes = text.count("}", i, end)
        if closes < depth and text.find("\\", i, end) < 0:
            # this chunk cannot bring the depth to zero and holds no escapes: skip it wholesale
            depth += text.count("{", i, end) - closes
            i = end
            continue
        # scan one character past the chunk so that an escape straddling the boundary stays whole
        next_i = end
        for m in _BRACE_TOKEN.finditer(text, i, min(end + 1, n)):
            tok = m.group()
            if tok == "{":
                depth += 1
            elif tok == "}":
                depth -= 1
                if depth == 0:
                    return m.start()
            next_i = max(next_i, m.end())
        i = next_i
    return -1


def _next_box_candidate(text: str, before: int, cache: dict[str, int]) -> tuple[int, str]:
    """Rightmost box command starting before `before`: (position, command), or (-1, "").

    `cache` remembers each command's last hit so that repeated calls stay linear overall."""
    best, best_cmd = -1, ""
    for cmd in _BOX_COMMANDS:
        pos = cache.get(cmd, len(text))
        if pos >= before:
            pos = text.rfind(cmd, 0, before)
            cache[cmd] = pos
        if pos > best:
            best, best_cmd = pos, cmd
    return best, best_cmd


def last_boxed(text: str) -> tuple[bool, str | None]:
    """(found, content) for the last box command in `text`.

    found is False when no `\\boxed`/`\\fbox` command occurs (the caller may fall back); content is
    None when the last box is unclosed or empty."""
    cache: dict[str, int] = {}
    before = len(text)
    while True:
        pos, cmd = _next_box_candidate(text, before, cache)
        if pos < 0:
            return False, None
        after = pos + len(cmd)
        if after < len(text) and (text[after].isalpha() or text[after] == "@"):
            before = pos  # another command such as \boxedfoo or \fboxsep: keep looking
            continue
        ws = _WS.match(text, after)  # `\s*` always matches
        j = after if ws is None else ws.end()
        if j < len(text) and text[j] == "{":
            close = _match_brace(text, j)
            if close < 0:
                return True, None
            content = text[j + 1 : close].strip()
            return True, (content or None)
        if j > after and j < len(text):
            bare = _BARE_BOX_TOKEN.match(text, j)
            if bare is not None:
                return True, bare.group()
        before = pos  # a bare mention of the command (e.g. at the very end): keep looking


def last_boxed_strict(text: str) -> str | None:
    """The official eval's box (oat_math_grader.py `extract_answer`): the content of the LAST
    `\\boxed` in `text`, stripped, when a `{` follows it at once and is closed; every brace counts,
    escaped ones too, as there. None otherwise (no `\\boxed`, `\\boxed 5`, unclosed, empty)."""
    pos = text.rfind(_BOXED)
    if pos < 0:
        return None
    open_pos = pos + len(_BOXED)
    if open_pos >= len(text) or text[open_pos] != "{":
        return None
    depth = 0
    for m in _BRACE.finditer(text, open_pos):
        depth += 1 if m.group() == "{" else -1
        if depth == 0:
            return text[open_pos + 1 : m.start()].strip() or None
    return None


def _unwrap(s: str) -> str:
    """Strip whitespace, one level of math/markdown wrappers and a trailing full stop."""
    s = s.strip().rstrip(".").strip()
    for left, right in _WRAPPERS:
        if len(s) >= len(left) + len(right) and s.startswith(left) and s.endswith(right):
            s = s[len(left) : len(s) - len(right)].strip()
            break
    return s.rstrip(".").strip()


def _answer_phrase(text: str) -> str | None:
    last = None
    for last in _ANSWER_CUE.finditer(text):  # noqa: B007 - we want the last match
        pass
    if last is None:
        return None
    line = text[last.end() : last.end() + _LINE_CAP]
    stop = _SENTENCE_END.search(line)
    if stop is not None:
        line = line[: stop.start()]
    phrase = _unwrap(line)
    return phrase or None


def _last_number(text: str) -> str | None:
    start = max(0, len(text) - _NUMBER_WINDOW)
    while True:
        last = None
        for last in _NUMBER.finditer(text, start):  # noqa: B007 - we want the last match
            pass
        if last is None:
            return None
        # a number cut by the window's edge: widen the window (geometric, so still linear)
        if last.start() == start and start > 0 and (text[start - 1].isdigit() or text[start - 1] in ",.-/"):
            start = max(0, start - 2 * (len(text) - start))
            continue
        return last.group()


def _boxed_or_fallback(text: str) -> str | None:
    found, content = last_boxed(text)
    if found:
        return content
    return _answer_phrase(text) or _last_number(text)


@dataclass(frozen=True)
class AnswerRule:
    """Where a response's answer is read: the think rule, then the box (see the module docstring)."""

    think: ThinkRule = "last"
    boxed_only: bool = False  # only the last `\\boxed{}` (`last_boxed_strict`), no fallbacks

    def __post_init__(self) -> None:
        if self.think not in THINK_RULES:
            raise ValueError(f"unknown think rule {self.think!r}; known: {', '.join(THINK_RULES)}")

    def extract(self, response: str) -> str | None:
        """The final answer of `response` under this rule, or None."""
        if not isinstance(response, str):
            return None
        text = think_part(response, self.think)
        if text is None:
            return None
        return last_boxed_strict(text) if self.boxed_only else _boxed_or_fallback(text)


def training_rule(requires_think: bool) -> AnswerRule:
    """The training reward's rule: "first" for think templates, "last" for the others."""
    return AnswerRule("first" if requires_think else "last")


def extract_answer(response: str, requires_think: bool = False) -> str | None:
    """The final answer of `response` under the training reward's rule, or None."""
    return training_rule(requires_think).extract(response)


def prepare_math(answer: str) -> str:
    """A gold or extracted answer made ready for math-verify: the content of a box if the whole
    thing is one (gold answers are sometimes stored boxed), wrappers stripped, thin spaces such as
    `1\\,000` removed (math-verify would read that as a product)."""
    s = _unwrap(answer)
    if s.startswith(_BOX_COMMANDS):
        found, content = last_boxed(s)
        if found and content is not None:
            s = _unwrap(content)
    return _SPACING.sub("", s)


def normalise(answer: str) -> str:
    """Key for the cheap exact-match pre-check: `prepare_math` without any whitespace (LaTeX math
    mode ignores spaces, so `1 000` and `1000` render alike)."""
    return "".join(prepare_math(answer).split())


def choice_letter(answer: str | None) -> str | None:
    """The multiple-choice letter A-J in `answer`, upper-cased, or None.

    Tolerates `C`, `c`, `(C)`, `C)`, `C.`, `C:`, `(C) 42`, `\\text{C}`, `\\textbf{(C)}`, `$C$`."""
    if answer is None:
        return None
    s = answer.strip()
    for _ in range(3):  # nested wrappers such as $\text{\textbf{C}}$
        s = _TEXT_CMD.sub(r"\1", _unwrap(s)).strip()
    m = _CHOICE.match(s)
    if m is None:
        return None
    return (m.group(1) or m.group(2)).upper()
