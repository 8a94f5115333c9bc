"""The command line built from ``Config``: every field a flag of the same name (``sft_lr`` is
``--sft-lr``), under its group's title, its docstring as the help with the values a mode allows
and the default (docstrings and titles read from ``trainer/config.py``'s source, so the two cannot
disagree). ``--preset NAME`` sets a preset's values first; flags given explicitly win."""

from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
import itertools
import textwrap
import types
from collections.abc import Sequence
from typing import Union, get_args, get_origin

from termgym.errors import ConfigError, UnknownName

from .checks import FIELD_CHOICES, HINTS
from .config import PRESETS, Config


def field_docs(cls: type) -> dict[str, str]:
    """Each field's docstring (the string literal right under it in the body of the class, or of
    the base class, that declares it), its whitespace folded to single spaces."""
    docs = {}
    for klass in reversed(cls.__mro__):
        if not dataclasses.is_dataclass(klass):
            continue
        definition = ast.parse(textwrap.dedent(inspect.getsource(klass))).body[0]
        assert isinstance(definition, ast.ClassDef)  # the source of a class is its class statement
        for node, following in itertools.pairwise(definition.body):
            if (
                isinstance(node, ast.AnnAssign)
                and isinstance(node.target, ast.Name)
                and isinstance(following, ast.Expr)
                and isinstance(following.value, ast.Constant)
            ):
                docs[node.target.id] = " ".join(str(following.value.value).split())
    return docs


def field_groups(cls: type) -> dict[str, str]:
    """Each field's group: the title (the docstring) of the class that declares it."""
    groups = {}
    for klass in reversed(cls.__mro__):
        for name in inspect.get_annotations(klass):
            groups[name] = " ".join((klass.__doc__ or "").split())
    return groups


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line from the caller, not argparse's usage block
        raise ConfigError(f"{message} (see {self.prog} --help)")


SCALARS: dict[object, type] = {int: int, float: float, str: str}


def _scalar(name: str, annotation: object) -> type:
    """What a flag's value converts to: ``int``, ``float`` or ``str`` (``X | None``: ``X``)."""
    if annotation in SCALARS:
        return SCALARS[annotation]
    if get_origin(annotation) in (Union, types.UnionType):
        present = [arg for arg in get_args(annotation) if arg is not type(None)]
        if len(present) == 1:
            return _scalar(name, present[0])
    raise TypeError(f"Config.{name}: no command-line flag for {annotation!r}")


def build_parser(prog: str = "termgym train") -> argparse.ArgumentParser:
    """Every field of ``Config`` as a flag, in the class's order and under its group's title, its
    docstring as the help (with the values a mode allows and the default). Values are not checked
    here: ``check_config`` does, for flags and for configurations built in code alike."""
    parser = _Parser(prog=prog, description="Train a terminal agent with PPO on termgym tasks.")
    parser.add_argument(
        "--preset",
        default=None,
        help="start from a preset (tiny: the whole main job on a CPU; tiny-long: the tiny job started on the long"
        " families; tiny-ppo: PPO alone on four bundled tasks)",
    )
    docs, groups, sections = field_docs(Config), field_groups(Config), {}
    for f in dataclasses.fields(Config):
        title = groups[f.name]
        if title not in sections:
            sections[title] = parser.add_argument_group(title)
        section = sections[title]
        flag = "--" + f.name.replace("_", "-")
        annotation, allowed = HINTS[f.name], FIELD_CHOICES.get(f.name, ())
        notes = [f"one of: {', '.join(value or repr(value) for value in allowed)}"] if allowed else []
        if f.default is not None:
            notes.append(f"default: {f.default!r}")
        text = docs[f.name] + (f" ({'; '.join(notes)})" if notes else "")
        help_text = text.replace("%", "%%")  # argparse formats help with %
        if annotation is bool:
            section.add_argument(flag, action=argparse.BooleanOptionalAction, default=None, help=help_text)
        elif get_origin(annotation) is tuple:
            section.add_argument(flag, nargs="*", default=None, help=help_text)
        else:
            convert = str if allowed else _scalar(f.name, annotation)
            section.add_argument(flag, type=convert, default=None, help=help_text)
    return parser


def parse_config(argv: Sequence[str] | None = None) -> Config:
    """Defaults, then the preset, then the flags given explicitly."""
    args = build_parser().parse_args(argv)
    if args.preset is not None and args.preset not in PRESETS:
        raise UnknownName("--preset", args.preset, PRESETS)
    values = dict(PRESETS[args.preset]) if args.preset else {}
    for f in dataclasses.fields(Config):
        given = getattr(args, f.name)
        if given is not None:
            values[f.name] = tuple(given) if isinstance(given, list) else given
    return Config(**values)
