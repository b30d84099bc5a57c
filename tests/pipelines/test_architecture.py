"""The layout as a contract: import direction (import-linter), thin asset modules, and stage
commands that run without loading Dagster."""

import ast
import re
import subprocess
import sys
import textwrap
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
MAX_ASSET_MODULE_LINES = 300


def test_import_contracts_hold():
    """pyproject.toml [tool.importlinter]: layers and forbidden imports, checked by the real tool."""
    lint = Path(sys.executable).with_name("lint-imports")
    done = subprocess.run([str(lint)], cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "broken" in done.stdout and "0 broken" in done.stdout


def test_asset_modules_are_declarations():
    sizes = {p.name: len(p.read_text().splitlines()) for p in (REPO_ROOT / "assets").glob("*.py")}
    too_long = {name: n for name, n in sizes.items() if n > MAX_ASSET_MODULE_LINES}
    assert not too_long, f"asset modules over {MAX_ASSET_MODULE_LINES} lines: {too_long}"


STAGE_PACKAGE_ROOTS = ("annotation", "training", "envs")


def _module_prefix(doc_path: str) -> str:
    """``training/rl/`` -> ``training.rl``; ``training/base/pretrained.py`` -> ``training.base.pretrained``."""
    return doc_path.removesuffix("/").removesuffix(".py").replace("/", ".")


def _architecture_table() -> dict[str, set[str]]:
    """docs/architecture.md's stage table: each asset module -> the module prefixes it may import
    (its room, and what the last column names)."""
    allowed: dict[str, set[str]] = {}
    for line in (REPO_ROOT / "docs" / "architecture.md").read_text().splitlines():
        cells = [c.strip() for c in line.split("|")[1:-1]]
        if len(cells) != 6 or not re.search(r"`assets/\w+\.py`", cells[1]):
            continue
        rooms = re.findall(r"`((?:annotation|training|envs)/(?:[\w/]*/)?)`", cells[2])
        also = re.findall(r"`((?:annotation|training|envs)/[\w/.]+)`", cells[5])
        for module in re.findall(r"`(assets/\w+\.py)`", cells[1]):
            allowed.setdefault(module, set()).update(_module_prefix(p) for p in rooms + also)
    return allowed


def _stage_imports(path: Path) -> set[str]:
    """Modules of the stage packages that ``path`` imports, at module level or inside functions."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names = [node.module or ""] if isinstance(node, ast.ImportFrom) else []
        names += [a.name for a in node.names] if isinstance(node, ast.Import) else []
        found |= {n for n in names if n.split(".")[0] in STAGE_PACKAGE_ROOTS}
    return found


def test_each_asset_module_imports_from_the_rooms_the_architecture_table_names():
    """docs/architecture.md stays true: every asset module has a row, and imports stage code only
    from its room or from what its row's last column names."""
    table = _architecture_table()
    modules = {
        f"assets/{p.name}"
        for p in (REPO_ROOT / "assets").glob("*.py")
        if p.name not in ("__init__.py", "metadata.py", "config.py")
    }
    assert modules - set(table) == set(), "asset modules missing from docs/architecture.md's table"
    strays = {
        module: sorted(
            m for m in _stage_imports(REPO_ROOT / module) if not any(m == a or m.startswith(a + ".") for a in allowed)
        )
        for module, allowed in table.items()
    }
    assert not {m: s for m, s in strays.items() if s}, strays


def test_stepwise_label_runs_without_dagster(tmp_path):
    """`stepwise label` on an empty warehouse (hashing embedder) loads no Dagster module."""
    script = textwrap.dedent(
        """
        import sys
        from pipelines.cli import main
        code = main(["label", "--embedder", "hashing"])
        loaded = sorted(m for m in sys.modules if m == "dagster" or m.startswith("dagster."))
        print("CODE", code, "DAGSTER", len(loaded))
        """
    )
    env = {"STEPWISE_HOME": str(tmp_path / "home"), "HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"}
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO_ROOT, capture_output=True, text=True, env=env, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "CODE 0 DAGSTER 0" in done.stdout, done.stdout[-2000:]


PROJECT_PACKAGES = ("pipelines", "assets", "annotation", "training", "envs", "warehouse")


def import_cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan): each is a cycle."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for imported in edges.get(module, ()):
            if imported not in index:
                visit(imported)
                low[module] = min(low[module], low[imported])
            elif imported in on_stack:
                low[module] = min(low[module], index[imported])
        if low[module] == index[module]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == module:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for module in sorted(edges):
        if module not in index:
            visit(module)
    return cycles


def test_the_cycle_finder_finds_cycles():
    assert import_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert import_cycles({"a": {"b"}, "b": set()}) == []


def test_no_module_imports_itself_through_others():
    """No import cycle anywhere, counting the imports inside functions and under TYPE_CHECKING
    (the ones a layer contract between packages cannot see)."""
    import grimp

    graph = grimp.build_graph(*PROJECT_PACKAGES, cache_dir=None)
    edges = {m: set(graph.find_modules_directly_imported_by(m)) & graph.modules for m in graph.modules}
    assert import_cycles(edges) == []


MAX_STAGE_FUNCTION_LINES = 100
STAGE_PACKAGES = ("annotation", "training", "envs", "warehouse", "pipelines")


def long_functions_without_a_reason(source: str, limit: int = MAX_STAGE_FUNCTION_LINES) -> list[str]:
    """Functions of ``source`` longer than ``limit`` lines with no ``# long: <why>`` comment in the
    comment block directly above them (or above their decorators)."""
    import ast

    lines = source.splitlines()
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        if node.end_lineno is None or node.end_lineno - node.lineno + 1 <= limit:
            continue
        above = min([d.lineno for d in node.decorator_list] + [node.lineno]) - 2
        reasons = []
        while above >= 0 and lines[above].lstrip().startswith("#"):
            reasons.append(lines[above].lstrip().startswith("# long:"))
            above -= 1
        if not any(reasons):
            found.append(f"{node.name} ({node.end_lineno - node.lineno + 1} lines)")
    return found


def test_the_length_rule_sees_long_functions_and_reasons():
    body = "\n".join(f"    x{i} = {i}" for i in range(120))
    assert long_functions_without_a_reason(f"def f():\n{body}\n") == ["f (121 lines)"]
    assert long_functions_without_a_reason(f"# long: a table of cases\ndef f():\n{body}\n") == []
    assert long_functions_without_a_reason(f"def f():\n{body}\n", limit=200) == []


def test_stage_functions_are_short_or_say_why():
    """A stage function over ~100 lines is split into named steps, or says next to it why not."""
    found = {
        str(path.relative_to(REPO_ROOT)): names
        for package in STAGE_PACKAGES
        for path in sorted((REPO_ROOT / package).rglob("*.py"))
        if (names := long_functions_without_a_reason(path.read_text()))
    }
    assert not found, found


MAX_MODULE_LINES = 800
#: Modules over MAX_MODULE_LINES today, waiting for their split (issue 40, items 2 and 4): named
#: here so that none grows unseen and no other module joins them. A module leaves this list when it
#: is split; one that must stay long says why in its first lines (``Why this module is long:``).
MODULES_AWAITING_SPLIT: set[str] = set()


def test_no_module_over_800_lines_unless_it_says_why():
    """Outside tests and benchmarks, a module over 800 lines says why in its first lines, or is one
    of the named modules awaiting a split (and only while it is over)."""
    long_modules = {
        str(path.relative_to(REPO_ROOT)): len(path.read_text().splitlines())
        for package in (*STAGE_PACKAGES, "assets")
        for path in sorted((REPO_ROOT / package).rglob("*.py"))
        if len(path.read_text().splitlines()) > MAX_MODULE_LINES
    }
    unexplained = {
        name: n
        for name, n in long_modules.items()
        if name not in MODULES_AWAITING_SPLIT
        and "Why this module is long:" not in (REPO_ROOT / name).read_text()[:3000]
    }
    assert not unexplained, unexplained
    assert not MODULES_AWAITING_SPLIT - set(long_modules), "split already: remove from MODULES_AWAITING_SPLIT"
    assert "pipelines/cli.py" not in long_modules and (REPO_ROOT / "pipelines/cli/__init__.py").exists()
