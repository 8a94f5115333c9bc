"""Training from ATIF (``--sft-data``): the main job's teacher demonstrations, exported and read back,
are the same supervised rows as the job's own; trajectories of other tokenizers and other harnesses
are rendered with the policy's renderer; every agent step that is not trained is counted by reason."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
from rich.console import Console

from termgym import atif
from termgym.agents.renderers import make_renderer
from termgym.cli.export import export_atif
from termgym.envs.families import generate_split
from termgym.errors import ConfigError
from termgym.tasks import load_task
from termgym.trainer import sft_data
from termgym.trainer.checks import check_config
from termgym.trainer.config import PRESETS, TINY_BASE, Config
from termgym.trainer.demonstrations import imported_demonstrations, record_demonstrations
from termgym.trainer.models import TINY_FAMILY
from termgym.trainer.sft_data import load_sft_data

FIXTURES = Path(__file__).parents[1] / "termgym" / "fixtures" / "atif"


@pytest.fixture(scope="module")
def base_renderer():
    from transformers import AutoTokenizer

    return make_renderer(TINY_FAMILY, AutoTokenizer.from_pretrained(TINY_BASE))


def job(tmp_path: Path, **changes) -> Config:
    """The main job's configuration (the tiny preset: the teacher's demonstrations) in ``tmp_path``."""
    return replace(Config(**PRESETS["tiny"]), out=str(tmp_path), concurrency=4, **changes)


async def test_the_exported_teacher_demonstrations_train_as_the_jobs_own(tmp_path, base_renderer, no_leaks):
    run = tmp_path / "job"
    shutil.copytree(TINY_BASE, run / "init")  # phase 3 of the job: the policy it starts from
    cfg = job(run)
    tasks = [load_task(p) for p in generate_split(run / "tasks" / "train", "train", 6, seed=0, family_set="explore")]
    demos = await record_demonstrations(run, cfg, tasks, base_renderer, Console(quiet=True))
    assert demos and len({d.task for d in demos}) == len(demos)
    assert export_atif(run, tmp_path / "atif").sources == {"demonstration": len(demos)}

    again = tmp_path / "again"
    shutil.copytree(TINY_BASE, again / "init")
    imported = imported_demonstrations(
        again, job(again, sft_data=str(tmp_path / "atif")), base_renderer, Console(quiet=True)
    )
    assert [(d.ids, d.mask) for d in imported] == [(d.ids, d.mask) for d in demos]
    assert [d.task for d in imported] == [d.task for d in demos]
    report = json.loads((again / "sft" / "sft-data.json").read_text())
    replies = sum(len(atif.sampled_runs(d.mask)) for d in demos)
    assert report == {
        "rows": len(demos),
        "trajectories": len(demos),
        "from_ids": replies,
        "rendered": 0,
        "bridge_breaks": 0,
        "unfit": {},
    }
    assert (again / "sft" / "demonstrations.jsonl").read_text() == (run / "sft" / "demonstrations.jsonl").read_text()


def test_ids_of_another_tokenizer_are_not_trained_as_ids(tmp_path, base_renderer):
    """The same export under a policy of another vocabulary: no step is trained on the ids, and
    the steps with no text are counted, not dropped."""
    exported = exported_demonstration(tmp_path)
    data = load_sft_data([exported], base_renderer, max_context=512, fingerprint="sha256:another")
    assert data.rows == [] and data.from_ids == 0
    assert data.unfit == {sft_data.NO_TEXT: 2}
    forced = load_sft_data([exported], base_renderer, max_context=512, fingerprint="sha256:another", tokens="ids")
    assert forced.from_ids == 2 and len(forced.rows) == 1


def exported_demonstration(tmp_path: Path) -> Path:
    """A training run holding one demonstration of two replies, exported; its ATIF file."""
    run = tmp_path / "run"
    shutil.copytree(TINY_BASE, run / "init")
    demo = {"task": "families/train/x-0001", "commands": ["ls"], "ids": [1, 2, 3, 4, 5, 6], "mask": [0, 1, 1, 0, 1, 1]}
    (run / "sft").mkdir()
    (run / "sft" / "demonstrations.jsonl").write_text(json.dumps(demo) + "\n")
    export_atif(run, tmp_path / "atif")
    return tmp_path / "atif" / "demonstration-00000.json"


def test_beyond_the_context_and_outside_the_vocabulary_are_counted(tmp_path, base_renderer):
    exported = exported_demonstration(tmp_path)
    fingerprint = atif.tokenizer_fingerprint(TINY_BASE)
    assert load_sft_data([exported], base_renderer, max_context=5, fingerprint=fingerprint).unfit == {
        sft_data.CONTEXT: 2
    }
    data = json.loads(exported.read_text())
    data["steps"][2]["metrics"]["completion_token_ids"] = [10**9, 6]
    exported.write_text(json.dumps(data))
    assert load_sft_data([exported], base_renderer, max_context=512, fingerprint=fingerprint).unfit == {
        sft_data.VOCAB: 2
    }


def test_harbors_example_is_rendered_with_the_policys_renderer(base_renderer):
    """Another harness's trajectory (ids of another tokenizer, no fingerprint): its messages are
    rendered; the typed tokens are each reply's canonical ids, the tool results in between."""
    data = load_sft_data([FIXTURES / "harbor-rfc0001-example.json"], base_renderer, max_context=4096, fingerprint=None)
    assert data.rendered == 2 and data.from_ids == 0 and not data.unfit
    ((ids, mask),) = data.rows
    example = json.loads((FIXTURES / "harbor-rfc0001-example.json").read_text())
    tools = example["agent"]["tool_definitions"]
    user = {"role": "user", "content": example["steps"][0]["message"]}
    first, _ = sft_data._assistant(example["steps"][1])
    second, _ = sft_data._assistant(example["steps"][2])
    typed = [token for token, m in zip(ids, mask) if m]
    assert typed == base_renderer.render_assistant(first) + base_renderer.render_assistant(second)
    assert ids[: mask.index(1)] == base_renderer.render([user], tools=tools, add_generation_prompt=True)
    results = [
        {"role": "tool", "tool_call_id": r["source_call_id"], "content": r["content"]}
        for r in example["steps"][1]["observation"]["results"]
    ]
    assert (
        ids
        == base_renderer.render([user, first, *results, second], tools=tools, add_generation_prompt=False)[: len(ids)]
    )
    forced = load_sft_data(
        [FIXTURES / "harbor-rfc0001-example.json"], base_renderer, max_context=4096, fingerprint=None, tokens="ids"
    )
    assert forced.unfit == {sft_data.NO_IDS: 2} and not forced.rows  # no prompt ids: nothing to train on as ids


def test_a_compaction_restarts_the_context_from_its_summary(base_renderer):
    data = load_sft_data(
        [FIXTURES / "harbor-rfc0001-compaction.json"], base_renderer, max_context=4096, fingerprint=None
    )
    ((ids, mask),) = data.rows
    summary = {"role": "user", "content": "Summary: prior conversation covered topic X..."}
    reply = {"role": "assistant", "content": "Continuing from the summary."}
    assert ids == base_renderer.render([summary], add_generation_prompt=True) + base_renderer.render_assistant(reply)
    assert sum(mask) == len(base_renderer.render_assistant(reply))


def steps_of(*steps: dict) -> dict:
    return {
        "schema_version": "ATIF-v1.7",
        "agent": {"name": "x", "version": "1"},
        "steps": [{"step_id": n, **s} for n, s in enumerate(steps, start=1)],
    }


def test_steps_the_rfc_keeps_out_of_sft_and_images_are_counted(tmp_path, base_renderer):
    user = {"source": "user", "message": "hi"}
    copied = {"source": "agent", "message": "old", "is_copied_context": True}
    dispatched = {"source": "agent", "message": "", "llm_call_count": 0}
    fresh = {"source": "agent", "message": "new"}
    (tmp_path / "a.json").write_text(json.dumps(steps_of(user, copied, dispatched, fresh)))
    data = load_sft_data([tmp_path / "a.json"], base_renderer, max_context=4096, fingerprint=None)
    assert data.unfit == {sft_data.COPIED: 1, sft_data.DISPATCHED: 1} and data.rendered == 1
    ((ids, mask),) = data.rows
    assert [t for t, m in zip(ids, mask) if m] == base_renderer.render_assistant(
        {"role": "assistant", "content": "new"}
    )
    image = {"source": "user", "message": [{"type": "image", "source": {"media_type": "image/png", "path": "a.png"}}]}
    (tmp_path / "b.json").write_text(json.dumps(steps_of(image, fresh, fresh)))
    assert load_sft_data([tmp_path / "b.json"], base_renderer, max_context=4096, fingerprint=None).unfit == {
        sft_data.IMAGES: 2
    }
    assert "2 rows from 2" not in data.describe() and "1 copied context" in data.describe()
    sub = {
        **steps_of(user, fresh),
        "trajectory_id": "s1",
        "subagent_trajectories": [{**steps_of(user, fresh, fresh), "trajectory_id": "s2"}],
    }
    parent = {**steps_of(user, fresh), "subagent_trajectories": [sub]}
    (tmp_path / "c.json").write_text(json.dumps(parent))
    nested = load_sft_data([tmp_path / "c.json"], base_renderer, max_context=4096, fingerprint=None)
    assert nested.unfit == {sft_data.SUBAGENTS: 3} and nested.rendered == 1


def test_a_bridge_the_renderer_cannot_keep_starts_a_new_row(tmp_path, base_renderer):
    """Qwen3's rule: a user turn ends the reasoning cycle, so an earlier reply's reasoning is
    dropped and the prefix breaks (a renderer with thinking "cycle")."""
    renderer = make_renderer(TINY_FAMILY, base_renderer.tokenizer, thinking="cycle")
    thought = {"source": "agent", "message": "a", "reasoning_content": "because"}
    trajectory = steps_of({"source": "user", "message": "one"}, thought, {"source": "user", "message": "two"}, thought)
    (tmp_path / "t.json").write_text(json.dumps(trajectory))
    data = load_sft_data([tmp_path / "t.json"], renderer, max_context=4096, fingerprint=None)
    assert data.bridge_breaks == 1 and len(data.rows) == 2 and data.rendered == 2


def test_sft_data_needs_the_pool_and_existing_paths(tmp_path):
    with pytest.raises(ConfigError, match="give it with --pool"):
        check_config(replace(Config(), sft_data=str(tmp_path)))
    with pytest.raises(ConfigError, match="missing: no such file"):
        check_config(replace(Config(**PRESETS["tiny"]), sft_data=f"{tmp_path},{tmp_path / 'missing'}"))


def test_bad_or_empty_sft_data_is_one_line(tmp_path, base_renderer):
    (tmp_path / "bad.json").write_text('{"schema_version": "ATIF-v1.7", "agent": {}, "steps": []}')
    with pytest.raises(ConfigError, match=r"--sft-data: .*bad\.json: not an ATIF trajectory: agent"):
        imported_demonstrations(
            tmp_path, job(tmp_path, sft_data=str(tmp_path / "bad.json")), base_renderer, Console(quiet=True)
        )
    (tmp_path / "empty.json").write_text(json.dumps(steps_of({"source": "user", "message": "hi"})))
    with pytest.raises(ConfigError, match="no agent step to train on"):
        imported_demonstrations(
            tmp_path, job(tmp_path, sft_data=str(tmp_path / "empty.json")), base_renderer, Console(quiet=True)
        )


def test_the_flags_parse_and_their_modes_are_the_loaders():
    from typing import get_args

    from termgym.trainer.config import SftDataTokens
    from termgym.trainer.flags import parse_config

    assert get_args(SftDataTokens) == sft_data.TOKEN_USES
    cfg = parse_config(["--preset", "tiny", "--sft-data", "a.json,b", "--sft-data-tokens", "render"])
    assert (cfg.sft_data, cfg.sft_data_tokens) == ("a.json,b", "render")


async def test_the_ppo_phase_of_a_job_with_sft_data_is_a_valid_ppo_run(tmp_path, monkeypatch):
    """PPO runs as ``termgym train`` without --pool: --sft-data, a --pool flag, is not passed on."""
    from termgym.trainer import pipeline

    seen = []

    async def train(cfg, *rest):
        seen.append(cfg)
        return []

    monkeypatch.setattr(pipeline, "train", train)
    cfg = job(tmp_path, sft_data=str(tmp_path))
    check_config(cfg)
    await pipeline.reinforce(cfg, tmp_path / "policy", [], tmp_path / "ppo")
    ((ppo,),) = [seen]
    assert ppo.pool == 0 and ppo.sft_data == ""
    check_config(replace(ppo, tasks=("file-ops/bulk-rename",)))
