"""Tests for termgym.images.dockerfile.parse_dockerfile: tables of Dockerfiles and the plans they give."""

from __future__ import annotations

import dataclasses
import subprocess

import pytest

from termgym.images.dockerfile import (
    CopyStep,
    EnvironmentPlan,
    RunStep,
    WorkdirStep,
    parse_dockerfile,
)
from termgym.images.dockerfile_syntax import DockerfileError


def run(command, env=(), workdir="/", line=2):
    return RunStep(command=command, env=tuple(env), workdir=workdir, line=line)


def copy(sources, dest, workdir="/", is_add=False, line=2):
    return CopyStep(sources=tuple(sources), dest=dest, workdir=workdir, is_add=is_add, line=line)


# (id, dockerfile, build_args, expected steps)
STEP_CASES = [
    ("shell-form", "FROM a\nRUN echo hi", None, [run("echo hi")]),
    ("keywords-case-insensitive", "from a\nrun echo hi\nworkdir /x", None, [run("echo hi"), WorkdirStep("/x", 3)]),
    ("leading-whitespace", "FROM a\n   RUN echo hi", None, [run("echo hi")]),
    ("continuation", "FROM a\nRUN echo a \\\n  b \\\n  c", None, [run("echo a   b   c")]),
    ("continuation-trailing-space", "FROM a\nRUN echo a \\  \n  b", None, [run("echo a   b")]),
    (
        "comment-and-empty-lines-inside-continuation",
        "FROM a\nRUN apt-get update && \\\n  # a comment\n\n  apt-get install -y curl",
        None,
        [run("apt-get update &&   apt-get install -y curl")],
    ),
    ("comment-is-not-continued", "FROM a\n# comment \\\nRUN x", None, [run("x", line=3)]),
    (
        "escape-directive-backtick",
        "# escape=`\nFROM a\nRUN echo a `\n  b\nCOPY C:\\x `\n  /d/",
        None,
        [run("echo a   b", line=3), copy(["C:\\x"], "/d/", line=5)],
    ),
    (
        "escape-directive-with-syntax",
        "# syntax=docker/dockerfile:1\n# ESCAPE = `\nFROM a\nRUN echo `\n  b",
        None,
        [run("echo   b", line=4)],
    ),
    (
        "directive-after-comment-is-a-comment",
        "# hello\n# escape=`\nFROM a\nRUN echo `\nRUN two",
        None,
        [run("echo `", line=4), run("two", line=5)],
    ),
    ("exec-form", 'FROM a\nRUN ["echo", "$HOME", "a b"]', None, [run(("echo", "$HOME", "a b"))]),
    ("invalid-json-is-shell-form", "FROM a\nRUN [ -f x ] && echo y", None, [run("[ -f x ] && echo y")]),
    (
        "run-not-substituted",
        "FROM a\nENV X=1\nRUN echo $X ${X:-d}",
        None,
        [run("echo $X ${X:-d}", [("X", "1")], line=3)],
    ),
    ("heredoc", "FROM a\nRUN <<EOF\necho one\n  echo two\nEOF", None, [run("echo one\n  echo two\n")]),
    ("heredoc-strip-tabs", "FROM a\nRUN <<-EOF\n\techo one\n\t\techo two\n\tEOF", None, [run("echo one\necho two\n")]),
    (
        "heredoc-quoted-delimiter",
        "FROM a\nRUN <<'EOF'\necho $HOME\nEOF\nRUN next",
        None,
        [run("echo $HOME\n"), run("next", line=5)],
    ),
    ("heredoc-double-quoted", 'FROM a\nRUN <<"END"\nx\nEND', None, [run("x\n")]),
    (
        "heredoc-body-keeps-comments-and-backslashes",
        "FROM a\nRUN <<EOF\n# not a comment \\\necho ok\n\nEOF",
        None,
        [run("# not a comment \\\necho ok\n\n")],
    ),
    (
        "heredoc-as-stdin-of-a-command",
        "FROM a\nRUN python3 <<'PY'\nprint(1)\nPY",
        None,
        [run("python3 <<'PY'\nprint(1)\nPY")],
    ),
    ("heredoc-marker-inside-quotes-is-not-one", "FROM a\nRUN echo '<<EOF'", None, [run("echo '<<EOF'")]),
    ("unicode-line-separator-is-not-a-newline", "FROM a\nRUN echo '\u2028'", None, [run("echo '\u2028'")]),
    (
        "heredoc-with-unbalanced-quote-elsewhere",
        "FROM a\nRUN cat <<EOF # don't\nx\nEOF",
        None,
        [run("cat <<EOF # don't\nx\nEOF")],
    ),
    ("here-string-is-not-a-heredoc", "FROM a\nRUN cat <<<word", None, [run("cat <<<word")]),
    ("workdir-default-relative-to-root", "FROM a\nWORKDIR app", None, [WorkdirStep("/app", 2)]),
    (
        "workdir-relative-to-previous",
        "FROM a\nWORKDIR /a\nWORKDIR b/../c\nWORKDIR /abs//x/",
        None,
        [WorkdirStep("/a", 2), WorkdirStep("/a/c", 3), WorkdirStep("/abs/x", 4)],
    ),
    ("workdir-quoted", 'FROM a\nWORKDIR "/my dir"', None, [WorkdirStep("/my dir", 2)]),
    (
        "copy-relative-dest",
        "FROM a\nWORKDIR /app\nCOPY x.py y",
        None,
        [WorkdirStep("/app", 2), copy(["x.py"], "/app/y", "/app", line=3)],
    ),
    (
        "copy-dot-dest-is-directory",
        "FROM a\nWORKDIR /app\nCOPY . .",
        None,
        [WorkdirStep("/app", 2), copy(["."], "/app/", "/app", line=3)],
    ),
    ("copy-dest-keeps-slash", "FROM a\nCOPY x /opt/y/", None, [copy(["x"], "/opt/y/")]),
    ("copy-into-root", "FROM a\nCOPY x /", None, [copy(["x"], "/")]),
    (
        "copy-several-sources-and-globs",
        "FROM a\nCOPY a.txt src/*.py b?[0-9] /dst/",
        None,
        [copy(["a.txt", "src/*.py", "b?[0-9]"], "/dst/")],
    ),
    ("copy-json-form", 'FROM a\nCOPY ["my file", "other", "/d/"]', None, [copy(["my file", "other"], "/d/")]),
    ("copy-quoted-word", 'FROM a\nCOPY "my file" /d/', None, [copy(["my file"], "/d/")]),
    ("copy-escaped-space", "FROM a\nCOPY my\\ file /d/", None, [copy(["my file"], "/d/")]),
    ("copy-flags-ignored", "FROM a\nCOPY --chown=app:app --chmod=755 --link x /y", None, [copy(["x"], "/y")]),
    ("add-local", "FROM a\nADD files.tar.gz /opt/", None, [copy(["files.tar.gz"], "/opt/", is_add=True)]),
    (
        "copy-heredoc-writes-file",
        "FROM a\nARG V=1\nCOPY <<EOF /etc/app.conf\nv=$V\nEOF",
        None,
        [run("mkdir -p /etc && cat > /etc/app.conf <<'TERMGYM_EOF'\nv=1\nTERMGYM_EOF", [("V", "1")], line=3)],
    ),
    (
        "copy-heredoc-quoted-into-dir",
        "FROM a\nCOPY <<'EOF' /d/\n$V\nEOF",
        None,
        [run("mkdir -p /d && cat > /d/EOF <<'TERMGYM_EOF'\n$V\nTERMGYM_EOF")],
    ),
    (
        "shell-instruction-makes-exec-form",
        'FROM a\nSHELL ["/bin/bash", "-o", "pipefail", "-c"]\nRUN echo ${x}\nRUN ["ls"]',
        None,
        [run(("/bin/bash", "-o", "pipefail", "-c", "echo ${x}"), line=3), run(("ls",), line=4)],
    ),
]


@pytest.mark.parametrize(
    ("text", "build_args", "expected"), [c[1:] for c in STEP_CASES], ids=[c[0] for c in STEP_CASES]
)
def test_steps(text, build_args, expected):
    assert parse_dockerfile(text, build_args).steps == tuple(expected)


# (id, dockerfile, build_args, {plan field: expected value})
PLAN_CASES = [
    (
        "minimal",
        "FROM ubuntu:24.04",
        None,
        {"base_image": "ubuntu:24.04", "steps": (), "env": (), "workdir": "/", "user": None, "ignored": ()},
    ),
    ("stage-name-stripped", "FROM python:3.12-slim AS final", None, {"base_image": "python:3.12-slim"}),
    ("platform-flag", "FROM --platform=linux/amd64 debian AS x", None, {"base_image": "debian"}),
    ("env-legacy-form", "FROM a\nENV GREETING hello big   world", None, {"env": (("GREETING", "hello big   world"),)}),
    (
        "env-equals-form",
        "FROM a\nENV K=V K2=\"v 2\" K3=v\\ 3 K4='$K' K5=",
        None,
        {"env": (("K", "V"), ("K2", "v 2"), ("K3", "v 3"), ("K4", "$K"), ("K5", ""))},
    ),
    (
        "env-first-definition-order",
        "FROM a\nENV A=1 B=2\nENV A=3 C=4",
        None,
        {"env": (("A", "3"), ("B", "2"), ("C", "4"))},
    ),
    ("env-same-instruction-sees-old-values", "FROM a\nENV A=1\nENV A=2 B=$A", None, {"env": (("A", "2"), ("B", "1"))}),
    (
        "substitution-forms",
        "FROM a\nENV S=set E=\nENV A=$S-${S} B=${U:-def} C=${E:-def} D=${S:+alt} F=${U:+alt} G=${E-d} H=${U-d} I=\\$S",
        None,
        {
            "env": (
                ("S", "set"),
                ("E", ""),
                ("A", "set-set"),
                ("B", "def"),
                ("C", "def"),
                ("D", "alt"),
                ("F", ""),
                ("G", ""),
                ("H", "d"),
                ("I", "$S"),
            )
        },
    ),
    ("substitution-default-with-space", "FROM a\nENV C=${U:-a b} D=1", None, {"env": (("C", "a b"), ("D", "1"))}),
    ("substitution-nested-default", "FROM a\nENV X=x\nENV Y=${U:-${X}/y}", None, {"env": (("X", "x"), ("Y", "x/y"))}),
    (
        "substitution-in-double-quotes",
        'FROM a\nENV X=x\nENV Y="$X \\"q\\" \\$X"',
        None,
        {"env": (("X", "x"), ("Y", 'x "q" $X'))},
    ),
    ("dollar-without-name-is-literal", "FROM a\nENV P=5$ Q=$1", None, {"env": (("P", "5$"), ("Q", "$1"))}),
    (
        "substitution-in-workdir-copy-user",
        "FROM a\nARG APP=/srv\nENV U=worker\nWORKDIR $APP/x\nCOPY ${APP}.conf ${APP}/\nUSER ${U}:${U}",
        None,
        {
            "workdir": "/srv/x",
            "user": "worker:worker",
            "steps": (WorkdirStep("/srv/x", 4), copy(["/srv.conf"], "/srv/", "/srv/x", line=5)),
        },
    ),
    ("arg-default", "FROM a\nARG V=1.0\nENV VERSION=$V", None, {"env": (("VERSION", "1.0"),)}),
    ("arg-build-arg-override", "FROM a\nARG V=1.0\nENV VERSION=$V", {"V": "2.0"}, {"env": (("VERSION", "2.0"),)}),
    ("arg-without-default", "FROM a\nARG V\nENV VERSION=[$V]", None, {"env": (("VERSION", "[]"),)}),
    ("arg-without-default-set-by-build-arg", "FROM a\nARG V\nENV VERSION=$V", {"V": "3"}, {"env": (("VERSION", "3"),)}),
    (
        "undeclared-build-arg-ignored",
        "FROM a\nENV X=${NOT_DECLARED:-no}",
        {"NOT_DECLARED": "yes"},
        {"env": (("X", "no"),)},
    ),
    (
        "arg-before-from-in-from",
        "ARG TAG=3.11\nARG IMG=python:${TAG}\nFROM ${IMG}-slim",
        None,
        {"base_image": "python:3.11-slim"},
    ),
    ("arg-before-from-overridden", "ARG TAG=3.11\nFROM python:$TAG", {"TAG": "3.13"}, {"base_image": "python:3.13"}),
    ("arg-before-from-not-in-stage", "ARG TAG=3.11\nFROM a\nENV T=[$TAG]", None, {"env": (("T", "[]"),)}),
    ("arg-before-from-redeclared", "ARG TAG=3.11\nFROM a\nARG TAG\nENV T=$TAG", {"TAG": "9"}, {"env": (("T", "9"),)}),
    (
        "run-env-carries-args-and-env",
        "FROM a\nARG A=1\nARG SHADOW=arg\nENV SHADOW=env E=2\nRUN make",
        None,
        {"steps": (run("make", [("A", "1"), ("SHADOW", "env"), ("E", "2")], line=5),)},
    ),
    ("env-beats-arg-in-substitution", "FROM a\nENV X=env\nARG X=arg\nWORKDIR /$X", None, {"workdir": "/env"}),
    (
        "multi-stage-only-last-counts",
        "FROM golang AS build\nENV GO=1\nRUN go build\nCOPY --from=other /x /y\nFROM alpine:3\nRUN echo final",
        None,
        {
            "base_image": "alpine:3",
            "env": (),
            "steps": (run("echo final", line=6),),
            "ignored": ("FROM golang AS build (line 1): build stage not used by the final stage",),
        },
    ),
    (
        "multi-stage-chained",
        "FROM ubuntu AS base\nENV A=1\nWORKDIR /w\nRUN one\nFROM scratch AS unused\nFROM base AS final\nRUN two",
        None,
        {
            "base_image": "ubuntu",
            "env": (("A", "1"),),
            "workdir": "/w",
            "steps": (WorkdirStep("/w", 3), run("one", [("A", "1")], "/w", 4), run("two", [("A", "1")], "/w", 7)),
            "ignored": ("FROM scratch AS unused (line 5): build stage not used by the final stage",),
        },
    ),
    ("multi-stage-args-do-not-leak", "FROM a AS one\nARG X=1\nFROM one\nENV Y=[$X]", None, {"env": (("Y", "[]"),)}),
    ("user-last-wins", "FROM a\nUSER app\nUSER root:root", None, {"user": "root:root"}),
    (
        "ignored-instructions",
        'FROM a\nEXPOSE 80\nCMD ["python", "app.py"]\nentrypoint ["x"]\nLABEL a=b\nVOLUME /data\nHEALTHCHECK NONE\n'
        "STOPSIGNAL SIGTERM\nMAINTAINER me\nONBUILD RUN x\nCOPY --chown=1:1 a /b",
        None,
        {
            "entrypoint": ("x",),  # no longer ignored: the plan carries it
            "ignored": (
                "EXPOSE 80 (line 2)",
                'CMD ["python", "app.py"] (line 3)',
                "LABEL a=b (line 5)",
                "VOLUME /data (line 6)",
                "HEALTHCHECK NONE (line 7)",
                "STOPSIGNAL SIGTERM (line 8)",
                "MAINTAINER me (line 9)",
                "ONBUILD RUN x (line 10)",
                "COPY --chown=1:1 (line 11)",
            ),
        },
    ),
    ("no-entrypoint-keeps-the-images", "FROM a\nCMD x", None, {"entrypoint": None}),
    ("entrypoint-exec-form", 'FROM a\nENTRYPOINT ["/e.sh", "$HOME"]', None, {"entrypoint": ("/e.sh", "$HOME")}),
    (
        "entrypoint-shell-form",
        'FROM a\nENV X=1\nENTRYPOINT  svc $X &&  exec "$@"',
        None,
        {"entrypoint": ("/bin/sh", "-c", 'svc $X &&  exec "$@"')},
    ),
    (
        "entrypoint-shell-form-after-shell",
        'FROM a\nSHELL ["/bin/bash", "-c"]\nENTRYPOINT svc',
        None,
        {"entrypoint": ("/bin/bash", "-c", "svc")},
    ),
    (
        "entrypoint-continued",
        "FROM a\nENTRYPOINT svc \\\n  --flag",
        None,
        {"entrypoint": ("/bin/sh", "-c", "svc   --flag")},
    ),
    (
        "entrypoint-last-wins",
        'FROM a\nENTRYPOINT ["/one"]\nENTRYPOINT ["/two", "x"]',
        None,
        {"entrypoint": ("/two", "x")},
    ),
    ("entrypoint-cleared", 'FROM a\nENTRYPOINT ["/one"]\nENTRYPOINT []', None, {"entrypoint": (), "ignored": ()}),
    ("entrypoint-cleared-by-nothing", "FROM a\nENTRYPOINT", None, {"entrypoint": ()}),
    ("entrypoint-not-json-is-shell-form", "FROM a\nENTRYPOINT [x", None, {"entrypoint": ("/bin/sh", "-c", "[x")}),
    (
        "entrypoint-of-a-chained-stage",
        'FROM a AS base\nENTRYPOINT ["/b"]\nFROM base\nRUN x',
        None,
        {"entrypoint": ("/b",)},
    ),
    (
        "entrypoint-of-an-unused-stage",
        'FROM a AS other\nENTRYPOINT ["/b"]\nFROM a',
        None,
        {"entrypoint": None, "ignored": ("FROM a AS other (line 1): build stage not used by the final stage",)},
    ),
    ("long-ignored-is-shortened", "FROM a\nCMD " + "x" * 100, None, {"ignored": ("CMD " + "x" * 53 + "... (line 2)",)}),
    ("crlf-and-bom", "\ufeffFROM a\r\nENV A=1\r\n", None, {"env": (("A", "1"),)}),
]


@pytest.mark.parametrize(
    ("text", "build_args", "expected"), [c[1:] for c in PLAN_CASES], ids=[c[0] for c in PLAN_CASES]
)
def test_plan(text, build_args, expected):
    plan = parse_dockerfile(text, build_args)
    assert {key: getattr(plan, key) for key in expected} == expected


# (id, dockerfile, line, message after "line N: ")
ERROR_CASES = [
    ("empty", "", 1, "no FROM instruction"),
    ("only-comments-and-args", "# c\nARG X=1\n", 1, "no FROM instruction"),
    ("instruction-before-from", "RUN echo\nFROM a", 1, "RUN before the first FROM (only ARG may precede FROM)"),
    ("unknown-instruction", "FROM a\nFROB x", 2, "unknown instruction FROB"),
    (
        "copy-from",
        "FROM a AS b\nFROM c\nCOPY --from=b /x /y",
        3,
        "COPY --from is not supported by the embedded backend",
    ),
    (
        "add-url",
        "FROM a\nADD https://example.com/x.tgz /opt/",
        2,
        "ADD from a URL needs network; not supported by the embedded backend",
    ),
    (
        "add-git",
        "FROM a\nADD git@github.com:o/r.git /src/",
        2,
        "ADD from a URL needs network; not supported by the embedded backend",
    ),
    (
        "run-mount",
        "FROM a\nRUN --mount=type=cache,target=/root/.cache pip install x",
        2,
        "RUN --mount is not supported by the embedded backend",
    ),
    ("run-network", "FROM a\nRUN --network=none make", 2, "RUN --network is not supported by the embedded backend"),
    (
        "copy-unknown-flag",
        "FROM a\nCOPY --parents a/b /c/",
        2,
        "COPY --parents is not supported by the embedded backend",
    ),
    ("run-empty", "FROM a\nRUN", 2, "RUN needs a command"),
    ("run-empty-exec", "FROM a\nRUN []", 2, "RUN needs a command"),
    ("copy-one-argument", "FROM a\nCOPY x", 2, "COPY needs at least one source and a destination"),
    ("copy-several-to-file", "FROM a\nCOPY a b /c", 2, "COPY with several sources needs a destination ending in /"),
    ("env-no-value", "FROM a\nENV ONLY", 2, "ENV ONLY needs a value"),
    ("env-mixed-forms", "FROM a\nENV A=1 B", 2, "ENV expects name=value, got 'B'"),
    ("arg-empty", "FROM a\nARG", 2, "ARG needs a name"),
    ("workdir-empty", "FROM a\nWORKDIR", 2, "WORKDIR needs a path"),
    ("unterminated-quote", 'FROM a\nENV A="x', 2, "unterminated \" quote in 'A=\"x'"),
    (
        "unsupported-substitution",
        "FROM a\nENV A=${B%%x}",
        2,
        "unsupported substitution in '${B%%x}': only $V, ${V}, ${V:-w}, ${V:+w}",
    ),
    ("unclosed-brace", "FROM a\nENV A=${B:-x", 2, "missing '}' in '${B:-x'"),
    ("bad-substitution", "FROM a\nENV A=${}", 2, "bad substitution in '${}'"),
    ("unterminated-heredoc", "FROM a\nRUN <<EOF\necho x\nEOF2", 2, "heredoc <<EOF is not terminated"),
    ("bad-escape-directive", "# escape=x\nFROM a", 1, "invalid escape character 'x': must be \\ or `"),
    ("duplicate-directive", "# escape=`\n# escape=\\\nFROM a", 2, "duplicate parser directive 'escape'"),
    ("from-extra-words", "FROM a b", 1, "FROM expects an image and optionally 'AS name'"),
    ("from-empty-after-substitution", "ARG I\nFROM $I", 2, "FROM image '$I' is empty after substitution"),
    ("duplicate-stage", "FROM a AS x\nFROM b AS X", 2, "duplicate stage name 'x'"),
    ("shell-not-json", "FROM a\nSHELL /bin/bash -c", 2, 'SHELL needs a non-empty JSON array, e.g. ["/bin/bash", "-c"]'),
]


@pytest.mark.parametrize(("text", "line", "problem"), [c[1:] for c in ERROR_CASES], ids=[c[0] for c in ERROR_CASES])
def test_errors(text, line, problem):
    with pytest.raises(DockerfileError) as caught:
        parse_dockerfile(text)
    assert str(caught.value) == f"line {line}: {problem}"
    assert (caught.value.line, caught.value.problem) == (line, problem)
    assert isinstance(caught.value, ValueError)


def test_errors_in_unused_stages_do_not_matter():
    plan = parse_dockerfile("FROM a AS build\nRUN --mount=type=cache,target=/x make\nCOPY --from=z /a /b\nFROM b")
    assert plan.base_image == "b" and plan.steps == ()


def test_shebang_heredoc_runs_as_a_script(tmp_path):
    plan = parse_dockerfile("FROM a\nRUN <<EOF\n#!/bin/sh\nprintf '%s' \"$0\" > /dev/null\necho from-script\nEOF")
    (step,) = plan.steps
    assert isinstance(step, RunStep)
    assert isinstance(step.command, str) and "#!/bin/sh\n" in step.command
    result = subprocess.run(["/bin/sh", "-c", step.command], capture_output=True, text=True, timeout=10)
    assert (result.returncode, result.stdout) == (0, "from-script\n")


def test_copy_heredoc_command_writes_content_verbatim(tmp_path):
    target = tmp_path / "sub" / "f.txt"
    body = "line $x\nTERMGYM_EOF\n'quoted'\n"
    text = f"FROM a\nCOPY <<'EOF' {target}\n{body}EOF"
    (step,) = parse_dockerfile(text).steps
    assert isinstance(step, RunStep) and isinstance(step.command, str)  # a heredoc COPY runs as a shell command
    subprocess.run(["/bin/sh", "-c", step.command], check=True, timeout=10)
    assert target.read_text() == body


def test_plan_is_frozen():
    plan = parse_dockerfile("FROM a\nRUN x")
    assert isinstance(plan, EnvironmentPlan)
    step = plan.steps[0]
    assert isinstance(step, RunStep)
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.workdir = "/x"  # pyright: ignore[reportAttributeAccessIssue]  # deliberately writes a frozen field: the FrozenInstanceError is under test
    with pytest.raises(dataclasses.FrozenInstanceError):
        step.command = "y"  # pyright: ignore[reportAttributeAccessIssue]  # deliberately writes a frozen field: the FrozenInstanceError is under test
