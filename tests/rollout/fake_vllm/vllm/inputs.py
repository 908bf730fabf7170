"""vllm.inputs.TokensPrompt: a TypedDict in vLLM, a dict here."""

from __future__ import annotations

from typing import Any


def TokensPrompt(**kwargs: Any) -> dict[str, Any]:  # noqa: N802 - vLLM's name
    return dict(kwargs)
