"""A SkyRL-gym environment loop over two bundled termgym tasks, a scripted policy in place of a model.

    .venv/bin/python examples/skyrl_env_loop.py [--backend local|docker] [--dataset PATH]

What SkyRL's generator does with each row of its dataset, without the GPU: make the environment
the row names (``env_class: termgym``) with the row's extras, ``init`` it with the row's prompt,
feed it the policy's replies until ``done``, read the reward and metadata, ``close`` it. The policy
here replies as a model following termgym's ``text`` format would: a look around, the task's
reference solution in one fenced block, then ``:submit``. A real run swaps it for SkyRL's vLLM
generator and points ``data.train_data`` at the dataset this writes.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import pandas
import skyrl_gym
from skyrl_gym.envs.base_text_env import BaseTextEnv

from termgym.integrations.skyrl import write_dataset
from termgym.tasks.bundled import resolve_task

TASKS = ["file-ops/bulk-rename", "text-processing/word-frequency"]


def scripted_replies(task_name: str) -> list[str]:
    """What a policy that knows the answer replies: a look, the reference solution, the submit."""
    task = resolve_task(task_name)
    assert task.solution_script is not None
    solution = (task.path / "solution" / task.solution_script).read_text()
    return [
        "First, where am I?\n```bash\npwd && ls\n```",
        f"Now the work:\n```bash\n{solution.strip()}\n```",
        "Done.\n```bash\n:submit\n```",
    ]


def main() -> int:
    assert __doc__ is not None  # the module docstring: the description
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="local", choices=["local", "docker", "daytona"])
    parser.add_argument("--dataset", help="where to write the SkyRL dataset (default: a temporary file)")
    args = parser.parse_args()
    path = Path(args.dataset or Path(tempfile.mkdtemp(prefix="termgym-skyrl-")) / "train.parquet")
    write_dataset(TASKS, path, backend=args.backend, max_turns=10)
    rows = pandas.read_parquet(path).to_dict("records")
    print(f"dataset: {path} ({len(rows)} rows)")
    for row in rows:
        extras = {key: value for key, value in row.items() if key not in ("prompt", "env_class")}
        env = skyrl_gym.make(row["env_class"], env_config={}, extras=extras)
        assert isinstance(env, BaseTextEnv)  # what SkyRL's generator drives
        try:
            _prompt, info = env.init(list(row["prompt"]))
            output = None
            for reply in scripted_replies(row["task"]):
                output = env.step(reply)
                if output["done"]:
                    break
            assert output is not None and output["done"]
            meta = output["metadata"]
            print(
                f"{meta['task']}: reward {output['reward']:.2f}, resolved {meta['resolved']}, "
                f"{meta['passed']}/{meta['total']} assertions, stop {meta['stop_reason']}, "
                f"{env.get_metrics()['turns']} turns on {info['backend']}"
            )
        finally:
            env.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
