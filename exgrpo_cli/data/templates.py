"""Prompt templates: how a Question becomes the text the policy continues.

Each model preset names one template (docs/algorithm.md §8). Think-style templates ask for the
reasoning inside `<think>...</think>` and the answer in `\\boxed{}` after it; the reward then
requires the closing `</think>` (`Template.requires_think`). When a data row carries its own chat
messages (the official parquet files do), `think` uses them as given so that a model sees exactly
the prompt it was trained with. The official evaluation (generate_vllm.py) drops the data's
system message and lets the model's own chat template supply its default one: `exgrpo eval` asks
for that with `data_system=False` on the paper benchmarks. `Template.prompt_ids` is the one place
a prompt becomes token ids (the plain-text templates' BOS is added there).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from exgrpo_cli.data.types import Question

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

THINK_SYSTEM = (
    "Reason about the problem step by step inside <think> </think> tags. After </think>, "
    "give the final answer in \\boxed{}."
)
SHORT_SYSTEM = "Think in <think></think>, then answer in \\boxed{}."
BOXED_SYSTEM = "Reason step by step and put the final answer in \\boxed{}."


@dataclass(frozen=True)
class Template:
    name: str
    system: str | None  # None: no system message
    chat: bool  # rendered with the tokenizer's chat template
    requires_think: bool  # the training reward needs a </think> and reads the text after the first
    use_data_messages: bool = False  # prefer the row's own chat messages when present
    plain_format: str = "{question}"  # used when chat is False

    def messages(self, q: Question, data_system: bool = True) -> list[dict[str, str]]:
        """The chat of `q`; with `data_system=False` the data's own system message is left out (the
        template's own system line, used when the data has no messages, is kept)."""
        if self.use_data_messages and q.messages:
            return [{"role": r, "content": c} for r, c in q.messages if data_system or r != "system"]
        msgs = [{"role": "system", "content": self.system}] if self.system else []
        return msgs + [{"role": "user", "content": q.question}]

    def render(self, q: Question, tokenizer: PreTrainedTokenizerBase | None, data_system: bool = True) -> str:
        """The prompt text; only chat templates use the tokenizer (None will do for the others)."""
        if not self.chat:
            return self.plain_format.format(question=q.question)
        if tokenizer is None or getattr(tokenizer, "chat_template", None) is None:
            raise ValueError(
                f"template {self.name!r} needs a chat template, but the tokenizer has none; "
                "choose model.template=plain or llama_base"
            )
        # tokenize=False on one conversation: the text (the declared union covers ids and batches)
        msgs = self.messages(q, data_system)
        return cast(str, tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True))

    def prompt_ids(self, q: Question, tokenizer: Any, data_system: bool = True) -> list[int]:
        """The prompt's token ids, what training, validation and eval feed the model. A chat
        template writes its own special tokens into the text (Llama's `<|begin_of_text|>`), so the
        text is tokenised without adding any; a plain-text template gets the tokenizer's BOS in
        front where the tokenizer defines one, as the base model saw every document start in
        pre-training (Llama-3.1-8B base without it often degrades)."""
        ids = list(tokenizer(self.render(q, tokenizer, data_system), add_special_tokens=False)["input_ids"])
        bos = None if self.chat else getattr(tokenizer, "bos_token_id", None)
        if bos is not None and (not ids or ids[0] != bos):
            ids.insert(0, int(bos))
        return ids


TEMPLATES: dict[str, Template] = {
    # the tiny model: the think/boxed conventions with a short system line (prompt tokens are costly)
    "think_short": Template("think_short", SHORT_SYSTEM, chat=True, requires_think=True),
    # the paper's Qwen2.5-Math/LUFFY-style models: think tags, data's own messages when given
    "think": Template("think", THINK_SYSTEM, chat=True, requires_think=True, use_data_messages=True),
    # instruct models without think tags (and DeepMath's messages)
    "boxed_chat": Template(
        "boxed_chat", BOXED_SYSTEM, chat=True, requires_think=False, use_data_messages=True
    ),
    # Llama-3.1-8B base in the paper (its appendix): no chat template, no think tags, one line
    # ending in the line break after the instruction
    "llama_base": Template(
        "llama_base",
        None,
        chat=False,
        requires_think=False,
        plain_format="User: {question} Answer: Let's think step by step.\n",
    ),
    "plain": Template("plain", None, chat=False, requires_think=False),
}


def get_template(name: str) -> Template:
    try:
        return TEMPLATES[name]
    except KeyError:
        raise ValueError(f"unknown template {name!r}; known: {', '.join(TEMPLATES)}") from None
