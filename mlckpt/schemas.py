"""JSON Schema validation (draft 2020-12) with one-line, path-naming errors.  Pure.

Schemas live in ``rules/<version>/schemas/``; every file type the runner writes and the checker
reads has one there.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from functools import cache
from pathlib import Path
from typing import Any

from jsonschema import Draft202012Validator, validators
from jsonschema.exceptions import ValidationError, best_match
from referencing import Registry, Resource

from mlckpt import strict
from mlckpt.resources import rules_dir


def _strict_integer(checker: object, instance: object) -> bool:
    # JSON Schema's "integer" accepts 2.0; our integers are counts and byte sizes used as Python
    # ints, so a float there is a type error (hosts=2.0 must be refused, not crash later).
    return isinstance(instance, int) and not isinstance(instance, bool)


StrictValidator = validators.extend(
    Draft202012Validator,
    type_checker=Draft202012Validator.TYPE_CHECKER.redefine("integer", _strict_integer),
)


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
def _registry(rules_version: str) -> tuple[Registry, dict[str, Any]]:
    """Every schema of a rules version, by file stem, in one registry so that relative ``$ref``s
    resolve locally (never over the network)."""
    schemas: dict[str, Any] = {}
    registry: Registry = Registry()
    for path in sorted(schema_folder(rules_version).glob("*.schema.json")):
        # Released schema files are fixed data: tests/unit/formats/test_formats.py checks each against the
        # draft 2020-12 metaschema and pins them, so loading need not (it cost ~70 ms a version).
        schema = json.loads(path.read_text(encoding="utf-8"))
        schemas[path.name.removesuffix(".schema.json")] = schema
        registry = registry.with_resource(schema["$id"], Resource.from_contents(schema))
    return registry, schemas


@cache
def validator(name: str, rules_version: str = "1.0") -> Draft202012Validator:
    registry, schemas = _registry(rules_version)
    return StrictValidator(schemas[name], registry=registry,  # type: ignore[no-any-return]
                           format_checker=Draft202012Validator.FORMAT_CHECKER)


@cache
def fast_check(name: str, rules_version: str) -> Callable[..., bool] | None:
    """A fast "valid" for the documents of schema ``name`` that the strict validator accepts, or None
    where the schema refers outside itself or asks for a format.  jsonschema-rs compiles the same
    draft 2020-12 schema in Rust (about ten times faster than the general validator, for the tens
    of thousands of records a large run has).  Its "yes" is trusted only for a document with no
    integral float anywhere (draft 6 on counts 2.0 as an integer, ours do not); every other
    document goes to :func:`validator`, which decides and says why (exactly its verdicts, tested
    against it in tests/unit/formats/test_schema_fast.py)."""
    import jsonschema_rs

    _, schemas = _registry(rules_version)
    schema = schemas[name]
    text = json.dumps(schema)
    if '"format":' in text or "$ref" in text.replace('"$ref": "#/', ""):
        return None
    run = jsonschema_rs.Draft202012Validator(schema).is_valid

    def check(doc: Any, integral: bool | None = None) -> bool:
        """``integral``: whether ``doc`` holds an integral float, where the caller knows (the
        strict decoder counts them: :func:`mlckpt.strict.integral_floats`); None walks it."""
        if has_integral_float(doc) if integral is None else integral:
            return False
        try:
            return bool(run(doc))
        except (ValueError, OverflowError):  # a value it cannot take (an integer past 64 bits)
            return False

    return check


def has_integral_float(node: Any) -> bool:
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


def errors(doc: Any, name: str, rules_version: str = "1.0") -> Iterator[ValidationError]:
    yield from validator(name, rules_version).iter_errors(doc)


def first_error(doc: Any, name: str, rules_version: str = "1.0") -> str | None:
    err = best_match(validator(name, rules_version).iter_errors(doc))
    return None if err is None else describe(err)


def pinned(name: str, key: str, rules_version: str) -> Any:
    """The value a rules version's schema ``name`` pins for its top-level ``key`` (a format
    version: what a runner judged by those rules writes, e.g. ``run_format``)."""
    return validator(name, rules_version).schema["properties"][key]["const"]


def drop_unknown_nulls(doc: dict[str, Any], name: str, rules_version: str) -> None:
    """Remove, in place, the keys ``doc`` holds at null (or as a block of nulls) that schema
    ``name`` of ``rules_version`` does not know: a setting added by a later rules version, left
    off, means nothing to an older one (``checkpoint.restore_from`` under rules 1.2, ``witness``
    under 1.3)."""
    for err in list(validator(name, rules_version).iter_errors(doc)):
        if err.validator != "additionalProperties" or not isinstance(err.instance, dict):
            continue
        for key in set(err.instance) - set(err.schema.get("properties", {})):
            if _all_null(err.instance[key]):
                del err.instance[key]


def _all_null(value: Any) -> bool:
    """null, or a block (of blocks) of nulls: ``storage: {s3: {part_size: null, ...}}``."""
    return value is None or (isinstance(value, dict) and all(_all_null(v) for v in value.values()))
