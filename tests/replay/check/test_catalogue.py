"""The catalogue: one row per code, and everything the checker lists or ranks derived from it."""

from __future__ import annotations

import inspect
import re

from click.testing import CliRunner

from specreplay.replay.check import catalogue, checker
from specreplay.replay.check.catalogue import BY_CODE, CATALOGUE


def test_one_row_per_code_each_with_a_rule_a_statement_and_a_message():
    assert len(CATALOGUE) >= 23
    assert len(BY_CODE) == len(CATALOGUE)  # codes are unique
    for row in CATALOGUE:
        assert re.fullmatch(r"[A-Z]\d+-[a-z0-9-]+", row.code), row.code
        assert row.severity in ("error", "warning"), row.code
        assert row.statement.strip() and "\n" not in row.statement, row.code
        assert row.source.strip(), row.code
        assert callable(row.rule) and callable(row.message), row.code
        assert row.rule.__module__.startswith("specreplay.replay.check.rules_"), row.code
        assert row.scope in ("rows", "run"), row.code
        assert len(row.sides) == 2, row.code


def test_the_ranks_order_every_code():
    ranks = sorted(row.rank for row in CATALOGUE)
    assert ranks == list(range(len(CATALOGUE)))


def test_codes_severities_ranks_and_the_invariant_list_are_derived_from_the_rows():
    rows = {row.code: row for row in CATALOGUE}
    assert checker.all_codes() == sorted((r.code, r.severity, r.statement, r.source) for r in CATALOGUE)
    assert checker.SEVERITY == {code: row.severity for code, row in rows.items()}
    assert checker._RANK == {code: row.rank for code, row in rows.items()}
    heads = [row.code for row in checker.INVARIANTS]
    extras = [code for code, *_ in checker.EXTRA_CODES]
    assert sorted(heads + extras) == sorted(rows)  # every code is a rule's own or an extra, once
    assert len({id(row.rule) for row in checker.INVARIANTS}) == len(heads)  # one head per rule
    assert {id(row.rule) for row in CATALOGUE} == {id(row.rule) for row in checker.INVARIANTS}


def test_rules_that_report_several_codes_run_once():
    shared = [row.code for row in CATALOGUE if row.rule is BY_CODE["S3-scheduler-computed-tokens"].rule]
    assert shared == [
        "S3-scheduler-computed-tokens",
        "X2-sched-worker-computed",
        "X2-worker-kv-position",
        "X2-worker-position-mismatch",
    ]
    per_frame = catalogue.rules_of(CATALOGUE, "rows")
    at_end = catalogue.rules_of(CATALOGUE, "run")
    assert len(per_frame) == len(set(per_frame)) and len(at_end) == len(set(at_end))
    assert len(per_frame) + len(at_end) == len(checker.INVARIANTS)


def test_each_rule_family_says_what_it_checks():
    modules = {inspect.getmodule(row.rule) for row in CATALOGUE}
    assert len(modules) >= 5
    for module in modules:
        assert module.__doc__ and len(module.__doc__.strip()) > 40, module.__name__
        for row in CATALOGUE:
            if inspect.getmodule(row.rule) is module:
                assert row.code.split("-")[0] in module.__doc__ or row.code in module.__doc__, (
                    module.__name__,
                    row.code,
                )


def test_specreplay_codes_lists_every_row():
    from specreplay.cli.main import main

    result = CliRunner().invoke(main, ["codes"])
    assert result.exit_code == 0, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == len(CATALOGUE)
    for line, (code, severity, statement, source) in zip(lines, checker.all_codes()):
        assert line == f"{code:30} {severity:8} {statement} [{source}]"
