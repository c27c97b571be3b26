"""Engine configuration: the knobs of vLLM's scheduler and engine that the reference models honour.

Where it sits: part of a workload (replay), stamped into every trace's metadata (traces).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

from specreplay.traces.errors import InputError

#: The vLLM releases the reference models follow, oldest first. Where they differ is written
#: once, in replay/models/releases.py; a workload names the one it runs under.
MODELLED_VERSIONS = ("0.32.0", "0.33.0", "0.34.0")
#: Traces and workloads from before versions were modelled were all 0.32.0's.
EARLIEST_VERSION = MODELLED_VERSIONS[0]
#: What a trace written before prefix caching was modelled (trace schema < 8) ran with: the
#: reference models had none, and the live engine turned it off. A workload file that leaves
#: `enable_prefix_caching` out gets vLLM's default (on).
BEFORE_PREFIX_CACHING = {"enable_prefix_caching": False}


@dataclass(frozen=True)
class EngineConfig:
    max_num_batched_tokens: int = 40  # token budget of one schedule() call
    max_num_seqs: int = 16  # most running requests
    num_spec_tokens: int = 3  # k: draft slots per decoding request
    async_scheduling: bool = True  # AsyncScheduler, two batches in flight; else Scheduler, one
    block_size: int = 16  # tokens per KV block
    num_blocks: int = 1000  # KV blocks in the cache
    max_model_len: int = 512
    long_prefill_token_threshold: int = 0  # 0: off
    vocab_size: int = 512
    num_lookahead_tokens: int = 0  # KV slots past each scheduled range: 0 ngram, k EAGLE/draft model, k+1 DFlash
    vllm_version: str = EARLIEST_VERSION  # the vLLM release the engine behaves as (MODELLED_VERSIONS)
    # vLLM's automatic prefix caching (CacheConfig.enable_prefix_caching), on by default as in
    # vLLM: full blocks of known tokens are cached by hash and a new or resumed request starts
    # from the longest cached prefix of its tokens (replay/models/kv.py).
    enable_prefix_caching: bool = True
    # vLLM's use_eagle_block_drop (an EAGLE-style drafter: eagle, eagle3, mtp, dflash): a
    # prefix-cache hit gives back its last block, recomputed for the drafter's hidden states.
    eagle_block_drop: bool = False
    # SGLang's adaptive speculative decoding (--speculative-adaptive): the EAGLE worker changes its
    # draft steps per batch size as it runs, by SGLang's own policy, starting from
    # num_spec_tokens. SGLang's scheduler only (vLLM has no counterpart here); written into a
    # workload or a trace only when on, so every other one reads and writes as before.
    adaptive_speculation: bool = False
    # The KV connector (vLLM's kv_transfer_config.kv_connector) a recorded engine ran with: a third
    # party that supplies some of a new request's tokens as computed KV. Recorded by an attached
    # recording; no engine here models one yet, so every engine refuses a config that names one
    # (engines/registry.py). Written only when set, so every other workload and trace reads as before.
    kv_connector: str = ""

    @property
    def depth(self) -> int:
        """Batches in flight: the engine's batch_queue_size."""
        return 2 if self.async_scheduling else 1

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        if not self.adaptive_speculation:
            del data["adaptive_speculation"]  # SGLang's alone: absent where off (the class comment)
        if not self.kv_connector:
            del data["kv_connector"]  # recorded only where an engine ran with one
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str = "config") -> EngineConfig:
        known = {f.name: f for f in fields(cls)}
        unknown = sorted(set(data) - set(known))
        if unknown:
            raise InputError(f"{where}: unknown engine setting {unknown[0]!r}; known: {', '.join(known)}")
        values: dict[str, Any] = {}
        for name, value in data.items():
            want = {"bool": bool, "str": str}.get(str(known[name].type), int)
            if want is str and not isinstance(value, str):
                raise InputError(f"{where}: {name} must be a string, got {value!r}")
            if want is bool and not isinstance(value, bool):
                raise InputError(f"{where}: {name} must be true or false, got {value!r}")
            if want is int and (isinstance(value, bool) or not isinstance(value, int)):
                raise InputError(f"{where}: {name} must be an integer, got {value!r}")
            values[name] = value
        config = cls(**values)
        config.validate(where)
        return config

    def validate(self, where: str = "config") -> None:
        if self.vllm_version not in MODELLED_VERSIONS:
            raise InputError(
                f"{where}: vllm_version {self.vllm_version!r} is not modelled; modelled: {', '.join(MODELLED_VERSIONS)}"
            )
        positive = ("max_num_batched_tokens", "max_num_seqs", "block_size", "num_blocks", "max_model_len", "vocab_size")
        for name in positive:
            if getattr(self, name) < 1:
                raise InputError(f"{where}: {name} must be >= 1, got {getattr(self, name)}")
        for name in ("num_spec_tokens", "long_prefill_token_threshold", "num_lookahead_tokens"):
            if getattr(self, name) < 0:
                raise InputError(f"{where}: {name} must be >= 0, got {getattr(self, name)}")
        if self.max_num_batched_tokens < self.max_num_seqs:
            raise InputError(
                f"{where}: max_num_batched_tokens ({self.max_num_batched_tokens}) must be >= "
                f"max_num_seqs ({self.max_num_seqs}), as vLLM requires"
            )
        if self.long_prefill_token_threshold > self.max_model_len:
            raise InputError(
                f"{where}: long_prefill_token_threshold ({self.long_prefill_token_threshold}) must be <= "
                f"max_model_len ({self.max_model_len}), as vLLM requires"
            )
        if self.num_lookahead_tokens and not self.num_spec_tokens:
            raise InputError(f"{where}: num_lookahead_tokens needs a drafter (num_spec_tokens > 0), as in vLLM")
        if self.num_lookahead_tokens > self.num_spec_tokens + 1:
            raise InputError(
                f"{where}: num_lookahead_tokens {self.num_lookahead_tokens} is above num_spec_tokens + 1 "
                f"({self.num_spec_tokens + 1}), the most any vLLM drafter reserves"
            )
        if self.eagle_block_drop and not self.num_spec_tokens:
            raise InputError(f"{where}: eagle_block_drop needs a drafter (num_spec_tokens > 0), as in vLLM")
        if self.adaptive_speculation and not self.num_spec_tokens:
            raise InputError(f"{where}: adaptive_speculation needs a drafter (num_spec_tokens > 0) to adapt")
        if self.num_spec_tokens > 16:
            raise InputError(f"{where}: num_spec_tokens {self.num_spec_tokens} is above 16")
        if self.vocab_size > 1 << 20 or self.max_model_len > 1 << 20 or self.block_size > 1 << 12:
            raise InputError(f"{where}: vocab_size, max_model_len or block_size is unreasonably large")
        if self.num_blocks * self.block_size > 1 << 24:
            raise InputError(
                f"{where}: num_blocks * block_size = {self.num_blocks * self.block_size} KV slots; "
                f"the reference runner holds at most {1 << 24}"
            )
