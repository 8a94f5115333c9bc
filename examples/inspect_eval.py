"""One bundled termgym task evaluated by inspect-ai: its basic agent, a scripted model, termgym's sandbox and scorer.

    .venv/bin/inspect eval examples/inspect_eval.py --display plain [-T backend=docker] [-T solve=false]

The sample runs in a termgym sandbox (``sandbox=("termgym", ...)``, found through termgym's
``inspect_ai`` entry point, no import needed for it); inspect's ``basic_agent`` drives it with the
``bash`` tool; ``termgym_scorer()`` grades it with the task's own verifier: ``resolved`` and
``reward`` (passed / S). The model is inspect's ``mockllm/model`` with scripted outputs (this
machine has no model to call): with ``solve=true`` it runs the task's reference solution, with
``solve=false`` it submits at once. For a real model: ``--model openai/NAME`` with
``OPENAI_BASE_URL`` pointing at an OpenAI-compatible server, and drop ``model=`` below.
"""

from __future__ import annotations

from inspect_ai import Task, task
from inspect_ai.model import ModelOutput, ModelUsage, get_model
from inspect_ai.solver import basic_agent
from inspect_ai.tool import bash

from termgym.integrations.inspect import termgym_samples, termgym_scorer
from termgym.tasks.bundled import resolve_task

TASK = "file-ops/bulk-rename"
MODEL = "mockllm/model"


def scripted_outputs(solve: bool) -> list[ModelOutput]:
    task = resolve_task(TASK)
    assert task.solution_script is not None
    solution = (task.path / "solution" / task.solution_script).read_text()
    calls = [("bash", {"command": "ls /app/reports | head -5"})]
    if solve:
        calls.append(("bash", {"command": solution}))
    calls.append(("submit", {"answer": "done"}))
    outputs = [ModelOutput.for_tool_call(MODEL, name, arguments) for name, arguments in calls]
    for output in outputs:  # set, so that mockllm counts no tokens (its tokenizer would be downloaded)
        output.usage = ModelUsage(input_tokens=1, output_tokens=1, total_tokens=2)
    return outputs


@task
def termgym_bulk_rename(backend: str = "local", solve: bool = True) -> Task:
    return Task(
        dataset=termgym_samples([TASK], backend=backend),
        solver=basic_agent(tools=[bash(timeout=120)], max_attempts=1),
        scorer=termgym_scorer(),
        model=get_model(MODEL, custom_outputs=scripted_outputs(solve)),
    )
