"""A scripted stand-in for ``AsyncTerminalEnv`` with what the model agent uses of it: the
transcript, the turn budget, the agent time, ``step`` and ``truncate``. Observations come from a
fixed list (hostile text welcome); SUBMIT ends the episode."""

from __future__ import annotations

from termgym.env import SUBMIT
from termgym.episode.options import EnvOptions
from termgym.transcript import Transcript


class FakeEnv:
    def __init__(self, observations: list[str], max_turns: int) -> None:
        self.observations = observations
        self.options = EnvOptions(max_turns=max_turns)
        self.transcript = Transcript(task="t")
        self.done, self.turns, self.actions = False, 0, []
        self.remaining_time = 1e9

    async def step(self, action: str, *, timeout: float | None = None):
        self.actions.append(action)
        if action == SUBMIT:
            self.done = True
            self.transcript.submit()
            self.transcript.stop("submitted")
            return "", 1.0, True, False, {}
        self.turns += 1
        output = self.observations[(self.turns - 1) % len(self.observations)]
        result = {"output": output, "exit_code": 0, "timed_out": False}
        self.transcript.step(action, timeout, result, output)
        if self.turns >= self.options.max_turns:
            self.done = True
            self.transcript.stop("max_turns")
        return output, 0.0, False, self.done, {**result}

    async def truncate(self, reason):
        self.done = True
        self.transcript.stop(reason)
        return "", 0.0, False, True, {"stop_reason": reason}
