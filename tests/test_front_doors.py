"""The front doors stay true: every path and module that a doc page or a docstring names exists,
every module is in the layers contract, and a package's docstring names only its own modules."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")  # Python 3.11 on

REPO = Path(__file__).resolve().parents[1]
TOP = ("mlckpt", "checker", "tests", "benchmarks", "rules", "docs", "workloads", "submissions")
PATH = re.compile(r"(?<![\w/.~-])((?:" + "|".join(TOP) + r")/[\w./-]*[\w/])")
# a placeholder in the path or just after it: a pattern, not a file
PLACEHOLDER = re.compile(r"[<{*…]|NAME|\.\.\.")
DOTTED = re.compile(r"(?<![\w./-])((?:mlckpt|checker)(?:\.[A-Za-z_]\w*)+)(?![\w-])")
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())


def texts() -> Iterator[tuple[str, str]]:
    """Every doc page the site builds (the changelog aside: history names what was) and every
    docstring of the code."""
    for p in sorted((REPO / "docs" / "src").rglob("*.md")):
        if p.name != "changelog.md":
            yield str(p.relative_to(REPO)), p.read_text()
    for base in ("mlckpt", "checker"):
        for p in sorted((REPO / base).rglob("*.py")):
            for node in ast.walk(ast.parse(p.read_text())):
                if isinstance(node, ast.Module | ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                    doc = ast.get_docstring(node)
                    if doc:
                        yield str(p.relative_to(REPO)), doc


def wheel_only() -> set[str]:
    """Paths that exist only in a built wheel (pyproject's force-include targets)."""
    targets = PYPROJECT["tool"]["hatch"]["build"]["targets"]["wheel"].get("force-include", {}).values()
    return {str(Path(t).parent) for t in targets}


def test_every_path_the_docs_and_docstrings_name_exists() -> None:
    missing = set()
    for where, text in texts():
        for m in PATH.finditer(text):
            if PLACEHOLDER.search(text[m.start():m.end() + 3]):
                continue
            path = m.group(1).rstrip("/.")
            if not (REPO / path).exists() and path not in wheel_only():
                missing.add((where, path))
    assert not missing, sorted(missing)


def _source(module: str) -> Path | None:
    base = REPO / module.replace(".", "/")
    for p in (base.with_suffix(".py"), base / "__init__.py"):
        if p.is_file():
            return p
    return None


def resolves(name: str) -> bool:
    """``name`` is a module, or a module and a name it defines or imports."""
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        src = _source(".".join(parts[:i]))
        if src is None:
            continue
        if i == len(parts):
            return True
        attr = re.escape(parts[i])
        return bool(re.search(rf"^\s*(?:def|class)\s+{attr}\b|^\s*{attr}\s*[:=]|^\s*from .*\b{attr}\b|"
                              rf"^\s+{attr},", src.read_text(), re.M))
    return False


def test_every_module_the_docs_and_docstrings_name_exists() -> None:
    missing = {(where, m.group(1)) for where, text in texts() for m in DOTTED.finditer(text)
               if not m.group(1).endswith((".md", ".dev", ".py", ".yaml")) and not resolves(m.group(1))}
    assert not missing, sorted(missing)


def test_the_checker_catches_a_missing_path_and_module() -> None:
    assert not resolves("mlckpt.sysinfo") and not resolves("mlckpt.run.features.gpustate")
    assert resolves("mlckpt.run.phases.gpustate") and resolves("mlckpt.plan.settings.Settings")
    assert [m.group(1) for m in PATH.finditer("see `mlckpt/metrics.py`, rules/1.16/ and rules/<v>/")] == [
        "mlckpt/metrics.py", "rules/1.16/"]


def _layers() -> list[str]:
    contract = next(c for c in PYPROJECT["tool"]["importlinter"]["contracts"]
                    if c["name"] == "Layers in pipeline order")
    return [name.strip() for layer in contract["layers"] for name in re.split(r"[|:]", layer)]


def _modules(package: Path) -> set[str]:
    """The modules and subpackages directly in ``package``."""
    return {p.stem if p.is_file() else p.name for p in package.iterdir()
            if (p.suffix == ".py" and p.stem != "__init__") or (p / "__init__.py").is_file()}


def test_every_module_is_in_the_layers_contract() -> None:
    layered = set(_layers())
    modules = {f"mlckpt.{name}" for name in _modules(REPO / "mlckpt") - {"__main__"}}
    assert modules - layered == set(), "modules in no layer of the import contract"
    run = next(c for c in PYPROJECT["tool"]["importlinter"]["contracts"]
               if c.get("containers") == ["mlckpt.run"])
    rooms = {n.strip() for layer in run["layers"] for n in layer.split("|")}
    assert _modules(REPO / "mlckpt" / "run") - rooms == set(), "mlckpt/run modules in no room of its contract"


def packages() -> list[Path]:
    return [*sorted(p.parent for p in (REPO / "mlckpt").rglob("__init__.py")), REPO / "checker"]


@pytest.mark.parametrize("package", packages(), ids=lambda p: str(p.relative_to(REPO)))
def test_a_package_docstring_names_only_its_own_modules(package: Path) -> None:
    """A name in double backquotes that is a module elsewhere in the code is one of this package's
    own (a package's docstring is its table of contents)."""
    doc = ast.get_docstring(ast.parse((package / "__init__.py").read_text())) or ""
    own = {p.stem for p in package.glob("*.py")} | {p.name for p in package.iterdir() if p.is_dir()}
    elsewhere = {p.stem for p in (REPO / "mlckpt").rglob("*.py")} - {"__init__", "__main__"}
    named = set(re.findall(r"``(\w+)``", doc))
    assert (named & elsewhere) - own == set(), f"{package}: names modules that live elsewhere"


def test_the_unit_tests_are_arranged_as_the_design_page_says() -> None:
    """docs/src/design/layout.md: ``unit/<package>/``, the pure parts by package (or top module)."""
    page = (REPO / "docs" / "src" / "design" / "layout.md").read_text()
    assert "`unit/<package>/` (pure parts, by package)" in page
    names = _modules(REPO / "mlckpt") | {"checker"}
    folders = {p.name for p in (REPO / "tests" / "unit").iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert folders and folders <= names, sorted(folders - names)


# A split result is a write invocation and a read-only invocation: one word for the idea
# ("split"), one for its parts ("invocation").  The persisted names keep their history: the rule
# SPLIT-PAIR and its check split_pair, the report's metrics.unpaired_write_half, the leaderboard's
# verdict "unpaired".
OTHER_WORDS = re.compile(r"\b(write|read)[ _]hal(f|ves)\b|\b(both|two|the) halves of a split|\.halves\b|"
                         r"\bsplit[ _]pairs?\b|\bpair_[a-z]+\b|\b[a-z]+_halves\b")
PERSISTED = ("unpaired_write_half", "split_pair")


def other_words(text: str) -> list[str]:
    """The split idea's retired words in ``text`` (persisted names aside)."""
    for name in PERSISTED:
        text = text.replace(name, "")
    return [m.group(0) for m in OTHER_WORDS.finditer(text)]


def test_one_word_per_idea_for_a_split_result() -> None:
    found = {str(p.relative_to(REPO)): other_words(p.read_text())
             for pattern in ("mlckpt/**/*.py", "checker/**/*.py", "docs/src/*/*.md", "README.md")
             for p in sorted(REPO.glob(pattern))}
    assert {k: v for k, v in found.items() if v} == {}
    planted = "the write half's e.halves; both halves of a split; split_pair and pair_doc"
    assert other_words(planted) == ["write half", ".halves", "both halves of a split", "pair_doc"]


def test_every_benchmark_is_in_the_index_with_a_page_and_none_reaches_into_the_tests() -> None:
    """benchmarks/README.md indexes every script, each row links a page that exists, and no script
    puts tests/ on its path or imports from it (the shared code is benchmarks/lab/)."""
    bench = REPO / "benchmarks"
    index = (bench / "README.md").read_text()
    scripts = sorted(p.name for p in bench.iterdir() if p.suffix in (".py", ".sh"))
    assert [s for s in scripts if f"| `{s}` |" not in index] == []
    linked = re.findall(r"\]\((\.\./docs/src/[^)]+\.md)\)", index)
    assert linked and [p for p in linked if not (bench / p).resolve().is_file()] == []
    reaching = [p.name for p in sorted(bench.rglob("*.py"))
                if re.search(r"sys\.path\.(insert|append)|^\s*from (support|test_\w+)\b|^\s*import support\b",
                             p.read_text(), re.M)]
    assert reaching == []
    nav = (REPO / "docs" / "mkdocs.yml").read_text()
    pages = sorted(p.name for p in (REPO / "docs" / "src" / "measurements").glob("*.md"))
    assert [p for p in pages if f"measurements/{p}" not in nav] == []
