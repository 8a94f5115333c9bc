"""Chat renderers: a conversation to token ids, a completion back to a reply, and the bridge between
turns (``base``: the contract). One renderer per family termgym renders itself, token-exact
(``chatml``: Qwen2.5 / Qwen3; ``qwen_xml``: Qwen3.5 / Qwen3-Coder; ``llama3``), and the generic
``template`` renderer over a tokenizer's own chat template. ``detect`` picks one from a model's
files; ``formats`` holds the chat formats' tokens and templates and the machinery the format
renderers share. Nothing here imports ``transformers`` at import time: renderers work on the
tokenizer they are given.
"""

from termgym.agents.renderers.base import THINKING_RETENTIONS, ParsedReply, Renderer, ThinkingRetention
from termgym.agents.renderers.chatml import ChatMLRenderer
from termgym.agents.renderers.detect import RENDERER_NAMES, detect_renderer, make_renderer, renderer_for_model_dir
from termgym.agents.renderers.formats import (
    FORMAT_NAMES,
    FORMATS,
    FormatRenderer,
    FormatSpec,
    chat_template_text,
    format_spec,
)
from termgym.agents.renderers.llama3 import Llama3Renderer
from termgym.agents.renderers.qwen_xml import QwenXMLRenderer
from termgym.agents.renderers.template import TemplateRenderer

__all__ = [
    "FORMATS",
    "FORMAT_NAMES",
    "RENDERER_NAMES",
    "THINKING_RETENTIONS",
    "ChatMLRenderer",
    "FormatRenderer",
    "FormatSpec",
    "Llama3Renderer",
    "ParsedReply",
    "QwenXMLRenderer",
    "Renderer",
    "TemplateRenderer",
    "ThinkingRetention",
    "chat_template_text",
    "detect_renderer",
    "format_spec",
    "make_renderer",
    "renderer_for_model_dir",
]
