"""Gate reports for CI systems: JUnit XML, GitHub workflow annotations and step summary, JSON.

Where it sits: cli, the rendering end of `specreplay gate`; takes `GateResult`s, returns text.
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

from specreplay.cli.render import unchecked_note
from specreplay.replay.workflows.gate import GateResult

ANNOTATIONS_PER_KIND = 10
SUMMARY_LIMIT = 200_000  # bytes; GitHub accepts 1 MiB per step summary
_KIND = {"fail": "error", "error": "error", "changed": "warning", "n/a": "notice"}  # gate result -> annotation
RESULTS = ("pass", "fail", "changed", "error", "n/a")


def counts(results: list[GateResult]) -> Counter:
    return Counter(r.result for r in results)


def summary_line(results: list[GateResult]) -> str:
    """`11 traces, 8 pass, 0 fail, 0 changed, 0 error, 3 n/a (did not apply: nothing ran)`: n/a
    counted apart, and only when there is one."""
    c = counts(results)
    line = f"{len(results)} traces, {c['pass']} pass, {c['fail']} fail, {c['changed']} changed, {c['error']} error"
    return line + (f", {c['n/a']} n/a (did not apply: nothing ran)" if c["n/a"] else "")


def junit_xml(results: list[GateResult]) -> str:
    """One testcase per trace, and one per finding code inside it; an n/a trace is skipped, with
    the reason."""
    suite = ET.Element("testsuite", name="specreplay-gate")
    tests = failures = errors = 0
    for r in results:
        name = Path(r.path).name
        case = ET.SubElement(suite, "testcase", classname="specreplay.gate", name=name)
        tests += 1
        if r.result == "error":
            errors += 1
            ET.SubElement(case, "error", message=r.message, type="error").text = r.message
        elif r.result == "n/a":
            ET.SubElement(case, "skipped", message=f"n/a: {r.message}")
        elif r.result in ("fail", "changed"):
            failures += 1
            body = r.message + ("\n" + "\n".join(r.notes) if r.notes else "")
            ET.SubElement(case, "failure", message=r.message, type=r.result).text = body
        for code, items in _by_code(r).items():
            sub = ET.SubElement(suite, "testcase", classname=f"specreplay.gate.{name}", name=code)
            tests += 1
            first = items[0]
            kind = "failure" if first.severity == "error" else "skipped"
            if kind == "failure":
                failures += 1
            text = "\n".join(f"step {f.step} request {f.request_label}: {f.message}" for f in items[:20])
            if len(items) > 20:
                text += f"\n... and {len(items) - 20} more"
            ET.SubElement(sub, kind, message=f"{len(items)} x {code}: {first.message}").text = text
        for code in r.unchecked:  # could not run: skipped, never passed
            sub = ET.SubElement(suite, "testcase", classname=f"specreplay.gate.{name}", name=code)
            tests += 1
            ET.SubElement(sub, "skipped", message=f"{code} not checked: {_why_unchecked(code, r.unchecked)}")
    suite.set("tests", str(tests))
    suite.set("failures", str(failures))
    suite.set("errors", str(errors))
    suite.set("skipped", str(sum(1 for c in suite.iter("skipped"))))
    ET.indent(suite)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(suite, encoding="unicode") + "\n"


def _why_unchecked(code: str, unchecked: list[str]) -> str:
    from specreplay.replay.check.coverage import why

    return why(code, unchecked)


def _by_code(r: GateResult) -> dict:
    out: dict = {}
    for f in r.findings:
        out.setdefault(f.code, []).append(f)
    return out


def github_annotations(results: list[GateResult]) -> list[str]:
    """Workflow commands: an error or warning per failing or changed trace, a notice per n/a
    trace (the implementation does not apply: nothing ran), then a notice per trace with codes
    left unchecked (no ground truth); at most 10 per kind, the rest counted in one notice."""
    found = [(_KIND[r.result], r.path, f"specreplay gate: {r.result}", r.message) for r in results if r.result in _KIND]
    found += [
        ("notice", r.path, "specreplay gate: not checked", unchecked_note(r.unchecked)) for r in results if r.unchecked
    ]
    lines: list[str] = []
    emitted: Counter = Counter()
    dropped: Counter = Counter()
    for kind, path, title, text in found:
        if emitted[kind] >= ANNOTATIONS_PER_KIND:
            dropped[kind] += 1
            continue
        emitted[kind] += 1
        lines.append(f"::{kind} file={_escape_property(path)},title={_escape_property(title)}::{_escape(text)}")
    for kind, n in sorted(dropped.items()):
        lines.append(f"::notice title=specreplay gate::{n} more {kind} annotations not shown")
    return lines


def _escape(text: str) -> str:
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _escape_property(text: str) -> str:
    return _escape(text).replace(":", "%3A").replace(",", "%2C")


def markdown_summary(results: list[GateResult]) -> str:
    lines = [
        "## specreplay gate",
        "",
        summary_line(results).replace(" traces, ", " traces: ", 1),
        "",
        "| trace | result | first finding |",
        "| --- | --- | --- |",
    ]
    size = sum(len(line) + 1 for line in lines)
    for i, r in enumerate(results):
        first = r.first
        cell = "-" if first is None else f"step {first.step} req {first.request_label} `{first.code}`"
        if r.result in ("error", "n/a"):
            cell = r.message
        elif r.unchecked:
            cell = unchecked_note(r.unchecked) if first is None else f"{cell} ({unchecked_note(r.unchecked)})"
        line = f"| {Path(r.path).name} | {r.result} | {cell.replace('|', '/')} |"
        if size + len(line) > SUMMARY_LIMIT:
            lines.append(f"| ... {len(results) - i} more traces | | |")
            break
        lines.append(line)
        size += len(line) + 1
    return "\n".join(lines) + "\n"


def gate_json(results: list[GateResult]) -> str:
    c = counts(results)
    return json.dumps(
        {"counts": {k: c[k] for k in RESULTS}, "results": [r.to_dict() for r in results]},
        indent=2,
        default=str,
    )
