"""The Gymnasium wrapper: registered id, spec compliance (check_env), sync stepping."""

from __future__ import annotations

import gymnasium as gym
import pytest
from gymnasium.utils.env_checker import check_env

import termgym
from termgym.gym_env import ShellText


def test_registered_id_makes_a_working_env(task_dir, no_leaks):
    env = gym.make("termgym/Terminal-v0", task=str(task_dir), backend="local", max_turns=5)
    try:
        obs, info = env.reset(seed=0)
        assert "result.txt" in obs
        obs, reward, terminated, truncated, info = env.step("echo done > /app/result.txt && echo ok")
        assert obs == "ok\n" and reward == 0.0 and not (terminated or truncated)
        obs, reward, terminated, truncated, info = env.step(termgym.SUBMIT)
        assert terminated and info["resolved"] and reward == pytest.approx(0.1)
    finally:
        env.close()


def test_passes_gymnasium_env_checker(task_dir, no_leaks):
    env = termgym.TerminalEnv(str(task_dir), max_turns=5)
    try:
        check_env(env, skip_render_check=True)
    finally:
        env.close()


@pytest.mark.parametrize(
    ("value", "max_length", "inside"),
    [
        ("ls -la /app | grep 'x'", 64, True),
        ("ünïcödé\x00\n", 64, True),
        ("", 64, True),
        (b"bytes", 64, False),
        ("x" * 11, 10, False),
    ],
)
def test_text_space_accepts_any_string_within_length(value, max_length, inside):
    assert ShellText(max_length).contains(value) is inside


def test_text_space_samples_are_harmless_words():
    space = ShellText(32)
    space.seed(3)
    for _ in range(50):
        sample = space.sample()
        assert len(sample) <= 32 and all(c.isalnum() or c == " " for c in sample)
