"""The ``parts`` family set (envs/families/parts.py): generation deterministic per seed, one part of
each kind in every task, the teacher's independent per-part mistakes at their rates, and, on the
embedded backend, each part's assertion passing exactly when its part is done (the oracle
resolves; a partial solution or a flawed one fails part by part)."""

from __future__ import annotations

import asyncio
import math
import random
from collections import Counter

import pytest

from termgym.agents import OracleAgent, ScriptedAgent
from termgym.audit.runner import audit_tasks
from termgym.envs.families import FAMILY_SETS, NamePool, generate_split, make_task, write_task
from termgym.envs.families.parts import FAMILIES, FORGETS_CONTENT, FORGETS_PARENTS, KINDS, MOVES, draw_parts, flaws_of
from termgym.envs.families.teacher import teacher_commands
from termgym.episode.options import EnvOptions
from termgym.tasks import load_task
from termgym.trial import run_trial

OPTIONS = EnvOptions(run_id="parts-test")
PARTS = {"three-parts": 3, "four-parts": 4, "five-parts": 5}
RATES = {"write": FORGETS_CONTENT, "nest": FORGETS_PARENTS, "copy": MOVES}


def kind_of(command: str) -> str:
    return {"echo": "write", "mkdir": "nest", "cp": "copy"}[command.split()[0]]


def test_the_set_has_three_families_of_three_to_five_parts_and_no_held_out_family():
    chosen = FAMILY_SETS["parts"]
    assert tuple(chosen.families) == tuple(PARTS) == tuple(FAMILIES) and chosen.heldout_only == ()
    assert chosen.split_families("train") == chosen.split_families("heldout") == tuple(PARTS)


def test_generation_is_deterministic_per_seed_and_differs_between_seeds(tmp_path):
    assert [make_task("train", 3, i, "parts") for i in range(12)] == [
        make_task("train", 3, i, "parts") for i in range(12)
    ]
    assert [make_task("train", 3, i, "parts") for i in range(12)] != [
        make_task("train", 4, i, "parts") for i in range(12)
    ]
    a = generate_split(tmp_path / "a", "heldout", 9, seed=5, family_set="parts")
    b = generate_split(tmp_path / "b", "heldout", 9, seed=5, family_set="parts")
    for x, y in zip(a, b):
        assert {p.relative_to(x): p.read_bytes() for p in x.rglob("*") if p.is_file()} == {
            p.relative_to(y): p.read_bytes() for p in y.rglob("*") if p.is_file()
        }


@pytest.mark.parametrize("split", ["train", "heldout"])
def test_every_task_has_a_part_of_each_kind_one_assertion_a_part_and_distinct_names(split):
    for i in range(90):
        spec = make_task(split, 0, i, "parts")
        count = PARTS[spec.family]
        assert len(spec.commands) == len(spec.assertions) == count
        kinds = Counter(kind_of(c) for c in spec.commands)
        assert set(kinds) == set(KINDS) and sum(kinds.values()) == count
        assert len(set(spec.params)) == len(spec.params)  # no part touches another's names
        assert len(spec.files) == kinds["copy"]  # a copy's source, and nothing else


def test_the_flaws_are_every_set_of_mistaken_parts_at_the_product_of_the_rates():
    parts = draw_parts(random.Random(1), NamePool("train", 5), 4)
    flaws = flaws_of(parts)
    assert len(flaws) == 2**4 - 1
    assert math.isclose(sum(f.rate for f in flaws), 1 - math.prod(1 - p.rate for p in parts))
    for flaw in flaws:
        wrong = {i for i, (typed, part) in enumerate(zip(flaw.commands, parts)) if typed != part.command}
        assert wrong and all(flaw.commands[i] == parts[i].flawed for i in wrong)
        expected = math.prod(p.rate if i in wrong else 1 - p.rate for i, p in enumerate(parts))
        assert math.isclose(flaw.rate, expected)
        assert {f"part {i + 1}" for i in wrong} == {m.split(":")[0] for m in flaw.mistake.split("; ")}


def test_the_teacher_errs_on_each_part_independently_at_its_kinds_rate(tmp_path):
    paths = generate_split(tmp_path / "t", "train", 300, seed=0, family_set="parts")
    errors: dict[str, list[bool]] = {kind: [] for kind in KINDS}
    resolved = []
    for path in paths:
        reference = (path / "solution" / "solve.sh").read_text().splitlines()[1:]
        typed = teacher_commands(path, 0).commands
        assert typed == teacher_commands(path, 0).commands  # deterministic per seed
        right = [t == r for t, r in zip(typed, reference)]
        for command, ok in zip(reference, right):
            errors[kind_of(command)].append(not ok)
        resolved.append(all(right))
    assert RATES == {"write": 0.3, "nest": 0.6, "copy": 0.6}
    for kind, flags in errors.items():
        assert abs(sum(flags) / len(flags) - RATES[kind]) < 0.06, (kind, sum(flags) / len(flags))
    assert 0.01 < sum(resolved) / len(resolved) < 0.12  # rarely all parts right
    assert [teacher_commands(p, 0).commands for p in paths] != [teacher_commands(p, 1).commands for p in paths]


# -- on the embedded backend ---------------------------------------------------------------------


def five_parts(tmp_path):
    spec = make_task("heldout", 0, 2, "parts")  # round-robin: three, four, five parts
    assert spec.family == "five-parts"
    return spec, load_task(write_task(spec, tmp_path / spec.name, split="heldout", seed=0, index=0))


def passed(record) -> list[bool]:
    return [a["passed"] for a in record.assertions]


async def test_the_oracle_resolves_and_each_part_left_out_fails_its_own_assertion_alone(tmp_path, no_leaks):
    spec, task = five_parts(tmp_path)
    oracle = await run_trial(task, OracleAgent(), OPTIONS)
    assert oracle.error is None and oracle.resolved and passed(oracle) == [True] * 5
    partial = await asyncio.gather(
        *(run_trial(task, ScriptedAgent(spec.commands[:i] + spec.commands[i + 1 :]), OPTIONS) for i in range(5))
    )
    for left_out, record in enumerate(partial):
        assert not record.resolved and passed(record) == [i != left_out for i in range(5)], left_out


async def test_each_mistake_of_the_teacher_fails_exactly_the_parts_it_names(tmp_path, no_leaks):
    spec, task = five_parts(tmp_path)
    singles = [f for f in spec.flaws if ";" not in f.mistake]
    everything = max(spec.flaws, key=lambda f: f.mistake.count(";"))
    records = await asyncio.gather(
        *(run_trial(task, ScriptedAgent(f.commands), OPTIONS) for f in (*singles, everything))
    )
    for flaw, record in zip((*singles, everything), records):
        wrong = [typed != right for typed, right in zip(flaw.commands, spec.commands)]
        assert record.error is None and not record.resolved and passed(record) == [not w for w in wrong], flaw.mistake
    assert len(singles) == 5 and passed(records[-1]) == [False] * 5


@pytest.mark.slow
async def test_the_audit_accepts_a_sample_of_every_family(tmp_path, no_leaks):
    paths = generate_split(tmp_path / "h", "heldout", 3, 11, family_set="parts")
    verdicts = await audit_tasks([load_task(p) for p in paths], OPTIONS, k=2, concurrency=3)
    assert all(v.accepted and not v.flags for v in verdicts), [v.to_dict() for v in verdicts]
