"""vLLM's teardown of its process groups (recorded only)."""

from __future__ import annotations


def destroy_model_parallel() -> None:
    from vllm import EVENTS

    EVENTS.append({"call": "destroy_model_parallel"})


def destroy_distributed_environment() -> None:
    from vllm import EVENTS

    EVENTS.append({"call": "destroy_distributed_environment"})
