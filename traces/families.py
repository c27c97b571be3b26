"""What a trace's engine family tells its readers: the engine line, and how its worker view reads.

Where it sits: the base layer (traces/), read by check/ and views/, which read traces and nothing
else, and by the registry (replay/engines/registry.py), whose runner families and engines carry
these names. A trace names its runner family in `impl.runner_family` ("v1", "v2", "sglang"; a
trace before schema v5 names none: V1's, `family_of` says so once for everyone) and its engine
in `impl.engine`. Generic code asks a family's traits here instead of comparing its name:
tests/test_seams.py holds that no name of a family or an engine line is compared outside the
families and the registries.

A family's traits:
  line        the engine line whose scheduler it serves (`EngineLine`): vLLM's or SGLang's
  view        how `show` and `export` draw its worker view (views/family_views.py): V1's
              persistent batch, MRV2's slots, SGLang's rows
  catalogue   the runner tag its own codes carry in the checker's catalogue (check/catalogue.py)
  baseline    its trace is also held to the baseline family's codes that need no worker state
              of its own (the vLLM line: V1's)
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any


class EngineLine(StrEnum):
    """Whose scheduler an engine runs (and whose outcomes a recording holds)."""

    VLLM = "vllm"
    SGLANG = "sglang"


class WorkerView(StrEnum):
    """How a family's worker view is drawn (views/family_views.py has one drawing per value)."""

    PERSISTENT_BATCH = "persistent-batch"  # a row in a persistent batch, dropped when unscheduled
    SLOTS = "slots"  # a slot kept while unscheduled, drafts verified from the slot
    SGLANG_ROWS = "sglang-rows"  # SGLang's batch rows, its committed and allocated lengths


@dataclass(frozen=True)
class FamilyTraits:
    name: str
    line: EngineLine
    view: WorkerView
    summary: str
    shown_as: str = ""  # what the family adds to a view's title ("" for the default family)


#: Every runner family a trace may name, in the order the registry lists them.
FAMILIES: dict[str, FamilyTraits] = {
    traits.name: traits
    for traits in (
        FamilyTraits("v1", EngineLine.VLLM, WorkerView.PERSISTENT_BATCH, "vLLM's V1 GPUModelRunner"),
        FamilyTraits("v2", EngineLine.VLLM, WorkerView.SLOTS, "vLLM's Model Runner V2", " on Model Runner V2"),
        FamilyTraits(
            "sglang", EngineLine.SGLANG, WorkerView.SGLANG_ROWS, "SGLang's worker (reference)", " on SGLang's scheduler"
        ),
    )
}
#: The family of a trace that names none (recorded before schema v5 named families): V1's.
DEFAULT_FAMILY = "v1"
#: The family whose codes a trace without a worker view (`unobserved`) is checked as: what needs no
#: worker view is the same on every runner of the line.
BASELINE_FAMILY = "v1"


def family_name(impl: Any) -> str:
    """The runner family a trace's implementation metadata names (`ImplHeader`), or the default."""
    return getattr(impl, "runner_family", None) or DEFAULT_FAMILY


def traits(name: str | None) -> FamilyTraits:
    """A family's traits; an unknown name (a fork's runner: header.UNOBSERVED_RUNNER) as the baseline's line."""
    return FAMILIES.get(name or DEFAULT_FAMILY) or FAMILIES[BASELINE_FAMILY]


def family_of(impl: Any) -> FamilyTraits:
    """The traits of the family a trace's implementation metadata names."""
    return traits(family_name(impl))


def line_families(line: EngineLine) -> tuple[str, ...]:
    """The families of one engine line."""
    return tuple(name for name, t in FAMILIES.items() if t.line is line)
