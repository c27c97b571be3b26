"""The README stays true: its test command is what CI runs, its schema page is the schema, and
its "write your own" example runs."""

from __future__ import annotations

import re
import sys
from pathlib import Path

from click.testing import CliRunner

from specreplay.cli.main import main
from specreplay.traces import schema

ROOT = Path(__file__).resolve().parent.parent


def test_ci_runs_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text().strip().splitlines()[-1]
    assert ci in readme


def test_schema_page_is_generated_from_the_schema():
    page = (ROOT / "docs" / "trace-format.md").read_text()
    assert schema.markdown_table() in page and f"v{schema.SCHEMA_VERSION}" in page


def test_readme_example_implementation_runs(tmp_path, monkeypatch):
    readme = (ROOT / "README.md").read_text()
    code = re.search(r"```python\n(# myfix.py.*?)```", readme, re.S).group(1)
    (tmp_path / "myfix.py").write_text(code)
    monkeypatch.syspath_prepend(str(tmp_path))
    out = tmp_path / "mine.parquet"
    result = CliRunner().invoke(
        main, ["record", "--scenario", "reentry", "--impl", "myfix:ClearOnSkip", "-o", str(out)]
    )
    assert result.exit_code == 0, result.output
    assert "check: ok" in result.output
    # A name read from a trace never imports code: replaying it by its own name is refused.
    replay = CliRunner().invoke(main, ["replay", str(out), "-o", str(tmp_path / "again.parquet")])
    assert replay.exit_code == 2 and "not in the registry" in replay.output
    sys.modules.pop("myfix", None)
