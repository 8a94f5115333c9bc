"""Parse a task's Dockerfile into the plan the embedded backend runs without an image.

:func:`parse_dockerfile` is pure. It follows BuildKit where that matters for a plan:
parser directives at the top (``# escape=``` makes the backtick the escape character);
comment and empty lines inside continuations are dropped; ARGs before the first FROM
serve FROM lines only (a stage re-declares them with a bare ``ARG NAME``); ENV beats an
ARG of the same name; ``$V``, ``${V}``, ``${V:-w}``, ``${V:+w}``, ``${V-w}``, ``${V+w}``
are substituted in FROM, ARG, ENV, WORKDIR, USER, COPY and ADD (never in RUN), each
instruction seeing the variables as they were before it. Only the last stage counts,
chained with the earlier stages it is built FROM (``FROM base AS final``). SHELL is
honoured: after ``SHELL ["bash", "-c"]`` a shell-form RUN comes back as
``("bash", "-c", command)``. ``COPY <<EOF /file`` becomes a RunStep writing the file.
ENTRYPOINT is Docker's: the last one wins, the shell form runs as the SHELL in effect
(``/bin/sh -c`` by default), ``ENTRYPOINT []`` clears the base image's, and no variable is
substituted in it (``entrypoint`` None: the Dockerfile sets none, the image's stays).
The lexing (directives, continuations, heredocs, words, substitution) is
:mod:`termgym.images.dockerfile_syntax`'s.
"""

from __future__ import annotations

import posixpath
import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field

from termgym.images.dockerfile_syntax import (
    HEREDOC_MARKER,
    DockerfileError,
    Instruction,
    escape_char,
    expand,
    json_array,
    read_instructions,
    split_words,
)

__all__ = ["CopyStep", "EnvironmentPlan", "RunStep", "WorkdirStep", "parse_dockerfile"]


@dataclass(frozen=True)
class CopyStep:
    """Copy ``sources`` (relative to the build context, as written, globs allowed)
    to ``dest`` (absolute; a trailing ``/`` means "into this directory")."""

    sources: tuple[str, ...]
    dest: str
    workdir: str
    is_add: bool
    line: int


@dataclass(frozen=True)
class RunStep:
    """Run ``command``: a ``str`` runs with ``/bin/sh -c``; a tuple is an argv.

    ``env`` holds the ARG values (declaration order) and then the ENV values in
    effect at this point; an ENV wins over an ARG of the same name.
    """

    command: str | tuple[str, ...]
    env: tuple[tuple[str, str], ...]
    workdir: str
    line: int


@dataclass(frozen=True)
class WorkdirStep:
    """Create the absolute directory ``path`` (and make it the working directory)."""

    path: str
    line: int


PlanStep = CopyStep | RunStep | WorkdirStep  # one step of an EnvironmentPlan


@dataclass(frozen=True)
class EnvironmentPlan:
    """What the final stage of a Dockerfile asks for, in order.

    ``base_image`` is the image of the last FROM (with chained stages, the image
    the first of them starts from). ``env`` is the final ENV in order of first
    definition, ``workdir`` the final WORKDIR ("/" by default), ``user`` the last
    USER, ``entrypoint`` the last ENTRYPOINT as the image's config holds it (an argv; ``()``
    after ``ENTRYPOINT []``; None where the chain sets none and the base image's runs).
    ``ignored`` lists, in line order, what the plan leaves out: instructions such as CMD
    (the backends' keeper takes its place, as Docker resets it after an ENTRYPOINT) or
    EXPOSE, ignored COPY flags, unused build stages.
    """

    base_image: str | None
    steps: tuple[PlanStep, ...]
    env: tuple[tuple[str, str], ...]
    workdir: str
    user: str | None
    ignored: tuple[str, ...]
    entrypoint: tuple[str, ...] | None = None


_IGNORED = frozenset("CMD EXPOSE LABEL VOLUME HEALTHCHECK STOPSIGNAL MAINTAINER ONBUILD".split())
_HANDLED = frozenset("FROM ARG ENV WORKDIR USER COPY ADD RUN SHELL ENTRYPOINT".split())
_FLAG = re.compile(r"--([A-Za-z][A-Za-z0-9-]*)(?:=(\S*))?(?:\s+|$)")
_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://|git@")


@dataclass
class _State:  # mutable accumulator for the chained stages
    base_image: str
    workdir: str = "/"
    user: str | None = None
    shell: tuple[str, ...] | None = None
    entrypoint: tuple[str, ...] | None = None
    env: dict[str, str] = field(default_factory=dict)
    steps: list[PlanStep] = field(default_factory=list)
    ignored: list[tuple[int, str]] = field(default_factory=list)


def parse_dockerfile(text: str, build_args: Mapping[str, str] | None = None) -> EnvironmentPlan:
    """Parse ``text`` into the plan of its final stage.

    ``build_args`` override ARG defaults (like ``--build-arg``); names no ARG
    declares are ignored. Raises :class:`DockerfileError` for a malformed
    Dockerfile, an unknown instruction, no FROM, ``COPY --from``, ``ADD`` of a URL,
    RUN flags (``--mount`` ...), or unsupported COPY/ADD flags in the final chain.
    """
    overrides = dict(build_args or {})
    lines = re.split(r"\r?\n", text.removeprefix("\ufeff"))
    escape = escape_char(lines)
    global_args: dict[str, str] = {}
    stages: list[tuple[Instruction, list[Instruction]]] = []
    for ins in read_instructions(lines, escape):
        if ins.keyword not in _HANDLED and ins.keyword not in _IGNORED:
            raise DockerfileError(ins.line, f"unknown instruction {ins.keyword}")
        if ins.keyword == "FROM":
            stages.append((ins, []))
        elif stages:
            stages[-1][1].append(ins)
        elif ins.keyword == "ARG":
            _declare_args(ins, global_args, global_args, overrides, {}, escape)
        else:
            raise DockerfileError(ins.line, f"{ins.keyword} before the first FROM (only ARG may precede FROM)")
    if not stages:
        raise DockerfileError(1, "no FROM instruction")

    parsed: list[tuple[str, str | None]] = []  # (image, stage name)
    for ins, _ in stages:
        image, name = _parse_from(ins, global_args, escape)
        if name is not None and any(name == other for _, other in parsed):
            raise DockerfileError(ins.line, f"duplicate stage name {name!r}")
        parsed.append((image, name))

    chain = [len(stages) - 1]  # the final stage, then the earlier stages it is built FROM
    while parents := [i for i in range(chain[-1]) if parsed[i][1] == parsed[chain[-1]][0].lower()]:
        chain.append(parents[-1])
    state = _State(base_image=parsed[chain[-1]][0])
    unused = "build stage not used by the final stage"
    state.ignored += [(ins.line, f"{ins.describe()}: {unused}") for i, (ins, _) in enumerate(stages) if i not in chain]
    for index in reversed(chain):
        stage_args: dict[str, str] = {}  # ARGs do not outlive their stage
        for ins in stages[index][1]:
            _apply(ins, state, stage_args, global_args, overrides, escape)
    ignored = tuple(text for _, text in sorted(state.ignored, key=lambda item: item[0]))
    env, steps = tuple(state.env.items()), tuple(state.steps)
    return EnvironmentPlan(state.base_image, steps, env, state.workdir, state.user, ignored, state.entrypoint)


def _parse_from(ins: Instruction, global_args: Mapping[str, str], escape: str) -> tuple[str, str | None]:
    flags, rest = _take_flags(ins.args)
    for name, _ in flags:
        if name != "platform":
            raise DockerfileError(ins.line, f"FROM flag --{name} is not supported")
    words = split_words(rest, escape, ins.line)
    if len(words) != 1 and (len(words) != 3 or words[1].lower() != "as"):
        raise DockerfileError(ins.line, "FROM expects an image and optionally 'AS name'")
    image = expand(words[0], global_args, escape, ins.line)
    if not image:
        raise DockerfileError(ins.line, f"FROM image {words[0]!r} is empty after substitution")
    return image, words[2].lower() if len(words) == 3 else None


def _take_flags(args: str) -> tuple[list[tuple[str, str | None]], str]:
    flags: list[tuple[str, str | None]] = []
    while (match := _FLAG.match(args)) is not None:
        flags.append((match.group(1).lower(), match.group(2)))
        args = args[match.end() :]
    return flags, args


def _declare_args(
    ins: Instruction,
    args: dict[str, str],
    global_args: Mapping[str, str],
    overrides: Mapping[str, str],
    env: Mapping[str, str],
    escape: str,
) -> None:
    words = split_words(ins.args, escape, ins.line)
    if not words:
        raise DockerfileError(ins.line, "ARG needs a name")
    scope = {**args, **env}
    for word in words:
        name, has_default, default = word.partition("=")
        if not name:
            raise DockerfileError(ins.line, f"ARG needs a name before '=', got {word!r}")
        if name in overrides:
            args[name] = overrides[name]
        elif has_default:
            args[name] = expand(default, scope, escape, ins.line)
        elif name in global_args:
            args[name] = global_args[name]


def _env_pairs(ins: Instruction, scope: Mapping[str, str], escape: str) -> list[tuple[str, str]]:
    words = split_words(ins.args, escape, ins.line)
    if not words:
        raise DockerfileError(ins.line, "ENV needs a name and a value")
    if "=" not in words[0]:
        parts = re.split(r"[ \t]+", ins.args, maxsplit=1)
        if len(parts) < 2:
            raise DockerfileError(ins.line, f"ENV {parts[0]} needs a value")
        return [(parts[0], expand(parts[1], scope, escape, ins.line))]
    pairs = []
    for word in words:
        name, has_value, value = word.partition("=")
        if not has_value or not name:
            raise DockerfileError(ins.line, f"ENV expects name=value, got {word!r}")
        pairs.append((name, expand(value, scope, escape, ins.line)))
    return pairs


def _apply(
    ins: Instruction,
    state: _State,
    args: dict[str, str],
    global_args: Mapping[str, str],
    overrides: Mapping[str, str],
    escape: str,
) -> None:
    """Apply one instruction of a chained stage to ``state`` (``args``: the stage's ARGs)."""
    scope = {**args, **state.env}
    if ins.keyword in _IGNORED:
        state.ignored.append((ins.line, ins.describe()))
    elif ins.keyword == "ARG":
        _declare_args(ins, args, global_args, overrides, state.env, escape)
    elif ins.keyword == "ENV":
        state.env.update(_env_pairs(ins, scope, escape))
    elif ins.keyword == "WORKDIR":
        path = expand(ins.args, scope, escape, ins.line)
        if not path:
            raise DockerfileError(ins.line, "WORKDIR needs a path")
        state.workdir = _normalize(posixpath.join(state.workdir, path))
        state.steps.append(WorkdirStep(state.workdir, ins.line))
    elif ins.keyword == "USER":
        user = expand(ins.args, scope, escape, ins.line)
        if not user:
            raise DockerfileError(ins.line, "USER needs a user name")
        state.user = user
    elif ins.keyword == "SHELL":
        state.shell = json_array(ins.args)
        if not state.shell:
            raise DockerfileError(ins.line, 'SHELL needs a non-empty JSON array, e.g. ["/bin/bash", "-c"]')
    elif ins.keyword == "ENTRYPOINT":
        state.entrypoint = _entrypoint(ins, state)
    elif ins.keyword == "RUN":
        state.steps.append(_run_step(ins, state, scope))
    else:
        _copy(ins, state, scope, escape)


def _entrypoint(ins: Instruction, state: _State) -> tuple[str, ...]:
    """The ENTRYPOINT's argv as Docker keeps it: the exec form's words (``[]``, or no argument at all,
    clears it), or the shell form's text after the SHELL in effect; never substituted (Docker
    substitutes none)."""
    argv = json_array(ins.args)
    if argv is not None or not ins.args:
        return argv or ()
    return (*(state.shell or ("/bin/sh", "-c")), ins.args)


def _run_step(ins: Instruction, state: _State, scope: Mapping[str, str]) -> RunStep:
    flags, rest = _take_flags(ins.args)
    if flags:
        raise DockerfileError(ins.line, f"RUN --{flags[0][0]} is not supported by the embedded backend")
    argv = json_array(rest)
    command: str | tuple[str, ...]
    if argv is not None:
        if not argv:
            raise DockerfileError(ins.line, "RUN needs a command")
        command = argv
    elif len(ins.heredocs) == 1 and HEREDOC_MARKER.fullmatch(rest):
        body = ins.heredocs[0].content()  # BuildKit runs a lone heredoc as the script itself
        if body.startswith("#!"):
            command = _script_command(body)
        else:
            command = body if state.shell is None else (*state.shell, body)
    else:
        if not rest:
            raise DockerfileError(ins.line, "RUN needs a command")
        command = rest + "".join("\n" + "\n".join((*doc.lines, doc.terminator)) for doc in ins.heredocs)
        if state.shell is not None:
            command = (*state.shell, command)
    return RunStep(command, tuple(scope.items()), state.workdir, ins.line)


def _copy(ins: Instruction, state: _State, scope: Mapping[str, str], escape: str) -> None:
    keyword, is_add = ins.keyword, ins.keyword == "ADD"
    flags, rest = _take_flags(ins.args)
    for name, value in flags:
        if name == "from" and not is_add:
            raise DockerfileError(ins.line, "COPY --from is not supported by the embedded backend")
        if name not in ("chown", "chmod", "link"):
            raise DockerfileError(ins.line, f"{keyword} --{name} is not supported by the embedded backend")
        if name != "link":
            state.ignored.append((ins.line, f"{keyword} --{name}={value} (line {ins.line})"))
    argv = json_array(rest)
    if argv is not None:
        raw = list(argv)
        items = [expand(item, scope, escape, ins.line, quotes=False) for item in raw]
    else:
        raw = split_words(rest, escape, ins.line)
        items = [expand(item, scope, escape, ins.line) for item in raw]
    if len(items) < 2:
        raise DockerfileError(ins.line, f"{keyword} needs at least one source and a destination")
    sources, dest = tuple(items[:-1]), items[-1]
    into_dir = dest.endswith("/") or dest in (".", "..") or dest.endswith(("/.", "/.."))
    dest = _normalize(posixpath.join(state.workdir, dest))
    if into_dir and dest != "/":
        dest += "/"
    if len(sources) > 1 and not into_dir:
        raise DockerfileError(ins.line, f"{keyword} with several sources needs a destination ending in /")
    if is_add and any(_URL.match(source) for source in sources):
        raise DockerfileError(ins.line, "ADD from a URL needs network; not supported by the embedded backend")
    heredoc_sources = [] if argv is not None else [word for word in raw[:-1] if HEREDOC_MARKER.fullmatch(word)]
    if not heredoc_sources:
        state.steps.append(CopyStep(sources, dest, state.workdir, is_add, ins.line))
        return
    if len(heredoc_sources) != len(sources):
        raise DockerfileError(ins.line, f"{keyword} cannot mix heredoc and file sources")
    env = tuple(scope.items())
    for doc in ins.heredocs:
        content = doc.content() if doc.quoted else expand(doc.content(), scope, escape, ins.line, quotes=False)
        target = dest + doc.name if dest.endswith("/") else dest
        state.steps.append(RunStep(_write_command(target, content), env, state.workdir, ins.line))


def _delimiter(content: str) -> str:
    delimiter = "TERMGYM_EOF"
    while delimiter in content.splitlines():
        delimiter += "_"
    return delimiter


def _write_command(target: str, content: str) -> str:
    """A /bin/sh command that writes ``content`` verbatim to the file ``target``."""
    delimiter = _delimiter(content)
    directory = shlex.quote(posixpath.dirname(target) or "/")
    return f"mkdir -p {directory} && cat > {shlex.quote(target)} <<'{delimiter}'\n{content}{delimiter}"


def _script_command(script: str) -> str:
    """A /bin/sh command that runs ``script`` (starting with ``#!``) as an executable file."""
    delimiter = _delimiter(script)
    return (
        'f="$(mktemp)" && cat > "$f" <<' + f"'{delimiter}'\n{script}{delimiter}\n"
        'chmod +x "$f" && "$f"; status=$?; rm -f "$f"; exit $status'
    )


def _normalize(path: str) -> str:
    path = posixpath.normpath(path)
    return "/" + path.lstrip("/") if path.startswith("//") else path
