"""Section, the base of every params.yaml section's schema, and what every section shares: reading
the YAML and the one-line errors that name the offending key."""
from __future__ import annotations

import difflib
import re
from typing import Any, get_args

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError


class Section(BaseModel):
    # Unknown keys are errors: a typo in an ablation must not silently train the baseline again.
    model_config = ConfigDict(extra="forbid")


class ParamsError(ValueError):
    """A params.yaml problem; its message names the offending key."""


def stage_error(stage: str, exc: BaseException) -> SystemExit:
    """The one line a stage exits with on bad input or a full disk: the stage, then the error's first line."""
    from pipeline.io.atomic import disk_full  # a full disk's line: the file, the space, what to do

    lines = str(disk_full(exc, atomic=False) or exc).strip().splitlines() or [type(exc).__name__]
    return SystemExit(f"{stage}: {lines[0]}")


class _Loader(yaml.SafeLoader):
    """YAML 1.1 reads `1e-5` (no dot) as a string; DVC (YAML 1.2) and users read a float."""


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*\.[0-9_]*(?:[eE][-+]?[0-9]+)?|[0-9][0-9_]*[eE][-+]?[0-9]+"
               r"|\.[0-9_]+(?:[eE][-+]?[0-9]+)?|\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"),
    list("-+0123456789."))


def read_yaml(text: str) -> Any:
    return yaml.load(text, Loader=_Loader)  # noqa: S506 - a SafeLoader subclass


def unknown_key(path: str, key: str, known: list[str]) -> str:
    """`path: unknown key (did you mean 'x'?)`: the message for every misspelt key."""
    close = difflib.get_close_matches(str(key), known, n=1)
    hint = f"did you mean {close[0]!r}?" if close else f"known: {', '.join(known)}"
    return f"{path}: unknown key ({hint})"


def fields_at(model: type[BaseModel], path: tuple | list) -> list[str]:
    """Field names of the (nested) pydantic model at `path` below `model`, or [] if none is there."""
    for name in path:
        if isinstance(name, int):  # an item of a list: the list's own model, already taken
            continue
        field = model.model_fields.get(name)
        model = field.annotation if field else None
        # list[X] and X | None: their model X
        model = next((a for a in get_args(model) if isinstance(a, type) and issubclass(a, BaseModel)), model)
        if not (isinstance(model, type) and issubclass(model, BaseModel)):
            return []
    return list(model.model_fields)


def error_line(exc: ValidationError, source: str, schema: type[BaseModel]) -> str:
    """The first error of validating `source` against `schema`, as one line naming its key."""
    err = exc.errors()[0]
    loc = tuple(err["loc"])
    where = ".".join(str(p) for p in loc)
    if err["type"] == "extra_forbidden":
        return f"{source}: {unknown_key(where, str(loc[-1]), fields_at(schema, loc[:-1]))}"
    msg = err["msg"].removeprefix("Value error, ")
    if msg.startswith(where):  # our own validators name the key themselves
        return f"{source}: {msg}"
    got = f" (got {err['input']!r})" if not isinstance(err["input"], dict) else ""
    return f"{source}: {where}: {msg}{got}"
