"""The shape of the code (docs/src/design/layout.md), enforced: import contracts, no import cycle,
bounded module and function sizes, no test switch in production code, types that check."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path

import grimp
import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("mlckpt", "checker")
MAX_MODULE_LINES = 420  # the design page says why, and how a module is cut
MAX_FUNCTION_LINES = 60


def sources() -> list[Path]:
    return sorted(p for pkg in PACKAGES for p in (REPO / pkg).rglob("*.py"))


def cycles(graph: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.get(root, ()))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph.get(w, ())))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    x = stack.pop()
                    on.discard(x)
                    comp.append(x)
                    if x == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def test_cycle_finder_finds_cycles() -> None:
    assert cycles({"a": ["b"], "b": ["c"], "c": ["a"], "d": ["a"]}) == [["a", "b", "c"]]
    assert cycles({"a": ["b"], "b": [], "c": ["c"]}) == []


def test_no_import_cycle() -> None:
    """Lazy imports inside functions count: grimp reads every import statement."""
    g = grimp.build_graph(*PACKAGES)
    graph = {m: [d for d in g.find_modules_directly_imported_by(m) if d in g.modules] for m in g.modules}
    assert cycles(graph) == []


def test_import_contracts() -> None:
    exe = Path(sys.executable).parent / "lint-imports"
    cmd = [str(exe)] if exe.exists() else [shutil.which("lint-imports") or "lint-imports"]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, check=False, timeout=120)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "0 broken" in proc.stdout


def test_module_sizes() -> None:
    sizes = {str(p.relative_to(REPO)): len(p.read_text().splitlines()) for p in sources()}
    big = {name: n for name, n in sizes.items() if n > MAX_MODULE_LINES}
    assert big == {}


def test_function_sizes() -> None:
    long: dict[str, int] = {}
    for p in sources():
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                n = node.end_lineno - node.lineno + 1  # type: ignore[operator]
                if n > MAX_FUNCTION_LINES:
                    long[f"{p.relative_to(REPO)}:{node.name}"] = n
    assert long == {}


@pytest.mark.parametrize("word", ["MLCKPT_TEST", "MLCKPT_GUARDIAN", "MLCKPT_LAUNCHED"])
def test_no_test_switch_in_production_code(word: str) -> None:
    hits = [str(p.relative_to(REPO)) for p in sources() if word in p.read_text()]
    assert hits == []


def test_ruff_clean() -> None:
    exe = Path(sys.executable).parent / "ruff"
    cmd = [str(exe) if exe.exists() else "ruff", "check", "--no-cache", "."]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, check=False, timeout=120)
    assert proc.returncode == 0, proc.stdout[-3000:]


def test_types_check(tmp_path: Path) -> None:
    """The annotations hold: mypy over both packages, as pyproject.toml configures it."""
    cmd = [sys.executable, "-m", "mypy", "--cache-dir", str(tmp_path / "cache"), "--no-error-summary"]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, check=False, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-1000:]


MAX_ANY_PER_KLOC = 15  # sigstore-python: 3; httpie: 7.5 (docs/src/design/layout.md)


def any_uses(source: str) -> int:
    """How many times ``Any`` is named in code (annotations, casts, aliases; not prose or imports)."""
    return sum(1 for node in ast.walk(ast.parse(source))
               if (isinstance(node, ast.Name) and node.id == "Any")
               or (isinstance(node, ast.Attribute) and node.attr == "Any"))


def test_any_counter_counts_code_not_prose() -> None:
    src = ('"""Any docstring."""\nfrom typing import Any\nimport typing\n\n\n'
           'def f(x: Any) -> dict[str, typing.Any]:\n    return {}  # Any comment\n')
    assert any_uses(src) == 2


def test_any_stays_rare() -> None:
    """Values are typed where they are read: ``Any`` only where a value is truly open (a parsed
    document before it is judged, a library's untyped object)."""
    uses = lines = 0
    for p in sources():
        text = p.read_text()
        uses += any_uses(text)
        lines += len(text.splitlines())
    assert 1000 * uses / lines < MAX_ANY_PER_KLOC, f"{uses} uses of Any in {lines} lines"


def test_types_check_finds_a_wrong_record_key(tmp_path: Path) -> None:
    """The record shapes are checked, not decoration: a misspelt key of a restore's record fails."""
    bad = tmp_path / "bad_record.py"
    bad.write_text("from mlckpt.records import ReadRecord\n\n\n"
                   "def f(r: ReadRecord) -> int:\n    return r[\"verifed_bytes\"]\n")
    cmd = [sys.executable, "-m", "mypy", "--cache-dir", str(tmp_path / "cache"), "--no-error-summary",
           "--config-file", str(REPO / "pyproject.toml"), str(bad)]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, check=False, timeout=600)
    assert proc.returncode == 1 and '"verifed_bytes"' in proc.stdout, proc.stdout + proc.stderr


# The modules whose functions return a command's exit status.
COMMAND_MODULES = ("mlckpt/cli/*.py", "mlckpt/command_line.py", "mlckpt/run/runner.py", "checker/*.py",
                   "checker/leaderboard/command.py")


def literal_statuses(path: Path) -> list[str]:
    """``function:line`` of each ``return <integer>`` in a function of ``path`` that returns ``int``."""
    out = []
    for fn in ast.walk(ast.parse(path.read_text())):
        returns = getattr(fn, "returns", None)
        if not (isinstance(fn, ast.FunctionDef) and isinstance(returns, ast.Name) and returns.id == "int"):
            continue
        for node in ast.walk(fn):
            if isinstance(node, ast.Return) and node.value is not None:
                value = node.value
                values = [value.body, value.orelse] if isinstance(value, ast.IfExp) else [value]
                out += [f"{fn.name}:{node.lineno}" for v in values
                        if isinstance(v, ast.Constant) and type(v.value) is int]
    return out


def test_exit_statuses_come_from_one_enum(tmp_path: Path) -> None:
    """A command returns an ``ExitStatus``, never a number of its own."""
    found = {str(p.relative_to(REPO)): literal_statuses(p)
             for pattern in COMMAND_MODULES for p in sorted(REPO.glob(pattern))}
    assert {k: v for k, v in found.items() if v} == {}
    planted = tmp_path / "cmd.py"
    planted.write_text("def handle(args: object) -> int:\n    return 1 if args else 0\n")
    assert literal_statuses(planted) == ["handle:2", "handle:2"]


def _imports(path: Path) -> Iterable[tuple[str, str]]:
    """(module, name) of every ``from module import name`` in ``path`` (``import module``: name '')."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            yield from ((node.module, a.name) for a in node.names)
        elif isinstance(node, ast.Import):
            yield from ((a.name, "") for a in node.names)


def test_no_test_module_imports_another() -> None:
    """What tests share lives in tests/support; a test module or a conftest is never imported."""
    tests = REPO / "tests"
    found = [f"{p.relative_to(REPO)}: {m}" for p in sorted(tests.rglob("*.py")) if "support" not in p.parts
             for m, _ in _imports(p) if m.split(".")[-1].startswith("test_") or m.endswith("conftest")]
    assert found == []


def test_test_module_names_are_unique() -> None:
    """The test folders are no packages: pytest imports each test module by its file name alone,
    and a second module of the same name stops the whole run at collection."""
    seen: dict[str, list[str]] = {}
    for p in sorted((REPO / "tests").rglob("test_*.py")):
        seen.setdefault(p.name, []).append(str(p.relative_to(REPO)))
    assert {name: paths for name, paths in seen.items() if len(paths) > 1} == {}


def test_no_private_name_crosses_a_module() -> None:
    """A name another module needs is public in the module that owns it."""
    crossing = [f"{p.relative_to(REPO)}: {m}.{n}" for p in sources() for m, n in _imports(p)
                if m.startswith(PACKAGES) and n.startswith("_") and not n.startswith("__")]
    assert crossing == []
