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
"""

from __future__ import annotations

import json
import posixpath
import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field

from termgym.errors import ConfigError

__all__ = ["CopyStep", "DockerfileError", "EnvironmentPlan", "RunStep", "WorkdirStep", "parse_dockerfile"]


class DockerfileError(ConfigError):
    """A Dockerfile that is malformed or needs what the embedded backend lacks.

    ``str(error)`` is ``"line N: problem"`` (one line); ``line`` and ``problem``
    hold the parts.
    """

    def __init__(self, line: int, problem: str) -> None:
        self.line, self.problem = line, problem
        super().__init__(f"line {line}: {problem}")


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
    USER. ``ignored`` lists, in line order, what the plan leaves out:
    instructions such as CMD or EXPOSE, ignored COPY flags, unused build stages.
    """

    base_image: str | None
    steps: tuple[PlanStep, ...]
    env: tuple[tuple[str, str], ...]
    workdir: str
    user: str | None
    ignored: tuple[str, ...]


_IGNORED = frozenset("CMD ENTRYPOINT EXPOSE LABEL VOLUME HEALTHCHECK STOPSIGNAL MAINTAINER ONBUILD".split())
_HANDLED = frozenset("FROM ARG ENV WORKDIR USER COPY ADD RUN SHELL".split())
_DIRECTIVE = re.compile(r"#\s*([A-Za-z][A-Za-z0-9]*)\s*=\s*(.+?)\s*$")
_HEREDOC = re.compile(r"<<(-?)(['\"]?)([A-Za-z_][A-Za-z0-9_]*)\2")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_FLAG = re.compile(r"--([A-Za-z][A-Za-z0-9-]*)(?:=(\S*))?(?:\s+|$)")
_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://|git@")
_SUBST_OPS = (":-", ":+", "-", "+")


@dataclass(frozen=True)
class _Heredoc:
    name: str
    quoted: bool
    strip_tabs: bool
    lines: tuple[str, ...]
    terminator: str

    def content(self) -> str:
        lines = [ln.lstrip("\t") for ln in self.lines] if self.strip_tabs else self.lines
        return "".join(ln + "\n" for ln in lines)


@dataclass(frozen=True)
class _Instr:
    keyword: str  # upper case
    args: str  # continuations joined, stripped
    line: int
    heredocs: tuple[_Heredoc, ...] = ()

    def describe(self) -> str:
        text = f"{self.keyword} {self.args}".strip()
        return (text if len(text) <= 60 else text[:57] + "...") + f" (line {self.line})"


@dataclass
class _State:  # mutable accumulator for the chained stages
    base_image: str
    workdir: str = "/"
    user: str | None = None
    shell: tuple[str, ...] | None = None
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
    escape = _escape_char(lines)
    global_args: dict[str, str] = {}
    stages: list[tuple[_Instr, list[_Instr]]] = []
    for ins in _read_instructions(lines, escape):
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
    return EnvironmentPlan(
        state.base_image, tuple(state.steps), tuple(state.env.items()), state.workdir, state.user, ignored
    )


def _escape_char(lines: list[str]) -> str:
    escape = "\\"
    seen: set[str] = set()
    for number, raw in enumerate(lines, start=1):
        match = _DIRECTIVE.match(raw)
        if match is None or match.group(1).lower() not in {"syntax", "escape", "check"}:
            break
        key, value = match.group(1).lower(), match.group(2)
        if key in seen:
            raise DockerfileError(number, f"duplicate parser directive {key!r}")
        seen.add(key)
        if key == "escape":
            if value not in ("\\", "`"):
                raise DockerfileError(number, f"invalid escape character {value!r}: must be \\ or `")
            escape = value
    return escape


def _read_instructions(lines: list[str], escape: str) -> list[_Instr]:
    continuation = re.compile(re.escape(escape) + r"[ \t]*$")
    result: list[_Instr] = []
    i = 0
    while i < len(lines):
        if _blank_or_comment(lines[i]):
            i += 1
            continue
        start, parts, current = i + 1, [], lines[i].lstrip()
        while True:
            i += 1
            match = continuation.search(current)
            if match is None:
                parts.append(current)
                break
            parts.append(current[: match.start()])
            while i < len(lines) and _blank_or_comment(lines[i]):
                i += 1
            if i == len(lines):
                break
            current = lines[i]
        keyword, _, args = re.sub(r"\s", " ", "".join(parts).strip(), count=1).partition(" ")
        keyword, args = keyword.upper(), args.strip()
        heredocs: list[_Heredoc] = []
        if keyword in ("RUN", "COPY", "ADD"):
            for strip_tabs, quoted, name in _heredoc_markers(args, escape, start):
                body: list[str] = []
                while True:
                    if i == len(lines):
                        raise DockerfileError(start, f"heredoc <<{name} is not terminated")
                    raw, i = lines[i], i + 1
                    if (raw.lstrip("\t") if strip_tabs else raw) == name:
                        heredocs.append(_Heredoc(name, quoted, strip_tabs, tuple(body), raw))
                        break
                    body.append(raw)
        result.append(_Instr(keyword, args, start, tuple(heredocs)))
    return result


def _blank_or_comment(raw: str) -> bool:
    stripped = raw.strip()
    return not stripped or stripped.startswith("#")


def _heredoc_markers(args: str, escape: str, line: int) -> list[tuple[bool, bool, str]]:
    """``(strip_tabs, quoted, name)`` for each word that is a ``<<NAME`` marker (as BuildKit)."""
    try:
        words = _split_words(args, escape, line)
    except DockerfileError:  # an unbalanced quote (in a shell comment, say): plain words
        words = args.split()
    matches = [_HEREDOC.fullmatch(word) for word in words]
    return [(m.group(1) == "-", bool(m.group(2)), m.group(3)) for m in matches if m is not None]


def _split_words(text: str, escape: str, line: int) -> list[str]:
    """Split on whitespace outside quotes and ``${...}``; quotes and escapes stay in the words."""
    words: list[str] = []
    current: list[str] = []
    quote: str | None = None
    braces, i = 0, 0
    while i < len(text):
        char = text[i]
        if char == escape and quote != "'" and i + 1 < len(text):
            current.append(text[i : i + 2])
            i += 2
            continue
        if quote is not None:
            quote = None if char == quote else quote
        elif char in " \t\r\n" and not braces:
            if current:
                words.append("".join(current))
                current = []
            i += 1
            continue
        elif char in "'\"":
            quote = char
        elif text.startswith("${", i) or (char == "}" and braces):
            braces += 1 if char == "$" else -1
        current.append(char)
        i += 1
    if quote is not None:
        raise DockerfileError(line, f"unterminated {quote} quote in {text!r}")
    if current:
        words.append("".join(current))
    return words


def _expand(word: str, scope: Mapping[str, str], escape: str, line: int, quotes: bool = True) -> str:
    """Substitute variables in ``word``; with ``quotes``, also remove quotes and escapes."""
    out: list[str] = []
    quote: str | None = None
    i = 0
    while i < len(word):
        char = word[i]
        if quote == "'":
            if char == "'":
                quote = None
            else:
                out.append(char)
            i += 1
        elif char == escape and i + 1 < len(word):
            following = word[i + 1]
            if quotes and quote is None:
                out.append(following)
            elif following == "$" or (quote == '"' and following in ('"', escape)):
                out.append(following)
            else:
                out.append(char + following)
            i += 2
        elif quotes and char in "'\"" and quote in (None, char):
            quote = None if quote else char
            i += 1
        elif char == "$":
            value, i = _substitute(word, i, scope, escape, line)
            out.append(value)
        else:
            out.append(char)
            i += 1
    if quote is not None:
        raise DockerfileError(line, f"unterminated {quote} quote in {word!r}")
    return "".join(out)


def _substitute(word: str, i: int, scope: Mapping[str, str], escape: str, line: int) -> tuple[str, int]:
    """Value of the reference starting at ``word[i] == "$"`` and the index after it."""
    if not word.startswith("{", i + 1):
        match = _NAME.match(word, i + 1)
        return ("$", i + 1) if match is None else (scope.get(match.group(), ""), match.end())
    match = _NAME.match(word, i + 2)
    if match is None:
        raise DockerfileError(line, f"bad substitution in {word!r}")
    name, j = match.group(), match.end()
    if word.startswith("}", j):
        return scope.get(name, ""), j + 1
    op = next((op for op in _SUBST_OPS if word.startswith(op, j)), None)
    if op is None:
        raise DockerfileError(line, f"unsupported substitution in {word!r}: only $V, ${{V}}, ${{V:-w}}, ${{V:+w}}")
    k, depth = j + len(op), 0
    while k < len(word):
        if word[k] == escape:
            k += 2
            continue
        if word.startswith("${", k):
            depth, k = depth + 1, k + 2
            continue
        if word[k] == "}":
            if depth == 0:
                break
            depth -= 1
        k += 1
    else:
        raise DockerfileError(line, f"missing '}}' in {word!r}")
    value = scope.get(name)
    is_set = bool(value) if op.startswith(":") else value is not None
    if is_set != op.endswith("-"):  # default when unset, alternative when set
        return _expand(word[j + len(op) : k], scope, escape, line, quotes=False), k + 1
    return (value or "") if is_set else "", k + 1


def _parse_from(ins: _Instr, global_args: Mapping[str, str], escape: str) -> tuple[str, str | None]:
    flags, rest = _take_flags(ins.args)
    for name, _ in flags:
        if name != "platform":
            raise DockerfileError(ins.line, f"FROM flag --{name} is not supported")
    words = _split_words(rest, escape, ins.line)
    if len(words) != 1 and (len(words) != 3 or words[1].lower() != "as"):
        raise DockerfileError(ins.line, "FROM expects an image and optionally 'AS name'")
    image = _expand(words[0], global_args, escape, ins.line)
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
    ins: _Instr,
    args: dict[str, str],
    global_args: Mapping[str, str],
    overrides: Mapping[str, str],
    env: Mapping[str, str],
    escape: str,
) -> None:
    words = _split_words(ins.args, escape, ins.line)
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
            args[name] = _expand(default, scope, escape, ins.line)
        elif name in global_args:
            args[name] = global_args[name]


def _env_pairs(ins: _Instr, scope: Mapping[str, str], escape: str) -> list[tuple[str, str]]:
    words = _split_words(ins.args, escape, ins.line)
    if not words:
        raise DockerfileError(ins.line, "ENV needs a name and a value")
    if "=" not in words[0]:
        parts = re.split(r"[ \t]+", ins.args, maxsplit=1)
        if len(parts) < 2:
            raise DockerfileError(ins.line, f"ENV {parts[0]} needs a value")
        return [(parts[0], _expand(parts[1], scope, escape, ins.line))]
    pairs = []
    for word in words:
        name, has_value, value = word.partition("=")
        if not has_value or not name:
            raise DockerfileError(ins.line, f"ENV expects name=value, got {word!r}")
        pairs.append((name, _expand(value, scope, escape, ins.line)))
    return pairs


def _apply(
    ins: _Instr,
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
        path = _expand(ins.args, scope, escape, ins.line)
        if not path:
            raise DockerfileError(ins.line, "WORKDIR needs a path")
        state.workdir = _normalize(posixpath.join(state.workdir, path))
        state.steps.append(WorkdirStep(state.workdir, ins.line))
    elif ins.keyword == "USER":
        user = _expand(ins.args, scope, escape, ins.line)
        if not user:
            raise DockerfileError(ins.line, "USER needs a user name")
        state.user = user
    elif ins.keyword == "SHELL":
        state.shell = _json_array(ins.args)
        if not state.shell:
            raise DockerfileError(ins.line, 'SHELL needs a non-empty JSON array, e.g. ["/bin/bash", "-c"]')
    elif ins.keyword == "RUN":
        state.steps.append(_run_step(ins, state, scope))
    else:
        _copy(ins, state, scope, escape)


def _run_step(ins: _Instr, state: _State, scope: Mapping[str, str]) -> RunStep:
    flags, rest = _take_flags(ins.args)
    if flags:
        raise DockerfileError(ins.line, f"RUN --{flags[0][0]} is not supported by the embedded backend")
    argv = _json_array(rest)
    command: str | tuple[str, ...]
    if argv is not None:
        if not argv:
            raise DockerfileError(ins.line, "RUN needs a command")
        command = argv
    elif len(ins.heredocs) == 1 and _HEREDOC.fullmatch(rest):
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


def _copy(ins: _Instr, state: _State, scope: Mapping[str, str], escape: str) -> None:
    keyword, is_add = ins.keyword, ins.keyword == "ADD"
    flags, rest = _take_flags(ins.args)
    for name, value in flags:
        if name == "from" and not is_add:
            raise DockerfileError(ins.line, "COPY --from is not supported by the embedded backend")
        if name not in ("chown", "chmod", "link"):
            raise DockerfileError(ins.line, f"{keyword} --{name} is not supported by the embedded backend")
        if name != "link":
            state.ignored.append((ins.line, f"{keyword} --{name}={value} (line {ins.line})"))
    argv = _json_array(rest)
    if argv is not None:
        raw = list(argv)
        items = [_expand(item, scope, escape, ins.line, quotes=False) for item in raw]
    else:
        raw = _split_words(rest, escape, ins.line)
        items = [_expand(item, scope, escape, ins.line) for item in raw]
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
    heredoc_sources = [] if argv is not None else [word for word in raw[:-1] if _HEREDOC.fullmatch(word)]
    if not heredoc_sources:
        state.steps.append(CopyStep(sources, dest, state.workdir, is_add, ins.line))
        return
    if len(heredoc_sources) != len(sources):
        raise DockerfileError(ins.line, f"{keyword} cannot mix heredoc and file sources")
    env = tuple(scope.items())
    for doc in ins.heredocs:
        content = doc.content() if doc.quoted else _expand(doc.content(), scope, escape, ins.line, quotes=False)
        target = dest + doc.name if dest.endswith("/") else dest
        state.steps.append(RunStep(_write_command(target, content), env, state.workdir, ins.line))


def _json_array(text: str) -> tuple[str, ...] | None:
    """The strings of a JSON array, or None when ``text`` is not one."""
    if not text.startswith("["):
        return None
    try:
        value = json.loads(text)
    except ValueError:
        return None
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        return None
    return tuple(value)


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
