"""A mistyped name (a bundled task, a family set, a preset, a mode) is one line naming the closest
known names, exit 2, from every place that looks one up; the suggestion itself is pure."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest

from termgym.cli import main as termgym_main
from termgym.envs.families import generate_split, make_task
from termgym.errors import ConfigError, UnknownName, did_you_mean
from termgym.tasks import TaskError
from termgym.tasks.bundled import bundled_task_names, is_task_name, resolve_task


@pytest.mark.parametrize(
    ("name", "known", "said"),
    [
        ("shrot", ["short", "long", "explore"], "did you mean short?"),
        ("tiny-lng", ["tiny", "tiny-long", "tiny-ppo"], "did you mean tiny-long?"),  # tiny, tiny-ppo: further
        ("tiny-pp", ["tiny", "tiny-long", "tiny-ppo"], "did you mean tiny-ppo?"),
        ("wrte", ["write", "wrote", "make"], "did you mean wrote or write?"),  # as close: both
        ("tny", ["tiny", "tiny-long", "tiny-ppo"], "did you mean tiny?"),
        ("medium", ["short", "long", "explore"], ""),  # nothing close: no guess
        ("x", [], ""),
    ],
)
def test_the_closest_names_are_suggested_closest_first_and_none_when_nothing_is_close(name, known, said):
    assert did_you_mean(name, known) == said


def test_an_unknown_name_is_one_line_with_the_suggestion_and_every_choice():
    error = UnknownName("--families", "shrot", ["short", "long", "explore"])
    assert str(error) == "--families 'shrot': did you mean short? (choose one of short, long, explore)"
    assert isinstance(error, ConfigError) and (error.name, error.known) == ("shrot", ["short", "long", "explore"])
    assert str(UnknownName("--track", "x", ["", "wandb"])) == "--track 'x': choose one of '', wandb"


def test_a_mistyped_bundled_task_names_the_closest_bundled_ones():
    assert "file-ops/organize-by-extension" in bundled_task_names() and len(bundled_task_names()) >= 15
    with pytest.raises(TaskError) as caught:
        resolve_task("file-ops/organise-by-extension")
    message = str(caught.value)
    assert message.endswith(
        "nor is it a bundled task (termgym list names them); did you mean file-ops/organize-by-extension?"
    )
    assert "\n" not in message
    with pytest.raises(TaskError, match="did you mean file-ops/organize-by-extension"):
        resolve_task("termgym/file-ops/organize-by-extensio")  # the namespaced spelling too
    with pytest.raises(TaskError, match=r"task directory does not exist, nor is it a bundled task \(termgym list"):
        resolve_task("/no/such/place")  # nothing close: no guess
    assert is_task_name("file-ops/organize-by-extension") and not is_task_name("file-ops/organise-by-extension")


@pytest.mark.parametrize("command", [["check"], ["run", "--simulate"], ["audit", "-k", "1"]])
def test_the_commands_that_take_a_task_suggest_the_closest(command, capsys):
    assert termgym_main([*command, "text-processing/acess-log-report"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err.rstrip().endswith("did you mean text-processing/access-log-report?")


def test_a_mistyped_family_set_names_the_closest(tmp_path):
    with pytest.raises(UnknownName, match=r"unknown family set 'shrot': did you mean short\?"):
        make_task("train", 0, 0, "shrot")
    with pytest.raises(UnknownName, match=r"unknown split 'heldot': did you mean heldout\?"):
        generate_split(tmp_path, "heldot", 2, 0)
    cli = [sys.executable, "-m", "termgym.envs.families", str(tmp_path / "x"), "--count", "2", "--families", "explor"]
    result = subprocess.run(cli, capture_output=True, text=True, check=False)
    assert result.returncode == 2 and result.stderr.strip().splitlines() == [
        "error: unknown family set 'explor': did you mean explore? (choose one of short, long, explore, parts)"
    ]
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        (["--preset", "tny"], "--preset 'tny': did you mean tiny? (choose one of tiny, tiny-long, tiny-ppo)"),
        (
            ["--preset", "tiny-lng"],
            "--preset 'tiny-lng': did you mean tiny-long? (choose one of tiny, tiny-long, tiny-ppo)",
        ),
        (["--pool", "4", "--families", "shrot"], "--families 'shrot': did you mean short?"),
        (["--pool", "4", "--sft-first-families", "lng"], "--sft-first-families 'lng': did you mean long?"),
        (
            ["--mode", "cancl"],
            "--mode 'cancl': did you mean cancel? (choose one of wait, cancel, carry-over, reweight)",
        ),
        (
            ["--tasks", "file-ops/bulk-renam"],
            "nor is it a bundled task (termgym list names them); did you mean file-ops/bulk-rename?",
        ),
    ],
)
def test_the_trainer_suggests_the_closest_preset_family_set_mode_and_task(flags, said, tmp_path, capsys):
    pytest.importorskip("torch", reason="the train extra")
    assert termgym_main(["train", "--out", str(tmp_path / "run"), *flags]) == 2
    err = capsys.readouterr().err
    assert said in err and err.count("\n") == 1
    assert not (tmp_path / "run").exists()  # refused before any work


def typo(name: str) -> Any:
    """A name as a user gives it: unchecked by the type of the parameter it goes to."""
    return name


def test_the_other_name_lookups_suggest_the_same_way():
    from termgym.agents import make_agent
    from termgym.agents.renderers.formats import check_thinking, format_spec
    from termgym.sandboxes import backend_module
    from termgym.scheduling.scheduler import SchedulerConfig

    for look_up, said in (
        (lambda: backend_module("dokcer"), "unknown backend 'dokcer': did you mean docker?"),
        (lambda: make_agent("oracel"), "unknown agent 'oracel': did you mean oracle?"),
        (lambda: check_thinking("cycel"), "unknown thinking retention 'cycel': did you mean cycle?"),
        (lambda: format_spec("chatm"), "unknown chat format 'chatm': did you mean chatml?"),
        (lambda: SchedulerConfig(4, mode=typo("reweigh")), "unknown mode 'reweigh': did you mean reweight?"),
        (lambda: SchedulerConfig(4, clock=typo("wal")), "unknown clock 'wal': did you mean wall?"),
    ):
        with pytest.raises(UnknownName) as caught:
            look_up()
        assert str(caught.value).startswith(said), str(caught.value)


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["chek", "x"], "invalid choice: 'chek' (choose from 'check', "),
        (["check", "x", "--backend", "dokcer"], "invalid choice: 'dokcer' (choose from 'local', 'docker'"),
        (["check", "x", "--agent", "nul"], "invalid choice: 'nul' (choose from 'oracle', 'null'"),
    ],
)
def test_a_mistyped_subcommand_or_choice_on_the_command_line_gets_the_closest(args, said, capsys):
    assert termgym_main(args) == 2
    err = capsys.readouterr().err
    closest = {"chek": "check", "dokcer": "docker", "nul": "null"}[args[0] if args[0] == "chek" else args[-1]]
    assert said in err and f"; did you mean {closest}? (see termgym" in err and err.count("\n") == 1


def test_a_choice_close_to_none_is_argparses_line_alone(capsys):
    assert termgym_main(["check", "x", "--backend", "zzz"]) == 2
    err = capsys.readouterr().err
    assert "invalid choice: 'zzz'" in err and "did you mean" not in err
