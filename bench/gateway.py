"""The recording gateway's added latency per call against calling the upstream directly, measured
side by side in one run, at 1, 64 and 256 concurrent sessions with the gateway on one core; and the
gateway's memory per live session. Target: p99 added latency under 2 ms at 256 sessions on one core.

Three processes. The upstream, a minimal OpenAI-compatible chat server (aiohttp on uvloop), answers
``/v1/chat/completions`` at once from prebuilt bytes shaped as vLLM answers a request with
``return_token_ids`` and ``logprobs``: ``prompt_token_ids`` (one id per four bytes of the request,
so they grow with the history, as a real prompt's do), the reply's 20 ``choices[0].token_ids``, its
20 ``logprobs.content`` entries, and one ``bash`` tool call. The gateway (``termgym.gateway.Gateway``
with a ``ForwardUpstream`` per session on one shared ``aiohttp`` client, as ``HarnessAgent`` builds
them: sessions opened with a deadline and a transcript, closed at the end of their trial; CPython's
default loop and garbage collector, as a harness run has them) runs in its own process, pinned to
one core, alone on it; a small control server in the same process and event loop (not termgym's
code) opens and closes sessions and reports the process's memory. The load client (this process,
aiohttp on uvloop) is pinned to the other core, with the upstream.

Each session is a harness trial's model calls: a system prompt, the tools and the task, then per
turn the assistant's reply and a tool message of about 1 KB appended, 10 turns a trial (then a new
gateway session starts from the opening messages), so the gateway's parse and record work is a real
harness's (bodies of 3 to 14 KB, 700 to 3600 prompt ids in each answer). Every turn the session
sends the same serialized body twice, once straight to the upstream (direct) and once through its
gateway session, in a random order, then waits a think time (the model's latency and the command's
in a real rollout) of ``--think`` seconds ± ``--jitter`` (relative); with one session the think
time is ``--single-think`` (the floor, without the idle core's wake-ups dominating). Latency is the
client's, from the request's send to the answer's last byte; the first turn of each session (its
connections' set-up) is left out. Added latency is the gateway's percentile minus the direct
call's: both are measured at the same moments under the same load on the client's core, so the
difference is what the extra hop and the gateway's work add. Per level the gateway's CPU per call
and utilisation (``/proc/PID/stat``), its run-queue wait (the share of the level its threads were
runnable while another process had its core, ``/proc/PID/task/*/schedstat``: above a few percent,
other work on the machine inflates the figures), its garbage collector's share of the level and
its longest pause (``gc.callbacks``).

Memory per live session: a fresh gateway process, warmed up (connections to the upstream made,
then closed); its RSS (``/proc/self/status``, after ``gc.collect()``) before ``--memory-sessions``
sessions are opened and after each has made ``--memory-calls`` calls (the calls are kept in memory:
requests, answers, token ids, the transcript's last reply); per session is the growth over the
number of sessions. What an open session holds before its first call is traced (``tracemalloc``
around the opening: RSS is too coarse for it).

    .venv/bin/python bench/gateway.py [--levels 1 64 256] [--calls 3000] [--single-calls 400]
        [--think 1.0] [--jitter 0.5] [--single-think 0.02] [--memory-sessions 1000] [--memory-calls 10]
        [--settled-heap] [--record-on-close] [--profile N] [--quick]

By default the gateway runs as shipped: under ``termgym.agents.heap.settled_heap`` (what ``termgym
run`` and ``termgym gateway`` do; ``--no-settled-heap``: CPython's thresholds), and at each
session's close doing what ``HarnessAgent.run`` does when its trial ends, in the same event loop:
the transcript's record of the session's calls (``Call.to_dict`` of each, the merged samples;
``--no-record-on-close`` leaves it out).
``--profile N`` runs N sessions once more afterwards with cProfile on in the gateway process and
prints the top functions by own time (cProfile slows the gateway: those latencies are not the
table's). ``--quick`` is a smoke run of about 10 seconds. The whole run with the defaults: about
100 seconds.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import gc
import io
import json
import math
import multiprocessing
import os
import pstats
import random
import sys
import time
import tracemalloc
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.model_agent import pin

MODEL = "bench-model"
EPISODE_TURNS = 10  # a trial's calls: then a new gateway session from the opening messages
COMPLETION_TOKENS = 20
TARGET_SESSIONS = 256
TARGET_P99_MS = 2.0
HEADERS = {"content-type": "application/json", "authorization": "Bearer EMPTY"}

SYSTEM = (
    "You are a helpful assistant that can interact with a computer shell to solve programming tasks. "
    "Think step by step, run one command at a time with the bash tool, read its output carefully, and "
    "submit when the task is done. Never ask the user for clarification; make reasonable assumptions. "
) * 5
TASK = (
    "In /app there is a Python project whose test suite fails. Find the bug in the package, fix it "
    "without changing the tests, run the tests to check, and write a one-line summary of the fix to "
    "/app/SUMMARY.txt. The repository uses pytest; the tests are in /app/tests. "
) * 2
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "bash",
            "description": "Run a bash command in the task's shell and return its output and exit code.",
            "parameters": {
                "type": "object",
                "properties": {
                    "command": {"type": "string", "description": "The command to run."},
                    "timeout": {"type": "integer", "description": "Seconds before the command is stopped."},
                },
                "required": ["command"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "submit",
            "description": "Submit the task as done.",
            "parameters": {"type": "object", "properties": {}},
        },
    },
]
LISTING = "\n".join(f"-rw-r--r-- 1 root root {1000 + 37 * i:>6} Nov 29 12:{i:02d} module_{i:02d}.py" for i in range(20))
OUTPUT = LISTING[:1000]  # what every command "prints": about 1 KB
ARGUMENTS = json.dumps({"command": "ls -la /app/src"})
REPLY_TEXT = "Let me look at the source files first."


def assistant_message(call_id: str) -> dict[str, Any]:
    """The upstream's reply as a harness appends it to its history."""
    call = {"id": call_id, "type": "function", "function": {"name": "bash", "arguments": ARGUMENTS}}
    return {"role": "assistant", "content": REPLY_TEXT, "tool_calls": [call]}


def opening(session: int) -> list[dict[str, Any]]:
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": f"[trial {session}] {TASK}"}]


def request_body(messages: list[dict[str, Any]]) -> bytes:
    body = {"model": MODEL, "messages": messages, "tools": TOOLS, "temperature": 1.0, "max_tokens": 4096}
    return json.dumps(body).encode()


# -- the upstream (its own process) -----------------------------------------------------------


class FastUpstream:
    """Answers every chat request at once, from prebuilt bytes, as vLLM answers a request with
    ``return_token_ids`` and ``logprobs`` (module docstring); does not parse the request."""

    def __init__(self) -> None:
        self.ids = b",".join(b"%d" % (10000 + (7919 * i) % 90000) for i in range(60_000))  # 6 bytes an id
        self.calls = 0
        entry = '{"token":"x","logprob":-0.125,"bytes":[120],"top_logprobs":[]}'
        message = json.dumps(assistant_message("call_0"))
        self.head = b'{"id":"chatcmpl-bench","object":"chat.completion","created":1764400000,"model":"%s",' % (
            MODEL.encode()
        )
        self.choice = (
            '"choices":[{"index":0,"message":'
            + message
            + ',"logprobs":{"content":['
            + ",".join([entry] * COMPLETION_TOKENS)
            + ']},"finish_reason":"tool_calls","stop_reason":null,"token_ids":['
        ).encode()

    async def chat(self, request: Any) -> Any:
        from aiohttp import web

        body = await request.read()
        self.calls += 1
        prompt = min(max(1, len(body) // 4), 60_000 - COMPLETION_TOKENS)
        payload = b"".join(
            (
                self.head,
                b'"prompt_token_ids":[',
                self.ids[: 6 * prompt - 1],
                b"],",
                self.choice,
                self.ids[6 * prompt : 6 * (prompt + COMPLETION_TOKENS) - 1],
                b']}],"usage":{"prompt_tokens":%d,"completion_tokens":%d,"total_tokens":%d}}'
                % (prompt, COMPLETION_TOKENS, prompt + COMPLETION_TOKENS),
            )
        )
        return web.Response(body=payload, content_type="application/json")


def serve_upstream(pipe: Any, core: int | None) -> None:
    """The upstream process: pinned to ``core``, on uvloop where installed; sends its port, then
    serves until it is terminated."""
    if core is not None:
        os.sched_setaffinity(0, {core})
    from aiohttp import web

    async def run() -> None:
        server = FastUpstream()
        app = web.Application(client_max_size=64 << 20)
        app.router.add_post("/v1/chat/completions", server.chat)
        runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0, backlog=4096)
        await site.start()
        pipe.send(runner.addresses[0][1])
        await asyncio.Event().wait()

    _run(run(), fast=True)


def _run(coroutine: Any, *, fast: bool) -> None:
    factory: Any = None
    if fast:
        try:
            import uvloop

            factory = uvloop.new_event_loop
        except ImportError:
            pass
    with asyncio.Runner(loop_factory=factory) as runner:
        runner.run(coroutine)


# -- the gateway (its own process) ------------------------------------------------------------


def rss_kb() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def serve_gateway(pipe: Any, core: int | None, upstream_url: str, settle: bool, record: bool) -> None:
    """The gateway process: termgym's ``Gateway`` as a harness run starts it (CPython's default
    event loop and collector), pinned to ``core``, and a control server in the same event loop:
    ``POST /open`` and ``/close`` (``{"ids": [...]}``), ``GET /stats`` (``?collect=1``: after
    ``gc.collect()``), ``POST /profile`` (``{"on": bool}``: the profile's text when turned off)."""
    if core is not None:
        os.sched_setaffinity(0, {core})
    import aiohttp
    from aiohttp import web

    from termgym.gateway import ForwardUpstream, Gateway
    from termgym.integrations.harness import _record
    from termgym.transcript import Transcript

    async def run() -> None:
        http = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1000, force_close=False))
        gateway = await Gateway().start()
        dropped: set[str] = set()
        closed = {"calls": 0, "failed": 0}
        pauses: list[float] = []
        started = [0.0]
        profiler: list[cProfile.Profile] = []

        def on_gc(phase: str, info: dict[str, Any]) -> None:
            if phase == "start":
                started[0] = time.perf_counter()
            else:
                pauses.append(time.perf_counter() - started[0])

        gc.callbacks.append(on_gc)

        async def open_sessions(request: Any) -> Any:
            ids = (await request.json())["ids"]
            traced = request.query.get("trace")  # the bytes the open sessions hold (RSS is too coarse)
            if traced:
                tracemalloc.start()
            deadline = time.monotonic() + 3600.0  # the trial's agent time
            for sid in ids:
                upstream = ForwardUpstream(upstream_url, http, None, {}, dropped)
                gateway.open(sid, upstream, model=MODEL, deadline=deadline, transcript=Transcript())
            held = tracemalloc.get_traced_memory()[0] if traced else 0
            if traced:
                tracemalloc.stop()
            return web.json_response({"bytes": held})

        async def close_sessions(request: Any) -> Any:
            for sid in (await request.json())["ids"]:
                session = gateway.close(sid, "trial_ended")
                if record:  # what HarnessAgent.run does when its trial ends, in the gateway's event loop
                    _record(session.transcript, "bench", session, None)
                closed["calls"] += len(session.calls)
                closed["failed"] += sum(1 for call in session.calls if call.status != 200)
            return web.json_response({})

        async def stats(request: Any) -> Any:
            if request.query.get("collect"):
                gc.collect()
            calls = [call for session in gateway.sessions.values() for call in session.calls]
            gc_max, gc_total = max(pauses, default=0.0), sum(pauses)
            pauses.clear()
            return web.json_response(
                {
                    "rss_kb": rss_kb(),
                    "sessions": len(gateway.sessions),
                    "calls": closed["calls"] + len(calls),
                    "failed": closed["failed"] + sum(1 for call in calls if call.status != 200),
                    "prompt_ids": sum(len(call.prompt_ids or ()) for call in calls),
                    "gc_max": gc_max,
                    "gc_total": gc_total,
                }
            )

        async def profile(request: Any) -> Any:
            if (await request.json())["on"]:
                profiler.append(cProfile.Profile())
                profiler[-1].enable()
                return web.json_response({})
            done = profiler.pop()
            done.disable()
            out = io.StringIO()
            pstats.Stats(done, stream=out).sort_stats("tottime").print_stats(30)
            return web.json_response({"text": out.getvalue()})

        app = web.Application()
        app.router.add_post("/open", open_sessions)
        app.router.add_post("/close", close_sessions)
        app.router.add_get("/stats", stats)
        app.router.add_post("/profile", profile)
        runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        pipe.send((gateway.port, runner.addresses[0][1]))
        try:
            await asyncio.Event().wait()
        finally:
            await gateway.aclose()
            await http.close()

    if settle:  # what `termgym run` does for the model agent's episodes, not (yet) for a harness's
        from termgym.agents.heap import settled_heap

        with settled_heap():
            _run(run(), fast=False)
    else:
        _run(run(), fast=False)


# -- the processes, from outside --------------------------------------------------------------


def cpu_seconds(pid: int) -> float:
    """User and system CPU of process ``pid``, all its threads (``/proc/PID/stat``)."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def wait_seconds(pid: int) -> float:
    """Seconds the threads of ``pid`` waited runnable on a run queue; 0 where not reported."""
    total = 0
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/schedstat") as stat:
                total += int(stat.read().split()[1])
    except (OSError, IndexError, ValueError):
        return 0.0
    return total / 1e9


class Bench:
    """The processes and the client's connections: ``direct`` to the upstream, ``through`` the
    gateway, ``control`` to the gateway process's control server."""

    def __init__(self, upstream_port: int, gateway_port: int, control_port: int, gateway_pid: int) -> None:
        import aiohttp

        self.direct_url = f"http://127.0.0.1:{upstream_port}/v1/chat/completions"
        self.gateway_url = f"http://127.0.0.1:{gateway_port}"
        self.control_url = f"http://127.0.0.1:{control_port}"
        self.gateway_pid = gateway_pid
        self.direct = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
        self.through = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
        self.control = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))

    async def aclose(self) -> None:
        for http in (self.direct, self.through, self.control):
            await http.close()

    async def post(self, http: Any, url: str, payload: bytes) -> float:
        started = time.perf_counter()
        async with http.post(url, data=payload, headers=HEADERS) as response:
            await response.read()
            status = response.status
        elapsed = time.perf_counter() - started
        if status != 200:
            raise RuntimeError(f"{url} answered HTTP {status}")
        return elapsed

    async def command(self, route: str, data: dict[str, Any] | None = None, **query: str) -> dict[str, Any]:
        url = self.control_url + route
        if data is None:
            method = self.control.get(url, params=query)
        else:
            method = self.control.post(url, json=data, params=query)
        async with method as response:
            response.raise_for_status()
            return await response.json()

    def chat_url(self, sid: str) -> str:
        return f"{self.gateway_url}/sessions/{sid}/v1/chat/completions"


def spawn(context: Any, target: Any, *args: Any) -> tuple[Any, Any]:
    parent, child = context.Pipe()
    process = context.Process(target=target, args=(child, *args), daemon=True)
    process.start()
    if not parent.poll(60):
        process.terminate()
        raise RuntimeError(f"{target.__name__} did not start")
    return process, parent.recv()


def stop(process: Any) -> None:
    process.terminate()
    process.join(10)
    if process.is_alive():
        process.kill()
        process.join(5)


# -- one level --------------------------------------------------------------------------------


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


async def run_sessions(
    bench: Bench, sessions: int, turns: int, think: float, jitter: float, tag: str, seed: int
) -> tuple[list[float], list[float]]:
    """``sessions`` concurrent sessions of ``turns`` turns, each turn the same body direct and
    through the gateway in a random order; the latencies of both, the first turn of each left out."""
    direct: list[float] = []
    through: list[float] = []

    async def session(slot: int) -> None:
        rng = random.Random(seed * 100_003 + slot)
        await asyncio.sleep(rng.uniform(0, think))  # arrivals spread over one think time
        sid, messages = "", []
        for turn in range(turns):
            if turn % EPISODE_TURNS == 0:  # a new trial: a new gateway session, the opening history
                if sid:
                    await bench.command("/close", {"ids": [sid]})
                sid = f"{tag}-{slot}-{turn // EPISODE_TURNS}"
                await bench.command("/open", {"ids": [sid]})
                messages = opening(slot)
            payload = request_body(messages)
            legs = [(bench.direct, bench.direct_url, direct), (bench.through, bench.chat_url(sid), through)]
            rng.shuffle(legs)
            for http, url, out in legs:
                elapsed = await bench.post(http, url, payload)
                if turn > 0:
                    out.append(elapsed)
            call_id = f"call_{turn}"
            messages += [assistant_message(call_id), {"role": "tool", "tool_call_id": call_id, "content": OUTPUT}]
            if think > 0:
                await asyncio.sleep(think * rng.uniform(1 - jitter, 1 + jitter))
        await bench.command("/close", {"ids": [sid]})

    await asyncio.gather(*(session(slot) for slot in range(sessions)))
    return direct, through


async def run_level(bench: Bench, args: argparse.Namespace, sessions: int, pids: dict[str, int]) -> dict[str, Any]:
    single = sessions == 1
    calls = args.single_calls if single else args.calls
    think = args.single_think if single else args.think
    turns = 1 + math.ceil(calls / sessions)
    before = await bench.command("/stats")
    cpu = {name: cpu_seconds(pid) for name, pid in pids.items()}
    waited = wait_seconds(pids["gateway"])
    wall = time.monotonic()
    direct, through = await run_sessions(bench, sessions, turns, think, args.jitter, f"L{sessions}", sessions)
    wall = time.monotonic() - wall
    waited = wait_seconds(pids["gateway"]) - waited
    cpu = {name: cpu_seconds(pid) - cpu[name] for name, pid in pids.items()}
    after = await bench.command("/stats")
    recorded = after["calls"] - before["calls"]
    expected = sessions * turns
    return {
        "sessions": sessions,
        "think": think,
        "measured": len(through),
        "rate": recorded / wall,
        "gateway_util": cpu["gateway"] / wall,
        "gateway_per_call": cpu["gateway"] / recorded if recorded else math.nan,
        "other_util": (cpu["client"] + cpu["upstream"]) / wall,
        "waited": waited / wall,
        "direct": (percentile(direct, 0.5), percentile(direct, 0.99)),
        "through": (percentile(through, 0.5), percentile(through, 0.99)),
        "gc_max": after["gc_max"],
        "gc_share": after["gc_total"] / wall,
        "errors": after["failed"] - before["failed"] + abs(recorded - expected),
        "wall": wall,
    }


async def profile_level(bench: Bench, args: argparse.Namespace) -> str:
    await bench.command("/profile", {"on": True})
    turns = 1 + math.ceil(args.calls / args.profile)
    await run_sessions(bench, args.profile, turns, args.think, args.jitter, "P", 7)
    return (await bench.command("/profile", {"on": False}))["text"]


# -- memory per live session ------------------------------------------------------------------


async def measure_memory(bench: Bench, args: argparse.Namespace) -> dict[str, Any]:
    """RSS of a fresh gateway process before, after opening the sessions, and after their calls."""
    workers = min(100, args.memory_sessions)

    async def trial(sid: str, slot: int, calls: int) -> None:
        messages = opening(slot)
        for turn in range(calls):
            await bench.post(bench.through, bench.chat_url(sid), request_body(messages))
            call_id = f"call_{turn}"
            messages += [assistant_message(call_id), {"role": "tool", "tool_call_id": call_id, "content": OUTPUT}]

    async def drive(ids: list[str], calls: int) -> None:
        queue: asyncio.Queue[tuple[int, str]] = asyncio.Queue()
        for slot, sid in enumerate(ids):
            queue.put_nowait((slot, sid))

        async def worker() -> None:
            while not queue.empty():
                slot, sid = queue.get_nowait()
                await trial(sid, slot, calls)

        await asyncio.gather(*(worker() for _ in range(workers)))

    warm = [f"warm-{i}" for i in range(workers)]  # the upstream connections made, then the sessions closed
    await bench.command("/open", {"ids": warm})
    await drive(warm, 2)
    await bench.command("/close", {"ids": warm})
    before = await bench.command("/stats", collect="1")
    ids = [f"mem-{i}" for i in range(args.memory_sessions)]
    opened = await bench.command("/open", {"ids": ids}, trace="1")
    await drive(ids, args.memory_calls)
    after = await bench.command("/stats", collect="1")
    async with bench.control.get(f"{bench.gateway_url}/sessions/{ids[0]}/calls") as response:
        recorded = len(await response.read())
    count = args.memory_sessions
    return {
        "sessions": count,
        "calls": args.memory_calls,
        "before": before["rss_kb"],
        "after": after["rss_kb"],
        "empty_kb": opened["bytes"] / 1024 / count,
        "per_session_kb": (after["rss_kb"] - before["rss_kb"]) / count,
        "recorded_kb": recorded / 1024,
        "prompt_ids": after["prompt_ids"] / max(1, after["calls"] - before["calls"]),
        "errors": after["failed"] + abs(after["calls"] - before["calls"] - count * args.memory_calls),
    }


# -- the run ----------------------------------------------------------------------------------


async def start_gateway(
    context: Any, core: int | None, upstream_port: int, args: argparse.Namespace
) -> tuple[Any, Bench]:
    upstream_url = f"http://127.0.0.1:{upstream_port}/v1"
    settings = (core, upstream_url, args.settle_heap, args.record_on_close)
    process, (gateway_port, control_port) = spawn(context, serve_gateway, *settings)
    return process, Bench(upstream_port, gateway_port, control_port, process.pid)


async def main_async(args: argparse.Namespace) -> int:
    client_core, gateway_core = pin()  # the client (this process) and the upstream share a core
    context = multiprocessing.get_context("spawn")
    processes: list[Any] = []
    bench: Bench | None = None
    try:
        upstream, upstream_port = spawn(context, serve_upstream, client_core)
        processes.append(upstream)
        gateway, bench = await start_gateway(context, gateway_core, upstream_port, args)
        processes.append(gateway)
        pids = {"gateway": gateway.pid, "upstream": upstream.pid, "client": os.getpid()}
        levels = [await run_level(bench, args, n, pids) for n in args.levels]
        profile = await profile_level(bench, args) if args.profile else None
        await bench.aclose()
        stop(gateway)
        processes.remove(gateway)
        gateway, bench = await start_gateway(context, gateway_core, upstream_port, args)  # a fresh heap
        processes.append(gateway)
        memory = await measure_memory(bench, args)
    finally:
        if bench is not None:
            await bench.aclose()
        for process in processes:
            stop(process)
    report(args, levels, memory, profile, gateway_core, client_core)
    return 1 if any(row["errors"] for row in levels) or memory["errors"] else 0


def report(
    args: argparse.Namespace,
    levels: list[dict[str, Any]],
    memory: dict[str, Any],
    profile: str | None,
    gateway_core: int | None,
    client_core: int | None,
) -> None:
    where = (
        f"gateway pinned to core {gateway_core} alone; client and upstream pinned to core {client_core}"
        if gateway_core is not None
        else "NOT pinned (fewer than two cores)"
    )
    collector = "settled_heap" if args.settle_heap else "CPython's default thresholds"
    record = "; at each close, the transcript's record built (HarnessAgent's)" if args.record_on_close else ""
    print(
        f"{where}; think time {args.think:g} s ± {100 * args.jitter:g}% ({args.single_think:g} s with one session), "
        f"{EPISODE_TURNS} calls per gateway session, each call's body sent direct and through the gateway; "
        f"the gateway's collector: {collector}{record}\n"
    )
    print(
        "| sessions | calls measured (each way) | calls/s | gateway CPU | gateway CPU µs/call | gateway run-queue wait "
        "| client+upstream CPU | direct p50 ms | direct p99 ms | gateway p50 ms | gateway p99 ms | added p50 ms "
        "| added p99 ms | gateway/direct p50 | gateway/direct p99 | GC time | GC max pause ms | errors | target |"
    )
    print("|" + "---|" * 19)
    for row in levels:
        (d50, d99), (g50, g99) = row["direct"], row["through"]
        target = ""
        if row["sessions"] == TARGET_SESSIONS:
            target = "PASS" if (g99 - d99) * 1e3 < TARGET_P99_MS and not row["errors"] else "FAIL"
        print(
            f"| {row['sessions']} | {row['measured']} | {row['rate']:.0f} | {100 * row['gateway_util']:.0f}% "
            f"| {1e6 * row['gateway_per_call']:.0f} | {100 * row['waited']:.1f}% | {100 * row['other_util']:.0f}% "
            f"| {1e3 * d50:.2f} | {1e3 * d99:.2f} | {1e3 * g50:.2f} | {1e3 * g99:.2f} | {1e3 * (g50 - d50):.2f} "
            f"| {1e3 * (g99 - d99):.2f} | {g50 / d50:.2f} | {g99 / d99:.2f} | {100 * row['gc_share']:.1f}% | {1e3 * row['gc_max']:.1f} "
            f"| {row['errors']} | {target} |"
        )
    print()
    wanted = [row for row in levels if row["sessions"] == TARGET_SESSIONS]
    if wanted:
        row = wanted[0]
        added = 1e3 * (row["through"][1] - row["direct"][1])
        ok = added < TARGET_P99_MS and not row["errors"]
        print(
            f"target: p99 added latency < {TARGET_P99_MS:g} ms at {TARGET_SESSIONS} sessions on one core: "
            f"{added:.2f} ms: {'met' if ok else 'MISSED'}"
        )
    busy = [row for row in levels if row["waited"] > 0.05]
    if busy:
        print(
            f"warning: the gateway waited for its core up to {100 * max(r['waited'] for r in busy):.0f}% of a level "
            "(other work on the machine): its latencies are inflated by that"
        )
    print("wall time per level: " + ", ".join(f"{r['sessions']}: {r['wall']:.1f} s" for r in levels))
    print(
        f"\nmemory per live session: a fresh gateway process, {memory['sessions']} sessions open, "
        f"{memory['calls']} calls each (mean {memory['prompt_ids']:.0f} prompt ids per answer)\n"
    )
    print("| gateway RSS | MB |")
    print("|---|---|")
    print(f"| before (warmed up, no session open) | {memory['before'] / 1024:.1f} |")
    print(f"| {memory['sessions']} sessions open, after {memory['calls']} calls each | {memory['after'] / 1024:.1f} |")
    print()
    print(
        f"per session: {memory['per_session_kb']:.0f} KB with {memory['calls']} calls recorded "
        f"(of which {memory['empty_kb']:.1f} KB an open session without calls, traced); one session's GET /calls is {memory['recorded_kb']:.0f} KB "
        f"of JSON; errors {memory['errors']}"
    )
    if profile is not None:
        print(f"\ncProfile of the gateway process, {args.profile} sessions (top functions by own time):\n\n{profile}")


def main() -> int:
    assert __doc__ is not None  # the module docstring: the description
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--levels", type=int, nargs="+", default=[1, 64, 256], help="concurrent sessions")
    parser.add_argument("--calls", type=int, default=3000, help="calls measured each way per level")
    parser.add_argument("--single-calls", type=int, default=400, help="calls measured each way with one session")
    parser.add_argument("--think", type=float, default=1.0, help="mean seconds between a session's calls")
    parser.add_argument("--jitter", type=float, default=0.5, help="relative half-width of the think time's spread")
    parser.add_argument("--single-think", type=float, default=0.02, help="seconds between calls with one session")
    parser.add_argument("--memory-sessions", type=int, default=1000)
    parser.add_argument("--memory-calls", type=int, default=10)
    parser.add_argument("--profile", type=int, default=0, metavar="N", help="also profile N sessions")
    parser.add_argument(
        "--settled-heap",
        dest="settle_heap",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="run the gateway process under termgym.agents.heap.settled_heap, as termgym run and termgym gateway do (default; --no-settled-heap: CPython's thresholds)",
    )
    parser.add_argument(
        "--record-on-close",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="at a session's close, build its transcript's record as HarnessAgent does (calls' to_dict, merge; default)",
    )
    parser.add_argument("--quick", action="store_true", help="a smoke run of about 10 seconds")
    args = parser.parse_args()
    if args.quick:
        args.calls, args.single_calls, args.think, args.memory_sessions = 300, 50, 0.3, 100
    result: list[int] = []

    async def run() -> None:
        result.append(await main_async(args))

    _run(run(), fast=True)  # the client on uvloop, as the upstream: their core is shared
    return result[0]


if __name__ == "__main__":
    raise SystemExit(main())
