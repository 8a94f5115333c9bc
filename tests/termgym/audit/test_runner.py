"""The audit on the embedded backend: broken tasks caught for the right reason, bundled tasks accepted."""

from __future__ import annotations

import asyncio
import json
import textwrap
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar

import pytest

from termgym.audit.judge import OpenAIJudge
from termgym.audit.runner import audit_task, leakage
from termgym.episode.options import EnvOptions
from termgym.tasks import load_task
from tests.helpers import KIT_SOURCE, REPO_ROOT, termgym, write_task

OPTIONS = EnvOptions(run_id="audit-test")
THREE_STEPS = "#!/bin/bash\nset -e\necho a > /app/a\necho b > /app/b\necho c > /app/c\n"
PER_FILE_TEST = textwrap.dedent(f"""\
    #!/bin/sh
    {KIT_SOURCE}
    tg_check_sh "a written" 'grep -qx a /app/a'
    tg_check_sh "b written" 'grep -qx b /app/b'
    tg_check_sh "c written" 'grep -qx c /app/c'
    tg_finish
    """)


def audit(task_dir: Path, **kwargs):
    return asyncio.run(audit_task(load_task(task_dir), OPTIONS, k=kwargs.pop("k", 2), **kwargs))


def kinds(items) -> list[str]:
    return [item.kind for item in items]


def test_a_sound_multi_step_task_is_accepted_with_partial_credit(tmp_path, no_leaks):
    verdict = audit(write_task(tmp_path, solve_sh=THREE_STEPS, test_sh=PER_FILE_TEST))
    assert verdict.accepted, verdict.to_dict()
    assert verdict.rejects == [] and verdict.flags == []
    assert verdict.checks["oracle"] == "2/2" and verdict.checks["null"] == "0/3"
    assert verdict.checks["determinism"] == "same" and verdict.scores["granularity"] == pytest.approx(
        0.5 * 3 / 20 + 0.5
    )
    assert verdict.judge == "not run"


def test_verifier_that_passes_on_an_empty_sandbox_is_weak(tmp_path, no_leaks):
    test_sh = f'#!/bin/sh\n{KIT_SOURCE}\ntg_check "app exists" test -d /app\ntg_check "shell works" true\ntg_finish\n'
    verdict = audit(write_task(tmp_path, test_sh=test_sh))
    assert not verdict.accepted
    assert kinds(verdict.rejects) == ["weak_verifier"]
    assert "doing nothing resolves it" in verdict.rejects[0].reason


def test_tests_copied_into_the_image_leak(tmp_path, no_leaks):
    expected = "alpha\nbeta\n"
    task = write_task(
        tmp_path,
        dockerfile="FROM debian:bookworm-slim\nWORKDIR /app\nCOPY notes.txt /app/notes.txt\n",
        solve_sh="#!/bin/bash\nprintf 'alpha\\nbeta\\n' > /app/result.txt\n",
        test_sh=f'#!/bin/sh\n{KIT_SOURCE}\ntg_check "result matches" cmp /app/result.txt /tests/expected.txt\ntg_finish\n',
        extra_files={"tests/expected.txt": expected, "environment/notes.txt": expected},
    )
    verdict = audit(task, k=1)
    assert kinds(verdict.rejects) == ["test_leakage"]
    assert "tests/expected.txt is in the environment as notes.txt" in verdict.rejects[0].reason


def test_answers_written_into_the_image_by_a_run_step_are_flagged(tmp_path, no_leaks):
    task = write_task(
        tmp_path,
        dockerfile="FROM debian:bookworm-slim\nWORKDIR /app\nRUN mkdir -p /opt/data && printf 'alpha\\nbeta\\n' > /opt/data/.cache\nCOPY input.txt /opt/data/input.txt\n",
        solve_sh="#!/bin/bash\nprintf 'alpha\\nbeta\\n' > /app/result.txt\n",
        test_sh=f'#!/bin/sh\n{KIT_SOURCE}\ntg_check "result matches" cmp /app/result.txt /tests/expected.txt\ntg_finish\n',
        extra_files={"tests/expected.txt": "alpha\nbeta\n", "environment/input.txt": "unrelated\n"},
    )
    verdict = audit(task, k=1)
    assert kinds(verdict.flags) == ["test_content_in_sandbox"] and verdict.rejects == []
    assert verdict.flags[0].reason == "tests/expected.txt is in the environment as /opt/data/.cache (same content)"


def test_flaky_verifier_is_caught_by_verifying_twice(tmp_path, no_leaks):
    # Passes the first time it runs in a sandbox, fails every time after: fresh sandboxes all pass.
    test_sh = textwrap.dedent(f"""\
        #!/bin/sh
        {KIT_SOURCE}
        tg_check "result exists" test -f /app/result.txt
        tg_check_sh "first look" 'test ! -e /var/tmp/seen'
        touch /var/tmp/seen
        tg_finish
        """)
    verdict = audit(write_task(tmp_path, test_sh=test_sh))
    assert verdict.checks["oracle"] == "2/2" and verdict.checks["determinism"] == "differs"
    assert kinds(verdict.rejects) == ["flaky"]
    assert "verifying the same final state twice" in verdict.rejects[0].reason


def test_solution_that_fails_is_rejected(tmp_path, no_leaks):
    verdict = audit(write_task(tmp_path, solve_sh="#!/bin/bash\necho nope > /app/result.txt\n"))
    assert kinds(verdict.rejects) == ["solution_fails"]
    assert "0/2" in verdict.rejects[0].reason and "1/2 assertions passed" in verdict.rejects[0].reason


def test_a_verifier_that_runs_the_solutions_work_outside_the_work_directory_is_caught_until_declared(
    tmp_path, no_leaks
):
    """The reference solution installs a helper the verifier runs: the audit's oracle runs are
    scored as any agent's, so the task is rejected with the file named and the key to declare it;
    declared, it is accepted."""
    test_sh = (
        f"#!/bin/sh\n{KIT_SOURCE}\ntg_check_sh 'the helper says done' '[ \"$(/opt/helper/say)\" = done ]'\ntg_finish\n"
    )
    solve_sh = "#!/bin/sh\nmkdir -p /opt/helper && printf '#!/bin/sh\\necho done\\n' > /opt/helper/say && chmod +x /opt/helper/say\n"
    verdict = audit(write_task(tmp_path, "undeclared", test_sh=test_sh, solve_sh=solve_sh))
    assert kinds(verdict.rejects) == ["solution_fails"], verdict.rejects
    assert "tampered" in verdict.rejects[0].reason and "/opt/helper/say" in verdict.rejects[0].reason
    assert "[verifier].agent_paths" in verdict.rejects[0].reason
    declared = write_task(
        tmp_path, "declared", test_sh=test_sh, solve_sh=solve_sh, verifier_toml='agent_paths = ["/opt/helper"]'
    )
    assert audit(declared).accepted


def test_task_without_a_reference_solution_is_rejected_without_a_sandbox(tmp_path):
    task = write_task(tmp_path)
    (task / "solution" / "solve.sh").unlink()
    verdict = audit(task)
    assert kinds(verdict.rejects) == ["solution_fails"] and "no reference solution" in verdict.rejects[0].reason


def test_binary_in_disguise_is_flagged(tmp_path, no_leaks):
    # Every assertion needs all three files: the score jumps from none to all.
    all_three = "test -f /app/a && test -f /app/b && test -f /app/c"
    test_sh = (
        f"#!/bin/sh\n{KIT_SOURCE}\n"
        + "".join(f"tg_check_sh \"check {i}\" '{all_three}'\n" for i in range(3))
        + "tg_finish\n"
    )
    verdict = audit(write_task(tmp_path, solve_sh=THREE_STEPS, test_sh=test_sh), k=1)
    assert kinds(verdict.flags) == ["binary_in_disguise"]
    assert "1 steps 0/3, 2 steps 0/3" in verdict.flags[0].reason
    assert verdict.scores["granularity"] == pytest.approx(0.5 * 3 / 20)


def test_leakage_ignores_a_clean_build_context(task_dir):
    assert leakage(load_task(task_dir)) == ([], [])


class _Judge(BaseHTTPRequestHandler):
    requests: ClassVar[list[dict]] = []
    reply: ClassVar[dict] = {
        "scores": {d: 0.9 for d in ("instruction_verifier_alignment", "solution_legitimacy", "instruction_clarity")},
        "reasons": {"instruction_clarity": "names the path"},
        "hard_rejects": [{"kind": "hidden_requirements", "reason": "the tests check a trailing newline"}],
    }

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).requests.append({"path": self.path, "body": body})
        if body["model"] == "broken":
            self.send_response(500)
            self.end_headers()
            return
        content = "Here is my audit:\n" + json.dumps(self.reply)
        data = json.dumps({"choices": [{"message": {"role": "assistant", "content": content}}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@pytest.fixture
def judge_url():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Judge)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    _Judge.requests = []
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_judge_on_a_local_openai_compatible_server(tmp_path, judge_url, no_leaks):
    task = write_task(tmp_path, solve_sh=THREE_STEPS, test_sh=PER_FILE_TEST)
    verdict = audit(task, k=1, judge=OpenAIJudge(judge_url, "auditor"))
    request = _Judge.requests[0]
    assert request["path"] == "/v1/chat/completions" and request["body"]["model"] == "auditor"
    system, user = request["body"]["messages"]
    assert "instruction_verifier_alignment" in system["content"] and "hidden_requirements" in system["content"]
    assert "Write the word done" in user["content"] and "tg_check_sh" in user["content"]
    assert verdict.judge == "ran" and verdict.scores["instruction_clarity"] == pytest.approx(0.9)
    assert kinds(verdict.rejects) == ["hidden_requirements"] and not verdict.accepted


def test_judge_failure_is_reported_and_the_mechanical_verdict_stands(tmp_path, judge_url, no_leaks):
    task = write_task(tmp_path, solve_sh=THREE_STEPS, test_sh=PER_FILE_TEST)
    verdict = audit(task, k=1, judge=OpenAIJudge(judge_url + "/v1", "broken"))
    assert verdict.judge.startswith("failed:") and "500" in verdict.judge
    assert verdict.accepted and set(verdict.scores) == {"verifier_correctness", "granularity", "solution_reliability"}


def test_cli_strict_exits_1_on_a_reject_and_table_names_the_reason(tmp_path, no_leaks):
    task = write_task(tmp_path, solve_sh="#!/bin/bash\ntrue\n")
    result = termgym("audit", str(task), "--k", "1")
    assert result.returncode == 0, result.stderr
    assert "solution_fails" in result.stdout and "0/1 tasks accepted" in result.stdout
    assert termgym("audit", str(task), "--k", "1", "--strict").returncode == 1
    bad = termgym("audit", str(task), "--k", "0")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "--k" in bad.stderr


def test_every_bundled_task_passes_the_audit(tmp_path, no_leaks):
    envs = REPO_ROOT / "envs"
    selection = tmp_path / "selected.txt"
    result = termgym("audit", str(envs), "--k", "1", "-n", "4", "--json", "--select", str(selection))
    assert result.returncode == 0, result.stderr
    verdicts = json.loads(result.stdout)
    assert len(verdicts) == 20
    assert [v["task"] for v in verdicts if not v["accepted"]] == []
    lines = selection.read_text().splitlines()
    scores = {v["task"]: v["score"] for v in verdicts}
    ordered = [scores[load_task(line).name] for line in lines]
    assert len(lines) == 20 and ordered == sorted(ordered, reverse=True)


def test_cache_skips_unchanged_tasks_and_misses_on_any_changed_byte(tmp_path, no_leaks):
    from termgym.audit.cache import AuditCache
    from termgym.audit.runner import audit_tasks

    task_dir = write_task(tmp_path / "t", solve_sh=THREE_STEPS, test_sh=PER_FILE_TEST)
    cache = AuditCache()
    first = asyncio.run(audit_tasks([load_task(task_dir)], OPTIONS, k=1, cache=cache))
    assert cache.hits == 0 and len(cache.entries) == 1
    cache.save(tmp_path / "cache.json")
    reloaded = AuditCache.load(tmp_path / "cache.json")

    again = asyncio.run(audit_tasks([load_task(task_dir)], OPTIONS, k=1, cache=reloaded))
    assert reloaded.hits == 1 and [v.to_dict() for v in again] == [v.to_dict() for v in first]
    with open(task_dir / "tests" / "test.sh", "a") as handle:
        handle.write("# changed\n")
    asyncio.run(audit_tasks([load_task(task_dir)], OPTIONS, k=1, cache=reloaded))
    assert reloaded.hits == 1 and len(reloaded.entries) == 2  # a miss, audited and added
    asyncio.run(audit_tasks([load_task(task_dir)], OPTIONS, k=2, cache=reloaded))
    assert reloaded.hits == 1 and len(reloaded.entries) == 3  # another k is another audit


def test_cli_cache_is_written_then_used_and_a_bad_cache_is_one_line(tmp_path, no_leaks):
    task = write_task(tmp_path / "t", solve_sh=THREE_STEPS, test_sh=PER_FILE_TEST)
    cache = tmp_path / "cache.json"
    first = termgym("audit", str(task), "--k", "1", "--cache", str(cache))
    assert first.returncode == 0, first.stderr
    assert "0 verdicts from the cache" in first.stdout and cache.exists()
    second = termgym("audit", str(task), "--k", "1", "--cache", str(cache))
    assert "1 verdicts from the cache" in second.stdout and "1/1 tasks accepted" in second.stdout
    cache.write_text("[1, 2]")
    bad = termgym("audit", str(task), "--k", "1", "--cache", str(cache))
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "not an audit cache" in bad.stderr
