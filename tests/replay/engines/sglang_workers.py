"""A user's reference SGLang worker subclass: the form a worker variant takes on `--engine
sglang-scheduler` (`--impl tests.replay.engines.sglang_workers:NAME`, from the repository root).
It imports only specreplay's public API, as a user's module would.

    AcceptsOneDraftTooMany  a verify round accepts one draft past the first mismatch: the emitted
                            run and the accept length SGLang commits grow by one wrong token
    VerifyWithoutRows       a `verify` override with the wrong parameters: refused before the run
"""

from __future__ import annotations

from specreplay.replay.api import SglangReferenceWorker


class AcceptsOneDraftTooMany(SglangReferenceWorker):
    """Accepts one draft past the first mismatch of every verify round that had one."""

    def verify(self, rows):
        results = super().verify(rows)
        for r in results:
            if r.accepted < self.k:
                wrong = r.drafts[r.accepted]
                r.accepted += 1
                # The accepted drafts, the one that did not match, then the token after it.
                r.emitted = [*r.emitted[:-1], wrong, self.oracle.token_at(r.rid, r.first_position + r.accepted + 1)]
                r.next_draft = self.propose(r.rid, r.first_position + r.accepted + 2)
        return results


class VerifyWithoutRows(SglangReferenceWorker):
    """`verify` written without its `rows` parameter."""

    def verify(self):  # type: ignore[override]
        return []
