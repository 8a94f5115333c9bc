"""The tiny policy, its tokenizer and the critic; the config's command line."""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
from typing import Literal, get_args

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from termgym.agents.renderers import RENDERER_NAMES, format_spec, renderer_for_model_dir
from termgym.envs.families import FAMILY_SETS
from termgym.trainer.checks import FIELD_CHOICES, choices_of
from termgym.trainer.config import PRESETS, Config, FamilySetName, RendererName, resolve_max_context
from termgym.trainer.flags import build_parser, field_docs, field_groups, parse_config
from termgym.trainer.models import TINY_FAMILY, Critic, context_window


def test_the_tiny_policy_is_a_normal_local_moe_model_directory(tiny_policy_dir):
    assert os.environ["HF_HUB_OFFLINE"] == "1"
    model = AutoModelForCausalLM.from_pretrained(tiny_policy_dir, local_files_only=True)
    tokenizer = AutoTokenizer.from_pretrained(tiny_policy_dir, local_files_only=True)
    assert model.config.model_type == "qwen3_moe" and model.config.num_experts > model.config.num_experts_per_tok
    assert 100_000 <= sum(p.numel() for p in model.parameters()) <= 5_000_000
    specials = format_spec(TINY_FAMILY).special_tokens
    assert [tokenizer.convert_tokens_to_ids(t) for t in specials] == list(range(len(specials)))
    assert len(tokenizer) == model.config.vocab_size
    assert model.config.eos_token_id == tokenizer.eos_token_id == tokenizer.convert_tokens_to_ids("<|im_end|>")
    # the directory says its chat format: the renderer is found from its files, the template saved
    assert renderer_for_model_dir(tiny_policy_dir).name == TINY_FAMILY and tokenizer.chat_template


@pytest.mark.parametrize(
    "text", ["ls -la /app && echo done", "find . -name '*.txt' | xargs wc -l", "héllo\tworld\n", "\x00\x7f"]
)
def test_the_byte_level_tokenizer_round_trips_any_text(tiny_policy, text):
    _, tokenizer = tiny_policy
    assert tokenizer.decode(tokenizer(text, add_special_tokens=False).input_ids) == text


def test_shell_words_and_the_text_format_are_few_tokens_and_markers_are_special(tiny_policy):
    _, tokenizer = tiny_policy
    for word in ("grep", " grep", "xargs", " sed", "mkdir"):
        assert len(tokenizer(word, add_special_tokens=False).input_ids) == 1, word
    # one id per piece of the pre-tokenizer: ``` bash \n : submit \n ```
    assert len(tokenizer("```bash\n:submit\n```", add_special_tokens=False).input_ids) == 7
    for marker in ("<|im_start|>", "<|im_end|>"):
        assert len(tokenizer(marker, add_special_tokens=False).input_ids) == 1
        assert len(tokenizer(marker, add_special_tokens=False, split_special_tokens=True).input_ids) > 1


def test_the_critic_starts_from_the_policy_weights_with_a_zero_value_head(tiny_policy, tiny_policy_dir):
    policy, _ = tiny_policy
    critic = Critic(tiny_policy_dir)
    backbone = critic.backbone.state_dict()
    for name, tensor in policy.model.state_dict().items():
        assert torch.equal(backbone[name], tensor), name
    ids = torch.tensor([[1, 50, 60, 70]])
    values = critic(ids, torch.ones_like(ids))
    assert values.shape == (1, 4) and torch.count_nonzero(values) == 0


def test_every_config_field_has_a_docstring_shown_by_help():
    docs = field_docs(Config)
    assert set(docs) == {f.name for f in dataclasses.fields(Config)}
    text = " ".join(build_parser().format_help().split())
    for doc in docs.values():
        assert " ".join(doc.split()[:4]) in text


def test_help_lists_the_values_of_every_mode_read_from_its_literal():
    text = " ".join(build_parser().format_help().split())
    assert FIELD_CHOICES["mode"] == ("wait", "cancel", "carry-over", "reweight")  # the scheduler's SchedulerMode
    assert {"action_format", "context", "thinking", "renderer", "generator", "sampler_dtype", "advantage"} < set(
        FIELD_CHOICES
    )
    for name, allowed in FIELD_CHOICES.items():
        assert f"one of: {', '.join(value or repr(value) for value in allowed)}" in text, name
    # the two spelled out here, not imported: they must stay the lists their owners keep
    assert get_args(RendererName) == RENDERER_NAMES and get_args(FamilySetName) == tuple(FAMILY_SETS)


@pytest.mark.parametrize(
    ("annotation", "expected"),
    [
        (Literal["a", "b"], ("a", "b")),
        (Literal["a"] | Literal[""], ("a", "")),
        (Literal["a"] | None, ()),  # not a closed set of strings
        (int, ()),
        (int | None, ()),
        (str, ()),
        (tuple[str, ...], ()),
    ],
)
def test_choices_of_reads_literals_only(annotation, expected):
    assert choices_of(annotation) == expected


def test_fields_are_grouped_by_concern_and_help_shows_the_groups():
    groups = field_groups(Config)
    order = [groups[f.name] for f in dataclasses.fields(Config)]
    assert all(order) and len(set(order)) >= 8
    assert len([title for title, _ in itertools.groupby(order)]) == len(set(order))  # each group in one piece
    text = build_parser().format_help()
    for title in set(order):
        assert f"\n{title}:\n" in text, title


def test_preset_then_explicit_flags():
    cfg = parse_config(["--preset", "tiny-ppo", "--steps", "7", "--no-resume", "--tasks", "a", "b"])
    assert cfg.steps == 7 and cfg.tasks == ("a", "b") and cfg.resume is False
    assert cfg.actor_lr == PRESETS["tiny-ppo"]["actor_lr"]
    assert parse_config([]).actor_lr == 1e-6 and parse_config([]).critic_lr == 1.5e-5  # the published values
    with pytest.raises(ValueError, match="invalid int"):
        parse_config(["--steps", "x"])


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--reward", "sparse"], "--reward 'sparse': choose one of dense, binary"),
        (["--sampler-dtype", "float16"], "--sampler-dtype 'float16'"),
        (["--mode", "fastest"], "--mode 'fastest'"),
        (["--steps", "0"], "--steps must be at least 1"),
        (["--pool", "10", "--heldout", "0"], "with --pool"),
        (["--generator", "server"], "--generator server needs --base-url URL and --served-model NAME"),
        (["--renderer", "gpt2"], "--renderer 'gpt2': choose one of auto, chatml"),
        (["--thinking", "some"], "--thinking 'some'"),
    ],
)
def test_unusable_values_are_refused_before_any_work(flags, message, tmp_path, capsys):
    from termgym.cli import main as termgym_main

    assert termgym_main(["train", "--out", str(tmp_path / "run"), *flags]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
    assert not (tmp_path / "run").exists()  # refused before the run directory was made


@pytest.mark.parametrize(
    ("config", "window"),
    [
        ({"model_type": "llama", "max_position_embeddings": 131072}, 131072),
        ({"model_type": "gpt2", "n_positions": 1024}, 1024),
        ({"model_type": "mpt", "max_seq_len": 2048}, 2048),
        ({"model_type": "qwen3_5_moe", "text_config": {"max_position_embeddings": 262144}}, 262144),  # a VL wrapper
        ({"max_position_embeddings": 4096, "text_config": {"max_position_embeddings": 8192}}, 4096),
        ({"model_type": "odd", "max_position_embeddings": 0}, None),
        ({"model_type": "odd", "max_position_embeddings": True}, None),
        ({"model_type": "odd"}, None),
        ([], None),
    ],
)
def test_context_window_is_what_the_models_config_states(tmp_path, config, window):
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert context_window(tmp_path) == window


def test_context_window_of_no_config_or_a_broken_one_is_unknown(tmp_path):
    assert context_window(tmp_path) is None
    (tmp_path / "config.json").write_text("{not json")
    assert context_window(tmp_path) is None


def test_max_context_not_given_becomes_the_models_window():
    """Defect 6 of issue 31: --model DIR kept the tiny policy's 1024 tokens."""
    assert parse_config(["--model", "DIR"]).max_context is None  # not given: resolved once the model is known
    assert resolve_max_context(parse_config(["--model", "DIR"]), 8192).max_context == 8192
    assert resolve_max_context(parse_config(["--model", "DIR"]), None).max_context == 1024  # states none
    assert resolve_max_context(parse_config([]), None).max_context == 1024  # the tiny policy
    assert resolve_max_context(parse_config(["--model", "DIR", "--max-context", "600"]), 8192).max_context == 600
    assert resolve_max_context(parse_config(["--preset", "tiny", "--model", "DIR"]), 8192).max_context == 512
