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


def ci_stages() -> list[tuple[str, str]]:
    """.ci/run's stages, (name, command), in order: its `stage NAME "COMMAND"` lines."""
    text = (ROOT / ".ci" / "run").read_text()
    return re.findall(r'^stage (\S+) "(.*)"$', text, re.M)


def readme_test_command() -> str:
    readme = (ROOT / "README.md").read_text()
    block = re.search(r"Install what the tests need.*?```bash\n(.*?)\n```", readme, re.S)
    assert block, "the README's test command block is gone"
    (command,) = block.group(1).strip().splitlines()
    return command


def test_ci_runs_the_readme_test_command():
    """The README's one copy-paste command is .ci/run's stages joined, in order, nothing more."""
    stages = ci_stages()
    assert [name for name, _ in stages] == [
        "installs",
        "lint",
        "types",
        "tests",
        "gate",
        "engines",
    ]
    assert " && ".join(command for _, command in stages) == readme_test_command()
    # Nothing else in .ci/run runs a command: every line outside the stage lines is the timing
    # scaffolding (comments, the shell's options, the stage function, the summary).
    text = (ROOT / ".ci" / "run").read_text()
    assert text.count("\nstage ") == len(stages) and 'eval "$2"' in text


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
