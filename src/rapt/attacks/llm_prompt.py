"""The LLM reconstruction attacker's prompt, shared by the attacker
(:mod:`rapt.attacks.llm_recovery`) and its fine-tuning (:mod:`rapt.attacks.llm_tuning`), so that
a tuned LLM reads exactly the prompt it was trained on."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["INSTRUCTION", "build_prompt"]

INSTRUCTION = ("Some words in each noisy sentence were replaced by random words with a similar "
               "meaning or spelling. Reply with the original sentence only.")


def build_prompt(shots: Sequence[tuple[str, str]], target: str, chat_tokenizer: Any = None) -> str:
    """The prompt for one target: the instruction, ``shots`` as (privatized, original) text
    pairs, then the target's privatized text. With ``chat_tokenizer`` (an instruct LLM's, with a
    chat template) each shot is a user / assistant turn; otherwise a plain
    "Noisy: ... / Original: ..." completion."""
    if chat_tokenizer is not None:
        msgs = [{"role": "system", "content": INSTRUCTION}]
        for noisy, clean in shots:
            msgs += [{"role": "user", "content": f"Noisy: {noisy}"},
                     {"role": "assistant", "content": clean}]
        msgs.append({"role": "user", "content": f"Noisy: {target}"})
        return chat_tokenizer.apply_chat_template(msgs, tokenize=False,
                                                 add_generation_prompt=True)
    body = "".join(f"Noisy: {noisy}\nOriginal: {clean}\n\n" for noisy, clean in shots)
    return f"{INSTRUCTION}\n\n{body}Noisy: {target}\nOriginal:"
