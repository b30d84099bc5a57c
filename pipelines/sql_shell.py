"""``stepwise sql`` without a query: an interactive SQL shell over the warehouse's views.

The DuckDB Python package ships no command-line shell, so users get one here: statements end with
``;`` (they may span lines), the history is kept in ``<STEPWISE_HOME>/.sql_history``, and a few
dot-commands discover the schema:

    .tables            the views, with their row counts
    .schema VIEW       a view's columns and types (also: \\d VIEW)
    .lineage EPISODE   where an episode came from, down to raw files
    .help / .quit
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable
from pathlib import Path

import duckdb
import pyarrow as pa

from warehouse.catalog import Warehouse

PROMPT, CONTINUATION = "stepwise> ", "     ...> "
HELP = __doc__.split("\n\n", 2)[-1] if __doc__ else ""


def error_hint(warehouse: Warehouse, exc: Exception) -> str:
    """A SQL error on one line, with the views that exist when a name was not found."""
    message = str(exc).splitlines()[0]
    if isinstance(exc, duckdb.CatalogException | duckdb.BinderException):
        return f"{message}\n  views: {', '.join(warehouse.views())} (.schema VIEW lists a view's columns)"
    return message


def run_command(warehouse: Warehouse, line: str, show: Callable[[pa.Table], None]) -> bool:
    """Run one dot-command; False when the shell should end."""
    parts = line.strip().split()
    command, args = parts[0], parts[1:]
    if command in (".quit", ".exit", "\\q"):
        return False
    if command in (".help", "\\?"):
        print(HELP)
    elif command in (".tables", "\\dt"):
        rows = []
        for view in warehouse.views():
            try:
                n = warehouse.query(f"SELECT count(*) AS n FROM {view}").to_pylist()[0]["n"]
            except duckdb.Error:
                n = None
            rows.append({"view": view, "rows": n})
        show(pa.Table.from_pylist(rows))
    elif command in (".schema", "\\d") and args:
        try:
            show(pa.Table.from_pylist([{"column": c, "type": t} for c, t in warehouse.columns(args[0])]))
        except KeyError as exc:
            print(exc.args[0], file=sys.stderr)
    elif command == ".lineage" and args:
        table = warehouse.lineage_of(args[0])
        if table.num_rows:
            show(table)
        else:
            print(f"no current version holds episode {args[0]!r}", file=sys.stderr)
    else:
        print(f"unknown command {line.strip()!r}; .help lists them", file=sys.stderr)
    return True


def statements(lines: Iterable[str], interactive: bool) -> Iterable[str]:
    """Dot-commands (one line) and SQL statements (up to a ``;``) from input lines."""
    buffer: list[str] = []
    for line in lines:
        if not buffer and line.strip().startswith((".", "\\")):
            yield line.strip()
            continue
        if not line.strip() and not buffer:
            continue
        buffer.append(line)
        if line.rstrip().endswith(";"):
            yield "\n".join(buffer).strip()
            buffer = []
    if buffer:
        yield "\n".join(buffer).strip()


def _interactive_lines(history: Path) -> Iterable[str]:
    import readline

    try:
        readline.read_history_file(history)
    except OSError:
        pass
    pending = False
    try:
        while True:
            try:
                line = input(CONTINUATION if pending else PROMPT)
            except EOFError:
                print()
                return
            pending = (
                bool(line.strip()) and not line.strip().startswith((".", "\\")) and not line.rstrip().endswith(";")
            )
            yield line
    finally:
        try:
            readline.write_history_file(history)
        except OSError:
            pass


def shell(warehouse: Warehouse, show: Callable[[pa.Table], None], lines: Iterable[str] | None = None) -> int:
    """Read statements from ``lines`` (default: the terminal, with history) until .quit or the end;
    returns 0, or 2 when input was piped and a statement failed."""
    interactive = lines is None
    source = _interactive_lines(warehouse.home / ".sql_history") if lines is None else lines
    if interactive:
        print(f"Stepwise SQL on {warehouse.db_path} ({len(warehouse.views())} views; .tables, .help, .quit)")
    failed = False
    for statement in statements(source, interactive):
        if statement.startswith((".", "\\")):
            if not run_command(warehouse, statement, show):
                break
            continue
        try:
            show(warehouse.query(statement.rstrip(";")))
        except duckdb.Error as exc:
            failed = True
            print(f"error: {error_hint(warehouse, exc)}", file=sys.stderr)
    return 2 if failed and not interactive else 0
