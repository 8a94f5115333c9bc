"""``termgym gateway``: the recording gateway on its own, in front of an OpenAI-compatible server,
for a harness run outside termgym (docs/guides/harnesses.md). Sessions open on first use: a
harness given ``http://127.0.0.1:PORT/sessions/<id>/v1`` as its base URL (or the
``X-Termgym-Session`` header) records under ``<id>``. On SIGINT or SIGTERM the gateway stops and,
with ``--out``, writes each session's calls and token samples to its own file in ``OUT``:
``OUT/<id>.json`` for an id of lowercase letters, digits, ``-``, ``_`` and ``.``, any other
character percent-encoded (``termgym.gateway.files.session_file_name``: two ids never share a
file, none is written outside ``OUT``)."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
from pathlib import Path

from termgym.agents.heap import settled_heap
from termgym.agents.transport import check_base_url, resolve_api_key
from termgym.cli.common import UsageError, out
from termgym.gateway import SESSION_HEADER, Gateway
from termgym.gateway.files import session_file_name
from termgym.integrations.harness import Forwarding


def gateway_options(sub: argparse.ArgumentParser) -> None:
    sub.add_argument("--upstream", required=True, metavar="URL", help="the model's OpenAI-compatible base URL")
    sub.add_argument("--port", type=int, default=8765, help="port on 127.0.0.1 (default 8765; 0: any free one)")
    sub.add_argument("--api-key-env", default=None, metavar="VAR", help="the upstream's API key, from this variable")
    sub.add_argument("--temperature", type=float, default=None, help="force this temperature on every call")
    sub.add_argument(
        "--out", type=Path, default=None, help="write each session's calls here when stopped (OUT/<id>.json)"
    )


async def cmd_gateway(args: argparse.Namespace) -> int:
    check_base_url(args.upstream)
    if not 0 <= args.port <= 65535:
        raise UsageError(f"--port must be in 0..65535, got {args.port}")
    if args.temperature is not None and not 0 <= args.temperature <= 2:
        raise UsageError(f"--temperature must be in [0, 2], got {args.temperature}")
    forced = {} if args.temperature is None else {"temperature": args.temperature}
    forwarding = Forwarding(args.upstream, resolve_api_key(args.api_key_env, dict(os.environ)), forced)
    gateway = Gateway(port=args.port, on_demand=lambda _sid: forwarding())
    try:
        await gateway.start()
    except OSError as exc:
        raise UsageError(f"cannot listen on 127.0.0.1:{args.port}: {exc.strerror or exc}") from None
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    out.print(f"termgym gateway on {gateway.url}: base URL {gateway.url}/sessions/<id>/v1 (or header {SESSION_HEADER})")
    try:
        with settled_heap():  # many live sessions: rare, short garbage collections (termgym.agents.heap)
            await stop.wait()
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
        sessions = list(gateway.sessions.values())
        await gateway.aclose()
        await forwarding.aclose()
        if args.out is not None:
            args.out.mkdir(parents=True, exist_ok=True)
            for session in sessions:
                target = args.out / session_file_name(session.id)
                target.write_text(json.dumps(session.to_dict()), encoding="utf-8")
            out.print(f"{len(sessions)} session(s) written to {args.out}")
    return 0
