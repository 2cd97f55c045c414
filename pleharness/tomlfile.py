"""Reading the harness's TOML files (scenarios, suites, engine profiles) with errors that name the
file, the line (syntax) or the dotted key (content) and what was expected."""
from __future__ import annotations

import tomllib
from collections.abc import Iterable
from pathlib import Path
from typing import Any, TypeVar, get_args

from pydantic import BaseModel, ValidationError

from .errors import UsageError

M = TypeVar("M", bound=BaseModel)


def read_toml(path: Path, what: str, error: type[Exception] = UsageError) -> dict[str, Any]:
    """Parse ``path``; raises ``error`` naming the file (and line, for syntax errors)."""
    if Path(path).is_dir():
        raise error(f"{what} {path} is a folder, not a TOML file")
    if Path(path).exists() and not Path(path).is_file():  # a FIFO would block the read
        raise error(f"{what} {path} is not a regular file (a device, FIFO or pipe): save it "
                    "to a file first")
    try:
        # a UTF-8 byte-order mark (some editors write one) is read past, as Python's own
        # "utf-8-sig" codec does
        return tomllib.loads(Path(path).read_text(encoding="utf-8-sig"))
    except FileNotFoundError:
        raise error(f"{what} {path} not found") from None
    except tomllib.TOMLDecodeError as exc:
        raise error(f"{path}: TOML syntax error: {exc}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise error(f"{path}: cannot read: {exc}") from None


def _model_at(model: type[BaseModel], loc: tuple) -> type[BaseModel]:
    """The (nested) model that holds the key at ``loc``, for the 'allowed keys' hint."""
    for part in loc[:-1]:
        if isinstance(part, int):  # an index into a list of models
            continue
        field = model.model_fields.get(part)
        ann = getattr(field, "annotation", None)
        cands = [ann] + list(get_args(ann))
        sub = next((c for c in cands if isinstance(c, type) and issubclass(c, BaseModel)), None)
        if sub is None:
            break
        model = sub
    return model


def validate(model: type[M], data: Any, where: str, prefix: str = "",
             error: type[Exception] = UsageError) -> M:
    """``model.model_validate(data, strict=True)``; on failure raises ``error`` with one clause
    per problem: ``<where>: <prefix><dotted.key>: <message>``, unknown keys listing the allowed
    ones. Strict: values are never coerced (``repeats = "2"`` is an error naming the key and the
    expected type; an integer is still accepted where a float is expected)."""
    try:
        return model.model_validate(data, strict=True)
    except ValidationError as exc:
        raise error(f"{where}: " + "; ".join(_messages(model, exc, prefix))) from None


def _messages(model: type[BaseModel], exc: ValidationError, prefix: str) -> Iterable[str]:
    for e in exc.errors():
        loc = tuple(e["loc"])
        key = prefix + ".".join(str(x) for x in loc) if loc else prefix.rstrip(".") or "(file)"
        if e["type"] == "extra_forbidden":
            allowed = ", ".join(_model_at(model, loc).model_fields)
            yield f"{key}: unknown key (allowed: {allowed})"
        else:
            yield f"{key}: {e['msg']}"


def find_named(name_or_path: str, dirs: Iterable[Path], what: str,
               error: type[Exception] = UsageError) -> Path:
    """A path as given (``x.toml`` or an existing path), else ``<dir>/<name>.toml`` in ``dirs``.
    Raises ``error`` listing the known names."""
    dirs = list(dirs)
    p = Path(name_or_path)
    if p.suffix == ".toml" or p.exists():
        if p.is_dir() and str(name_or_path).strip():
            raise error(f"{p}: a folder, not a file ({what} expected)")
        if p.exists() and not p.is_file() and not p.is_dir():
            raise error(f"{p}: not a regular file (a device, FIFO or pipe such as /dev/stdin or "
                        f"<(...)): a {what} is read from a file; save it to one first")
        if not p.is_file():
            raise error(f"{p}: {what} file not found")
        return p
    for d in dirs:
        cand = d / f"{name_or_path}.toml"
        if cand.is_file():
            return cand
    known = sorted({f.stem for d in dirs for f in d.glob("*.toml")})
    raise error(f"unknown {what} {name_or_path!r} (known: {', '.join(known)})")
