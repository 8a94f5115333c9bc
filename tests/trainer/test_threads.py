"""The trainer sets OpenMP's wait policy before torch loads (trainer/__init__.py): torch's threads
sleep while they wait, unless the environment chose otherwise."""

import os
import subprocess
import sys

PROBE = "import os\nimport termgym.trainer.cli\nprint(os.environ.get('OMP_WAIT_POLICY'))\n"


def _policy(env: dict[str, str]) -> str:
    ran = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, check=True)
    return ran.stdout.strip()


def test_the_trainer_makes_torch_threads_wait_passively_by_default():
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    assert _policy(env) == "PASSIVE"


def test_a_wait_policy_the_environment_sets_is_kept():
    assert _policy({**os.environ, "OMP_WAIT_POLICY": "ACTIVE"}) == "ACTIVE"


def test_the_policy_is_set_before_torch_is_imported():
    probe = (
        "import builtins, os\n"
        "real = builtins.__import__\n"
        "def spy(name, *args, **kwargs):\n"
        "    if name == 'torch' and 'OMP_WAIT_POLICY' not in os.environ:\n"
        "        raise SystemExit('torch imported before the wait policy was set')\n"
        "    return real(name, *args, **kwargs)\n"
        "builtins.__import__ = spy\n"
        "import termgym.trainer.cli\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    ran = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True)
    assert ran.returncode == 0, ran.stderr
