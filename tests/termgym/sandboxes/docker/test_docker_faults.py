"""How the Docker backend names what failed: the engine's and the connection's faults become the
error tree's (a server error on what a container holds is the agent's doing once it acted, a
refused connection the infrastructure's), and a bug of termgym's stays a bug, never a retried
``SandboxError``. The engine is a stand-in here: only the mapping is under test."""

from __future__ import annotations

from types import SimpleNamespace

import docker.errors
import pytest
import requests

from termgym.errors import SandboxBroken, SandboxError, SandboxGone
from termgym.sandboxes.base import SandboxSpec
from termgym.sandboxes.docker import sandbox as backend


def sandbox_whose_engine_raises(monkeypatch: pytest.MonkeyPatch, error: Exception) -> backend.DockerSandbox:
    def fail(*args, **kwargs):
        raise error

    api = SimpleNamespace(diff=fail, events=lambda **kwargs: [])
    monkeypatch.setattr(backend, "docker_client", lambda: SimpleNamespace(api=api))
    sandbox = backend.DockerSandbox(SandboxSpec(name="t", context_dir=None, dockerfile=None))
    sandbox._container = "c0ffee"
    return sandbox


def server_error() -> docker.errors.APIError:
    response = requests.Response()
    response.status_code = 500
    return docker.errors.APIError("500 Server Error: lstat /root/...: file name too long", response=response)


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (server_error(), SandboxBroken),
        (docker.errors.NotFound("no such container"), SandboxGone),
        (requests.ConnectionError("connection refused"), SandboxError),
        (OSError("socket closed"), SandboxError),
    ],
    ids=["server-error", "gone", "refused", "os-error"],
)
async def test_engine_faults_map_to_the_error_tree(monkeypatch, error, expected):
    sandbox = sandbox_whose_engine_raises(monkeypatch, error)
    with pytest.raises(SandboxError) as raised:
        await sandbox.agent_changes()
    assert type(raised.value) is expected
    assert raised.value.__cause__ is error


@pytest.mark.parametrize("bug", [TypeError("unexpected keyword"), KeyError("Path"), RecursionError()])
async def test_a_bug_is_not_dressed_up_as_a_sandbox_fault(monkeypatch, bug):
    """The scheduler retries a SandboxError as an infrastructure fault: a bug would be retried,
    and the trial's failure erased. It propagates as what it is (``run_trial`` records it as
    ``internal_error``, kept in the batch)."""
    sandbox = sandbox_whose_engine_raises(monkeypatch, bug)
    with pytest.raises(type(bug)):
        await sandbox.agent_changes()
