"""ATIF export (``termgym export atif``, ``termgym.atif``): every file a run exports validates against
an independent ATIF model package (``atif``, a test dependency) and termgym's own checks; turns,
commands, observations, token ids and the verifier's result land where the RFC puts them; Harbor's
published example passes the same checks; bad input is one line and exit 2."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from termgym import atif, atif_rules
from termgym.cli import main
from termgym.cli.export import export_atif
from termgym.records import TrialRecord, append_record
from termgym.transcript import SCHEMA, Transcript, write_transcript

models = pytest.importorskip("atif", reason="the test extra's ATIF models: pip install -e '.[test]'")
ValidationError = pytest.importorskip("pydantic").ValidationError
FIXTURES = Path(__file__).parent / "fixtures" / "atif"


def valid(data: dict) -> dict:
    """``data`` after both the independent models and termgym's own check accept it."""
    models.Trajectory.model_validate(data)
    assert atif_rules.check(data) == []
    return data


def exported(tmp_path: Path, run: Path, *, command: bool = True) -> list[dict]:
    """Every file ``termgym export atif RUN`` writes (``command=False``: its function, in a test
    that already runs an event loop), each validated."""
    out = tmp_path / "atif"
    if command:
        assert main(["export", "atif", str(run), "--out", str(out)]) == 0
    else:
        export_atif(run, out)
    return [valid(json.loads(p.read_text())) for p in sorted(out.glob("*.json"))]


def model_transcript() -> Transcript:
    """A model agent's episode on the tokens client: a command in the tool format, a bridged
    second prompt, an invalid reply, a new segment after a summary, then the submit."""
    t = Transcript(task="demo/task", agent="model", model="tiny", instruction="Make /app/x.", trial_id="t1")
    assert t.segment.reason == "start"  # the session opens its first segment before the first reply
    tokens = {"prompt_ids": [1, 2, 3], "bridge_ids": None, "completion_ids": [10, 11], "logprobs": [-0.5, -0.25]}
    t.reply(
        {
            "content": "I will create it.",
            "reasoning": "an empty file is enough",
            "tool_calls": [{"id": "c1", "name": "bash", "arguments": '{"command": "touch /app/x"}'}],
            "finish_reason": "tool_calls",
            "usage": {"prompt_tokens": 3, "completion_tokens": 2},
            "tokens": tokens,
            "latency": 0.1,
        }
    )
    t.step("touch /app/x", 5.0, {"output": "", "exit_code": 0, "timed_out": False, "duration": 0.01}, "(no output)")
    t.reply(
        {
            "content": "```bash\nls /app\n```",
            "tool_calls": [],
            "usage": {"prompt_tokens": 7, "completion_tokens": 1},
            "tokens": {"prompt_ids": None, "bridge_ids": [20, 21], "completion_ids": [12], "logprobs": [-1.0]},
        }
    )
    t.step("ls /app", None, {"output": "x\n" * 3, "exit_code": 0, "timed_out": False, "duration": 0.02}, "x\n[cut]")
    t.reply({"content": "hmm", "tool_calls": [], "usage": {"prompt_tokens": 9, "completion_tokens": 1}, "tokens": None})
    t.invalid("no command found", "Reply with one command.")
    t.new_segment("summary")
    t.reply(
        {
            "content": "",
            "tool_calls": [{"id": "c9", "name": "submit", "arguments": {}}],
            "usage": {"prompt_tokens": 4, "completion_tokens": 1},
            "tokens": {"prompt_ids": [1, 5, 6, 7], "bridge_ids": None, "completion_ids": [13], "logprobs": [-0.1]},
        }
    )
    t.submit()
    t.stop("submitted")
    t.usage.prompt_tokens, t.usage.completion_tokens, t.usage.requests = 23, 5, 4
    return t


RECORD = TrialRecord(
    task="demo/task",
    backend="local",
    agent="model",
    resolved=False,
    reward=0.1,
    passed=2,
    total=3,
    assertions=[{"name": "a", "passed": True}, {"name": "b", "passed": True}, {"name": "c", "passed": False}],
    report_format="ctrf",
    run_id="run-1",
    trial_id="t1",
    stop_reason="submitted",
)


def test_a_model_agents_turns_map_to_agent_steps_with_their_calls_observations_and_token_ids():
    data = valid(atif.from_transcript(model_transcript().to_dict(), json.loads(RECORD.to_json())))
    user, first, second, invalid, context, submit = data["steps"]
    assert user == {"step_id": 1, "source": "user", "message": "Make /app/x."}
    assert first["message"] == "I will create it." and first["reasoning_content"] == "an empty file is enough"
    assert first["tool_calls"][0] == {
        "tool_call_id": "c1",
        "function_name": "bash",
        "arguments": {"command": "touch /app/x"},
    }
    result = first["observation"]["results"][0]
    assert result["source_call_id"] == "c1" and result["content"] == "(no output)"
    assert result["extra"]["termgym"]["exit_code"] == 0
    assert first["metrics"] == {
        "prompt_tokens": 3,
        "completion_tokens": 2,
        "prompt_token_ids": [1, 2, 3],
        "completion_token_ids": [10, 11],
        "logprobs": [-0.5, -0.25],
    }
    # the bridged prompt is the whole prompt: the first prompt, its completion, then the bridge
    assert second["metrics"]["prompt_token_ids"] == [1, 2, 3, 10, 11, 20, 21]
    assert second["tool_calls"][0]["arguments"] == {"command": "ls /app"}
    assert second["tool_calls"][0]["extra"] == {"termgym": {"parsed_from_text": True}}
    shown = second["observation"]["results"][0]
    assert shown["content"] == "x\n[cut]" and shown["extra"]["termgym"]["output"] == "x\nx\nx\n"
    assert "tool_calls" not in invalid and invalid["observation"]["results"][0]["content"] == "Reply with one command."
    assert invalid["extra"]["termgym"]["action"] == {"kind": "invalid", "error": "no command found"}
    assert "completion_token_ids" not in invalid["metrics"]
    assert context["source"] == "system"
    assert context["extra"]["context_management"] == {"type": "compaction", "boundary": "replace"}
    assert submit["metrics"]["prompt_token_ids"] == [1, 5, 6, 7] and "observation" not in submit
    final = data["final_metrics"]
    assert final["total_prompt_tokens"] == 23 and final["total_completion_tokens"] == 5 and final["total_steps"] == 6
    assert final["extra"]["reward"] == 0.1 and (final["extra"]["passed"], final["extra"]["total"]) == (2, 3)
    assert [a["passed"] for a in final["extra"]["assertions"]] == [True, True, False]
    assert final["extra"]["stop_reason"] == "submitted" and final["extra"]["report_format"] == "ctrf"
    assert data["session_id"] == "run-1" and data["trajectory_id"] == "t1"
    assert data["agent"]["model_name"] == "tiny" and data["extra"]["termgym"]["record"]["backend"] == "local"


def harness_transcript() -> dict:
    """mini-swe-agent through the gateway: three answered calls (the second one failed and is
    not a step), two commands and the submit; the first call in the tool format."""

    def call(index, status, message, prompt=None, completion=None):
        response = {"choices": [{"message": message}]} if status == 200 else None
        return {
            "index": index,
            "status": status,
            "response": response,
            "prompt_ids": prompt,
            "completion_ids": completion,
            "logprobs": [-0.5] * len(completion) if completion else None,
            "usage": {"prompt_tokens": len(prompt or []), "completion_tokens": len(completion or [])},
        }

    tool = {"id": "b1", "type": "function", "function": {"name": "bash", "arguments": '{"command": "ls"}'}}
    t = Transcript(task="h/task", agent="mini-swe-agent", model="m", instruction="Do it.", trial_id="h1")
    t.step("ls", None, {"output": "a\n", "exit_code": 0, "timed_out": False, "duration": 0.1}, "a\n")
    t.step("cat a", None, {"output": "A\n", "exit_code": 0, "timed_out": False, "duration": 0.1}, "A\n")
    t.submit()
    t.harness = {"name": "mini-swe-agent", "exit_status": "Submitted", "error": None, "messages": []}
    t.calls = [
        call(0, 200, {"content": "", "tool_calls": [tool]}, [1, 2], [3]),
        call(1, 502, {}),
        call(
            2, 200, {"content": "THOUGHT: read it\n```bash\ncat a\n```", "reasoning_content": "why"}, [1, 2, 3, 4], [5]
        ),
        call(3, 200, {"content": "```bash\necho COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT\n```"}, [1, 2, 3, 4, 5, 6], [7]),
    ]
    return t.to_dict()


def test_a_harness_trial_has_one_agent_step_per_answered_call_with_its_commands_attached():
    data = valid(atif.from_transcript(harness_transcript()))
    _, first, second, third = data["steps"]
    assert first["tool_calls"][0]["arguments"] == {"command": "ls"}
    assert first["observation"]["results"][0] == {
        "content": "a\n",
        "source_call_id": "b1",
        "extra": {"termgym": {"turn": 0, "command": "ls", "exit_code": 0, "timed_out": False, "duration": 0.1}},
    }
    assert second["reasoning_content"] == "why" and second["observation"]["results"][0]["content"] == "A\n"
    assert "source_call_id" not in second["observation"]["results"][0]  # the command was in the text
    assert "observation" not in third and third["metrics"]["completion_token_ids"] == [7]
    assert second["metrics"]["prompt_token_ids"] == [1, 2, 3, 4] and second["metrics"]["logprobs"] == [-0.5]
    assert data["extra"]["termgym"]["harness"]["exit_status"] == "Submitted"


@pytest.mark.parametrize(
    ("commands", "asked", "owners"),
    [
        (["ls", "cat a"], [["ls"], ["cat a"]], [0, 1]),
        (["ls", "ls"], [["ls"], ["ls"]], [0, 1]),  # the same command twice: one per call
        (["ls", "pwd"], [["ls"], ["cat"]], [0, 0]),  # a command no reply names stays with the call before
        (["x", "ls"], [["cat"], ["ls"]], [0, 1]),
        (["ls"], [], [0]),
        (["( cd /app\nls\n)", "( cd /app\npwd\n)"], [["ls"], ["pwd"]], [0, 1]),  # a harness's wrapping
        (["ls"], [[""], ["ls"]], [1]),  # an empty reply names nothing
    ],
)
def test_commands_go_to_the_call_that_asked_for_them(commands, asked, owners):
    assert atif._owners(commands, asked) == owners


def test_a_run_of_the_oracle_exports_its_trials_with_the_verifiers_result(tmp_path, capsys):
    run = tmp_path / "run"
    args = ["run", "termgym/file-ops/bulk-rename", "--agent", "oracle", "--backend", "local", "--out", str(run)]
    assert main(args) == 0
    record = json.loads((run / "trials.jsonl").read_text().splitlines()[0])
    (data,) = exported(tmp_path, run)
    assert "wrote 1 ATIF trajectories" in capsys.readouterr().out
    assert data["trajectory_id"] == record["trial_id"] and data["agent"]["name"] == "oracle"
    step = data["steps"][1]
    assert step["llm_call_count"] == 0 and "metrics" not in step  # no model: the RFC's deterministic dispatch
    assert step["tool_calls"][0]["arguments"]["command"] == "bash /solution/solve.sh"
    final = data["final_metrics"]["extra"]
    assert final["resolved"] is True and final["passed"] == final["total"] == record["total"]
    assert final["reward"] == record["reward"] and len(final["assertions"]) == record["total"]


def test_a_check_with_out_keeps_its_record_and_exports_the_verifiers_result(tmp_path, capsys):
    out = tmp_path / "checked"
    args = [
        "check",
        "termgym/file-ops/bulk-rename",
        "--agent",
        "null",
        "--backend",
        "local",
        "--out",
        str(out),
        "--json",
    ]
    assert main(args) == 0
    printed = json.loads(capsys.readouterr().out)
    (record,) = [json.loads(line) for line in (out / "trials.jsonl").read_text().splitlines()]
    assert record == printed and (out / "trials" / record["trial_id"] / "trajectory.json").is_file()
    (data,) = exported(tmp_path, out)
    final = data["final_metrics"]["extra"]
    assert final["resolved"] is False and final["total"] == record["total"] > final["passed"] == record["passed"]


def test_transcripts_without_records_and_records_without_transcripts(tmp_path, capsys):
    run = tmp_path / "check-1"
    write_transcript(run / "trials" / "t1", model_transcript())
    append_record(run / "trials.jsonl", TrialRecord(task="lost", backend="local", agent="null", trial_id="gone"))
    (data,) = exported(tmp_path, run)
    assert data["trajectory_id"] == "t1" and "record" in data["extra"]["termgym"]
    assert "skipped gone: no transcript kept" in capsys.readouterr().err
    single = tmp_path / "single"
    assert main(["export", "atif", str(run / "trials" / "t1"), "--out", str(single)]) == 0
    assert valid(json.loads((single / "t1.json").read_text()))["steps"][1]["message"] == "I will create it."


def tiny_tokenizer(directory: Path, vocab: dict[str, int]) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    body = {"model": {"type": "BPE", "vocab": vocab}, "added_tokens": [{"id": 0, "content": "<s>"}]}
    (directory / "tokenizer.json").write_text(json.dumps(body))


def test_a_training_runs_demonstrations_and_rollouts_export_their_ids_and_tokenizer(tmp_path):
    run = tmp_path / "pipeline"
    tiny_tokenizer(run / "init", {"a": 1, "b": 2})
    (run / "tasks" / "train" / "copy-0001").mkdir(parents=True)
    (run / "tasks" / "train" / "copy-0001" / "instruction.md").write_text("Copy it.\n")
    demo = {
        "task": "families/train/copy-0001",
        "commands": ["cp a b"],
        "ids": [1, 2, 3, 4, 5, 6, 7],
        "mask": [0, 0, 1, 1, 0, 1, 1],
    }
    (run / "sft").mkdir()
    (run / "sft" / "demonstrations.jsonl").write_text(json.dumps(demo) + "\n")
    append_record(
        run / "sft" / "records.jsonl",
        TrialRecord(
            task=demo["task"], backend="local", agent="reference", resolved=True, reward=0.05, passed=1, total=1
        ),
    )
    sample = {
        "ids": [1, 2, 9, 3, 8],
        "loss_mask": [0, 0, 1, 0, 1],
        "logprobs": [0, 0, -0.5, 0, -0.25],
        "reason": "start",
    }
    rollout = {
        "step": 3,
        "task": "families/train/copy-0001",
        "commands": ["ls"],
        "reward": 0.0,
        "samples": [sample, sample],
    }
    (run / "ppo").mkdir()
    (run / "ppo" / "trajectories.jsonl").write_text(json.dumps(rollout) + "\n")
    demonstration, roll = exported(tmp_path, run)
    assert demonstration["steps"][0]["message"] == "Copy it.\n"
    first, submit = demonstration["steps"][1:]
    assert first["metrics"]["prompt_token_ids"] == [1, 2] and first["metrics"]["completion_token_ids"] == [3, 4]
    assert first["tool_calls"][0]["arguments"] == {"command": "cp a b"} and "tool_calls" not in submit
    assert submit["metrics"]["prompt_token_ids"] == [1, 2, 3, 4, 5] and submit["metrics"]["completion_token_ids"] == [
        6,
        7,
    ]
    assert demonstration["final_metrics"]["extra"]["resolved"] is True
    assert demonstration["extra"]["termgym"]["tokenizer"] == atif.tokenizer_fingerprint(run / "init") is not None
    assert [s["source"] for s in roll["steps"]] == ["user", "agent", "agent", "system", "agent", "agent"]
    assert roll["steps"][2]["metrics"]["logprobs"] == [-0.25]
    assert roll["extra"]["termgym"]["rollout"]["step"] == 3


def test_the_tokenizer_fingerprint_follows_the_vocabulary_not_the_bytes(tmp_path):
    tiny_tokenizer(tmp_path / "a", {"x": 1, "y": 2})
    tiny_tokenizer(tmp_path / "b", {"y": 2, "x": 1})
    tiny_tokenizer(tmp_path / "c", {"x": 2, "y": 1})
    assert atif.tokenizer_fingerprint(tmp_path / "a") == atif.tokenizer_fingerprint(tmp_path / "b")
    assert atif.tokenizer_fingerprint(tmp_path / "a") != atif.tokenizer_fingerprint(tmp_path / "c")
    assert atif.tokenizer_fingerprint(tmp_path / "none") is None


@pytest.mark.parametrize("name", ["harbor-rfc0001-example.json", "harbor-rfc0001-compaction.json"])
def test_harbors_published_examples_pass_the_checks(name):
    valid(json.loads((FIXTURES / name).read_text()))


def _broken(change) -> dict:
    data = copy.deepcopy(json.loads((FIXTURES / "harbor-rfc0001-example.json").read_text()))
    change(data)
    return data


BROKEN = {
    "version": lambda d: d.update(schema_version=17),
    "agent": lambda d: d["agent"].pop("version"),
    "steps": lambda d: d.update(steps={}),
    "step id": lambda d: d["steps"][1].update(step_id=5),
    "source": lambda d: d["steps"][0].update(source="tool"),
    "message": lambda d: d["steps"][0].pop("message"),
    "agent-only": lambda d: d["steps"][0].update(reasoning_content="no"),
    "timestamp": lambda d: d["steps"][0].update(timestamp="yesterday"),
    "call": lambda d: d["steps"][1]["tool_calls"][0].pop("arguments"),
    "result": lambda d: d["steps"][1]["observation"]["results"][0].update(source_call_id="nobody"),
    "results": lambda d: d["steps"][1].update(observation={"results": "x"}),
    "ids": lambda d: d["steps"][2]["metrics"].update(completion_token_ids=["a"]),
    "dispatch": lambda d: d["steps"][2].update(llm_call_count=0),
}


@pytest.mark.parametrize("name", sorted(BROKEN))
def test_what_the_independent_models_refuse_termgyms_check_refuses(name):
    data = _broken(BROKEN[name])
    with pytest.raises(ValidationError):
        models.Trajectory.model_validate(data)
    assert atif_rules.check(data)


def test_read_trajectories_skips_other_json_in_directories_and_names_a_bad_file(tmp_path):
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "a.json").write_text((FIXTURES / "harbor-rfc0001-example.json").read_text())
    (tmp_path / "d" / "other.json").write_text('{"not": "atif"}')
    found = list(atif.read_trajectories([tmp_path / "d"]))
    assert [p.name for p, _ in found] == ["a.json"]
    (tmp_path / "bad.json").write_text(json.dumps(_broken(BROKEN["step id"])))
    with pytest.raises(ValueError, match=r"bad.json: not an ATIF trajectory: steps\[1\]: step_id 5"):
        list(atif.read_trajectories([tmp_path / "bad.json"]))
    (tmp_path / "torn.json").write_text("{")
    with pytest.raises(ValueError, match=r"torn\.json: not JSON"):
        list(atif.read_trajectories([tmp_path / "torn.json"]))
    with pytest.raises(ValueError, match="no such file"):
        list(atif.read_trajectories([tmp_path / "missing"]))
    assert atif_rules.check([]) == ["a trajectory is a JSON object"]


@pytest.mark.parametrize(
    ("setup", "message"),
    [
        (lambda p: None, "no such run directory"),
        (lambda p: p.mkdir(), "no trials found"),
        (
            lambda p: (
                (p / "trials" / "t").mkdir(parents=True) or (p / "trials" / "t" / "trajectory.json").write_text("{")
            ),
            "not a transcript",
        ),
        (
            lambda p: (
                (p / "trials" / "t").mkdir(parents=True) or (p / "trials" / "t" / "trajectory.json").write_text("{}")
            ),
            f"not a termgym transcript (schema {SCHEMA})",
        ),
    ],
)
def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, setup, message):
    run = tmp_path / "run"
    setup(run)
    assert main(["export", "atif", str(run), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and "Traceback" not in err


# -- trials of an OpenAI-compatible model and of mini-swe-agent, exported -----------------------------

SOLUTION = Path(__file__).resolve().parents[2] / "envs" / "file-ops" / "bulk-rename" / "solution" / "solve.sh"


async def served_trial(tmp_path: Path, agent) -> tuple[TrialRecord, dict]:
    """One trial of the bulk-rename task by ``agent`` (on the scripted server), kept as a run."""
    from termgym.episode.options import EnvOptions
    from termgym.tasks.bundled import resolve_task
    from termgym.trial import run_trial

    run = tmp_path / "run"
    try:
        record = await run_trial(
            resolve_task("file-ops/bulk-rename"), agent, EnvOptions(trials_dir=str(run / "trials"))
        )
    finally:
        await agent.aclose()
    append_record(run / "trials.jsonl", record)
    assert record.transcript is not None and record.resolved
    return record, json.loads(Path(record.transcript).read_text())


async def test_a_model_agents_trial_on_a_served_model_exports_its_recorded_token_ids(tmp_path, no_leaks):
    from termgym.agents import ModelConfig
    from termgym.agents.settings import build_model_agent
    from tests.termgym.agents.fault_server import MODEL, FaultServer, tool_call

    async with FaultServer() as server:
        server.add(tool_call("bash", {"command": SOLUTION.read_text()}), tool_call("submit", {}))
        agent = build_model_agent(ModelConfig(model=MODEL, base_url=server.base_url), environ={})
        record, transcript = await served_trial(tmp_path, agent)
    (data,) = exported(tmp_path, tmp_path / "run", command=False)
    tokens = [t["reply"]["tokens"] for t in transcript["turns"]]
    agents = [s for s in data["steps"] if s["source"] == "agent"]
    metrics = [s["metrics"] for s in agents]
    assert [m["completion_token_ids"] for m in metrics] == [t["completion_ids"] for t in tokens]
    assert [m["logprobs"] for m in metrics] == [t["logprobs"] for t in tokens]
    # the chat client keeps the first prompt and then each bridge; the export has each whole prompt
    assert metrics[0]["prompt_token_ids"] == tokens[0]["prompt_ids"] and tokens[1]["prompt_ids"] is None
    first = metrics[0]["prompt_token_ids"] + metrics[0]["completion_token_ids"]
    assert metrics[1]["prompt_token_ids"] == first + tokens[1]["bridge_ids"]
    assert agents[0]["tool_calls"][0]["function_name"] == "bash" and agents[0]["observation"]["results"]
    assert agents[1]["tool_calls"][0]["function_name"] == "submit"
    assert data["final_metrics"]["extra"]["passed"] == record.passed == record.total


async def test_a_mini_swe_agent_trial_through_the_gateway_exports_the_same_way(tmp_path, no_leaks):
    pytest.importorskip("minisweagent", reason="the harnesses extra")
    from termgym.agents import ModelConfig
    from termgym.integrations.settings import build_harness_agent
    from tests.termgym.agents.fault_server import MODEL, FaultServer, tool_call

    async with FaultServer() as server:
        commands = [SOLUTION.read_text(), "ls /app/reports", "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"]
        server.add(*(tool_call("bash", {"command": c}) for c in commands))
        agent = build_harness_agent("mini-swe-agent", ModelConfig(model=MODEL, base_url=server.base_url), environ={})
        _, transcript = await served_trial(tmp_path, agent)
    (data,) = exported(tmp_path, tmp_path / "run", command=False)
    agents = [s for s in data["steps"] if s["source"] == "agent"]
    calls = transcript["calls"]
    assert len(agents) == len(calls) == 3 and data["agent"]["name"] == "mini-swe-agent"
    assert [s["metrics"]["completion_token_ids"] for s in agents] == [c["completion_ids"] for c in calls]
    assert [s["metrics"]["prompt_token_ids"] for s in agents] == [c["prompt_ids"] for c in calls]
    assert [s["metrics"]["logprobs"] for s in agents] == [c["logprobs"] for c in calls]
    assert [[c["arguments"]["command"] for c in s["tool_calls"]] for s in agents] == [[c] for c in commands]
    listing = agents[1]["observation"]["results"][0]
    assert (
        "2024-01-15_sales.csv" in listing["content"]
        and listing["source_call_id"] == agents[1]["tool_calls"][0]["tool_call_id"]
    )
    assert (
        data["final_metrics"]["extra"]["resolved"] is True
        and data["final_metrics"]["extra"]["stop_reason"] == "submitted"
    )
