"""JSON Schema validation (draft 2020-12) with one-line, path-naming errors.  Pure.

Schemas live in ``rules/<version>/schemas/``; every file type the runner writes and the checker
reads has one there.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mlckpt import strict
from mlckpt.resources import rules_dir

if TYPE_CHECKING:
    from jsonschema import Draft202012Validator
    from jsonschema.exceptions import ValidationError


def _date_time(text: str) -> bool:
    from rfc3339_validator import validate_rfc3339

    return bool(validate_rfc3339(text.upper()))


# The formats our schemas ask for, each judged as jsonschema's format checker judges it
# (rfc3339-validator's on the upper-cased text): the fast path calls the same functions.
FORMATS: dict[str, Callable[[str], bool]] = {"date-time": _date_time}


def _strict_integer(checker: object, instance: object) -> bool:
    # JSON Schema's "integer" accepts 2.0; our integers are counts and byte sizes used as Python
    # ints, so a float there is a type error (hosts=2.0 must be refused, not crash later).
    return isinstance(instance, int) and not isinstance(instance, bool)


def schema_folder(rules_version: str) -> Path:
    """A rules version's schemas: its own ``schemas/``; or, for a rule set written on top of
    another, those of the version its rules.yaml names under ``schemas:`` (a rule set whose rules
    come from one version and whose file formats from a later one), else its ``extends:`` base's."""
    folder = rules_dir() / rules_version
    if (folder / "schemas").is_dir() or not (folder / "rules.yaml").is_file():
        return folder / "schemas"
    data = strict.parse_yaml((folder / "rules.yaml").read_bytes())
    base = data.get("schemas") or data.get("extends")
    return schema_folder(str(base)) if base else folder / "schemas"


@cache
def _schemas(rules_version: str) -> dict[str, Any]:
    """Every schema of a rules version, by file stem."""
    # Released schema files are fixed data: tests/unit/formats/test_formats.py checks each against the
    # draft 2020-12 metaschema and pins them, so loading need not (it cost ~70 ms a version).
    return {path.name.removesuffix(".schema.json"): json.loads(path.read_text(encoding="utf-8"))
            for path in sorted(schema_folder(rules_version).glob("*.schema.json"))}


def schema(name: str, rules_version: str = "1.0") -> dict[str, Any]:
    """Schema ``name`` of a rules version (shared: not to be changed)."""
    return _schemas(rules_version)[name]


# jsonschema (with referencing and attrs, about 0.1 s to import) is loaded only where a document
# fails the fast path below and must be told why, or where its own checks are asked for.
@cache
def validator(name: str, rules_version: str = "1.0") -> Draft202012Validator:
    """The strict validator of schema ``name``: the one that decides, and says why."""
    from jsonschema import Draft202012Validator

    return _strict()(schema(name, rules_version), registry=_registry(rules_version),
                     format_checker=Draft202012Validator.FORMAT_CHECKER)


@cache
def _strict() -> Any:
    """Draft 2020-12 with our integer type, made once."""
    from jsonschema import Draft202012Validator, validators

    return validators.extend(
        Draft202012Validator,
        type_checker=Draft202012Validator.TYPE_CHECKER.redefine("integer", _strict_integer),
    )


@cache
def _registry(rules_version: str) -> object:
    """Every schema of the version in one registry, so that relative ``$ref``s resolve locally
    (never over the network)."""
    from referencing import Registry, Resource

    return Registry().with_resources(
        (s["$id"], Resource.from_contents(s)) for s in _schemas(rules_version).values())


def _no_retrieval(uri: str) -> Any:
    raise LookupError(f"{uri}: not a schema of this rules version (nothing is fetched)")


@cache
def fast_check(name: str, rules_version: str) -> Callable[..., bool] | None:
    """A fast "valid" for the documents of schema ``name``, given only where the strict validator
    gives it, or None where its schemas ask for a format it cannot judge as the strict one does.
    jsonschema-rs compiles the same draft 2020-12 schemas in Rust (about ten times faster than the
    general validator, for the tens of thousands of records a large run has; and a valid bundle
    never imports jsonschema), its ``$ref``s resolved among the version's own schemas and its
    formats judged by :data:`FORMATS`' own functions.  Draft 6 on counts 2.0 as an integer, ours
    do not: a document holding an integral float is judged by a second compilation whose every
    integer refuses a float (a keyword of ours on each, in Python, so only there).  What it
    refuses goes to :func:`validator`, which says why (tested against it in
    tests/unit/formats/test_schema_fast.py)."""
    schemas = _schemas(rules_version)
    if not {f for s in schemas.values() for f in _formats(s)} <= set(FORMATS):
        return None
    plain = _compiled(name, rules_version, exact=False)

    def check(doc: object, integral: bool | None = None) -> bool:
        """``integral``: whether ``doc`` holds an integral float, where the caller knows (the
        strict decoder counts them: :func:`mlckpt.strict.integral_floats`); None walks it."""
        run = _compiled(name, rules_version, exact=True) if (
            has_integral_float(doc) if integral is None else integral) else plain
        try:
            return bool(run(doc))
        except Exception:  # a value it cannot take (an integer past 64 bits): the strict one decides
            return False

    return check


class _Integer:
    """The keyword ``mlckptInteger``: an integer is an int, never an integral float."""

    def __init__(self, parent: object, value: object, path: object) -> None:
        pass

    def validate(self, instance: object) -> None:
        if isinstance(instance, float):
            raise ValueError(f"{instance!r} is not of type 'integer'")


@cache
def _compiled(name: str, rules_version: str, *, exact: bool) -> Callable[[object], bool]:
    import jsonschema_rs

    schemas, registry = _rs_registry(rules_version, exact)
    return jsonschema_rs.Draft202012Validator(
        schemas[name], registry=registry, retriever=_no_retrieval, validate_formats=True,
        ignore_unknown_formats=False, formats=FORMATS,
        keywords={"mlckptInteger": _Integer} if exact else None).is_valid


@cache
def _rs_registry(rules_version: str, exact: bool) -> tuple[dict[str, Any], Any]:
    """The version's schemas (``exact``: through :func:`_exact_integers`) and jsonschema-rs's registry."""
    import jsonschema_rs

    schemas = _schemas(rules_version)
    if exact:
        schemas = {k: _exact_integers(s) for k, s in schemas.items()}
    return schemas, jsonschema_rs.Registry([(s["$id"], s) for s in schemas.values()], retriever=_no_retrieval)


_VALUES = frozenset({"const", "enum", "default", "examples"})  # data, not schemas


def _exact_integers(node: object) -> object:
    """A copy of a schema whose every integer type (not also a number) carries ``mlckptInteger``."""
    if isinstance(node, list):
        return [_exact_integers(v) for v in node]
    if not isinstance(node, dict):
        return node
    out = {k: v if k in _VALUES else _exact_integers(v) for k, v in node.items()}
    types = node.get("type")
    types = types if isinstance(types, list) else [types]
    if "integer" in types and "number" not in types:
        out["mlckptInteger"] = True
    return out


def _formats(node: object) -> Iterator[str]:
    """Every ``format`` a schema asks for."""
    if isinstance(node, dict):
        if isinstance(node.get("format"), str):
            yield node["format"]
        for v in node.values():
            yield from _formats(v)
    elif isinstance(node, list):
        for v in node:
            yield from _formats(v)


def has_integral_float(node: object) -> bool:
    if isinstance(node, float):
        return node.is_integer()
    if isinstance(node, dict):
        return any(has_integral_float(v) for v in node.values())
    if isinstance(node, list):
        return any(has_integral_float(v) for v in node)
    return False


def dotted(err: ValidationError) -> str:
    return ".".join(str(p) for p in err.absolute_path) or "(top level)"


def describe(err: ValidationError) -> str:
    """'checkpoint.num_writes: 'abc' is not of type 'integer'' — the path first, then why."""
    if err.validator == "additionalProperties":
        extra = sorted(set(err.instance) - set(err.schema.get("properties", {})))
        where = dotted(err)
        keys = ", ".join(f"{where}.{k}" if where != "(top level)" else k for k in extra)
        return f"{keys}: unknown key"
    return f"{dotted(err)}: {err.message}"


def errors(doc: object, name: str, rules_version: str = "1.0") -> Iterator[ValidationError]:
    """Why ``doc`` does not match schema ``name`` (nothing where the fast path says it does)."""
    fast = fast_check(name, rules_version)
    if fast is not None and fast(doc):
        return
    yield from validator(name, rules_version).iter_errors(doc)


def first_error(doc: object, name: str, rules_version: str = "1.0") -> str | None:
    found = list(errors(doc, name, rules_version))
    if not found:
        return None
    from jsonschema.exceptions import best_match

    return describe(best_match(found))


def pinned(name: str, key: str, rules_version: str) -> Any:
    """The value a rules version's schema ``name`` pins for its top-level ``key`` (a format
    version: what a runner judged by those rules writes, e.g. ``run_format``)."""
    return schema(name, rules_version)["properties"][key]["const"]


def drop_unknown_nulls(doc: dict[str, object], name: str, rules_version: str) -> None:
    """Remove, in place, the keys ``doc`` holds at null (or as a block of nulls) that schema
    ``name`` of ``rules_version`` does not know: a setting added by a later rules version, left
    off, means nothing to an older one (``checkpoint.restore_from`` under rules 1.2, ``witness``
    under 1.3)."""
    for err in list(errors(doc, name, rules_version)):
        if err.validator != "additionalProperties" or not isinstance(err.instance, dict):
            continue
        for key in set(err.instance) - set(err.schema.get("properties", {})):
            if _all_null(err.instance[key]):
                del err.instance[key]


def _all_null(value: object) -> bool:
    """null, or a block (of blocks) of nulls: ``storage: {s3: {part_size: null, ...}}``."""
    return value is None or (isinstance(value, dict) and all(_all_null(v) for v in value.values()))
