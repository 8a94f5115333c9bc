"""A small Daytona API on 127.0.0.1 for tests: what the termgym backend uses, as the pinned SDK
(``daytona==0.226.1``) sends and expects it, each sandbox a real local bubblewrap sandbox.

Control plane (``/api``): sandbox create / get / delete / list by labels (cursor pages), snapshot
get / create / delete. Toolbox (``/toolbox/<sandbox id>``): ``process/execute``, sessions (create,
asynchronous and synchronous commands, command status, logs as JSON or a following websocket with
the daemon's ``\\x01\\x01\\x01`` stdout marker, input, delete), ``files/bulk-upload``,
``files/bulk-download`` (multipart), ``work-dir``. Errors use the API's JSON envelope. The
Socket.IO event gateway is absent (404), so the SDK falls back to polling, as it does when the
gateway is unreachable.

A sandbox is a ``LocalSandbox``: commands really run in it. A session is a long-lived ``sh`` in the
sandbox; each command is written to it wrapped as the daemon wraps it (an input FIFO made inside
the session shell, output to a log file, the exit code to a file), so the first input can race the
FIFO exactly as with the daemon. A snapshot is "built" by preparing a local sandbox from its
Dockerfile (``RUN`` steps really run) and recording the Dockerfile; build contexts (object storage)
are not supported.

Faults (``Faults``): scripted or random outcomes per create attempt (429 with retry-after headers,
quota 400s, 500s before or after the sandbox exists, sandboxes that end in the error state), a
server-side create throttle, slow creates (stay ``creating``) and slow create answers, 5xx storms
on any path, a stale list. ``kill`` makes a sandbox disappear. Every request is recorded with its
time on the event loop's clock.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import errno
import io
import json
import os
import random
import re
import shutil
import signal
import tarfile
import tempfile
import uuid
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from aiohttp import BodyPartReader, MultipartWriter, web
from aiohttp.abc import AbstractStreamWriter

from termgym.errors import SandboxError
from termgym.sandboxes.base import SandboxSpec
from termgym.sandboxes.local import LocalSandbox
from termgym.sandboxes.pacing import max_in_any_window

STDOUT_PREFIX = b"\x01\x01\x01"
SESSIONS_DIR = "/run/.daytona/sessions"  # inside each sandbox, as the daemon keeps its own


@dataclass
class Faults:
    """What goes wrong, and when. Create outcomes: ``ok``, ``429``, ``quota``, ``500`` (nothing
    created), ``500-after`` (created, then 500), ``error-state`` (created, never starts)."""

    create_script: deque[str] = field(default_factory=deque)  # outcomes of the next create attempts
    create_rates: dict[str, float] = field(default_factory=dict)  # random outcomes, by probability
    retry_after: float = 1.0  # seconds, in Retry-After-sandbox-create
    throttle: tuple[int, float] | None = None  # the server's own create limit: (count, window s)
    create_latency: float = 0.0  # a new sandbox stays "creating" this long
    answer_delay: float = 0.0  # the create POST answers this late (the sandbox exists before)
    storms: list[tuple[str, str, int, int]] = field(default_factory=list)  # (method, path regex, status, count)
    stale_list: bool = False  # the list keeps showing deleted sandboxes as started
    input_keeper_delay: float = 0.0  # the session wrapper's FIFO writer opens this late (a race of the daemon)
    seed: int = 0


@dataclass
class RequestRecord:
    time: float
    method: str
    path: str
    status: int = 0


@dataclass
class FakeCommand:
    id: str
    command: str
    dir: str  # in the sandbox
    host_dir: Path
    suppress_echo: bool

    @property
    def exit_code(self) -> int | None:
        try:
            return int((self.host_dir / "exit_code").read_text().strip())
        except (OSError, ValueError):
            return None


@dataclass
class FakeSession:
    id: str
    shell: Any  # ProcessChannel of the session's sh
    drain: asyncio.Task[None]
    commands: dict[str, FakeCommand] = field(default_factory=dict)
    deleted: bool = False


@dataclass
class FakeSandbox:
    id: str
    name: str
    body: dict[str, Any]
    local: LocalSandbox
    state: str = "creating"
    error_reason: str | None = None
    ready_at: float = 0.0  # loop time from which a booted sandbox reports "started"
    boot: asyncio.Task[None] | None = None
    sessions: dict[str, FakeSession] = field(default_factory=dict)
    created_at: str = field(default_factory=lambda: dt.datetime.now(dt.UTC).isoformat())


class FakeDaytona:
    """The server. ``await start()``, point ``DAYTONA_API_URL`` at ``api_url``, ``await close()``."""

    def __init__(self, *, api_key: str = "test-key", faults: Faults | None = None, workdir: Path | None = None) -> None:
        self.api_key = api_key
        self.faults = faults or Faults()
        self.requests: list[RequestRecord] = []
        self.create_times: list[float] = []
        self.sandboxes: dict[str, FakeSandbox] = {}
        self.peak_live = 0  # the most sandboxes that ever existed at once, counted at each create
        self.snapshots: dict[str, dict[str, Any]] = {}
        self.ghosts: dict[str, dict[str, Any]] = {}  # deleted, still listed when the list is stale
        self.create_bodies: list[dict[str, Any]] = []
        self._workdir = Path(workdir or tempfile.mkdtemp(prefix="fake-daytona-"))
        self._rng = random.Random(self.faults.seed)
        self._runner: web.AppRunner | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self.port = 0

    # -- lifecycle and inspection ----------------------------------------------------------------

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def api_url(self) -> str:
        return f"{self.base_url}/api"

    async def start(self) -> FakeDaytona:
        app = web.Application(middlewares=[self._middleware], client_max_size=1 << 30)
        api, box = "/api", "/toolbox/{sid}"
        app.router.add_post(f"{api}/sandbox", self.create_sandbox)
        app.router.add_get(f"{api}/sandbox", self.list_sandboxes)
        app.router.add_get(f"{api}/sandbox/{{key}}", self.get_sandbox)
        app.router.add_delete(f"{api}/sandbox/{{key}}", self.delete_sandbox)
        app.router.add_get(f"{api}/snapshots/{{key}}", self.get_snapshot)
        app.router.add_post(f"{api}/snapshots", self.create_snapshot)
        app.router.add_delete(f"{api}/snapshots/{{key}}", self.delete_snapshot)
        app.router.add_post(f"{box}/process/execute", self.execute)
        app.router.add_post(f"{box}/process/session", self.create_session)
        app.router.add_delete(f"{box}/process/session/{{session}}", self.delete_session)
        app.router.add_post(f"{box}/process/session/{{session}}/exec", self.session_exec)
        app.router.add_get(f"{box}/process/session/{{session}}/command/{{command}}", self.get_command)
        app.router.add_get(f"{box}/process/session/{{session}}/command/{{command}}/logs", self.command_logs)
        app.router.add_post(f"{box}/process/session/{{session}}/command/{{command}}/input", self.command_input)
        app.router.add_post(f"{box}/files/bulk-upload", self.bulk_upload)
        app.router.add_post(f"{box}/files/bulk-download", self.bulk_download)
        app.router.add_get(f"{box}/work-dir", self.work_dir)
        app.router.add_get("/_fake/stats", self.stats)  # not Daytona's: for a benchmark in another process
        self._runner = web.AppRunner(app, handle_signals=False)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        (address,) = self._runner.addresses  # the one listening socket
        self.port = address[1]
        return self

    async def close(self) -> None:
        for sandbox in list(self.sandboxes.values()):
            await self._destroy(sandbox)
        for task in list(self._tasks):
            task.cancel()
        if self._runner is not None:
            await self._runner.cleanup()
        shutil.rmtree(self._workdir, ignore_errors=True)

    async def stats(self, request: web.Request) -> web.StreamResponse:
        creates = [r for r in self.requests if r.method == "POST" and r.path == "/api/sandbox"]
        return web.json_response(
            {
                "create_times": self.create_times,
                "create_statuses": [r.status for r in creates],
                "live": len(self.sandboxes),
                "requests": len(self.requests),
                "snapshot_builds": sum(1 for r in self.requests if r.method == "POST" and r.path == "/api/snapshots"),
            }
        )

    def live(self) -> list[FakeSandbox]:
        return list(self.sandboxes.values())

    def max_creates(self, period: float) -> int:
        return max_in_any_window(self.create_times, period)

    async def kill(self, sandbox_id: str) -> None:
        """The sandbox disappears: its processes die, every later request about it gets a 404."""
        sandbox = self.sandboxes.get(sandbox_id)
        if sandbox is not None:
            await self._destroy(sandbox)

    # -- plumbing --------------------------------------------------------------------------------

    @web.middleware
    async def _middleware(self, request: web.Request, handler: Any) -> web.StreamResponse:
        record = RequestRecord(asyncio.get_running_loop().time(), request.method, request.path)
        self.requests.append(record)
        if request.method == "POST" and request.path == "/api/sandbox":
            self.create_times.append(record.time)  # every attempt, whatever the answer
        if request.path.startswith("/api/socket.io"):
            response: web.StreamResponse = _error(404, "Cannot GET /api/socket.io/")  # no event gateway
        elif request.headers.get("Authorization") != f"Bearer {self.api_key}":
            response = _error(401, "Invalid credentials")
        else:
            response = self._storm(request) or await handler(request)
        record.status = response.status
        return response

    def _storm(self, request: web.Request) -> web.Response | None:
        for index, (method, pattern, status, count) in enumerate(self.faults.storms):
            if count > 0 and method == request.method and re.search(pattern, request.path):
                self.faults.storms[index] = (method, pattern, status, count - 1)
                return _error(status, "Internal server error" if status >= 500 else "error")
        return None

    def _spawn(self, coroutine: Any) -> asyncio.Task[Any]:
        task = asyncio.ensure_future(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def _find(self, key: str) -> FakeSandbox | None:
        return self.sandboxes.get(key) or next((s for s in self.sandboxes.values() if s.name == key), None)

    def _dto(self, sandbox: FakeSandbox, *, state: str | None = None) -> dict[str, Any]:
        body = sandbox.body
        return {
            "id": sandbox.id,
            "organizationId": "org-test",
            "name": sandbox.name,
            "user": body.get("user") or "root",
            "env": body.get("env") or {},
            "labels": body.get("labels") or {},
            "public": False,
            "networkBlockAll": bool(body.get("networkBlockAll")),
            "kvm": False,
            "target": "us",
            "cpu": int(body.get("cpu") or 1),
            "gpu": 0,
            "memory": int(body.get("memory") or 1),
            "disk": int(body.get("disk") or 3),
            "toolboxProxyUrl": f"{self.base_url}/toolbox",
            "state": state or self._state(sandbox),
            "errorReason": sandbox.error_reason,
            "snapshot": body.get("snapshot"),
            "autoStopInterval": body.get("autoStopInterval"),
            "autoDeleteInterval": body.get("autoDeleteInterval"),
            "createdAt": sandbox.created_at,
            "updatedAt": sandbox.created_at,
        }

    # -- control plane: sandboxes ----------------------------------------------------------------

    async def create_sandbox(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.create_bodies.append(body)
        outcome = self._create_outcome()
        if outcome == "429":
            headers = {
                "Retry-After-sandbox-create": f"{self.faults.retry_after:g}",
                "X-RateLimit-Limit-sandbox-create": "600",
            }
            return _error(429, "ThrottlerException: Too Many Requests", headers=headers)
        if outcome == "quota":
            return _error(400, "Total CPU limit exceeded. Maximum allowed: 10.")
        if outcome == "500":
            return _error(500, "Internal server error")
        if not isinstance(body.get("labels"), dict):
            return _error(400, "labels must be an object")
        sandbox_id = str(uuid.uuid4())
        body = {**body, "name": body.get("name") or sandbox_id}
        if self._find(body["name"]) is not None:
            return _error(409, f"Sandbox with name {body['name']} already exists")
        dockerfile: str | None = None
        if body.get("snapshot"):
            snapshot = self.snapshots.get(body["snapshot"])
            if snapshot is None or snapshot["state"] != "active":
                return _error(400, f"Snapshot {body['snapshot']} not found or not active")
            dockerfile = snapshot["dockerfile"]
            body = {**body, "cpu": snapshot["cpu"], "memory": snapshot["mem"], "disk": snapshot["disk"]}
        elif body.get("buildInfo"):
            dockerfile = body["buildInfo"].get("dockerfileContent")
        sandbox = FakeSandbox(sandbox_id, body["name"], body, self._local(body["name"], dockerfile))
        sandbox.ready_at = asyncio.get_running_loop().time() + self.faults.create_latency
        self.sandboxes[sandbox.id] = sandbox
        self.peak_live = max(self.peak_live, len(self.sandboxes))
        if outcome == "error-state":
            sandbox.state, sandbox.error_reason = "error", "the runner failed to start the sandbox"
        else:
            sandbox.boot = self._spawn(self._boot(sandbox))
            if self.faults.create_latency <= 0:
                await asyncio.shield(sandbox.boot)
        if self.faults.answer_delay > 0:
            await asyncio.sleep(self.faults.answer_delay)
        if outcome == "500-after":
            return _error(500, "Internal server error")
        return web.json_response(self._dto(sandbox))

    def _create_outcome(self) -> str:
        throttle = self.faults.throttle
        if throttle is not None:
            limit, window = throttle
            now = self.create_times[-1]
            if sum(1 for t in self.create_times[:-1] if t > now - window) >= limit:
                return "429"
        if self.faults.create_script:
            return self.faults.create_script.popleft()
        draw = self._rng.random()
        for outcome, probability in self.faults.create_rates.items():
            if draw < probability:
                return outcome
            draw -= probability
        return "ok"

    def _local(self, name: str, dockerfile: str | None) -> LocalSandbox:
        context = self._workdir / uuid.uuid4().hex
        context.mkdir(parents=True)
        path = None
        if dockerfile is not None:
            path = context / "Dockerfile"
            path.write_text(dockerfile)
        return LocalSandbox(SandboxSpec(name=name, context_dir=context, dockerfile=path))

    async def _boot(self, sandbox: FakeSandbox) -> None:
        try:
            await sandbox.local.start()
        except SandboxError as exc:
            sandbox.state, sandbox.error_reason = "error", str(exc)
            return
        sandbox.state = "booted"

    def _state(self, sandbox: FakeSandbox) -> str:
        if sandbox.state == "booted":
            return "started" if asyncio.get_running_loop().time() >= sandbox.ready_at else "creating"
        return sandbox.state

    async def get_sandbox(self, request: web.Request) -> web.StreamResponse:
        sandbox = self._find(request.match_info["key"])
        if sandbox is None:
            return _error(404, f"Sandbox with ID or name {request.match_info['key']} not found")
        return web.json_response(self._dto(sandbox))

    async def delete_sandbox(self, request: web.Request) -> web.StreamResponse:
        sandbox = self._find(request.match_info["key"])
        if sandbox is None:
            return _error(404, f"Sandbox with ID or name {request.match_info['key']} not found")
        await self._destroy(sandbox)
        return web.json_response(self._dto(sandbox, state="destroyed"))

    async def _destroy(self, sandbox: FakeSandbox) -> None:
        if self.sandboxes.pop(sandbox.id, None) is None:
            return
        if self.faults.stale_list:
            self.ghosts[sandbox.id] = self._dto(sandbox, state="started")
        if sandbox.boot is not None:
            with contextlib.suppress(BaseException):
                await asyncio.shield(sandbox.boot)  # never stop a sandbox half-way through its start
        sandbox.state = "destroyed"
        for session in sandbox.sessions.values():
            session.deleted = True
            session.drain.cancel()
        await asyncio.shield(sandbox.local.stop())
        if sandbox.local.spec.context_dir is not None:
            shutil.rmtree(sandbox.local.spec.context_dir, ignore_errors=True)

    async def list_sandboxes(self, request: web.Request) -> web.StreamResponse:
        wanted = json.loads(request.query.get("labels") or "{}")
        limit = int(request.query.get("limit") or 100)
        offset = int(request.query.get("cursor") or 0)
        items = [self._dto(s) for s in self.sandboxes.values()] + list(self.ghosts.values())
        items = [i for i in items if all(i["labels"].get(k) == v for k, v in wanted.items())]
        page = items[offset : offset + limit]
        more = offset + limit < len(items)
        return web.json_response({"items": page, "nextCursor": str(offset + limit) if more else None})

    # -- control plane: snapshots ----------------------------------------------------------------

    def _snapshot_dto(self, snapshot: dict[str, Any]) -> dict[str, Any]:
        keys = ("id", "name", "state", "cpu", "mem", "disk", "errorReason", "createdAt", "updatedAt", "imageName")
        return {
            **{k: snapshot.get(k) for k in keys},
            "general": False,
            "size": None,
            "entrypoint": None,
            "gpu": 0,
            "lastUsedAt": None,
            "sourceSandboxId": None,
            "organizationId": "org-test",
        }

    def _snapshot(self, key: str) -> dict[str, Any] | None:
        return self.snapshots.get(key) or next((s for s in self.snapshots.values() if s["id"] == key), None)

    async def get_snapshot(self, request: web.Request) -> web.StreamResponse:
        snapshot = self._snapshot(request.match_info["key"])
        if snapshot is None:
            return _error(404, f"Snapshot {request.match_info['key']} not found")
        return web.json_response(self._snapshot_dto(snapshot))

    async def delete_snapshot(self, request: web.Request) -> web.StreamResponse:
        snapshot = self._snapshot(request.match_info["key"])
        if snapshot is None:
            return _error(404, f"Snapshot {request.match_info['key']} not found")
        self.snapshots.pop(snapshot["name"], None)
        return web.Response(status=200)

    async def create_snapshot(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        name = body.get("name")
        if not name:
            return _error(400, "name is required")
        if name in self.snapshots:
            return _error(409, f"Snapshot with name {name} already exists")
        now = dt.datetime.now(dt.UTC).isoformat()
        build = body.get("buildInfo") or {}
        dockerfile = build.get("dockerfileContent")
        snapshot = {
            "id": str(uuid.uuid4()),
            "name": name,
            "state": "building",
            "cpu": int(body.get("cpu") or 1),
            "mem": int(body.get("memory") or 1),
            "disk": int(body.get("disk") or 3),
            "errorReason": None,
            "createdAt": now,
            "updatedAt": now,
            "imageName": body.get("imageName"),
            "dockerfile": dockerfile,
        }
        self.snapshots[name] = snapshot
        if build.get("contextHashes"):
            snapshot["state"], snapshot["errorReason"] = (
                "build_failed",
                "build contexts are not available on this test server",
            )
        elif dockerfile is not None:
            local = self._local(name, dockerfile)
            try:
                await local.start()  # RUN steps really run: a failing one fails the build
                snapshot["state"] = "active"
            except SandboxError as exc:
                snapshot["state"] = "build_failed"
                snapshot["errorReason"] = f"{exc} {getattr(exc, 'log', '')[-500:]}".strip()
            finally:
                await local.stop()
                shutil.rmtree(local.spec.context_dir or "", ignore_errors=True)
        else:
            snapshot["state"] = "active"
        return web.json_response(self._snapshot_dto(snapshot))

    # -- toolbox ---------------------------------------------------------------------------------

    def _box(self, request: web.Request) -> FakeSandbox | web.Response:
        sandbox = self.sandboxes.get(request.match_info["sid"])
        if sandbox is None:
            return _error(404, "sandbox not found", toolbox=request)
        if self._state(sandbox) != "started":
            return _error(409, f"sandbox is {self._state(sandbox)}", toolbox=request)
        return sandbox

    async def execute(self, request: web.Request) -> web.StreamResponse:
        sandbox = self._box(request)
        if isinstance(sandbox, web.Response):
            return sandbox
        body = await request.json()
        timeout = float(body.get("timeout") or 3600)
        env = {**sandbox.local.env, **(body.get("envs") or {})}
        result = await sandbox.local.exec(
            ["/bin/sh", "-c", body["command"]],
            timeout=timeout,
            env=env,
            cwd=body.get("cwd") or "/",
            output_limit=1 << 26,
        )
        if result.timed_out:
            message = f"Command execution timed out after {timeout:g} seconds."
            return _error(408, message, toolbox=request)
        return web.json_response(
            {"exitCode": result.exit_code, "result": result.output.decode("utf-8", errors="replace")}
        )

    async def work_dir(self, request: web.Request) -> web.StreamResponse:
        sandbox = self._box(request)
        if isinstance(sandbox, web.Response):
            return sandbox
        return web.json_response({"dir": sandbox.local.workdir})

    async def create_session(self, request: web.Request) -> web.StreamResponse:
        sandbox = self._box(request)
        if isinstance(sandbox, web.Response):
            return sandbox
        session_id = (await request.json())["sessionId"]
        if session_id in sandbox.sessions:
            return _error(409, "session already exists", toolbox=request)
        shell = await sandbox.local.open_process(["/bin/sh"], env=sandbox.local.env, cwd="/")

        async def drain() -> None:
            while await shell.read(65536):
                pass

        sandbox.sessions[session_id] = FakeSession(session_id, shell, self._spawn(drain()))
        return web.Response(status=201)

    def _session(self, request: web.Request) -> tuple[FakeSandbox, FakeSession] | web.Response:
        sandbox = self._box(request)
        if isinstance(sandbox, web.Response):
            return sandbox
        session = sandbox.sessions.get(request.match_info["session"])
        if session is None or session.deleted:
            return _error(404, "session not found", toolbox=request)
        return sandbox, session

    async def delete_session(self, request: web.Request) -> web.StreamResponse:
        found = self._session(request)
        if isinstance(found, web.Response):
            return found
        sandbox, session = found
        session.deleted = True
        sandbox.sessions.pop(session.id, None)
        await session.shell.close()  # kills the session shell's process group, as the daemon does
        session.drain.cancel()
        return web.Response(status=204)

    async def session_exec(self, request: web.Request) -> web.StreamResponse:
        found = self._session(request)
        if isinstance(found, web.Response):
            return found
        sandbox, session = found
        body = await request.json()
        if not str(body.get("command") or "").strip():
            return _error(400, "command cannot be empty", toolbox=request)
        command_id = str(uuid.uuid4())
        inner = f"{SESSIONS_DIR}/{session.id}/{command_id}"
        host = _make_host_dir(sandbox.local, inner)
        (host / "output").touch()
        os.chown(host / "output", sandbox.local.owner, sandbox.local.owner)
        command = FakeCommand(command_id, body["command"], inner, host, bool(body.get("suppressInputEcho")))
        session.commands[command_id] = command
        keeper = 'sleep infinity > "$d/input"'
        if self.faults.input_keeper_delay > 0:
            keeper = f"{{ sleep {self.faults.input_keeper_delay:g}; exec {keeper}; }}"
        wrapper = (
            f"{{ d='{inner}'; mkfifo \"$d/input\"; {keeper} & tg_k=$!; {{ {body['command']}\n"
            f'}} < "$d/input" >> "$d/output" 2>&1; echo "$?" > "$d/exit.tmp"; mv "$d/exit.tmp" "$d/exit_code";'
            f' kill $tg_k 2>/dev/null; rm -f "$d/input"; }}\n'
        )
        await session.shell.write(wrapper.encode())
        if body.get("runAsync") or body.get("async"):
            return web.json_response({"cmdId": command_id}, status=202)
        while command.exit_code is None:
            if session.deleted:
                return _error(400, "session cancelled", toolbox=request)
            await asyncio.sleep(0.02)
        output = (host / "output").read_bytes().decode("utf-8", errors="replace")
        return web.json_response({"cmdId": command_id, "output": output, "exitCode": command.exit_code})

    def _command(self, request: web.Request) -> tuple[FakeSandbox, FakeSession, FakeCommand] | web.Response:
        found = self._session(request)
        if isinstance(found, web.Response):
            return found
        command = found[1].commands.get(request.match_info["command"])
        if command is None:
            return _error(404, "command not found", toolbox=request)
        return found[0], found[1], command

    async def get_command(self, request: web.Request) -> web.StreamResponse:
        found = self._command(request)
        if isinstance(found, web.Response):
            return found
        command = found[2]
        return web.json_response({"id": command.id, "command": command.command, "exitCode": command.exit_code})

    async def command_logs(self, request: web.Request) -> web.StreamResponse:
        found = self._command(request)
        if isinstance(found, web.Response):
            return found
        sandbox, session, command = found
        log = command.host_dir / "output"
        if request.headers.get("Upgrade", "").lower() != "websocket":
            text = log.read_bytes().decode("utf-8", errors="replace")
            return web.json_response({"output": text, "stdout": text, "stderr": ""})
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        follow = request.query.get("follow") == "true"
        position = 0
        with contextlib.suppress(OSError, ConnectionError):
            while not ws.closed:
                finished = command.exit_code is not None or session.deleted or sandbox.id not in self.sandboxes
                with open(log, "rb") as handle:
                    handle.seek(position)
                    data = handle.read(1 << 16)
                if data:
                    position += len(data)
                    await ws.send_bytes(STDOUT_PREFIX + data)
                    continue
                if finished or not follow:
                    break
                await asyncio.sleep(0.01)
        await ws.close(code=1000)
        return ws

    async def command_input(self, request: web.Request) -> web.StreamResponse:
        found = self._command(request)
        if isinstance(found, web.Response):
            return found
        command = found[2]
        if command.exit_code is not None:
            return _error(410, f"command has already completed with exit code {command.exit_code}", toolbox=request)
        data = str((await request.json())["data"])
        if not data.endswith("\n"):
            data += "\n"  # the daemon ensures a newline, for commands like `read`
        try:
            fd = os.open(command.host_dir / "input", os.O_WRONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
        except OSError as exc:  # no FIFO yet, or nobody reading it yet
            if exc.errno not in (errno.ENOENT, errno.ENXIO, errno.ELOOP):
                raise
            return _error(500, f"failed to open input pipe: {exc.strerror}", toolbox=request)
        try:
            pending = data.encode()
            while pending:
                try:
                    pending = pending[os.write(fd, pending) :]
                except BlockingIOError:
                    await asyncio.sleep(0.005)
        finally:
            os.close(fd)
        if not command.suppress_echo:
            with open(os.open(command.host_dir / "output", os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW), "ab") as handle:
                handle.write(data.encode())
        return web.Response(status=204)

    async def bulk_upload(self, request: web.Request) -> web.StreamResponse:
        sandbox = self._box(request)
        if isinstance(sandbox, web.Response):
            return sandbox
        reader = await request.multipart()
        files: dict[str, bytes] = {}
        paths: dict[str, str] = {}
        while (part := await reader.next()) is not None:
            assert isinstance(part, BodyPartReader), "a bulk upload's parts are fields, never nested multiparts"
            name = part.name or ""
            match = re.fullmatch(r"files\[(\d+)\]\.(path|file)", name)
            if match is None:
                continue
            if match.group(2) == "path":
                paths[match.group(1)] = await part.text()
            else:
                files[match.group(1)] = bytes(await part.read())
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w") as archive:
            for index, content in files.items():
                info = tarfile.TarInfo(paths[index].lstrip("/"))
                info.size, info.mode = len(content), 0o644
                archive.addfile(info, io.BytesIO(content))
        try:
            await sandbox.local.upload_tar(buffer.getvalue(), "/")
        except SandboxError as exc:
            return web.json_response({"errors": [str(exc)]}, status=400)
        return web.json_response({"files": [{"path": p} for p in paths.values()]})

    async def bulk_download(self, request: web.Request) -> web.StreamResponse:
        sandbox = self._box(request)
        if isinstance(sandbox, web.Response):
            return sandbox
        body = await request.json()
        writer = MultipartWriter("form-data")
        for path in body["paths"]:
            result = await sandbox.local.exec(["cat", "--", path], timeout=60, cwd="/", output_limit=1 << 28)
            if result.exit_code == 0:
                part = writer.append(result.output, {"Content-Type": "application/octet-stream"})
                part.set_content_disposition("form-data", quote_fields=False, name="file", filename=path)
            else:
                error = {"message": f"file not found: {path}", "statusCode": 404, "code": "FILE_NOT_FOUND"}
                part = writer.append(json.dumps(error), {"Content-Type": "application/json"})
                part.set_content_disposition("form-data", quote_fields=False, name="error", filename=path)
        response = web.StreamResponse(headers={"Content-Type": f"multipart/form-data; boundary={writer.boundary}"})
        await response.prepare(request)
        # MultipartWriter.write only calls write(bytes), which a prepared StreamResponse has; aiohttp's
        # annotation asks for the lower-level AbstractStreamWriter.
        await writer.write(cast(AbstractStreamWriter, response))
        await response.write_eof()
        return response


def _make_host_dir(local: LocalSandbox, inner: str) -> Path:
    """Make directory ``inner`` of the sandbox from the host, as the daemon (root in the sandbox)
    would: each level owned by the sandbox's root, and never through a symlink the sandbox made
    (which the host would follow out of the sandbox)."""
    path = local.files_dir
    for part in inner.strip("/").split("/"):
        path = path / part
        try:
            os.mkdir(path)
            os.chown(path, local.owner, local.owner)
        except FileExistsError:
            pass
        if path.is_symlink() or not path.is_dir():
            raise SandboxError(f"{inner}: {path.name} is not a directory the daemon made")
    return path


def _error(
    status: int, message: str, *, headers: dict[str, str] | None = None, toolbox: web.Request | None = None
) -> web.Response:
    body: dict[str, Any] = {"statusCode": status, "message": message, "error": _REASONS.get(status, "Error")}
    if toolbox is not None:  # the daemon's envelope
        body = {
            **body,
            "path": toolbox.path,
            "method": toolbox.method,
            "timestamp": dt.datetime.now(dt.UTC).isoformat(),
            "source": "DAYTONA_DAEMON",
        }
    return web.json_response(body, status=status, headers=headers)


_REASONS = {
    400: "Bad Request",
    401: "Unauthorized",
    404: "Not Found",
    408: "Request Timeout",
    409: "Conflict",
    410: "Gone",
    429: "Too Many Requests",
    500: "Internal Server Error",
}


async def _serve(port_file: Path, faults: Faults) -> None:
    server = await FakeDaytona(faults=faults).start()
    port_file.write_text(str(server.port))
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    await stop.wait()
    await server.close()


def main(argv: list[str] | None = None) -> None:
    """``python -m tests.termgym.sandboxes.daytona.server PORT_FILE [--create-latency S] [--429-rate P]``: serve on
    127.0.0.1 (any free port, written to PORT_FILE) until SIGTERM; the API key is ``test-key``."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m tests.termgym.sandboxes.daytona.server")
    parser.add_argument("port_file", type=Path)
    parser.add_argument("--create-latency", type=float, default=0.0)
    parser.add_argument("--429-rate", dest="rate_429", type=float, default=0.0)
    parser.add_argument("--quota-rate", type=float, default=0.0)
    args = parser.parse_args(argv)
    faults = Faults(
        create_latency=args.create_latency,
        create_rates={"429": args.rate_429, "quota": args.quota_rate},
        retry_after=0.5,
    )
    asyncio.run(_serve(args.port_file, faults))


if __name__ == "__main__":
    main()
