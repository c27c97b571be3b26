"""Forced logits: a live vLLM engine samples the oracle's tokens, as a function of what it fed.

Where it sits: workloads -> models -> impls -> observers -> **engines** -> traces -> check ->
workflows -> views -> cli, inside the processes of a live run (`--engine vllm`): the plugin
(families/vllm/plugin.py) calls `force_runner` on the runner vLLM built, V1's or Model Runner V2's, on a
GPU or a CPU, before its first step. Nothing of vLLM's source is edited; two methods of the model
*instances* the runner holds are replaced:

- the target model's `forward` runs as it is (attention, KV writes, the hidden states), then
  writes into the first channels of each token's hidden state (`encode`) the oracle's next token
  for what that token was: its request r, its position p and its input id t, as the model read them (the forward's
  `input_ids` and `positions`; the request from the forward context's `query_start_loc` and the
  runner's batch) -> `tokens.next_token(h(r), p, t, V)`;
- its `compute_logits` returns, for each row it is given (the runner's own gather of the hidden
  states at its logits indices), one-hot logits of the token written there (MARGIN above every
  other id), on the model's device and dtype: greedy sampling and the rejection sampler's
  argmax both pick it.

What else reads the hidden states sees those channels changed: an EAGLE head (whose random
weights draft nothing right either way).

A runner that feeds a wrong input id or position therefore samples a different token, as it
would with the real model; and the oracle's rule is the synthetic and recorded oracles' own
(workloads/oracle.py), so the trace's tokens have ground truth (T1). With `--drafter draft_model`
the draft model's two methods are replaced the same way with the workload's drafter rule
(`Oracle.drafts`): for position q + 1 the true token, plus one where the workload's acceptance rule
says reject; so the real engine's drafts and accepted counts are the workload's.

The rule's inputs (the workload: seed, vocabulary, each request's acceptance) reach the engine's
processes in a JSON file named by SPECREPLAY_LIVE_FORCED (live.live_environment). Only specreplay's own live runs
set it: a user's engine recorded with `record --attach` (families/vllm/attached.py) is never forced.
"""

from __future__ import annotations

import functools
import json
import os
from dataclasses import dataclass, field
from typing import Any

from specreplay.replay.workloads import tokens

FORCED_ENV = "SPECREPLAY_LIVE_FORCED"
#: "1": specreplay's live runs in this process are not forced (the dummy model's own tokens and
#: the unforced default drafters, as before forced logits; tests recorded against those).
UNFORCED_ENV = "SPECREPLAY_LIVE_UNFORCED"
#: The drafter rule of an id the workload does not know: every proposal wrong.
REJECT_ALL = tokens.DraftRule("none", 0.0)
#: How far the forced token's logit stands above every other id's.
MARGIN = 100.0
TARGET_PATCH = (
    "target model forward tags each token with the oracle's next token for (request, position, input id); "
    "its compute_logits returns one-hot logits of it (forced logits)"
)
DRAFT_PATCH = (
    "draft model forward/compute_logits likewise give the workload's drafter rule: the true token, "
    "+1 where its acceptance rule rejects (forced drafts)"
)


@dataclass
class ForcedRule:
    """The oracle's rules on tensors: the target's next token and the drafter's proposal."""

    seed: int
    vocab: int
    #: Each request's drafter rule by position (tokens.DraftRule: its rule, its listed rounds).
    acceptance: dict[str, tokens.DraftRule] = field(default_factory=dict)
    _hashes: dict[str, int] = field(default_factory=dict, repr=False)

    @classmethod
    def of_workload(cls, workload: Any) -> ForcedRule:
        acceptance = {spec.request_id: workload.draft_rule(spec) for spec in workload.requests}
        return cls(workload.seed, workload.config.vocab_size, acceptance)

    def request_hash(self, rid: str | None) -> int:
        """h(r) mod V (all the rule needs of it); an id the workload does not know (a dummy run's
        padding: None) hashes as itself."""
        if rid is None:
            return 0
        h = self._hashes.get(rid)
        if h is None:
            from specreplay.replay.families.vllm.plugin import external_id

            h = self._hashes[rid] = tokens.request_hash(self.seed, external_id(rid)) % self.vocab
        return h

    def rejects(self, rid: str | None, position: int) -> bool:
        """Does the workload's drafter propose a wrong token for `position` of `rid`?"""
        if rid is None:
            return True
        from specreplay.replay.families.vllm.plugin import external_id

        rule = self.acceptance.get(external_id(rid), REJECT_ALL)
        return not rule.correct(self.seed, external_id(rid), position)

    def next_tokens(self, request_ids: list[str | None], positions: Any, input_ids: Any) -> Any:
        """The target's token after each input: next_token(h(r), p, t) for the i-th token's
        request, position and input id (tensors of one length, on any device)."""
        import torch

        h = torch.tensor([self.request_hash(r) for r in request_ids], dtype=torch.int64, device=positions.device)
        p, t = positions.to(torch.int64), input_ids.to(torch.int64)
        return (tokens.MUL_TOKEN * t + tokens.MUL_POS * p + h) % self.vocab

    def draft_tokens(self, request_ids: list[str | None], positions: Any, input_ids: Any, own_inputs: bool) -> Any:
        """The drafter's proposal for each token's next position q + 1: the true token there,
        +1 where the acceptance rule rejects (q + 1). `own_inputs`: the inputs are this drafter's
        earlier proposals (its steps after the first), so a proposal it made wrong on purpose is
        taken back to the true token before the rule reads it, as `Oracle.drafts` keeps every
        draft a function of (request, position) whatever came before."""
        import torch

        pos = positions.to(torch.int64).tolist()
        t = input_ids.to(torch.int64)
        if own_inputs:
            undo = [1 if self.rejects(r, q) else 0 for r, q in zip(request_ids, pos)]
            t = (t - torch.tensor(undo, dtype=torch.int64, device=t.device)) % self.vocab
        true = self.next_tokens(request_ids, positions, t)
        plus = [1 if self.rejects(r, q + 1) else 0 for r, q in zip(request_ids, pos)]
        return (true + torch.tensor(plus, dtype=torch.int64, device=true.device)) % self.vocab


def forced_workload() -> Any:
    """The workload of this forced live run (its file, named by SPECREPLAY_LIVE_FORCED), or None:
    not forced (an attached user's engine, a `--model` run, `--no-forced`)."""
    path = os.environ.get(FORCED_ENV)
    return _load_workload(path) if path else None


@functools.lru_cache(maxsize=4)
def _load_workload(path: str) -> Any:
    from specreplay.replay.workloads.workload import Workload

    with open(path) as fh:
        return Workload.from_dict(json.load(fh), "forced-logits workload")


def write_workload(workload: Any, folder: str) -> str:
    """The workload's file for the engine's processes (a live run's rule and oracle)."""
    path = os.path.join(folder, "forced-workload.json")
    with open(path, "w") as fh:
        json.dump(workload.to_dict(), fh)
    return path


# ====================================================================== the layout
def token_requests(query_start_loc: Any, req_ids: list[str], num_tokens: int) -> list[str | None]:
    """Each of `num_tokens` tokens' request: batch row x holds tokens [qsl[x], qsl[x + 1]) and is
    request req_ids[x]; tokens past the last row (padding) belong to none."""
    starts = [int(v) for v in query_start_loc]
    out: list[str | None] = [None] * num_tokens
    for x, rid in enumerate(req_ids):
        if x + 1 >= len(starts):
            break
        for i in range(starts[x], min(starts[x + 1], num_tokens)):
            out[i] = rid
    return out


def forward_query_start_loc() -> Any:
    """The running forward's query_start_loc (its attention metadata: any layer's, as one
    forward's layers share the batch layout), on the host; None outside a forward with one."""
    from vllm.forward_context import get_forward_context, is_forward_context_available

    if not is_forward_context_available():
        return None
    meta = get_forward_context().attn_metadata
    if isinstance(meta, list):  # micro-batches: not run by specreplay's live engine
        meta = meta[0] if meta else None
    values = meta.values() if isinstance(meta, dict) else [meta]
    for m in values:
        qsl = getattr(m, "query_start_loc_cpu", None)
        if qsl is None:
            qsl = getattr(m, "query_start_loc", None)
        if qsl is not None:
            return qsl.cpu()
    return None


# ====================================================================== the patches
#: The forced token is written into the first DIGITS channels of a hidden state, DIGIT_BASE-ary
#: digits, least significant first: each is an integer below 64, exact in any float dtype a model
#: runs in (bfloat16 keeps integers to 256), for vocabularies up to 64 ** 3 ids.
DIGIT_BASE, DIGITS = 64, 3


def encode(hidden: Any, forced: Any) -> None:
    """Write token ids `forced` into hidden[:, :DIGITS] (in place)."""
    value = forced.to(hidden.device)
    for d in range(DIGITS):
        hidden[: value.shape[0], d] = (value % DIGIT_BASE).to(hidden.dtype)
        value = value // DIGIT_BASE


def decode(hidden: Any) -> Any:
    """The token ids `encode` wrote into the rows of `hidden`."""
    import torch

    out = torch.zeros(hidden.shape[0], dtype=torch.int64, device=hidden.device)
    for d in reversed(range(DIGITS)):
        out = out * DIGIT_BASE + hidden[:, d].float().round().to(torch.int64)
    return out


def force_model(model: Any, tagger: Any, corrupt: Any = None) -> None:
    """Replace `model`'s forward and compute_logits (on the instance): after the real forward,
    `tagger(input_ids, positions)` gives each token's forced next token (or None: leave the
    hidden states alone), written into its hidden state (`encode`); compute_logits turns the rows
    it gets back into one-hot logits. `corrupt(input_ids, positions)` (tests only): changes the
    input ids in place before the model reads them, as a runner feeding a wrong input would."""
    import torch

    forward, compute_logits = model.forward, model.compute_logits

    @functools.wraps(forward)
    def forced_forward(*a: Any, **kw: Any) -> Any:
        input_ids = kw.get("input_ids", a[0] if a else None)
        positions = kw.get("positions", a[1] if len(a) > 1 else None)
        if corrupt is not None and input_ids is not None and positions is not None:
            corrupt(input_ids, positions)
        out = forward(*a, **kw)
        hidden = out[0] if isinstance(out, tuple) else out
        if input_ids is None or positions is None or not isinstance(hidden, torch.Tensor):
            return out
        n = min(hidden.shape[0], input_ids.shape[0])
        forced = tagger(input_ids[:n], positions[:n])
        if forced is not None:
            encode(hidden, forced)
        return out

    @functools.wraps(compute_logits)
    def forced_compute_logits(hidden_states: Any, *a: Any, **kw: Any) -> Any:
        logits = compute_logits(hidden_states, *a, **kw)
        if logits is None:
            return logits
        wanted = decode(hidden_states).clamp(0, logits.shape[-1] - 1)
        logits.zero_()
        logits.scatter_(1, wanted.unsqueeze(1), MARGIN)
        return logits

    model.forward, model.compute_logits = forced_forward, forced_compute_logits


def force_runner(runner: Any, family: str, rule: ForcedRule) -> list[str]:
    """Force the target model of `runner` (family v1 or v2), and its draft model when the
    drafter is one (`draft_model`). Returns the patches applied (for the trace)."""
    batch = _batch_of(runner, family)
    drafts = {"forwards": 0}  # draft-model forwards since the target's last: its first reads true inputs

    def target(input_ids: Any, positions: Any) -> Any:
        drafts["forwards"] = 0
        qsl, req_ids = forward_query_start_loc(), batch()
        if qsl is None or req_ids is None:
            return None
        return rule.next_tokens(token_requests(qsl, req_ids, input_ids.shape[0]), positions, input_ids)

    def drafter(input_ids: Any, positions: Any) -> Any:
        own = drafts["forwards"] > 0
        drafts["forwards"] += 1
        qsl, req_ids = forward_query_start_loc(), batch()
        if qsl is None or req_ids is None:
            return None
        return rule.draft_tokens(token_requests(qsl, req_ids, input_ids.shape[0]), positions, input_ids, own)

    force_model(runner.model, target, _corrupter(rule, batch))
    patches = [TARGET_PATCH]
    draft_model = _draft_model(runner, family)
    if draft_model is not None:
        force_model(draft_model, drafter)
        patches.append(DRAFT_PATCH)
    return patches


#: Tests only: "request:position" (comma-separated): the target model reads input id + 1 there,
#: as a runner that feeds a wrong input would (the forced token must then be another).
CORRUPT_ENV = "SPECREPLAY_LIVE_FORCED_CORRUPT"


def _corrupter(rule: ForcedRule, batch: Any) -> Any:
    wanted = {
        (rid, int(pos))
        for rid, _, pos in (item.rpartition(":") for item in os.environ.get(CORRUPT_ENV, "").split(",") if item)
    }
    if not wanted:
        return None
    from specreplay.replay.families.vllm.plugin import external_id

    def corrupt(input_ids: Any, positions: Any) -> None:
        qsl, req_ids = forward_query_start_loc(), batch()
        if qsl is None or req_ids is None:
            return
        rids = token_requests(qsl, req_ids, input_ids.shape[0])
        for i, (rid, pos) in enumerate(zip(rids, positions.tolist())):
            if rid is not None and (external_id(rid), pos) in wanted:
                input_ids[i] = (input_ids[i] + 1) % rule.vocab

    return corrupt


def _batch_of(runner: Any, family: str) -> Any:
    """A function giving the request ids of the batch rows the runner is running now. V1: its
    persistent batch's rows (`input_batch.req_ids`, in row order). MRV2: the step's `InputBatch`,
    which `prepare_inputs` returns (kept here as it is returned)."""
    if family == "v1":
        return lambda: list(runner.input_batch.req_ids)
    held: dict[str, Any] = {"batch": None}
    prepare = runner.prepare_inputs

    @functools.wraps(prepare)
    def prepare_inputs(*a: Any, **kw: Any) -> Any:
        held["batch"] = prepare(*a, **kw)
        return held["batch"]

    runner.prepare_inputs = prepare_inputs
    return lambda: None if held["batch"] is None else list(held["batch"].req_ids)


def _draft_model(runner: Any, family: str) -> Any:
    """The draft model of a `draft_model` drafter (V1's DraftModelProposer, MRV2's standalone
    speculator), else None (n-gram drafters have no model; EAGLE's head is not forced)."""
    owner = getattr(runner, "drafter" if family == "v1" else "speculator", None)
    if owner is None or "DraftModel" not in type(owner).__name__ and "StandaloneAR" not in type(owner).__name__:
        return None
    return getattr(owner, "model", None)
