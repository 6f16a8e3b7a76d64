"""The benchmark results as a markdown table, each figure next to its goal."""

from __future__ import annotations

import re
from pathlib import Path

GOALS = {
    "ratio": 1.3,
    "placement_per_s": 200,
    "fraction_of_ceiling": 0.5,
    "fairness_ratio": 2.0,
    "machine_cpu_elected_over_native": 2.3,
    "agent_cpu_ms_per_elected_pod": 2.5,
    "source_writes_over_native": 2,
    "target_writes_over_native": 1,
    "webhook_p99_ms": 5.0,
    "rss_mb": 150,
    "webhook_process_rss_mb": 60,
    "restart_s": 5.0,
    "target_ready_s": 5.0,
    "many_targets_ready_s": 10.0,
    "many_targets_idle_cpu_percent": 2.0,
    "many_targets_rss_mb": 250,
    "many_targets_placement_loss": 0.2,
}
ERROR_LINE = re.compile(r" (ERROR|CRITICAL) |^Traceback ")


def agent_errors(bed) -> dict[str, list[str]]:
    """Error lines of every agent's log (the first 20 of each)."""
    found: dict[str, list[str]] = {}
    for cluster, agents in bed.installation.agents.items():
        for agent in agents:
            path = Path(agent.log_path)
            if not path.exists():
                continue
            lines = [
                line.rstrip()
                for line in path.read_text(errors="replace").splitlines()
                if ERROR_LINE.search(line)
            ]
            if lines:
                found[f"{cluster}/{agent.name}"] = lines[:20] + (
                    [f"… {len(lines) - 20} more"] if len(lines) > 20 else []
                )
    return found


def _verdict(ok: bool) -> str:
    return "met" if ok else "**not met**"


def rows(results: dict) -> list[tuple[str, str, str, str]]:
    """(figure, measured, goal, verdict) for every benchmark that ran."""
    out = []
    if rollout := results.get("rollout"):
        n = rollout["replicas"]
        out.append(
            (
                f"rollout of {n} replicas, native (s)",
                " / ".join(f"{s:.1f}" for s in rollout["native_s"]),
                "",
                "",
            )
        )
        out.append(
            (
                f"rollout of {n} replicas, elected over 2 targets (s)",
                " / ".join(f"{s:.1f}" for s in rollout["elected_s"]),
                "",
                "",
            )
        )
        ratio = rollout["ratio"]
        out.append(
            (
                "ratio elected / native (median of pairs)",
                f"{ratio:.2f}",
                f"≤ {GOALS['ratio']}",
                _verdict(ratio <= GOALS["ratio"]),
            )
        )
    if fairness := results.get("fairness"):
        out.extend(_fairness_rows(fairness))
    if placement := results.get("placement"):
        ceiling = placement["api_ceiling_per_s"]
        placed = placement["placement_per_s"]
        fraction = placement["fraction_of_ceiling"] or 0
        out.append(("API server ceiling, pod creations/s (one client)", f"{ceiling:.0f}", "", ""))
        out.append(
            (
                "placement, proxies bound/s (sustained)",
                f"{placed:.0f}",
                f"≥ {GOALS['placement_per_s']}",
                _verdict(placed >= GOALS["placement_per_s"]),
            )
        )
        out.append(
            (
                "placement / ceiling",
                f"{fraction:.2f}",
                f"≥ {GOALS['fraction_of_ceiling']}",
                _verdict(fraction >= GOALS["fraction_of_ceiling"]),
            )
        )
        out.append(
            (
                "native, pods bound/s by kube-scheduler",
                f"{placement['native_bound_per_s']:.0f}",
                "",
                "",
            )
        )
        runs = placement["runs"]
        kinds = ("ceiling", "native", "elected")
        if all("cpu_ms_per_pod" in runs[k] for k in kinds):
            cpu = {k: runs[k]["cpu_ms_per_pod"] for k in kinds}
            out.append(
                (
                    "machine CPU per pod: created only / native / elected (ms)",
                    " / ".join(f"{cpu[k]['machine']:.1f}" for k in kinds),
                    "",
                    "",
                )
            )
            out.append(
                (
                    "of which API servers / agent, elected (ms)",
                    f"{cpu['elected']['kube-apiserver']:.1f} / {cpu['elected']['agent']:.1f}",
                    "",
                    "",
                )
            )
            times = cpu["elected"]["machine"] / cpu["native"]["machine"]
            out.append(
                (
                    "machine CPU per elected pod / native, until bound (idle included)",
                    f"{times:.2f}",
                    "",
                    "",
                )
            )
            agent = cpu["elected"]["agent"]
            goal = GOALS["agent_cpu_ms_per_elected_pod"]
            out.append(
                (
                    "agent CPU per elected pod (ms; every agent, with its webhook process)",
                    f"{agent:.2f}",
                    f"≤ {goal}",
                    _verdict(agent <= goal),
                )
            )
    if webhook := results.get("webhook"):
        intended = webhook["latency_ms"]["intended"]
        service = webhook["latency_ms"]["service"]
        out.append(
            (
                f"webhook p50 / p99 at {webhook['achieved_rate']:.0f}/s over TLS, from when each "
                "request was due (ms)",
                f"{intended['p50']:.2f} / {intended['p99']:.2f}",
                f"p99 ≤ {GOALS['webhook_p99_ms']}",
                _verdict(intended["p99"] <= GOALS["webhook_p99_ms"] and not webhook["errors"]),
            )
        )
        out.append(
            (
                "webhook p50 / p99 / max from when each request was sent (ms)",
                f"{service['p50']:.2f} / {service['p99']:.2f} / {service['max']:.1f}",
                "",
                "",
            )
        )
        if "apiserver_within_5ms" in webhook:
            cross = webhook["apiserver"]
            out.append(
                (
                    f"admissions within 5 ms as the API server timed them "
                    f"({cross['achieved_per_s']:.0f} dry-run creations/s)",
                    f"{100 * webhook['apiserver_within_5ms']:.1f} %",
                    "",
                    "",
                )
            )
    if writes := results.get("writes"):
        out += _writes_rows(writes)
    if targets := results.get("targets"):
        worst = targets["max_s"]
        out.append(
            (
                "Target created → virtual node Ready (p50 / max, s)",
                f"{targets['p50_s']:.2f} / {worst:.2f}",
                f"≤ {GOALS['target_ready_s']}",
                _verdict(worst <= GOALS["target_ready_s"]),
            )
        )
    if scale := results.get("scale"):
        errors = results.get("agent_errors") or {}
        out.append(
            (
                f"{scale['targets']} targets, {scale['pods']} elected pods, all Running (s)",
                f"{scale['all_running_s']:.0f} ({scale['bound_per_s']:.0f} bound/s)",
                "all Running, no agent error",
                _verdict(not errors),
            )
        )
        agent = scale["agent"]
        out.append(
            (
                "agent RSS with them cached (MB; peak; its webhook process, peak)",
                f"{agent['rss_mb']:.0f} ({agent['peak_rss_mb']:.0f}; "
                f"{agent.get('webhook_process_rss_mb', 0):.0f}"
                + (
                    f", {agent['webhook_process_peak_rss_mb']:.0f})"
                    if "webhook_process_peak_rss_mb" in agent
                    else ")"
                ),
                f"≤ {GOALS['rss_mb']}; webhook process ≤ {GOALS['webhook_process_rss_mb']}",
                _verdict(
                    agent["peak_rss_mb"] <= GOALS["rss_mb"]
                    and agent.get("webhook_process_rss_mb", 0) <= GOALS["webhook_process_rss_mb"]
                ),
            )
        )
        out.append(
            (
                "agent CPU: during the rollout (s); idle afterwards (%)",
                f"{agent['cpu_s_during_rollout']:.0f}; {agent['cpu_percent_idle']:.1f}",
                "",
                "",
            )
        )
        if restart := scale.get("restart"):
            out.append(
                (
                    "agent restart → leader with every cache synced (s)",
                    f"{restart['seconds']:.2f}",
                    f"≤ {GOALS['restart_s']}",
                    _verdict(restart["seconds"] <= GOALS["restart_s"]),
                )
            )
            out.append(
                ("agent RSS right after that restart (MB)", f"{restart['rss_mb']:.0f}", "", "")
            )
    if (growth := results.get("growth")) and growth.get("target_steps"):
        out += _growth_rows(growth)
    return out


def _fairness_rows(fairness: dict) -> list[tuple[str, str, str, str]]:
    b, a = fairness["pods"], fairness["burst"]
    goal = GOALS["fairness_ratio"]
    ratio, native = fairness["ratio"], fairness["ratio_to_native_burst"]
    return [
        (
            f"{b} pods of namespace B to Running: alone; during A's {a} native; during A's "
            f"{a} elected (s, each round)",
            "; ".join(
                " / ".join(f"{s:.2f}" for s in fairness[f"{phase}_s"])
                for phase in ("alone", "during_native_burst", "during_burst")
            ),
            "",
            "",
        ),
        (
            "B during A's elected burst / B during A's native burst (medians)",
            f"{native:.2f}",
            f"≤ {goal}",
            _verdict(native <= goal),
        ),
        ("B during A's elected burst / B alone (medians)", f"{ratio:.2f}", "", ""),
    ]


def _writes_rows(writes: dict) -> list[tuple[str, str, str, str]]:
    source = writes["source_pod_writes"]
    target = writes["target_pod_writes"]
    events = writes["event_writes"]
    source_goal = source["native"] + GOALS["source_writes_over_native"]
    # A native pod's writes in a cluster (creation, binding, status, deletion) are what a
    # delegate's are bound to equal.
    target_goal = source["native"] + GOALS["target_writes_over_native"]
    return [
        (
            f"writes to the source API server per pod, native / elected ({writes['pods']} pods)",
            f"{source['native']:.2f} / {source['elected']:.2f}",
            f"elected ≤ native + {GOALS['source_writes_over_native']}",
            _verdict(source["elected"] <= source_goal),
        ),
        (
            "writes to the target API server per delegate",
            f"{target:.2f}",
            f"≤ native + {GOALS['target_writes_over_native']}",
            _verdict(target <= target_goal),
        ),
        (
            "event writes per pod: native / elected in the source / in the target",
            f"{events['native']:.2f} / {events['source']:.2f} / {events['target']:.2f}",
            "",
            "",
        ),
        *_life_rows(writes),
    ]


def _life_rows(writes: dict) -> list[tuple[str, str, str, str]]:
    """CPU over a pod's whole life, less what every component spends at rest."""
    machine = writes.get("machine_cpu_ms_per_pod")
    if not machine:
        return []
    goal = GOALS["machine_cpu_elected_over_native"]
    life = writes["elected"]["cpu_ms_per_pod_over_idle"]["life"]
    return [
        (
            "machine CPU per pod over its life, above idle: native / elected (ms)",
            f"{machine['native']:.1f} / {machine['elected']:.1f}",
            "",
            "",
        ),
        (
            "machine CPU per elected pod / native, over its life",
            f"{machine['ratio']:.2f}",
            f"≤ {goal}",
            _verdict(machine["ratio"] <= goal),
        ),
        (
            "of which API servers / agents (with their webhook processes), elected (ms)",
            f"{life.get('kube-apiserver', 0):.1f} / {life.get('agent', 0):.1f}",
            "",
            "",
        ),
    ]


def _growth_rows(growth: dict) -> list[tuple[str, str, str, str]]:
    out = []
    steps = {row["targets"]: row for row in growth["target_steps"]}
    top = steps[max(steps)]
    n = top["targets"]
    every = growth["ready_all_targets"]
    goal = GOALS["many_targets_ready_s"]
    out.append(
        (
            f"{n} targets: each Target created → its virtual node Ready (p50 / max, s)",
            f"{every['p50_s']:.2f} / {every['max_s']:.2f}",
            f"≤ {goal}",
            _verdict(every["max_s"] <= goal),
        )
    )
    idle = top["idle_cpu_percent"]
    goal = GOALS["many_targets_idle_cpu_percent"]
    out.append(
        (
            f"{n} targets: source agent at rest ({idle['seconds']:.0f} s, % of a core)",
            f"{idle['source_agent']:.1f}",
            f"≤ {goal}",
            _verdict(idle["source_agent"] <= goal),
        )
    )
    if 10 in steps and n != 10:
        ten, many = steps[10]["burst"]["bound_per_s"], top["burst"]["bound_per_s"]
        floor = (1 - GOALS["many_targets_placement_loss"]) * ten
        out.append(
            (
                f"placement with {n} / with 10 targets, {top['burst']['pods']} pods "
                "(proxies bound/s)",
                f"{many:.0f} / {ten:.0f}",
                f"≥ {floor:.0f} (at most {100 * GOALS['many_targets_placement_loss']:.0f} % below)",
                _verdict(many >= floor),
            )
        )
    by_pods = {row["pods"]: row for row in growth["pod_steps"]}
    if 10_000 in by_pods:
        row = by_pods[10_000]
        goal = GOALS["many_targets_rss_mb"]
        out.append(
            (
                f"{row['targets']} targets, 10000 pods: agent RSS (MB; its webhook process)",
                f"{row['rss_mb']:.0f} ({row['webhook_rss_mb']:.0f})",
                f"≤ {goal}",
                _verdict(row["rss_mb"] <= goal),
            )
        )
    for row in growth["target_steps"]:
        burst = row["burst"]
        out.append(
            (
                f"growth, {row['targets']} targets: Ready p50/max (s); at rest (%); "
                f"{burst['pods']} pods: bound/s, agent ms/pod, RSS (MB)",
                f"{row['ready']['p50_s']:.2f}/{row['ready']['max_s']:.2f}; "
                f"{row['idle_cpu_percent']['source_agent']:.1f}; "
                f"{burst['bound_per_s']:.0f}, {burst['cpu_ms_per_pod']['source_agent']:.2f}, "
                f"{burst['rss_mb']:.0f}",
                "",
                "",
            )
        )
    for row in growth["pod_steps"]:
        added = row["added"]
        out.append(
            (
                f"growth, {row['pods']} pods over {row['targets']} targets: bound/s, agent "
                "ms/pod (of those added); RSS (MB); at rest (%); one more Target → Ready (s)",
                f"{added['bound_per_s']:.0f}, {added['cpu_ms_per_pod']['source_agent']:.2f}; "
                f"{row['rss_mb']:.0f}; {row['idle_cpu_percent']['source_agent']:.1f}; "
                f"{row['probe_ready']['p50_s']:.2f}",
                "",
                "",
            )
        )
    return out


def markdown(results: dict) -> str:
    m = results.get("machine", {})
    quick = " (quick: smoke sizes, not figures)" if results.get("quick") else ""
    v = results.get("versions", {})
    lines = [
        "# multicluster-scheduler benchmarks",
        "",
        f"Run {results.get('started', '?')}{quick}, "
        f"{results.get('seconds', '?')} s. Machine: {m.get('cpus')} CPUs ({m.get('cpu')}), "
        f"{m.get('memory_gib')} GiB, Linux {m.get('kernel')}, Python {m.get('python')}. "
        "Versions: " + ", ".join(f"{k} {val}" for k, val in sorted(v.items())) + ".",
        "",
        "| figure | measured | goal | |",
        "|---|---|---|---|",
    ]
    lines += [f"| {a} | {b} | {c} | {d} |" for a, b, c, d in rows(results)]
    if results.get("error"):
        lines += ["", "The run failed:", "", "```", results["error"].rstrip(), "```"]
    errors = results.get("agent_errors") or {}
    if errors:
        lines += ["", "Errors in agent logs:", ""]
        for agent, found in errors.items():
            lines += [f"- {agent}:", *(f"  - `{line}`" for line in found)]
    return "\n".join(lines) + "\n"
