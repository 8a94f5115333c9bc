"""The audit's pure logic: scores, verdicts, leakage, splitting solutions, the judge's answers."""

from __future__ import annotations

import pytest

from termgym.audit.judge import JudgeError, parse_answer
from termgym.audit.rubric import (
    WEIGHTS,
    MechanicalFindings,
    Reject,
    RunResult,
    decide,
    find_leaks,
    merge_leaks,
    prefix_lengths,
    scan_roots,
    select_order,
    solution_prefixes,
    split_top_level,
    weighted_score,
)

OK = RunResult(6, 6, True)
NULL = RunResult(1, 6, False)


def findings(**changes) -> MechanicalFindings:
    base = dict(
        oracle=(OK, OK, OK), null=NULL, prefixes=((2, RunResult(3, 6, False)),), steps=4, deterministic=True, leaks=()
    )
    return MechanicalFindings(**{**base, **changes})


def test_weights_sum_to_one_and_match_the_rubric_groups():
    assert sum(WEIGHTS.values()) == pytest.approx(1.0)
    verifier = WEIGHTS["instruction_verifier_alignment"] + WEIGHTS["verifier_correctness"] + WEIGHTS["granularity"]
    solution = WEIGHTS["solution_reliability"] + WEIGHTS["solution_legitimacy"]
    instruction = WEIGHTS["instruction_clarity"] + WEIGHTS["instruction_completeness"]
    assert (verifier, solution, instruction, WEIGHTS["task_value"]) == pytest.approx((0.45, 0.25, 0.20, 0.10))
    assert len(WEIGHTS) == 8 and WEIGHTS["instruction_verifier_alignment"] == pytest.approx(0.20)


@pytest.mark.parametrize(
    ("scores", "expected"),
    [
        ({}, 0.0),
        ({"verifier_correctness": 1.0}, 1.0),
        ({"verifier_correctness": 1.0, "granularity": 0.0}, 0.6),  # 0.15 / 0.25: renormalised
        ({"verifier_correctness": 0.5, "granularity": 0.5, "solution_reliability": 0.5}, 0.5),
        ({"task_value": 2.0}, 1.0),  # clamped
        ({d: 1.0 for d in WEIGHTS}, 1.0),
    ],
)
def test_weighted_score_renormalises_over_what_ran(scores, expected):
    assert weighted_score(scores) == pytest.approx(expected)


def test_weighted_score_rejects_unknown_dimensions():
    with pytest.raises(ValueError, match="unknown rubric"):
        weighted_score({"vibes": 1.0})


@pytest.mark.parametrize(
    ("changes", "kinds"),
    [
        ({}, []),
        ({"oracle": (RunResult(2, 6, False),) * 3}, ["solution_fails"]),
        ({"oracle": (OK, RunResult(5, 6, False), OK)}, ["flaky"]),
        ({"deterministic": False}, ["flaky"]),
        ({"null": RunResult(6, 6, True)}, ["weak_verifier"]),
        ({"oracle": (RunResult(0, 0, False),), "null": RunResult(0, 0, False)}, ["solution_fails", "weak_verifier"]),
        (
            {"leaks": ("tests/expected.txt is in the environment as data/expected.txt (same content)",)},
            ["test_leakage"],
        ),
    ],
)
def test_hard_rejects(changes, kinds):
    verdict = decide("t", findings(**changes))
    assert [r.kind for r in verdict.rejects] == kinds
    assert verdict.accepted == (not kinds)


@pytest.mark.parametrize(
    ("prefixes", "steps", "flagged", "partial"),
    [
        (((2, RunResult(3, 6, False)),), 4, False, 1.0),
        (((1, RunResult(1, 6, False)), (2, RunResult(6, 6, True))), 3, True, 0.0),  # nothing beyond null, then all
        (((1, RunResult(0, 6, False)),), 2, True, 0.0),
        ((), 1, False, 0.5),  # a one-step solution: not measurable
    ],
)
def test_partial_credit_and_binary_in_disguise(prefixes, steps, flagged, partial):
    verdict = decide("t", findings(prefixes=prefixes, steps=steps))
    assert ("binary_in_disguise" in [f.kind for f in verdict.flags]) == flagged
    assert verdict.scores["granularity"] == pytest.approx(0.5 * 6 / 20 + 0.5 * partial)
    assert not verdict.rejects  # a flag lowers the score, it does not reject


def test_mechanical_scores_and_judge_merge():
    verdict = decide("t", findings())
    assert verdict.scores == pytest.approx(
        {"verifier_correctness": 5 / 6, "granularity": 0.5 * 6 / 20 + 0.5, "solution_reliability": 1.0}
    )
    assert verdict.judge == "not run"
    judged = decide(
        "t", findings(), {"task_value": 0.0, "verifier_correctness": 0.0}, [Reject("hidden_requirements", "x")]
    )
    assert judged.scores["verifier_correctness"] == pytest.approx(5 / 6)  # a judge cannot override a measurement
    assert judged.scores["task_value"] == 0.0 and judged.judge == "ran"
    assert not judged.accepted and judged.rejects[0].kind == "hidden_requirements"


def test_low_score_is_not_accepted_and_select_order_is_by_score():
    weak = decide("weak", findings(null=RunResult(5, 6, False)), min_score=0.9)
    assert not weak.rejects and not weak.accepted
    a = decide("a", findings())
    b = decide("b", findings(prefixes=()))
    c = decide("c", findings(deterministic=False))
    assert select_order([c, b, a, weak]) == ["a", "b"]


def test_find_leaks_by_content_and_by_path():
    protected = {
        "tests": [("test.sh", "h1"), ("data/expected.txt", "h2"), ("empty", "e0")],
        "solution": [("solve.sh", "h3")],
    }
    assert (
        find_leaks(protected, [("Dockerfile", "h9"), ("test.sh", "other"), ("empty", "e0")], min_bytes_hash="e0") == []
    )
    leaks = find_leaks(protected, [("copy/answers.txt", "h2"), ("solve.sh", "h3"), ("data/expected.txt", "x")])
    assert leaks == [
        "tests/data/expected.txt is in the environment as copy/answers.txt (same content)",
        "solution/solve.sh is in the environment as solve.sh (same content)",
    ]
    assert find_leaks({"tests": [("data/x", "a")]}, [("data/x", "b")]) == ["tests/data/x is in the environment by path"]
    assert find_leaks({"tests": [("x", "a")]}, [("tests/x", "b")]) == ["tests/x is in the environment by path"]


@pytest.mark.parametrize(
    ("script", "ends"),
    [
        ("#!/bin/bash\nset -e\n\n# comment\necho done > /app/x\n", [1, 4]),
        ("a \\\n  b\nc |\n  d\ne &&\n f\n", [1, 3, 5]),
        ("cat > f <<'EOF'\nif x; then\nEOF\nchmod +x f\n", [2, 3]),
        ("cat <<-END > f\n\tdone\n\tEND\nx\n", [2, 3]),
        ('for f in *; do\n  mv "$f" x\ndone\nls\n', [2, 3]),
        ("case $x in\n  a) y ;;\n  *) z ;;\nesac\n", [3]),
        ("{ find a\n  find b; } | sort\nf() {\n  echo hi\n}\n", [1, 4]),
        ("echo 'a\nb'\necho \"c # not a comment\"\n", [1, 2]),
        ("x=$(echo (\n", None),  # unbalanced: not split
        ("if true; then\n  echo\n", None),
        ("done\n", None),
        ("echo done; echo fi\n", [0]),
        ('while read -r l; do echo "$l"; done < f\n', [0]),
        ("for ((i = 0; i < 3; i++)); do echo $i; done\n", [0]),
    ],
)
def test_split_top_level(script, ends):
    assert split_top_level(script) == ends


@pytest.mark.parametrize(
    ("steps", "lengths"), [(0, []), (1, []), (2, [1]), (3, [1, 2]), (4, [1, 2, 3]), (9, [2, 5, 8])]
)
def test_prefix_lengths(steps, lengths):
    assert prefix_lengths(steps) == lengths


def test_solution_prefixes_cut_after_whole_commands():
    script = "#!/bin/bash\nset -e\nfor i in 1 2; do\n  echo $i\ndone\necho b > /app/b\n"
    prefixes, steps = solution_prefixes(script)
    assert steps == 3
    assert prefixes == [(1, "#!/bin/bash\nset -e\n"), (2, "#!/bin/bash\nset -e\nfor i in 1 2; do\n  echo $i\ndone\n")]
    assert solution_prefixes("if x; then\n") == ([], 1)


def test_parse_answer_defensively():
    answer = parse_answer(
        'Sure! ```json\n{"scores": {"task_value": 4, "instruction_clarity": 5, "vibes": 3, "verifier_correctness": "x"},'
        ' "reasons": {"task_value": "useful"}, "hard_rejects": [{"kind": "hidden_requirements", "reason": "checks\\nmode"},'
        ' {"kind": "made_up", "reason": "?"}, "junk"]}\n```'
    )
    assert answer.scores == {"task_value": pytest.approx(0.8), "instruction_clarity": 1.0}  # 1-5 scale rescaled
    assert answer.reasons == {"task_value": "useful"}
    assert answer.rejects == [Reject("hidden_requirements", "judge: checks mode")]
    assert parse_answer('{"scores": {"task_value": 0.25}}').scores == {"task_value": 0.25}


@pytest.mark.parametrize(
    "content",
    ["no json here", '{"scores": []}', '{"scores": {"vibes": 1}}', '{"scores": {"task_value": -1}}', "{broken"],
)
def test_parse_answer_without_usable_scores_raises(content):
    with pytest.raises(JudgeError):
        parse_answer(content)


def test_scan_roots_and_merge_leaks():
    roots = scan_roots(["/app/data/", "/opt/tool/bin/run.sh", "/tests/x", "/etc/conf"], ["/", "/app", "/solution"])
    assert roots == ["/app", "/app/data", "/etc", "/opt/tool/bin"]
    merged = merge_leaks(
        ["tests/a is in the environment as a (same content)"],
        [
            "tests/a is in the environment as /app/a (same content)",
            "tests/b is in the environment as /app/b (same content)",
        ],
    )
    assert merged == [
        "tests/a is in the environment as a (same content)",
        "tests/b is in the environment as /app/b (same content)",
    ]


def test_content_copied_in_the_sandbox_is_a_flag_not_a_reject():
    verdict = decide("t", findings(sandbox_copies=("tests/m is in the environment as /app/m (same content)",)))
    assert verdict.accepted and kinds_of(verdict.flags) == ["test_content_in_sandbox"]
    assert verdict.checks["leakage"] == "1 in sandbox?"
    both = decide("t", findings(leaks=("a",), sandbox_copies=("b",)))
    assert both.checks["leakage"] == "1 in context, 1 in sandbox?" and not both.accepted


def kinds_of(items) -> list[str]:
    return [item.kind for item in items]


def test_an_audited_count_holds_a_task_that_declares_none(tmp_path):
    from dataclasses import replace

    from termgym.audit.rubric import Verdict, with_audited_count
    from termgym.tasks import load_task
    from tests.helpers import write_task

    verdict = Verdict(task="demo", scores={}, score=1.0, rejects=[], accepted=True, checks={"assertions": "7/20"})
    task = load_task(write_task(tmp_path))
    assert verdict.assertions == 7 and with_audited_count(task, verdict).expected_assertions == 7
    declared = replace(task, expected_assertions=3)
    assert with_audited_count(declared, verdict).expected_assertions == 3  # a declaration wins
    unknown = Verdict(task="demo", scores={}, score=0.0, rejects=[], accepted=False, checks={"assertions": "0/20"})
    assert unknown.assertions is None and with_audited_count(task, unknown) is task
