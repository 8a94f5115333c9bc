"""The model agent's loop against a fast local fake OpenAI server, measured side by side in one run:
its own cost per turn against the raw HTTP round trip, and how many concurrent episodes one core
drives with how much added latency. Target: at least 500 concurrent episodes on one core with the
p99 added latency per turn under 5 ms.

The fake server (``/v1/models``, ``/v1/chat/completions``) runs in its own process, pinned to the
other core, so its CPU is not the driver's; the driver (this process: the agents, the SDK, the
fake environments) is pinned to one core. The server answers every chat request with one ``bash``
tool call, and with a ``submit`` on the episode's ``--turns``-th request, after a simulated model
latency; it does not parse the request's JSON (it finds the episode's marker in the raw body) and
writes its reply from prebuilt bytes, shaped as vLLM answers the chat client's request: the
``return_token_ids`` extras (``prompt_token_ids``, one id per four bytes of the request, and the
completion's ``token_ids``) and per-token ``logprobs``, 24 completion tokens. The environment is an
in-process fake with the attributes ``ModelAgent.run`` uses: a step sleeps ``--step`` seconds
(standing in for a command) and returns a fixed 400-character listing; the submit returns at once.

1. The loop's own cost, at concurrency 1 with no simulated latency, the same request bodies: the
   raw HTTP round trip of the serialized body through ``httpx2`` (the SDK's transport) as the
   floor; ``client.chat.completions.create`` of the same body through the SDK alone, built by
   ``termgym.agents.transport.openai_client`` as the agent builds it; a full agent turn (from the
   env's step returning to the next command reaching the env: prompt building, the request, the
   response's parse, the action's parse, the observation, the transcript). Each has its wall-time
   median and the driver's CPU per request (``time.process_time``, mean over all requests; on a
   shared machine the CPU figure is the one to trust, as wall times include other processes'
   turns on the core). The agent turn's CPU over the raw round trip's is the loop's own cost with
   its client's (the agent posts through the SDK's request path without its typed transform).
2. The concurrency sweep: 1, 100, 250, 500, 1000 concurrent episodes of ``--turns`` turns each on
   the one pinned core, each episode starting at a random offset within one model latency (so
   requests arrive spread out, as in a steady rollout), the simulated latency drawn uniformly from
   ``--latency`` ± ``--jitter`` (relative). A level still running after ``--level-limit`` seconds
   is stopped (a saturated driver: its queue only grows; the table says how many episodes were
   cut off) and measured over the turns that ran.

Added latency per turn. A turn of an episode runs from one command reaching the environment to the
next (``calls[j] - calls[j-1]``, timestamps taken in the fake env with ``time.monotonic``, the
clock the server uses too: CLOCK_MONOTONIC is system-wide on Linux). Of that, the model's time is
what the server measured itself for that request (from the body fully read to the reply written,
so its own simulated latency and any oversleep there), and the command's time is the nominal
``--step``. Everything else is added latency: the driver's CPU on the turn (the loop, the SDK, the
transport, the fake env's bookkeeping), the time the turn waited for the driver's event loop to get
to it (queueing behind other episodes' turns: the part that grows with concurrency), the env's
oversleep, the loopback network and the fake server's HTTP parsing outside its measured span (a
few tens of microseconds; a real server's would count against it, not the driver). The first turn
of each episode (the opening prompt, the connection's set-up) is left out: it is per episode, not
per turn. Percentiles, turns/s and the driver's CPU utilisation (``time.process_time`` over wall
time, sampled every 0.1 s) are taken over the steady window of each level, from the last episode's
start to the first episode's end, when all N episodes are live; CPU per turn is the driver's CPU
over that window divided by the turns in it, so 1e6 / (CPU µs per turn) is the most turns per second
one core can drive, whatever the model latency. Diagnostics per level: the run-queue wait (the
share of the window the driver's threads were runnable but another process had the core, from
``/proc/self/task/*/schedstat``: above a few percent, latencies are inflated by other work on the
machine), the garbage collector's share of the window and its longest pause (``gc.callbacks``),
and the size of a finished episode's transcript as JSON (its ``trajectory.json``; what the driver
holds in memory per episode grows with it).

The simulated model latency: 1.0 s mean (0.5 to 1.5 s), the short end of a real LLM's reply (100
to 300 tokens at 50 to 150 tokens/s per sequence under batch load is 1 to 5 s), so the load on the
driver per episode is at the high end: at 1.0 s, N episodes make about N turns/s. The honest figure
is turns/s per core against added latency; at a longer latency the same core drives proportionally
more episodes.

    .venv/bin/python bench/model_agent.py [--latency 1.0] [--jitter 0.5] [--step 0.005] [--turns 10]
        [--levels 1 100 250 500 1000] [--level-limit 40] [--no-token-ids] [--profile N] [--quick]

``--quick`` is a smoke run of a few seconds. ``--no-token-ids``: replies without vLLM's extras (as a
hosted API answers). ``--profile N`` runs N episodes under cProfile afterwards and prints the top
functions by own time (cProfile slows the driver: the profile's latencies are not the table's).
Whole run with the defaults: about 2.5 minutes (most of it in the levels that saturate the core and
run to the limit).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import gc
import io
import json
import multiprocessing
import os
import pstats
import random
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from termgym.agents.actions import TOOLS
from termgym.agents.heap import settled_heap
from termgym.agents.model import ModelAgent
from termgym.agents.settings import ModelConfig, build_model_agent
from termgym.agents.transport import Endpoint, openai_client
from termgym.cli import run_command
from termgym.env import SUBMIT, AsyncTerminalEnv
from termgym.episode.options import EnvOptions
from termgym.transcript import Transcript

MODEL = "bench-model"
MARKER = b"[episode "
REPLAY = 900_000  # episode ids of the raw replays in part 1 (their own turn counts on the server)
COMPLETION_TOKENS = 24
TARGET_EPISODES = 500
TARGET_P99_MS = 5.0
LISTING = "\n".join(f"-rw-r--r-- 1 root root {1000 + 37 * i:>6} Nov 29 12:{i:02d} file_{i:02d}.txt" for i in range(8))
OUTPUT = LISTING[:400]  # what every command "prints": 400 characters


# -- the fake server (its own process) --------------------------------------------------------


def _ids(count: int) -> bytes:
    """``count`` five-digit ids, comma-separated: a fixed width, so a prefix of ``n`` ids is a slice."""
    return b",".join(b"%d" % (10000 + i % 90000) for i in range(count))


class FakeServer:
    """Answers ``/v1/chat/completions`` from prebuilt bytes after a simulated latency; logs each
    request's episode, turn, and the monotonic times its body was read and its reply written."""

    def __init__(self) -> None:
        self.latency = 0.0
        self.jitter = 0.0
        self.turns = 10
        self.token_ids = True
        self.random = random.Random(0)
        self.counts: dict[int, int] = {}
        self.log: list[tuple[int, int, float, float]] = []
        self.prompt_ids = _ids(64_000)
        entry = '{"token":"x","logprob":-0.125,"bytes":[120],"top_logprobs":[]}'
        self.logprobs = ('"logprobs":{"content":[' + ",".join([entry] * COMPLETION_TOKENS) + "]},").encode()

    def configure(self, settings: dict[str, Any]) -> None:
        self.latency = float(settings["latency"])
        self.jitter = float(settings["jitter"])
        self.turns = int(settings["turns"])
        self.token_ids = bool(settings["token_ids"])
        self.random = random.Random(settings.get("seed", 0))

    def reply(self, turn: int, body_bytes: int) -> bytes:
        prompt = max(1, body_bytes // 4)
        if turn + 1 >= self.turns:
            call = b'"name":"submit","arguments":"{}"'
        else:
            call = b'"name":"bash","arguments":"{\\"command\\": \\"ls -la /app\\"}"'
        message = (
            b'"message":{"role":"assistant","content":null,"tool_calls":[{"id":"call_%d","type":"function",'
            b'"function":{%s}}]},' % (turn, call)
        )
        head = b'{"id":"chatcmpl-bench","object":"chat.completion","created":1764400000,"model":"' + MODEL.encode()
        parts = [head, b'",']
        if self.token_ids:
            parts += [b'"prompt_token_ids":[', self.prompt_ids[: 6 * prompt - 1], b"],"]
        parts += [b'"choices":[{"index":0,', message, self.logprobs if self.token_ids else b""]
        parts.append(b'"finish_reason":"tool_calls"')
        if self.token_ids:  # the ids that follow the prompt's: the next prompt extends prompt + reply, as vLLM's does
            parts += [b',"token_ids":[', self.prompt_ids[6 * prompt : 6 * (prompt + COMPLETION_TOKENS) - 1], b"]"]
        parts.append(
            b'}],"usage":{"prompt_tokens":%d,"completion_tokens":%d,"total_tokens":%d}}'
            % (prompt, COMPLETION_TOKENS, prompt + COMPLETION_TOKENS)
        )
        return b"".join(parts)

    async def chat(self, request: Any) -> Any:
        from aiohttp import web

        body = await request.read()
        arrived = time.monotonic()
        at = body.find(MARKER)
        episode = int(body[at + len(MARKER) : at + len(MARKER) + 6]) if at >= 0 else -1
        turn = self.counts.get(episode, 0)
        self.counts[episode] = turn + 1
        delay = self.latency * (1 + self.jitter * (2 * self.random.random() - 1))
        if delay > 0:
            await asyncio.sleep(delay)
        payload = self.reply(turn, len(body))
        self.log.append((episode, turn, arrived, time.monotonic()))
        return web.Response(body=payload, content_type="application/json")

    async def models(self, request: Any) -> Any:
        from aiohttp import web

        entry = {"id": MODEL, "object": "model", "created": 0, "owned_by": "bench", "max_model_len": 131072}
        return web.json_response({"object": "list", "data": [entry]})

    async def control(self, request: Any) -> Any:
        from aiohttp import web

        if request.method == "POST":
            self.configure(await request.json())
            return web.json_response({})
        log, self.log, self.counts = self.log, [], {}
        return web.json_response(log)


def serve(pipe: Any, core: int | None) -> None:
    """The server process: pinned to ``core``, on uvloop where installed; sends its port, then serves
    until it is terminated."""
    if core is not None:
        os.sched_setaffinity(0, {core})
    import logging

    from aiohttp import web

    logging.getLogger("aiohttp.server").setLevel(logging.CRITICAL)  # requests cut off when a level is stopped

    try:
        import uvloop

        factory: Any = uvloop.new_event_loop
    except ImportError:
        factory = None

    async def run() -> None:
        server = FakeServer()
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/v1/chat/completions", server.chat)
        app.router.add_get("/v1/models", server.models)
        app.router.add_route("*", "/bench", server.control)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0, backlog=4096)
        await site.start()
        sockets = getattr(site._server, "sockets", None) or []
        pipe.send(sockets[0].getsockname()[1])
        await asyncio.Event().wait()

    with asyncio.Runner(loop_factory=factory) as runner:
        runner.run(run())


class Control:
    """The driver's side channel to the server (configuration, the request log), used between runs."""

    def __init__(self, base_url: str) -> None:
        import httpx2

        self.url = base_url.removesuffix("/v1") + "/bench"
        self.client = httpx2.AsyncClient(timeout=60)

    async def configure(self, **settings: Any) -> None:
        (await self.client.post(self.url, json=settings)).raise_for_status()

    async def log(self) -> dict[tuple[int, int], tuple[float, float]]:
        response = await self.client.get(self.url)
        response.raise_for_status()
        return {(e, t): (arrived, departed) for e, t, arrived, departed in response.json()}

    async def aclose(self) -> None:
        await self.client.aclose()


# -- the fake environment ---------------------------------------------------------------------


@dataclass
class FakeEnv:
    """What ``ModelAgent.run`` uses of an ``AsyncTerminalEnv``, without a sandbox; records when each
    command (and the submit) reached it and when each step returned."""

    episode: int
    options: EnvOptions
    step_seconds: float
    transcript: Transcript = field(default_factory=Transcript)
    done: bool = False
    turns: int = 0
    started: float = 0.0
    calls: list[float] = field(default_factory=list)
    returns: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.started = time.monotonic()
        self._deadline = self.started + 3600

    @property
    def remaining_time(self) -> float:
        return max(0.0, self._deadline - time.monotonic()) if not self.done else 0.0

    async def step(self, action: str, *, timeout: float | None = None) -> tuple[str, float, bool, bool, dict]:
        self.calls.append(time.monotonic())
        if action == SUBMIT:
            self.transcript.submit()
            self.transcript.stop("submitted")
            self.done = True
            return "", 1.0, True, False, {"submitted": True}
        await asyncio.sleep(self.step_seconds)
        self.turns += 1
        info = {
            "output": OUTPUT,
            "exit_code": 0,
            "timed_out": False,
            "duration": self.step_seconds,
            "dropped_bytes": 0,
            "cwd": "/app",
            "shell_restarted": False,
            "turn": self.turns,
        }
        self.transcript.step(
            action, timeout, {k: info[k] for k in ("output", "exit_code", "timed_out", "duration", "cwd")}, OUTPUT
        )
        self.returns.append(time.monotonic())
        if self.turns >= self.options.max_turns:
            self.transcript.stop("max_turns")
            self.done = True
            return OUTPUT, 0.0, False, True, info
        return OUTPUT, 0.0, False, False, info

    async def truncate(self, reason: Any) -> tuple[str, float, bool, bool, dict]:
        self.transcript.stop(reason)
        self.done = True
        return "", 0.0, False, True, {"stop_reason": reason}


def instruction(episode: int) -> str:
    return f"[episode {episode:06d}] In /app, count the words in notes.txt and write the count to /app/count.txt."


async def run_episode(agent: ModelAgent, episode: int, delay: float, turns: int, step: float) -> FakeEnv:
    if delay > 0:
        await asyncio.sleep(delay)
    env = FakeEnv(episode, EnvOptions(max_turns=turns + 5), step)
    env.transcript.instruction = instruction(episode)
    await agent.run(cast(AsyncTerminalEnv, env), instruction(episode), {"workdir": "/app"})
    return env


def agent_for(base_url: str, connections: int) -> ModelAgent:
    return build_model_agent(ModelConfig(model=MODEL, base_url=base_url), environ={}, connections=connections)


# -- measuring --------------------------------------------------------------------------------


class GcPauses:
    """The garbage collector's pauses while registered: (monotonic start, seconds, generation)."""

    def __init__(self) -> None:
        self.pauses: list[tuple[float, float, int]] = []
        self._started = 0.0

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = time.monotonic()
        else:
            self.pauses.append((self._started, time.monotonic() - self._started, info["generation"]))

    def __enter__(self) -> GcPauses:
        gc.callbacks.append(self)
        return self

    def __exit__(self, *exc_info: object) -> None:
        gc.callbacks.remove(self)


def run_queue_wait() -> float:
    """Seconds this process's threads have waited on a run queue (runnable, another task on the
    core): /proc/self/task/*/schedstat; 0 where the kernel does not report it."""
    total = 0
    try:
        for task in os.listdir("/proc/self/task"):
            with open(f"/proc/self/task/{task}/schedstat") as stat:
                total += int(stat.read().split()[1])
    except (OSError, IndexError, ValueError):
        return 0.0
    return total / 1e9


# -- 1. the loop's own cost -------------------------------------------------------------------


def request_body(messages: list[dict[str, Any]]) -> dict[str, Any]:
    """What ``ChatSession.complete`` sends for ``messages`` (the tool format, the defaults)."""
    return {
        "model": MODEL,
        "messages": messages,
        "temperature": 1.0,
        "max_tokens": 4096,
        "tools": TOOLS,
        "tool_choice": "auto",
        "logprobs": True,
        "extra_body": {"return_token_ids": True},
    }


async def loop_cost(base_url: str, control: Control, args: argparse.Namespace) -> dict[str, float]:
    """Per turn at concurrency 1, no simulated latency, the same request bodies: the httpx2 round
    trip, the SDK call, the agent turn; medians of wall time and the driver's CPU per request."""
    import httpx2

    await control.configure(latency=0, jitter=0, turns=args.turns, token_ids=args.token_ids)
    agent = agent_for(base_url, 1)
    sdk = openai_client(Endpoint(base_url, MODEL), connections=1)
    http = httpx2.AsyncClient(limits=httpx2.Limits(max_connections=1, max_keepalive_connections=1), timeout=60)
    url = base_url + "/chat/completions"
    headers = {"content-type": "application/json", "authorization": "Bearer EMPTY"}
    wall: dict[str, list[float]] = {"turn": [], "sdk": [], "http": []}
    cpu: dict[str, float] = {"turn": 0.0, "sdk": 0.0, "http": 0.0}
    requests = 0
    try:
        for episode in range(-2, args.cost_episodes):  # two warm-up episodes (ids 8 and 9)
            started = time.process_time()
            env = await run_episode(agent, episode + 10, 0, args.turns, 0)
            spent = time.process_time() - started
            if len(env.calls) != args.turns:
                raise RuntimeError(f"episode {episode} ran {len(env.calls)} turns, not {args.turns}")
            if episode >= 0:
                wall["turn"] += [env.calls[j] - env.returns[j - 1] for j in range(1, len(env.calls))]
                cpu["turn"] += spent
                requests += args.turns
            messages = env.transcript.segment.messages
            for kind in ("sdk", "http"):
                replay = REPLAY + 2 * (episode + 2) + (kind == "http")  # its own turn count on the server
                first = {
                    **messages[1],
                    "content": messages[1]["content"].replace(f"{env.episode:06d}", f"{replay:06d}"),
                }
                bodies = [request_body([messages[0], first, *messages[2 : 2 + 2 * j]]) for j in range(args.turns)]
                contents = [  # what the SDK sends: the extra body's fields at the top level
                    json.dumps({**{k: v for k, v in b.items() if k != "extra_body"}, **b["extra_body"]}).encode()
                    for b in bodies
                ]
                spent = 0.0
                for j, body in enumerate(bodies):
                    clock = time.process_time()
                    started = time.monotonic()
                    if kind == "sdk":
                        extra = body.pop("extra_body")
                        await sdk.chat.completions.create(**body, extra_body=extra)
                    else:
                        response = await http.post(url, content=contents[j], headers=headers)
                        response.raise_for_status()
                    elapsed = time.monotonic() - started
                    spent += time.process_time() - clock
                    if episode >= 0 and j >= 1:  # the same turns as the agent's (its first left out)
                        wall[kind].append(elapsed)
                if episode >= 0:
                    cpu[kind] += spent
        log = await control.log()
    finally:
        await agent.aclose()
        await sdk.close()
        await http.aclose()
    server = [departed - arrived for (e, _), (arrived, departed) in log.items() if 10 <= e < REPLAY]
    result = {f"{kind}_wall": statistics.median(values) for kind, values in wall.items()}
    result |= {f"{kind}_cpu": value / requests for kind, value in cpu.items()}
    return result | {"server": statistics.median(server), "samples": len(wall["turn"]), "requests": requests}


# -- 2. the concurrency sweep -----------------------------------------------------------------


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


async def run_level(
    base_url: str, control: Control, args: argparse.Namespace, episodes: int, profiler: cProfile.Profile | None = None
) -> dict[str, Any]:
    """``episodes`` concurrent episodes, stopped at ``--level-limit`` seconds if they have not ended
    (a saturated driver: the level's figures are then those of the turns that ran)."""
    await control.configure(latency=args.latency, jitter=args.jitter, turns=args.turns, token_ids=args.token_ids)
    agent = agent_for(base_url, episodes)
    await agent.client.context_window()  # the one GET /models, before the episodes (the client keeps it)
    rng = random.Random(episodes)
    samples: list[tuple[float, float, float]] = []  # monotonic, process time, run-queue wait
    envs: list[FakeEnv] = []

    async def sample() -> None:
        while True:
            samples.append((time.monotonic(), time.process_time(), run_queue_wait()))
            await asyncio.sleep(0.1)

    async def episode(e: int, delay: float) -> None:
        await asyncio.sleep(delay)
        env = FakeEnv(e, EnvOptions(max_turns=args.turns + 5), args.step)
        env.transcript.instruction = instruction(e)
        envs.append(env)
        await agent.run(cast(AsyncTerminalEnv, env), instruction(e), {"workdir": "/app"})

    sampler = asyncio.create_task(sample())
    wall = time.monotonic()
    tasks = [asyncio.create_task(episode(e, rng.uniform(0, args.latency))) for e in range(episodes)]
    if profiler is not None:
        profiler.enable()
    try:
        with GcPauses() as collector:
            await asyncio.wait(tasks, timeout=args.level_limit)
    finally:
        stopped = time.monotonic()
        if profiler is not None:
            profiler.disable()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        sampler.cancel()
        await agent.aclose()
    wall = stopped - wall
    log = await control.log()
    failed = [t.exception() for t in tasks if not t.cancelled() and t.exception() is not None]
    unfinished = sum(1 for t in tasks if t.cancelled())
    short = [  # ended otherwise than by the submit of the last turn
        env for env in envs if env.done and (len(env.calls) != args.turns or env.transcript.stop_reason != "submitted")
    ]
    begin = max(env.started for env in envs)
    end = min([env.calls[-1] for env in envs if env.done] + [stopped])
    added, in_window = [], 0
    for env in envs:
        for j in range(len(env.calls)):
            arrived, departed = log[(env.episode, j)]
            if begin <= arrived <= end:
                in_window += 1
            if j >= 1 and begin <= env.calls[j - 1] and env.calls[j] <= end:
                added.append(env.calls[j] - env.calls[j - 1] - (departed - arrived) - args.step)
    at_begin = max((s for s in samples if s[0] <= begin), default=samples[0])
    at_end = min((s for s in samples if s[0] >= end), default=samples[-1])
    span = at_end[0] - at_begin[0]
    turns_in_span = sum(1 for (arrived, _) in log.values() if at_begin[0] <= arrived <= at_end[0])
    pauses = [seconds for started, seconds, _ in collector.pauses if begin <= started <= end]
    finished = [env for env in envs if env.done][:20]
    kept = [len(json.dumps(env.transcript.to_dict())) for env in finished]  # its trajectory.json
    nan = float("nan")
    return {
        "episodes": episodes,
        "errors": len(failed) + len(short),
        "first_error": repr(failed[0]) if failed else None,
        "unfinished": unfinished,
        "turns": len(added),
        "turns_per_s": in_window / (end - begin) if end > begin else nan,
        "cpu_util": (at_end[1] - at_begin[1]) / span if span > 0 else nan,
        "cpu_per_turn": (at_end[1] - at_begin[1]) / turns_in_span if turns_in_span else nan,
        "waited": (at_end[2] - at_begin[2]) / span if span > 0 else nan,
        "p50": percentile(added, 0.50) if added else nan,
        "p99": percentile(added, 0.99) if added else nan,
        "max": max(added) if added else nan,
        "wall": wall,
        "gc_share": sum(pauses) / (end - begin) if end > begin else nan,
        "gc_max": max(pauses, default=0.0),
        "transcript": statistics.mean(kept) if kept else nan,
    }


async def profile_level(base_url: str, control: Control, args: argparse.Namespace, episodes: int) -> str:
    profiler = cProfile.Profile()
    await run_level(base_url, control, args, episodes, profiler)
    out = io.StringIO()
    stats = pstats.Stats(profiler, stream=out)
    stats.sort_stats("tottime").print_stats(25)
    return out.getvalue()


# -- the run ----------------------------------------------------------------------------------


def pin() -> tuple[int | None, int | None]:
    """The driver's core and the server's: two different cores where this process may use two."""
    try:
        cores = sorted(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return None, None
    if len(cores) < 2:
        return None, None
    os.sched_setaffinity(0, {cores[0]})
    return cores[0], cores[-1]


async def main_async(args: argparse.Namespace) -> int:
    driver_core, server_core = pin()
    context = multiprocessing.get_context("spawn")
    parent, child = context.Pipe()
    server = context.Process(target=serve, args=(child, server_core), daemon=True)
    server.start()
    control: Control | None = None
    try:
        if not parent.poll(30):
            raise RuntimeError("the fake server did not start")
        base_url = f"http://127.0.0.1:{parent.recv()}/v1"
        control = Control(base_url)
        cost = await loop_cost(base_url, control, args)
        with settled_heap() if args.settle_heap else contextlib.nullcontext():  # as `termgym run` does
            levels = [await run_level(base_url, control, args, n) for n in args.levels]
        profile = await profile_level(base_url, control, args, args.profile) if args.profile else None
    finally:
        if control is not None:
            await control.aclose()
        server.terminate()
        server.join(10)
    where = (
        f"driver pinned to core {driver_core}, server to core {server_core}"
        if driver_core is not None
        else "driver and server NOT pinned (fewer than two cores)"
    )
    print(
        f"{where}; model latency {args.latency:g} s ± {100 * args.jitter:g}%, command {1e3 * args.step:g} ms, "
        f"{args.turns} turns per episode, token ids {'on' if args.token_ids else 'off'}\n"
    )
    print(
        f"1. the loop's own cost, concurrency 1, no model latency ({cost['samples']} turns for the wall medians, "
        f"{cost['requests']} requests for the CPU)\n"
    )
    print("| per turn | wall median µs | driver CPU µs | CPU / SDK call |")
    print("|---|---|---|---|")
    rows = (
        ("raw HTTP round trip, httpx2, the serialized body", "http"),
        ("SDK `chat.completions.create`, the same body", "sdk"),
        ("agent turn: step returned to the next command", "turn"),
    )
    for label, key in rows:
        print(
            f"| {label} | {1e6 * cost[key + '_wall']:.0f} | {1e6 * cost[key + '_cpu']:.0f} "
            f"| {cost[key + '_cpu'] / cost['sdk_cpu']:.2f} |"
        )
    print(f"| (the server's own span, in each wall time) | {1e6 * cost['server']:.0f} | | |")
    print()
    own = cost["turn_cpu"] - cost["http_cpu"]
    print(
        f"agent turn / raw HTTP round trip = {cost['turn_cpu'] / cost['http_cpu']:.2f} (CPU), "
        f"{cost['turn_wall'] / cost['http_wall']:.2f} (wall): the loop and its client add {1e6 * own:.0f} µs of CPU "
        f"per turn; agent turn / SDK call = {cost['turn_cpu'] / cost['sdk_cpu']:.2f} (CPU); "
        f"SDK / raw HTTP = {cost['sdk_cpu'] / cost['http_cpu']:.2f} (CPU)\n"
    )
    print(
        f"2. concurrent episodes on one core ({args.turns} turns each; figures over the steady window, "
        f"all episodes live; a level is stopped after {args.level_limit:g} s)\n"
    )
    print(
        "| episodes | turns measured | turns/s | driver CPU | CPU µs/turn | run-queue wait | added p50 ms "
        "| added p99 ms | added max ms | GC time | GC max pause ms | transcript KB | stopped unfinished | errors | target |"
    )
    print("|" + "---|" * 15)
    for row in levels:
        target = ""
        if row["episodes"] >= TARGET_EPISODES:
            target = "PASS" if row["p99"] * 1e3 < TARGET_P99_MS and not row["errors"] else "FAIL"
        print(
            f"| {row['episodes']} | {row['turns']} | {row['turns_per_s']:.0f} | {100 * row['cpu_util']:.0f}% "
            f"| {1e6 * row['cpu_per_turn']:.0f} | {100 * row['waited']:.0f}% | {1e3 * row['p50']:.2f} "
            f"| {1e3 * row['p99']:.2f} | {1e3 * row['max']:.2f} | {100 * row['gc_share']:.1f}% "
            f"| {1e3 * row['gc_max']:.1f} | {row['transcript'] / 1e3:.0f} | {row['unfinished']} | {row['errors']} | {target} |"
        )
    print()
    costs = [r["cpu_per_turn"] for r in levels if r["cpu_per_turn"] == r["cpu_per_turn"] and r["episodes"] > 1]
    if costs:
        best = min(costs)
        print(
            f"one core's ceiling at the lowest CPU per turn ({1e6 * best:.0f} µs): {1 / best:.0f} turns/s, about "
            f"{(args.latency + args.step) / best:.0f} episodes at {args.latency:g} s per reply with the core 100% busy"
        )
    wanted = [r for r in levels if r["episodes"] == TARGET_EPISODES]
    if wanted:
        row = wanted[0]
        ok = row["p99"] * 1e3 < TARGET_P99_MS and not row["errors"]
        print(
            f"target: {TARGET_EPISODES} episodes with p99 added latency < {TARGET_P99_MS:g} ms: "
            f"{1e3 * row['p99']:.2f} ms: {'met' if ok else 'MISSED'}"
        )
    waited = max((r["waited"] for r in levels), default=0.0)
    if waited > 0.05:
        print(
            f"warning: the driver waited for its core up to {100 * waited:.0f}% of the time (other processes "
            "on it): latencies are inflated by that contention; CPU per turn is not"
        )
    for row in levels:
        if row["first_error"]:
            print(f"{row['episodes']} episodes: first error: {row['first_error']}")
    walls = ", ".join(f"{r['episodes']}: {r['wall']:.1f} s" for r in levels)
    print(f"wall time per level: {walls}")
    if profile is not None:
        print(f"\ncProfile of {args.profile} episodes (top functions by own time):\n\n{profile}")
    return 1 if any(r["errors"] for r in levels) else 0


def main() -> int:
    assert __doc__ is not None  # the module docstring: the description
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--latency", type=float, default=1.0, help="mean simulated model latency, seconds")
    parser.add_argument("--jitter", type=float, default=0.5, help="relative half-width of the latency's spread")
    parser.add_argument("--step", type=float, default=0.005, help="the fake command's time, seconds")
    parser.add_argument("--turns", type=int, default=10, help="turns per episode (the last one a submit)")
    parser.add_argument("--levels", type=int, nargs="+", default=[1, 100, 250, 500, 1000])
    parser.add_argument("--cost-episodes", type=int, default=30, help="episodes of part 1")
    parser.add_argument("--level-limit", type=float, default=40.0, help="seconds before a level is stopped")
    parser.add_argument("--no-token-ids", dest="token_ids", action="store_false", help="replies without vLLM's extras")
    parser.add_argument("--profile", type=int, default=0, metavar="N", help="also profile N episodes")
    parser.add_argument("--quick", action="store_true", help="a smoke run of a few seconds")
    parser.add_argument(
        "--default-gc", dest="settle_heap", action="store_false", help="keep CPython's GC thresholds (no settle_heap)"
    )
    args = parser.parse_args()
    if args.quick:
        args.latency, args.turns, args.levels, args.cost_episodes, args.level_limit = 0.2, 4, [1, 50], 3, 5.0
    return run_command(main_async(args))


if __name__ == "__main__":
    raise SystemExit(main())
