"""A model's chat template is rendered once under a time, memory and size budget before it is used
for every question (issue 30, item 6); a hostile template is refused in one line."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from exgrpo_cli.data import template_budget
from exgrpo_cli.data.templates import get_template

_HOSTILE = {
    "nested-loops": "{% for i in range(100000) %}{% for j in range(100000) %}x{% endfor %}{% endfor %}",
    "string-product": "{{ 'x' * 4000000000 }}",
    "huge-output": "{% for i in range(99999) %}{{ 'abcdefghij' * 99 }}{% endfor %}",
}


def _tokenizer(tiny: Path, chat_template: str):  # noqa: ANN202 - a transformers tokenizer
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny))
    tok.chat_template = chat_template
    return tok


@pytest.mark.parametrize("kind", sorted(_HOSTILE))
def test_a_hostile_chat_template_is_refused_within_its_budget(
    tiny_model: Path, kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(template_budget, "TIME_S", 3.0)
    tok = _tokenizer(tiny_model, _HOSTILE[kind])
    t0 = time.monotonic()
    with pytest.raises(template_budget.TemplateRefused, match="chat template of model m"):
        template_budget.check_template(get_template("think_short"), tok, "model m")
    assert time.monotonic() - t0 < 8


def test_the_models_own_template_passes(tiny_model: Path) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_model))
    template_budget.check_template(get_template("think_short"), tok, "model tiny")
    template_budget.check_template(get_template("plain"), None, "model without a chat template")
