"""What the renderer tests share besides fixtures: the corpus the family tokenizers are trained on,
the format names, and the renderer configurations the tests run over (the tokenizers themselves
are conftest.py's session fixture)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from termgym.agents.renderers import ChatMLRenderer, Llama3Renderer, QwenXMLRenderer, ThinkingRetention

CORPUS = [
    "ls -la /app\ncat notes.txt | grep error\necho done > out.txt\n",
    "The files are a.txt and b.txt. exit code 0\n",
] * 5
FORMAT_NAMES = ("chatml", "qwen-xml", "llama3")


@dataclass(frozen=True)
class Config:
    """One renderer configuration: the family, and for qwen-xml whether the prompt opens <think>."""

    family: str
    open_think: bool = False

    @property
    def id(self) -> str:
        return self.family + ("-open-think" if self.open_think else "")

    def renderer(self, tokenizer: Any, thinking: ThinkingRetention = "cycle") -> Any:
        if self.family == "chatml":
            return ChatMLRenderer(tokenizer, thinking=thinking)
        if self.family == "qwen-xml":
            return QwenXMLRenderer(tokenizer, thinking=thinking, open_think=self.open_think)
        return Llama3Renderer(tokenizer, thinking=thinking)

    def template_kwargs(self, thinking: ThinkingRetention) -> dict[str, Any]:
        kwargs: dict[str, Any] = {"thinking_retention": thinking}
        if self.family == "qwen-xml":
            kwargs["open_think"] = self.open_think
        return kwargs


CONFIGS = (Config("chatml"), Config("qwen-xml", open_think=True), Config("qwen-xml"), Config("llama3"))
