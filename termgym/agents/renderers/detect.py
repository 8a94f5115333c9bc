"""Which renderer a model gets: decided from its files, or named.

``detect_renderer`` reads config.json's ``model_type`` and the tokenizer (its vocabulary and chat
template): ``qwen2``, ``qwen2_moe``, ``qwen3``, ``qwen3_moe`` and ``qwen3_next`` are ``chatml``
unless the chat template writes ``<function=`` (Qwen3-Coder: ``qwen-xml``); the ``qwen3_5`` types
are ``qwen-xml``; ``llama`` is ``llama3`` when the tokenizer has Llama 3's header tokens (Llama 2
does not). A model type termgym does not know, or none (a tokenizer without its config.json), is
decided by the tokenizer alone: ChatML tokens and ``<tool_call>`` with a ChatML template (or none)
are ``chatml``, or ``qwen-xml`` when the template writes ``<function=``; Llama 3's header tokens
with a Llama 3 template (or none) are ``llama3``. Anything else is a ``ConfigError`` of one line
saying what was found and that ``--renderer template`` or a family name can be given.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from termgym.agents.renderers.base import Renderer
from termgym.agents.renderers.chatml import ChatMLRenderer
from termgym.agents.renderers.formats import FORMATS, chat_template_text, check_thinking
from termgym.agents.renderers.llama3 import Llama3Renderer
from termgym.agents.renderers.qwen_xml import QwenXMLRenderer
from termgym.agents.renderers.template import TemplateRenderer
from termgym.errors import ConfigError, UnknownName

FAMILY_RENDERERS: dict[str, type[ChatMLRenderer] | type[Llama3Renderer]] = {
    "chatml": ChatMLRenderer,
    "qwen-xml": QwenXMLRenderer,
    "llama3": Llama3Renderer,
}
RENDERER_NAMES: tuple[str, ...] = ("auto", *FAMILY_RENDERERS, "template")
CHATML_TOKENS = ("<|im_start|>", "<|im_end|>")
LLAMA3_TOKENS = ("<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>")


def detect_renderer(tokenizer: Any, model_type: str | None) -> str:
    """The family renderer's name for this model (module docstring); ``ConfigError`` when the
    files fit none."""
    template = chat_template_text(tokenizer)
    vocab = tokenizer.get_vocab()
    chatml = all(t in vocab for t in CHATML_TOKENS)
    llama3 = all(t in vocab for t in LLAMA3_TOKENS)
    xml = "<function=" in template
    if model_type in FORMATS["qwen-xml"].model_types and chatml:
        return "qwen-xml"
    if model_type in FORMATS["chatml"].model_types and chatml:
        return "qwen-xml" if xml else "chatml"
    if model_type in FORMATS["llama3"].model_types and llama3:
        return "llama3"
    if chatml and "<tool_call>" in vocab and (not template or "<|im_start|>" in template):
        return "qwen-xml" if xml else "chatml"
    if llama3 and (not template or "<|start_header_id|>" in template):
        return "llama3"
    found = [f"model_type {model_type!r}" if model_type else "no model_type"]
    found.append("ChatML tokens" if chatml else "no ChatML tokens")
    found.append("Llama 3 header tokens" if llama3 else "no Llama 3 header tokens")
    found.append("a chat template" if template else "no chat template")
    raise ConfigError(
        f"cannot tell this model's chat format ({', '.join(found)}): pass --renderer template (the tokenizer's "
        f"own chat template, its prefix checked each turn) or a family: {', '.join(FAMILY_RENDERERS)}"
    )


def make_renderer(name: str, tokenizer: Any, *, thinking: str = "cycle", model_type: str | None = None) -> Renderer:
    """The renderer ``name`` (``auto``: ``detect_renderer`` with ``model_type``) over ``tokenizer``."""
    retention = check_thinking(thinking)
    if name not in RENDERER_NAMES:
        raise UnknownName("unknown renderer", name, RENDERER_NAMES)
    if name == "auto":
        name = detect_renderer(tokenizer, model_type)
    if name == "template":
        return TemplateRenderer(tokenizer, thinking=retention)
    return FAMILY_RENDERERS[name](tokenizer, thinking=retention)


def renderer_for_model_dir(
    path: str | os.PathLike, name: str = "auto", *, thinking: str = "cycle", tokenizer: Any = None
) -> Renderer:
    """The renderer for the model at ``path``: its tokenizer (``tokenizer``, or loaded from
    ``path``) and its config.json's ``model_type`` (none when the file is absent)."""
    directory = Path(path)
    model_type = model_type_of(directory)
    if tokenizer is None:
        from transformers import AutoTokenizer

        try:
            tokenizer = AutoTokenizer.from_pretrained(str(directory))
        except (OSError, ValueError) as exc:
            raise ConfigError(f"cannot load the tokenizer {str(path)!r}: {' '.join(str(exc).split())[:300]}") from None
    return make_renderer(name, tokenizer, thinking=thinking, model_type=model_type)


def model_type_of(directory: Path) -> str | None:
    """config.json's ``model_type`` in ``directory``; None without the file or the key."""
    config = directory / "config.json"
    if not config.is_file():
        return None
    try:
        data = json.loads(config.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read {config}: {' '.join(str(exc).split())[:200]}") from None
    model_type = data.get("model_type") if isinstance(data, dict) else None
    return model_type if isinstance(model_type, str) else None
