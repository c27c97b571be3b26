"""Pseudonymised token ids (traces/pseudonym.py): the permutation, the events, the run's key."""

from __future__ import annotations

import json
import multiprocessing
import os
import stat

import pytest

from specreplay.traces.errors import InputError
from specreplay.traces.parts import PartWriter, merge_rows, read_parts
from specreplay.traces.pseudonym import Pseudonym, for_recording, key_path, token_mode


def test_a_key_draws_one_permutation_of_the_vocabulary():
    a, again, other = Pseudonym(b"k" * 32, 1000), Pseudonym(b"k" * 32, 1000), Pseudonym(b"j" * 32, 1000)
    assert sorted(a.table) == list(range(1000))  # every id once: a bijection
    assert a.table == again.table and a.table != other.table
    assert sum(t == i for i, t in enumerate(a.table)) < 10  # not the identity, nor near it
    ids = list(range(1000))
    assert a.reveal(a.ids(ids)) == ids


def test_ids_outside_the_vocabulary_stay_as_they_are():
    p = Pseudonym(b"k" * 32, 50)
    assert p.ids([-1, 50, 10_000, -1]) == [-1, 50, 10_000, -1]  # placeholders a finding names
    assert p.ids(None) is None
    assert p.ids([3, 3, 7]) == [p.table[3], p.table[3], p.table[7]]  # equalities kept
    assert p.ids((3, 7)) == [p.table[3], p.table[7]]  # the scheduler observer's sampled ids are tuples


def test_every_event_that_holds_ids_is_permuted_and_nothing_else():
    p = Pseudonym(b"k" * 32, 100)
    request = {"e": "request", "id": "r", "prompt": [1, 2, 3], "stop_token_ids": [9, 4], "max_tokens": 7}
    out = p.event(request)
    assert out["prompt"] == p.ids([1, 2, 3]) and out["stop_token_ids"] == sorted(p.ids([9, 4]))
    assert out["max_tokens"] == 7 and request["prompt"] == [1, 2, 3]  # the observer's event untouched
    assert p.event({"e": "stream", "prompt": [5]})["prompt"] == p.ids([5])
    rows = {"e": "rows", "names": ["step", "apply_sampled_token_ids", "sched_num_tokens"], "rows": [[1, [4, 5], 12]]}
    assert p.event(rows)["rows"] == [[1, p.ids([4, 5]), 12]]
    patch = {"e": "patch", "rows": [[2, "r", {"worker_draft_ids": [6, -1], "worker_num_emitted": 2}]]}
    assert p.event(patch)["rows"] == [[2, "r", {"worker_draft_ids": [p.table[6], -1], "worker_num_emitted": 2}]]
    cols = {
        "e": "cols",
        "step": 3,
        "ids": ["r", "s"],
        "cols": {"worker_sampled_ids": [[1], None], "worker_slot": [0, 1]},
    }
    assert p.event(cols)["cols"] == {"worker_sampled_ids": [p.ids([1]), None], "worker_slot": [0, 1]}
    for untouched in ({"e": "abort", "id": "r", "step": 4}, {"e": "step", "step": 5}, {"e": "config", "config": {}}):
        assert p.event(untouched) == untouched


def test_a_part_written_through_it_merges_into_permuted_rows(tmp_path):
    p = Pseudonym(b"k" * 32, 100)
    writer = PartWriter(str(tmp_path), "core", {"e": "part", "run": "x", "role": "core"}, transform=p.event)
    writer.write({"e": "rows", "names": ["step", "request_id", "apply_sampled_token_ids"], "rows": [[1, "r", None]]})
    writer.write_columns(1, ["r"], {"apply_sampled_token_ids": [[8, 9]]})
    writer.close()
    (row,) = merge_rows(read_parts(str(tmp_path)))
    assert row["apply_sampled_token_ids"] == p.ids([8, 9]) != [8, 9]


def _key_of(folder: str, queue) -> None:
    queue.put(for_recording(folder, "run", 512).table[:20])


def test_the_processes_of_a_run_share_one_key_readable_by_its_owner_only(tmp_path):
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_key_of, args=(str(tmp_path), queue)) for _ in range(3)]
    umask = os.umask(0)  # the children inherit it: 0600 whatever the umask
    try:
        for proc in procs:
            proc.start()
    finally:
        os.umask(umask)
    tables = [queue.get(timeout=120) for _ in procs]
    for proc in procs:
        proc.join(60)
    mine = for_recording(str(tmp_path), "run", 512).table[:20]
    assert tables == [mine] * 3  # drawn by one, read by the others: one permutation
    path = key_path(str(tmp_path), "run")
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert os.listdir(tmp_path) == [os.path.basename(path)]  # nothing left aside
    assert len(bytes.fromhex(json.loads(open(path).read())["key"])) == 32
    assert for_recording(str(tmp_path), "other", 512).table != Pseudonym(b"", 512).table  # a key per run
    assert for_recording(str(tmp_path), "other", 512).table[:20] != mine


def test_a_key_for_another_vocabulary_or_unreadable_is_one_line(tmp_path):
    for_recording(str(tmp_path), "run", 512)
    with pytest.raises(InputError, match="vocabulary of 512 ids, this process's model has 1024"):
        for_recording(str(tmp_path), "run", 1024)
    open(key_path(str(tmp_path), "bad"), "w").write("{")
    with pytest.raises(InputError, match="not a readable token key"):
        for_recording(str(tmp_path), "bad", 512)


def test_the_mode_is_plain_pseudonym_or_refused(monkeypatch):
    monkeypatch.delenv("SPECREPLAY_TOKENS", raising=False)
    assert token_mode() == "plain"
    monkeypatch.setenv("SPECREPLAY_TOKENS", "pseudonym")
    assert token_mode() == "pseudonym"
    monkeypatch.setenv("SPECREPLAY_TOKENS", "hashed")
    with pytest.raises(InputError, match="SPECREPLAY_TOKENS='hashed': expected one of plain, pseudonym"):
        token_mode()
