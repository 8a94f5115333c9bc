"""The chat framing of an episode in token ids: the system and user turns, each observation as a
user turn, the assistant headers, and the command a sampled turn spells."""

from __future__ import annotations

from collections.abc import Sequence

from termgym.trainer.models import IM_END, IM_START, SUBMIT_TOKEN

SYSTEM_PROMPT = (
    "You operate a Linux shell to complete the user's task. Reply with exactly one shell command per "
    "turn; you will see its output. When the task is done, reply with <|submit|>."
)


class ChatFormat:
    """Token ids of the chat framing. Text is encoded with special tokens split, so no text, however
    hostile, turns into ``<|im_end|>`` or ``<|submit|>``."""

    def __init__(self, tokenizer, system: str = SYSTEM_PROMPT) -> None:
        self.tokenizer = tokenizer
        self.im_start, self.im_end = tokenizer.convert_tokens_to_ids(IM_START), tokenizer.convert_tokens_to_ids(IM_END)
        self.submit = tokenizer.convert_tokens_to_ids(SUBMIT_TOKEN)
        self.stop_ids = (self.im_end, self.submit)
        self.system = system

    def text(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False, split_special_tokens=True).input_ids if text else []

    def prompt(self, instruction: str) -> list[int]:
        """System turn, user turn with the instruction, then the assistant header."""
        return (
            [self.im_start]
            + self.text(f"system\n{self.system}")
            + [self.im_end]
            + self.text("\n")
            + [self.im_start]
            + self.text(f"user\n{instruction}")
            + [self.im_end]
            + self.text("\n")
            + [self.im_start]
            + self.text("assistant\n")
        )

    def observation(self, observation: str, max_tokens: int, *, closed: bool = True) -> list[int]:
        """A user turn holding the observation (its first ``max_tokens`` tokens), then the next
        assistant header. It starts with ``<|im_end|>`` when the sampled turn was not ``closed``
        (it ran out of tokens before its end-of-turn token)."""
        body = self.text(observation)[:max_tokens]
        return (
            ([] if closed else [self.im_end])
            + self.text("\n")
            + [self.im_start]
            + self.text("user\n")
            + body
            + [self.im_end]
            + self.text("\n")
            + [self.im_start]
            + self.text("assistant\n")
        )

    def command(self, sampled: Sequence[int]) -> str:
        """The shell command a turn's sampled ids spell (special tokens dropped)."""
        return self.tokenizer.decode([t for t in sampled if t not in self.stop_ids], skip_special_tokens=True)
