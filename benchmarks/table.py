"""The benchmark table: each figure, as measured, beside its target.

Where it sits: the rendering end of benchmarks/run.py.
"""

from __future__ import annotations

from typing import Any


def rows(out: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    """(figure, measured, target, verdict) for every figure present."""
    table: list[tuple[str, str, str, str]] = []

    def add(name: str, measured: str, target: str, ok: bool | None) -> None:
        table.append((name, measured, target, "n/a" if ok is None else ("met" if ok else "MISSED")))

    for n, t in (out.get("replay_throughput") or {}).items():
        name = f"replay throughput ({n} requests, {t['steps']} steps)"
        if "ratio" in t:
            add(
                name,
                f"reference {t['reference_request_steps_per_s']:,.0f}/s, vllm "
                f"{t['vllm_request_steps_per_s']:,.0f}/s: {t['ratio']:.2f}x",
                ">= 2x the real scheduler (goal 5x)",
                t["ratio"] >= 2,
            )
        else:
            add(name, f"reference {t['reference_request_steps_per_s']:,.0f}/s (no vllm)", ">= 2x (goal 5x)", None)
    g = out.get("cost_growth")
    if g:
        by = ", ".join(f"{n}: {us:.1f}" for n, us in g["us_per_request_step_by_requests"].items())
        add(
            f"cost by running requests (us/request-step, {g['steps']} steps)",
            f"{by}; max/min {g['flat_64_to_4096']:.2f}x",
            "flat within 1.5x from 64 to 4096",
            g["flat_64_to_4096"] <= 1.5,
        )
        steps = ", ".join(f"{s}: {us:.1f}" for s, us in g["us_per_request_step_by_steps"].items())
        add(
            "cost by steps (us/request-step)",
            f"{steps}; ratio {g['steps_ratio']:.2f}",
            "linear (ratio ~1)",
            0.5 <= g["steps_ratio"] <= 2,
        )
    e = out.get("explore")
    if e:
        per = ", ".join(
            f"{k.removesuffix('_workloads_per_s')} {v:.1f}/s" for k, v in e.items() if k.endswith("_workloads_per_s")
        )
        add(f"explore workloads per second ({e['workloads']} candidates, run + check)", per, "reported", None)
    for key, runner in (("attached_recorder_overhead", ""), ("attached_recorder_overhead_mrv2", " (Model Runner V2)")):
        for attached in out.get(key) or ():
            size = f", {attached['requests']} requests" if "requests" in attached else ""
            label = f"attached recorder CPU vs the scheduler's own{runner}{size}"
            target = "engine thread <= 3%, all <= 10%"
            if "ratio" not in attached:
                add(label, attached["note"], target, None)
                continue
            add(
                label,
                f"{attached['ratio'] * 100:.1f}% on the engine's thread "
                f"({attached['recorder_us_per_request_step']:.1f} vs "
                f"{attached['scheduler_us_per_request_step']:.1f} us per request-step); the part writer's "
                f"thread {attached['writer_ratio'] * 100:.1f}% "
                f"({attached['writer_thread_us_per_request_step']:.1f} us)",
                target,
                attached["ratio"] <= 0.03 and attached["ratio"] + attached["writer_ratio"] <= 0.10,
            )
    served = out.get("served_throughput")
    if served:
        if "modes" not in served:
            add("served throughput, recorder on vs off", served["note"], "<= 3% fewer tokens/s", None)
        for mode in ("whole", "window"):
            figures = (served.get("modes") or {}).get(mode)
            if figures is None:
                continue
            off = served["modes"]["off"]
            add(
                f"served throughput, recorder {mode} vs off ({served['prompts']} x {served['output_len']} tokens, "
                f"median of {served['rounds']} alternated rounds)",
                f"median {figures['tokens_per_s']:,.0f} vs {off['tokens_per_s']:,.0f} output tokens/s "
                f"({figures['tokens_per_s_vs_off']:+.1%}), best {figures['best_tokens_per_s_vs_off']:+.1%}; server "
                f"CPU per output token {figures['cpu_s_per_token'] * 1e3:.2f} vs {off['cpu_s_per_token'] * 1e3:.2f} ms "
                f"({figures['cpu_per_token_vs_off']:+.1%}), best {figures['best_cpu_per_token_vs_off']:+.1%}",
                "<= 3% fewer tokens/s",
                min(figures["tokens_per_s_vs_off"], figures["best_tokens_per_s_vs_off"]) >= -0.03,
            )
    live = out.get("live_recording_overhead")
    if live:
        if "overhead" in live:
            add(
                "live recording overhead",
                f"{live['overhead'] * 100:+.1f}% ({live['off_s']:.2f}s -> {live['on_s']:.2f}s)",
                "<= 3%",
                live["overhead"] <= 0.03,
            )
        else:
            add("live recording overhead", live["note"], "<= 3%", None)
    d = out.get("diff_cost")
    if d:
        add(
            f"diff cost ({d['rows']:,} request-steps)",
            f"{d['diff_s']:.1f}s vs read {d['read_s']:.1f}s: "
            f"{d['ratio']:.1f}x; peak {d['diff_peak_rss_mb']:.0f} MB vs table {d['table_mb']:.0f} MB: "
            f"{d['memory_ratio']:.1f}x"
            + (
                f", {d['extra_memory_ratio']:.2f}x above the {d['baseline_rss_mb']:.0f} MB of a 200-row diff"
                if "extra_memory_ratio" in d
                else ""
            ),
            "<= 2x read time; extra memory <= 1x the table",
            d["ratio"] <= 2 and d.get("extra_memory_ratio", d["memory_ratio"]) <= 1,
        )
    z = out.get("trace_size")
    if z:
        add(
            "trace size",
            f"{z['bytes_per_request_step']:.2f} B/request-step; JSON lines "
            f"{z['json_lines_bytes_per_request_step']:.0f} B ({z['json_ratio']:.0f}x)",
            "<= 4 B; JSON >= 20x",
            z["bytes_per_request_step"] <= 4 and z["json_ratio"] >= 20,
        )
    s = out.get("startup")
    if s:
        add(
            "start-up",
            f"--help {s['help_s']:.2f}s; diff imports torch: {s['diff_imports_torch']}",
            "<= 0.3 s; no torch",
            s["help_s"] <= 0.3 and not s["diff_imports_torch"],
        )
    gpu = out.get("gpu")
    if gpu:
        if "note" in gpu:
            add("GPU vs CPU", gpu["note"], "report both; cuda faster at 4096", None)
        else:
            sizes = gpu["sizes"]
            text = ", ".join(
                f"{n}: cpu {v['cpu_request_steps_per_s']:,.0f}/s, cuda {v['cuda_request_steps_per_s']:,.0f}/s"
                for n, v in sizes.items()
            )
            big = sizes.get(4096) or sizes[max(sizes)]
            add(f"GPU vs CPU ({gpu['device']})", text, "report both; cuda faster at 4096", big["cuda_s"] < big["cpu_s"])
    return table


def print_table(out: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(
        title=f"specreplay benchmarks ({'quick' if out['machine']['quick'] else 'full'}, "
        f"{out['machine']['cpus']} CPUs, medians of {out['machine']['repeat']})",
        title_justify="left",
    )
    for column in ("figure", "measured", "target", ""):
        table.add_column(column, overflow="fold")
    for row in rows(out):
        table.add_row(*row)
    Console().print(table)
