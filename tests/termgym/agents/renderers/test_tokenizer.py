"""``train_family_tokenizer``: each family's structural tokens are single ids in the family's order
(pad first, id 0), eos / pad / bos and the chat template are the family's and survive a save and
load, Qwen's unmarked tokens stay unmarked, and the framing is as few tokens as the byte-level
pre-tokenizer allows."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from termgym.agents.renderers import FORMATS, detect_renderer, make_renderer
from termgym.errors import ConfigError
from termgym.trainer.tokenizer import train_family_tokenizer
from tests.termgym.agents.renderers.helpers import CORPUS, FORMAT_NAMES

FRAMING = {
    "chatml": [
        "assistant\n",
        "user\n",
        "system\n",
        '{"name": "bash", "arguments": {"command": "',
        "```bash\n",
        ":submit",
    ],
    "qwen-xml": ["assistant\n", "\n<function=bash>\n<parameter=command>\n", "\n</parameter>\n</function>\n", ":submit"],
    "llama3": ["assistant", "ipython", '{"name": "bash", "parameters": {"command": "', "```bash\n", ":submit"],
}


@pytest.mark.parametrize("family", FORMAT_NAMES)
def test_structural_tokens_are_single_ids_in_the_familys_order(tokenizers, family):
    tokenizer, spec = tokenizers[family], FORMATS[family]
    assert [tokenizer.convert_tokens_to_ids(t) for t in spec.special_tokens] == list(range(len(spec.special_tokens)))
    assert tokenizer.pad_token_id == 0 and tokenizer.pad_token == spec.pad
    assert (tokenizer.eos_token, tokenizer.bos_token) == (spec.eos, spec.bos)
    for token in spec.special_tokens:
        assert tokenizer(token, add_special_tokens=False).input_ids == [tokenizer.convert_tokens_to_ids(token)]
    unmarked = {str(t) for t in tokenizer.added_tokens_decoder.values() if not t.special}
    assert unmarked == set(spec.unmarked)  # Qwen's <think>, <tool_call>...: added tokens, not special


@pytest.mark.parametrize("family", FORMAT_NAMES)
def test_save_and_load_keep_the_template_and_the_renderer_detects_the_family(tokenizers, family, tmp_path):
    tokenizer = tokenizers[family]
    tokenizer.save_pretrained(tmp_path)
    loaded = AutoTokenizer.from_pretrained(tmp_path)
    assert loaded.chat_template == FORMATS[family].chat_template
    assert detect_renderer(loaded, None) == family
    messages = [{"role": "system", "content": "s"}, {"role": "user", "content": "<tool_call> ls"}]
    assert make_renderer(family, loaded).render(messages) == make_renderer(family, tokenizer).render(messages)


@pytest.mark.parametrize("family", FORMAT_NAMES)
def test_the_framing_is_as_few_tokens_as_the_pre_tokenizer_allows(tokenizers, family):
    tokenizer = tokenizers[family]
    split = tokenizer.backend_tokenizer.pre_tokenizer.pre_tokenize_str
    for text in FRAMING[family]:
        assert len(tokenizer(text, add_special_tokens=False).input_ids) == len(split(text)), text


def test_the_same_texts_give_the_same_tokenizer_and_an_unknown_family_is_refused(tokenizers):
    again = train_family_tokenizer(CORPUS, "chatml", vocab_size=600)
    assert again.get_vocab() == tokenizers["chatml"].get_vocab()
    with pytest.raises(ConfigError, match="unknown chat format 'gpt'"):
        train_family_tokenizer(CORPUS, "gpt")
