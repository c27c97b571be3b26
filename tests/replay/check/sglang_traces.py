"""The SGLang traces committed under tests/replay/check/data/sglang/, and how each was recorded.

The main environment cannot record an SGLang trace (sglang lives in `.venv-sglang`), so the
checker's tests there read these: upstream SGLang 0.5.23 in each mode, and the variants that
break each G code (tests/replay/check/sglang_variants.py, the built-ins). In SGLang's
environment `test_sglang_codes.py` records each again and holds the file to it, row for row, so
a file never drifts from what the engine records; to write them afresh (after a schema or an
observer change), from the repository root:

    .venv-sglang/bin/python -m tests.replay.check.sglang_traces [NAME ...]
"""

from __future__ import annotations

from pathlib import Path

DATA = Path(__file__).parent / "data" / "sglang"
#: A finish by length and a stop token, a request drafting at random, a chunked 20-token prompt,
#: an abort mid-run: the checker's upstream workload, in either mode (k and the mode appended).
MIXED = "a:p4,t9 b:p3,t5,random:0.5 c:p3,t8,stop3@2 d:p20,t4@3 e:p3,t12@2 | budget 16 seqs 8 {} | abort(e)@5"
#: Six requests of 4 + 20 tokens in 64 KV slots (80 with EAGLE): SGLang retracts and re-prefills.
RETRACT = "0-5:p4,t20 | blocks {} block 16 {}"
VARIANTS = "tests.replay.check.sglang_variants:"

#: name -> (workload notation, implementation, the G codes its trace has)
TRACES: dict[str, tuple[str, str, frozenset[str]]] = {
    "upstream-overlap-spec": (MIXED.format("k3 async"), "upstream", frozenset()),
    "upstream-sync-spec": (MIXED.format("k3 sync"), "upstream", frozenset()),
    # #24590's shape: c's stop and e's abort under overlap release one position more (G5, a warning)
    "upstream-overlap-nospec": (MIXED.format("k0 async"), "upstream", frozenset({"G5-overcommit-at-finish"})),
    "upstream-retract-spec": (RETRACT.format(5, "k3 async"), "upstream", frozenset()),
    "upstream-retract-nospec": (RETRACT.format(4, "k0 async"), "upstream", frozenset()),
    "finish-trim": (MIXED.format("k0 async"), "sglang-finish-trim", frozenset()),
    "stale-commit": (
        RETRACT.format(5, "k3 async"),
        "sglang-stale-commit",
        frozenset({"G1-committed-past-allocated", "G2-committed-past-written", "G3-stale-result-applied"}),
    ),
    "drops-last-output": (
        RETRACT.format(4, "k0 async"),
        VARIANTS + "RetractionDropsLastOutput",
        # The dropped token had been streamed; the new generation's is streamed again: G9, G8.
        frozenset({"G4-retracted-next-life", "G8-delivered-past-max-tokens", "G9-client-tokens"}),
    ),
    "marks-output-sent": (
        RETRACT.format(4, "k0 async"),
        VARIANTS + "RetractionMarksOutputSent",
        frozenset({"G9-client-tokens"}),
    ),
    "seq-lens-not-resolved": (
        MIXED.format("k3 async"),
        VARIANTS + "SeqLensNotResolved",
        # The rounds run at stale positions: the client's tokens are not the ones sampled at theirs (G9).
        frozenset({"G6-future-map-order", "G9-client-tokens"}),
    ),
    "bonus-claimed": (
        MIXED.format("k3 sync"),
        VARIANTS + "BonusClaimedAtApply",
        frozenset({"G2-committed-past-written"}),
    ),
    # An abort taken in the verify round that crossed max_tokens: the client gets the whole round
    # (13 tokens for 12), upstream SGLang 0.5.23 (update_finish_state's to_finish branch).
    "abort-past-max": (
        "b:p3,t12,all | k3 sync | abort(b)@4",
        "upstream",
        frozenset({"G8-delivered-past-max-tokens"}),
    ),
    # A streaming session of three turns beside a plain request (the session's KV kept between turns).
    "upstream-session": (
        "s:p6,t6,stream q:p5,t8 | k0 async blocks 16 block 16 apc | append(s)@3:p4 append(s)@20:p3,t4",
        "upstream",
        frozenset(),
    ),
    # Upstream SGLang 0.5.23: the turn ended on a correction token and the session hands on its
    # finished length, one position past the KV its forwards wrote (G10; K1 from the KV truth).
    "session-overclaim": (
        "s:p4,t8,stream,none | k1 async apc | append(s)@20:p4",
        "upstream",
        frozenset({"G10-turn-past-computed"}),
    ),
    "commit-past-allocated": (
        "a:p4,t6 b:p3,t6 | k0 sync",
        VARIANTS + "CommitPastAllocated",
        frozenset({"G1-committed-past-allocated", "G7-sglang-own-check"}),
    ),
}


#: The upstream traces that show a real SGLang 0.5.23 bug (an error, not only the G5 warning).
UPSTREAM_ERRORS = frozenset({"abort-past-max", "session-overclaim"})


def path(name: str) -> Path:
    return DATA / f"{name}.parquet"


def notation(name: str) -> str:
    """The workload of trace `name`, named after it."""
    return TRACES[name][0].replace("| ", f"| name {name} ", 1)


def record(name: str):
    """The trace `name` as the engine records it now (SGLang's environment only)."""
    from specreplay.replay.engines.run import run_workload
    from specreplay.replay.impls.registry import resolve
    from specreplay.replay.workloads.notation import workload_from_notation

    return run_workload(
        workload_from_notation(notation(name)), resolve(TRACES[name][1], allow_import=True), engine="sglang-scheduler"
    )


def main(names: list[str]) -> None:
    """Record the traces `names` (all of them when none is named) and write them."""
    from specreplay.traces.io import write_trace

    DATA.mkdir(parents=True, exist_ok=True)
    for name in names or TRACES:
        trace = record(name)
        write_trace(trace, path(name))
        print(f"wrote {path(name)}: {trace.table.num_rows} rows, outcome {trace.outcome.status}")


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
