"""The parametric task families (termgym.envs.families): determinism, disjoint splits, sound
verifiers with partial credit on the embedded backend, and the audit's acceptance."""

from __future__ import annotations

import asyncio
import json
import random
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from termgym.agents import NullAgent, OracleAgent, ScriptedAgent
from termgym.audit.runner import audit_tasks
from termgym.envs.families import (
    FAMILIES,
    FAMILY_SETS,
    HELDOUT_ONLY,
    TRAIN_FAMILIES,
    NamePool,
    TaskSpec,
    generate_split,
    make_task,
    reference_commands,
    split_of,
    write_task,
)
from termgym.envs.families.names import MAX_LENGTH, MIN_LENGTH
from termgym.episode.options import EnvOptions
from termgym.tasks import discover_tasks, load_task
from termgym.tasks.bundled import bundled_root, bundled_task_paths
from termgym.trial import run_trial
from tests.helpers import REPO_ROOT

OPTIONS = EnvOptions(run_id="families-test")
ROOT = REPO_ROOT


def one_of_each(split: str = "heldout", seed: int = 0, family_set: str = "short") -> dict[str, TaskSpec]:
    n = len(FAMILY_SETS[family_set].families)
    return {make_task(split, seed, i, family_set).family: make_task(split, seed, i, family_set) for i in range(n)}


EVERY_FAMILY = [(name, family) for name, chosen in FAMILY_SETS.items() for family in chosen.families]


def tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


# -- pure generation -----------------------------------------------------------------------------


def test_same_seed_same_files_and_another_seed_other_names(tmp_path):
    a = generate_split(tmp_path / "a", "train", 20, seed=3)
    b = generate_split(tmp_path / "b", "train", 20, seed=3)
    c = generate_split(tmp_path / "c", "train", 20, seed=4)
    assert [p.name for p in a] == [p.name for p in b] == [p.name for p in c]
    assert tree(tmp_path / "a") == tree(tmp_path / "b")

    def instructions(paths: list[Path]) -> list[str]:
        return [(p / "instruction.md").read_text() for p in paths]

    assert sum(x != y for x, y in zip(instructions(a), instructions(c))) >= 18


def test_a_smaller_split_is_a_prefix_of_a_larger_one(tmp_path):
    small = generate_split(tmp_path / "s", "heldout", 7, seed=1)
    large = generate_split(tmp_path / "l", "heldout", 30, seed=1)
    for p in small:
        assert tree(p) == tree(tmp_path / "l" / p.name)
    assert len(large) == 30


def test_first_continues_a_split_with_tasks_it_does_not_hold(tmp_path):
    pool = generate_split(tmp_path / "pool", "train", 10, seed=2)
    more = generate_split(tmp_path / "more", "train", 5, seed=2, first=10)
    whole = generate_split(tmp_path / "whole", "train", 15, seed=2)
    assert [p.name for p in more] == [p.name for p in whole[10:]]
    assert not {p.name for p in more} & {p.name for p in pool}
    for p in more:
        assert tree(p) == tree(tmp_path / "whole" / p.name)
    assert json.loads((tmp_path / "more" / "split.json").read_text())["first"] == 10
    with pytest.raises(ValueError, match="first must be"):
        generate_split(tmp_path / "bad", "train", 5, seed=2, first=-1)


@pytest.mark.parametrize("family_set", list(FAMILY_SETS))
@pytest.mark.parametrize("seeds", [(0, 0), (0, 1), (7, 3), (123, 456)])
def test_no_heldout_name_or_word_ever_occurs_in_training(seeds, family_set):
    train_seed, heldout_seed = seeds
    train = [make_task("train", train_seed, i, family_set) for i in range(400)]
    heldout = [make_task("heldout", heldout_seed, i, family_set) for i in range(120)]
    train_words = {w for t in train for w in t.params}
    heldout_words = {w for t in heldout for w in t.params}
    assert train_words and heldout_words and not train_words & heldout_words
    assert all(split_of(w) == "train" for w in train_words)
    assert all(split_of(w) == "heldout" for w in heldout_words)
    # and no held-out word appears anywhere in a training task's text
    train_text = " ".join(t.instruction + " " + " ".join(t.commands) for t in train)
    tokens = set(train_text.replace("/", " ").replace(".", " ").replace(",", " ").split())
    assert not tokens & heldout_words


def test_name_pool_draws_fresh_varied_pronounceable_names():
    rng = random.Random(0)
    pool = NamePool("train")
    words = [w for _ in range(500) for w in pool.draw(rng, 2)]
    assert len(set(words)) > 950  # fresh: almost never repeated
    assert {len(w) for w in words} == set(range(MIN_LENGTH, MAX_LENGTH + 1))
    assert all(w.isascii() and w.isalpha() and w.islower() for w in words)
    assert all(split_of(w) == "train" for w in words)
    with pytest.raises(ValueError, match="unknown split"):
        NamePool("test")


def test_heldout_only_family_never_in_train_and_families_are_balanced(tmp_path):
    generate_split(tmp_path / "train", "train", 50, seed=0)
    generate_split(tmp_path / "heldout", "heldout", 12, seed=0)
    train = json.loads((tmp_path / "train" / "split.json").read_text())
    heldout = json.loads((tmp_path / "heldout" / "split.json").read_text())
    train_families = [t["family"] for t in train["tasks"]]
    assert set(HELDOUT_ONLY) and not set(HELDOUT_ONLY) & set(train_families)
    assert set(train_families) == set(TRAIN_FAMILIES) and set(train["families"]) == set(TRAIN_FAMILIES)
    assert {train_families.count(f) for f in TRAIN_FAMILIES} == {10}
    assert sorted(t["family"] for t in heldout["tasks"]) == sorted(list(FAMILIES) * 2)
    assert (train["split"], train["seed"], heldout["split"]) == ("train", 0, "heldout")
    for entry in train["tasks"]:
        meta = tomllib.loads((tmp_path / "train" / entry["dir"] / "task.toml").read_text())["metadata"]
        assert (meta["category"], meta["split"], meta["seed"]) == (entry["family"], "train", 0)


VERBS = (">", "echo", "mkdir", "-p", "cp", "cat", "ls")


@pytest.mark.parametrize("family_set", list(FAMILY_SETS))
def test_every_command_is_copied_from_the_instruction_or_from_what_a_look_showed(family_set):
    """Every word of a command is in the instruction, except after a look (``cat``, ``ls``), where
    it may be what the look showed: a name in the environment's files."""
    for split in ("train", "heldout"):
        for i in range(60):
            spec = make_task(split, 5, i, family_set)
            shown = " ".join(f"{path} {content}" for path, content in spec.files)
            for index, command in enumerate(spec.commands):
                looked = any(look < index for look in spec.looks)
                for token in command.split():
                    if token in VERBS or token in spec.instruction:
                        continue
                    assert looked and token.removeprefix("/app/") in shown, (spec.name, token)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_turns_and_assertion_counts(family):
    spec = one_of_each()[family]
    turns = {"write-file": 1, "make-dir": 1, "copy-file": 1, "dir-and-file": 2, "dir-file-copy": 3, "two-files": 2}
    assert len(spec.commands) == turns[family]
    assert 3 <= len(spec.assertions) <= 6


def test_the_long_set_has_many_assertions_and_one_family_far_longer_than_the_rest():
    turns: dict[str, set[int]] = {}
    for i in range(200):
        spec = make_task("heldout", 0, i, "long")
        assert 8 <= len(spec.assertions) <= 20, spec.name
        turns.setdefault(spec.family, set()).add(len(spec.commands))
    assert turns == {
        "file-set": {4, 5},
        "dir-files": {4, 5},
        "nested-tree": {5},
        "copy-chain": {6, 7, 8},
        "two-dirs": {5},
    }
    assert FAMILY_SETS["long"].heldout_only == ("two-dirs",)
    assert not set(FAMILY_SETS["long"].families) & set(FAMILIES)  # no family shared with the short set


def test_the_long_set_splits_like_the_short_one(tmp_path):
    train = generate_split(tmp_path / "train", "train", 40, seed=0, family_set="long")
    listing = json.loads((tmp_path / "train" / "split.json").read_text())
    assert listing["family_set"] == "long" and "two-dirs" not in listing["families"]
    assert {t["family"] for t in listing["tasks"]} == set(FAMILY_SETS["long"].train_families)
    assert [p.name for p in train[:4]] == ["file-set-0000", "dir-files-0001", "nested-tree-0002", "copy-chain-0003"]
    heldout = generate_split(tmp_path / "heldout", "heldout", 10, seed=0, family_set="long")
    assert sorted(p.name.rsplit("-", 1)[0] for p in heldout) == sorted(list(FAMILY_SETS["long"].families) * 2)
    # another set, the same indices: other tasks (its own seeds), and the short set is unchanged
    assert make_task("train", 0, 0, "long").instruction != make_task("train", 0, 0).instruction
    assert make_task("train", 0, 0) == make_task("train", 0, 0, "short")
    with pytest.raises(ValueError, match="unknown family set"):
        make_task("train", 0, 0, "medium")


def test_reference_commands_round_trip(tmp_path):
    for i, spec in enumerate(one_of_each().values()):
        path = write_task(spec, tmp_path / spec.name, split="heldout", seed=0, index=i)
        assert reference_commands(path) == list(spec.commands)
        assert load_task(path).family == spec.family
    bad = tmp_path / "bad"
    (bad / "solution").mkdir(parents=True)
    (bad / "solution" / "solve.sh").write_text("#!/bin/bash\nset -e\n")
    with pytest.raises(ValueError, match="not a generated solution"):
        reference_commands(bad)


def test_bad_input_is_one_line_and_a_nonzero_exit(tmp_path):
    with pytest.raises(ValueError, match="unknown split"):
        generate_split(tmp_path, "test", 3, 0)
    with pytest.raises(ValueError, match="count"):
        generate_split(tmp_path, "train", 0, 0)
    generate_split(tmp_path / "x", "train", 2, 0)
    with pytest.raises(ValueError, match="already exists"):
        generate_split(tmp_path / "x", "train", 2, 0)
    cli = [sys.executable, "-m", "termgym.envs.families"]
    bad = subprocess.run([*cli, str(tmp_path / "x"), "--count", "2"], capture_output=True, text=True, check=False)
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1 and "already exists" in bad.stderr
    for args in (["--count", "many"], ["--split", "test"], []):
        usage = subprocess.run([*cli, *args], capture_output=True, text=True, check=False)
        assert usage.returncode == 2 and len(usage.stderr.strip().splitlines()) == 1, usage.stderr
    good = subprocess.run(
        [*cli, str(tmp_path / "y"), "--split", "heldout", "--count", "6"], capture_output=True, text=True, check=False
    )
    assert good.returncode == 0, good.stderr
    assert len(discover_tasks(tmp_path / "y")) == 6
    # the same split in another process (another hash seed): the same files
    generate_split(tmp_path / "z", "heldout", 6, 0)
    assert tree(tmp_path / "y") == tree(tmp_path / "z")


def test_bundled_task_scans_ignore_the_package():
    assert (bundled_root() / "families" / "__init__.py").is_file()
    assert not any("families" in p.parts for p in bundled_task_paths())
    assert not any("families" in t.path.parts for t in discover_tasks(bundled_root()))


def test_tokenizer_corpus_ignores_the_package():
    pytest.importorskip("tokenizers")
    from termgym.trainer.models import corpus_texts

    sources = {p.read_text() for p in (bundled_root() / "families").glob("*.py")}
    assert not sources & set(corpus_texts(bundled_root()))


# -- on the embedded backend ---------------------------------------------------------------------


@pytest.mark.parametrize(("family_set", "family"), EVERY_FAMILY)
async def test_oracle_resolves_null_fails_and_prefixes_earn_partial_credit(family_set, family, tmp_path, no_leaks):
    spec = one_of_each(family_set=family_set)[family]
    task = load_task(write_task(spec, tmp_path / spec.name, split="heldout", seed=0, index=0))
    oracle, null = await asyncio.gather(run_trial(task, OracleAgent(), OPTIONS), run_trial(task, NullAgent(), OPTIONS))
    assert oracle.error is None and oracle.resolved and oracle.passed == oracle.total == len(spec.assertions)
    assert null.error is None and null.passed == 0  # doing nothing earns nothing
    scores = [null.passed]
    for keep in range(1, len(spec.commands)):
        prefix = await run_trial(task, ScriptedAgent(spec.commands[:keep]), OPTIONS)
        looked = keep - 1 in spec.looks
        assert not looked or prefix.passed == scores[-1], keep  # a look changes nothing
        scores += [] if looked else [prefix.passed]
    scores.append(oracle.passed)
    assert scores == sorted(set(scores)), scores  # every command but a look earns more credit


def misspell(command: str) -> str:
    """The command with its last path (or word) misspelt: one extra letter."""
    return command + "x"


@pytest.mark.parametrize(("family_set", "family"), EVERY_FAMILY)
async def test_trying_with_a_misspelt_name_never_scores_below_stopping(family_set, family, tmp_path, no_leaks):
    """After each prefix of the reference, a misspelt next command (a wrong file or directory
    created, or a command that fails) earns at least what stopping there earns: otherwise a policy
    learns to fail harmlessly instead of trying (PPO did, against the old "nothing else in /app"
    check, which an untouched /app passed)."""
    spec = one_of_each(family_set=family_set)[family]
    task = load_task(write_task(spec, tmp_path / spec.name, split="heldout", seed=0, index=0))
    for keep in range(len(spec.commands)):
        prefix, wrong = spec.commands[:keep], spec.commands[keep]
        stopped, tried, failed = await asyncio.gather(
            run_trial(task, ScriptedAgent(prefix), OPTIONS),
            run_trial(task, ScriptedAgent((*prefix, misspell(wrong))), OPTIONS),
            run_trial(task, ScriptedAgent((*prefix, f"echo x > /app/missing/{keep}.txt")), OPTIONS),
        )
        assert tried.passed >= stopped.passed, (keep, misspell(wrong), tried.assertions)
        assert failed.passed == stopped.passed, (keep, failed.assertions)  # a failed command changes nothing


async def test_the_reference_commands_one_per_turn_resolve_the_task(tmp_path, no_leaks):
    spec = one_of_each()["dir-file-copy"]
    path = write_task(spec, tmp_path / spec.name, split="heldout", seed=0, index=0)
    record = await run_trial(load_task(path), ScriptedAgent(tuple(reference_commands(path))), OPTIONS)
    assert record.resolved and record.turns >= 3


async def test_near_misses_are_graded_strictly(tmp_path, no_leaks):
    spec = one_of_each()["write-file"]
    task = load_task(write_task(spec, tmp_path / spec.name, split="heldout", seed=0, index=0))
    name, word = spec.params
    wrong = await run_trial(task, ScriptedAgent((f"echo {word} {word} > /app/{name}.txt",)), OPTIONS)
    assert not wrong.resolved and wrong.passed == 3  # exists, mentions, nothing else; not exact
    extra = await run_trial(task, ScriptedAgent((f"printf '{word}\\n\\n' > /app/{name}.txt", "touch /app/x")), OPTIONS)
    assert [a["passed"] for a in extra.assertions] == [True, True, True, False]


@pytest.mark.parametrize(("family_set", "multi_turn"), [("short", 3), ("long", 5), ("explore", 4)])
async def test_the_audit_accepts_a_sample_of_every_family(family_set, multi_turn, tmp_path, no_leaks):
    paths = generate_split(tmp_path / "h", "heldout", len(FAMILY_SETS[family_set].families), 11, family_set=family_set)
    verdicts = await audit_tasks([load_task(p) for p in paths], OPTIONS, k=2, concurrency=3)
    assert all(v.accepted for v in verdicts), [v.to_dict() for v in verdicts if not v.accepted]
    # a family that looks first earns its credit in its last command: the audit flags (does not
    # reject) that no prefix earns any; no other family is flagged
    looking = {f for f, spec in one_of_each(family_set=family_set).items() if spec.looks}
    for verdict in verdicts:
        family = load_task(paths[verdicts.index(verdict)]).family
        expected = ["binary_in_disguise"] if family in looking else []
        assert [flag.kind for flag in verdict.flags] == expected, (family, verdict.flags)
    multi = [v for v in verdicts if v.checks["partial"] != "n/a" and not v.flags]
    assert len(multi) == multi_turn - len(looking) and all(v.scores["granularity"] > 0.5 for v in multi)


# -- the scripted teacher (the explore set's flaws) ----------------------------------------------


def test_the_explore_set_gives_every_family_one_flaw_at_its_stated_rate_and_two_must_look():
    explore = FAMILY_SETS["explore"]
    specs = one_of_each(family_set="explore")
    assert set(specs) == set(explore.families) and explore.heldout_only == ("two-files",)
    rates = {family: [f.rate for f in spec.flaws] for family, spec in specs.items()}
    assert rates == {
        "write-file": [0.3],
        "make-path": [0.6],
        "copy-file": [0.6],
        "dir-and-file": [0.6],
        "read-config": [0.6],
        "find-file": [0.6],
        "two-files": [0.6],
    }
    assert {f for f, spec in specs.items() if spec.looks} == {"read-config", "find-file"}
    from termgym.envs.families.explore import find_file, read_config
    from termgym.envs.families.names import RESERVED

    assert {read_config.KEY, find_file.GUESS} <= RESERVED  # what the teacher guesses is never a drawn name
    # the short set is unchanged: no flaws, and the same tasks as before the explore set
    assert all(not spec.flaws and not spec.looks for spec in one_of_each().values())


def test_the_teacher_makes_each_mistake_at_its_rate_deterministically_per_seed(tmp_path):
    from termgym.envs.families.teacher import teacher_commands

    paths = generate_split(tmp_path / "t", "train", 600, seed=0, family_set="explore")
    choices = [teacher_commands(p, 0) for p in paths]
    assert choices == [teacher_commands(p, 0) for p in reversed(paths)][::-1]  # order-free
    assert choices != [teacher_commands(p, 1) for p in paths]  # another seed, other draws
    by_family: dict[str, list[bool]] = {}
    for path, choice in zip(paths, choices):
        spec_flaws = json.loads((path / "solution" / "teacher.json").read_text())["flaws"]
        flawed = choice.mistake is not None
        assert choice.commands == (tuple(spec_flaws[0]["commands"]) if flawed else tuple(reference_commands(path)))
        by_family.setdefault(path.name.rsplit("-", 1)[0], []).append(flawed)
    for family, flags in by_family.items():
        rate = FAMILY_SETS["explore"].families[family].make(random.Random(0), NamePool("train")).flaws[0].rate
        assert abs(sum(flags) / len(flags) - rate) < 0.12, (family, sum(flags) / len(flags))
    # a task of a family without flaws: the reference, always
    plain = generate_split(tmp_path / "s", "train", 1, seed=0)[0]
    assert teacher_commands(plain, 0).commands == tuple(reference_commands(plain))
    (paths[0] / "solution" / "teacher.json").write_text("{}")
    with pytest.raises(ValueError, match="not a teacher's list of flaws"):
        teacher_commands(paths[0], 0)


@pytest.mark.parametrize("family", list(FAMILY_SETS["explore"].families))
async def test_every_mistake_of_the_teacher_costs_assertions_and_never_resolves(family, tmp_path, no_leaks):
    spec = one_of_each(family_set="explore")[family]
    task = load_task(write_task(spec, tmp_path / spec.name, split="heldout", seed=0, index=0))
    for flaw in spec.flaws:
        flawed, right = await asyncio.gather(
            run_trial(task, ScriptedAgent(flaw.commands), OPTIONS),
            run_trial(task, ScriptedAgent(spec.commands), OPTIONS),
        )
        assert flawed.error is None and not flawed.resolved and flawed.passed < right.passed == right.total
