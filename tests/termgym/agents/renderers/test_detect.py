"""Choosing a renderer from a model's files: config.json's ``model_type`` with the tokenizer's
tokens and template, a one-line ``ConfigError`` when nothing fits, and the names ``make_renderer``
takes."""

from __future__ import annotations

import copy
import json
import re

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from termgym.agents.renderers import (
    FORMATS,
    ChatMLRenderer,
    Llama3Renderer,
    QwenXMLRenderer,
    TemplateRenderer,
    detect_renderer,
    make_renderer,
    renderer_for_model_dir,
)
from termgym.errors import ConfigError


def plain_tokenizer() -> PreTrainedTokenizerFast:
    """A byte-level BPE with no chat tokens at all (like a base model's)."""
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=["</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(["hello world"] * 4, trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="</s>")


def with_template(tokenizer, template: str):
    other = copy.deepcopy(tokenizer)
    other.chat_template = template
    return other


CODER_TEMPLATE = "{{ '<|im_start|>' }}{# ... #}{{ '<tool_call>\\n<function=' }}"


@pytest.mark.parametrize(
    ("family", "model_type", "template", "expected"),
    [
        ("chatml", "qwen2", None, "chatml"),
        ("chatml", "qwen3", None, "chatml"),
        ("chatml", "qwen3_moe", None, "chatml"),
        ("chatml", "qwen3_moe", CODER_TEMPLATE, "qwen-xml"),  # Qwen3-Coder
        ("qwen-xml", "qwen3_5_moe", None, "qwen-xml"),
        ("qwen-xml", "qwen3_5_moe_text", None, "qwen-xml"),
        ("qwen-xml", None, None, "qwen-xml"),  # no config.json: the template's <function=
        ("chatml", None, None, "chatml"),
        ("chatml", "llama", None, "chatml"),  # a Llama fine-tuned on ChatML (Hermes style)
        ("chatml", "some_new_arch", None, "chatml"),
        ("llama3", "llama", None, "llama3"),
        ("llama3", None, None, "llama3"),
    ],
)
def test_the_family_is_read_from_model_type_tokens_and_template(tokenizers, family, model_type, template, expected):
    tokenizer = tokenizers[family] if template is None else with_template(tokenizers[family], template)
    assert detect_renderer(tokenizer, model_type) == expected
    assert make_renderer("auto", tokenizer, model_type=model_type).name == expected


@pytest.mark.parametrize("model_type", ["llama", "mistral", None])
def test_a_model_of_no_known_family_is_one_line_naming_what_was_found_and_the_way_out(model_type):
    with pytest.raises(ConfigError) as caught:
        detect_renderer(plain_tokenizer(), model_type)
    message = str(caught.value)
    assert "\n" not in message
    assert "--renderer template" in message and "chatml, qwen-xml, llama3" in message
    assert (f"model_type {model_type!r}" if model_type else "no model_type") in message
    assert "no ChatML tokens" in message and "no Llama 3 header tokens" in message


def test_a_family_whose_tokens_the_tokenizer_lacks_is_refused_naming_them(tokenizers):
    with pytest.raises(ConfigError, match=r"^the tokenizer lacks the llama3 tokens <\|begin_of_text\|>, ") as caught:
        Llama3Renderer(tokenizers["chatml"])
    assert "\n" not in str(caught.value)
    with pytest.raises(ConfigError, match=re.escape("lacks the chatml tokens <|im_start|>, <|im_end|>, <tool_call>")):
        make_renderer("chatml", plain_tokenizer())


def test_make_renderer_names_and_retentions(tokenizers):
    tokenizer = tokenizers["chatml"]
    kinds = {"chatml": ChatMLRenderer, "qwen-xml": QwenXMLRenderer, "template": TemplateRenderer}
    for name, kind in kinds.items():
        renderer = make_renderer(name, tokenizer, thinking="strip")
        assert type(renderer) is kind and renderer.name == name and renderer.thinking == "strip"
    assert make_renderer("template", tokenizer).exact is False and make_renderer("chatml", tokenizer).exact is True
    with pytest.raises(ConfigError, match="unknown renderer 'harmony': choose one of auto, chatml"):
        make_renderer("harmony", tokenizer)
    with pytest.raises(ConfigError, match="unknown thinking retention 'some'"):
        make_renderer("chatml", tokenizer, thinking="some")


def test_qwen_xml_opens_the_think_block_when_the_template_does(tokenizers):
    tokenizer = tokenizers["qwen-xml"]
    assert QwenXMLRenderer(tokenizer).open_think is True  # the project's template: Qwen3.5's prompt
    assert QwenXMLRenderer(with_template(tokenizer, CODER_TEMPLATE)).open_think is False  # Qwen3-Coder's has no <think>
    prompt = QwenXMLRenderer(tokenizer).render([{"role": "user", "content": "hi"}])
    assert tokenizer.decode(prompt).endswith("<|im_start|>assistant\n<think>\n")


def test_renderer_for_model_dir_reads_config_json(tokenizers, tmp_path):
    tokenizers["chatml"].save_pretrained(tmp_path)
    assert renderer_for_model_dir(tmp_path).name == "chatml"  # no config.json: the tokenizer decides
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen3_5_moe"}))
    renderer = renderer_for_model_dir(tmp_path, thinking="all")
    assert renderer.name == "qwen-xml" and renderer.thinking == "all"
    assert renderer_for_model_dir(tmp_path, "llama3", tokenizer=tokenizers["llama3"]).name == "llama3"
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ConfigError, match=r"cannot read .*config\.json"):
        renderer_for_model_dir(tmp_path)
    with pytest.raises(ConfigError, match="cannot load the tokenizer"):
        renderer_for_model_dir(tmp_path / "missing")


def test_every_family_has_its_template_packaged():
    for spec in FORMATS.values():
        assert "add_generation_prompt" in spec.chat_template
