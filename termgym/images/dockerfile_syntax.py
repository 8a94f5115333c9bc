"""The Dockerfile lexer: how Dockerfile text becomes instructions, and how their words are split
and their variables expanded, by the part of BuildKit's rules that termgym implements.

Parser directives (``# syntax=``, ``# escape=``, ``# check=``) count only at the top: the first
line that is not one ends them, and a repeated one is an error. The escape character is the
backslash unless ``# escape=``` makes it the backtick (nothing else is allowed).
:func:`read_instructions` skips empty and comment lines, also inside continuations; a line ending
in the escape character (trailing blanks allowed) continues on the next; the keyword comes back
upper case, its arguments joined and stripped. RUN, COPY and ADD take a heredoc for each
``<<NAME``, ``<<-NAME`` (leading tabs stripped), ``<<'NAME'`` or ``<<"NAME"`` word: the lines
after the instruction up to the one that is ``NAME``. :func:`split_words` splits on whitespace
outside quotes and ``${...}``, leaving quotes and escapes in the words. :func:`expand`
substitutes ``$V``, ``${V}``, ``${V:-w}``, ``${V:+w}``, ``${V-w}`` and ``${V+w}`` (``w`` expanded
in turn; an unknown name is empty; single quotes are literal) and, unless told not to, removes
quotes and escapes. Every fault is a :class:`DockerfileError` naming its line.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass

from termgym.errors import ConfigError

__all__ = [
    "HEREDOC_MARKER",
    "DockerfileError",
    "Heredoc",
    "Instruction",
    "escape_char",
    "expand",
    "json_array",
    "read_instructions",
    "split_words",
]


class DockerfileError(ConfigError):
    """A Dockerfile that is malformed or needs what the embedded backend lacks.

    ``str(error)`` is ``"line N: problem"`` (one line); ``line`` and ``problem``
    hold the parts.
    """

    def __init__(self, line: int, problem: str) -> None:
        self.line, self.problem = line, problem
        super().__init__(f"line {line}: {problem}")


_DIRECTIVE = re.compile(r"#\s*([A-Za-z][A-Za-z0-9]*)\s*=\s*(.+?)\s*$")
HEREDOC_MARKER = re.compile(r"<<(-?)(['\"]?)([A-Za-z_][A-Za-z0-9_]*)\2")  # a word that starts a heredoc
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_SUBST_OPS = (":-", ":+", "-", "+")


@dataclass(frozen=True)
class Heredoc:
    """One heredoc of an instruction: its body ``lines`` and the ``terminator`` line as written."""

    name: str
    quoted: bool
    strip_tabs: bool
    lines: tuple[str, ...]
    terminator: str

    def content(self) -> str:
        """The body as a file holds it: each line newline-terminated, tabs stripped for ``<<-``."""
        lines = [ln.lstrip("\t") for ln in self.lines] if self.strip_tabs else self.lines
        return "".join(ln + "\n" for ln in lines)


@dataclass(frozen=True)
class Instruction:
    """One instruction, starting on ``line``, with the heredocs that follow it."""

    keyword: str  # upper case
    args: str  # continuations joined, stripped
    line: int
    heredocs: tuple[Heredoc, ...] = ()

    def describe(self) -> str:
        """The instruction in at most 60 characters, and its line."""
        text = f"{self.keyword} {self.args}".strip()
        return (text if len(text) <= 60 else text[:57] + "...") + f" (line {self.line})"


def escape_char(lines: list[str]) -> str:
    """The escape character the parser directives at the top of ``lines`` set (``\\`` by default)."""
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


def read_instructions(lines: list[str], escape: str) -> list[Instruction]:
    """The instructions of ``lines``, continuations joined and heredoc bodies attached."""
    continuation = re.compile(re.escape(escape) + r"[ \t]*$")
    result: list[Instruction] = []
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
        heredocs: list[Heredoc] = []
        if keyword in ("RUN", "COPY", "ADD"):
            for strip_tabs, quoted, name in _heredoc_markers(args, escape, start):
                body: list[str] = []
                while True:
                    if i == len(lines):
                        raise DockerfileError(start, f"heredoc <<{name} is not terminated")
                    raw, i = lines[i], i + 1
                    if (raw.lstrip("\t") if strip_tabs else raw) == name:
                        heredocs.append(Heredoc(name, quoted, strip_tabs, tuple(body), raw))
                        break
                    body.append(raw)
        result.append(Instruction(keyword, args, start, tuple(heredocs)))
    return result


def _blank_or_comment(raw: str) -> bool:
    stripped = raw.strip()
    return not stripped or stripped.startswith("#")


def _heredoc_markers(args: str, escape: str, line: int) -> list[tuple[bool, bool, str]]:
    """``(strip_tabs, quoted, name)`` for each word that is a ``<<NAME`` marker (as BuildKit)."""
    try:
        words = split_words(args, escape, line)
    except DockerfileError:  # an unbalanced quote (in a shell comment, say): plain words
        words = args.split()
    matches = [HEREDOC_MARKER.fullmatch(word) for word in words]
    return [(m.group(1) == "-", bool(m.group(2)), m.group(3)) for m in matches if m is not None]


def split_words(text: str, escape: str, line: int) -> list[str]:
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


def expand(word: str, scope: Mapping[str, str], escape: str, line: int, quotes: bool = True) -> str:
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
        return expand(word[j + len(op) : k], scope, escape, line, quotes=False), k + 1
    return (value or "") if is_set else "", k + 1


def json_array(text: str) -> tuple[str, ...] | None:
    """The strings of a JSON array (an instruction's exec form), or None when ``text`` is not one."""
    if not text.startswith("["):
        return None
    try:
        value = json.loads(text)
    except ValueError:
        return None
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        return None
    return tuple(value)
