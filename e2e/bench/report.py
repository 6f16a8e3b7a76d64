"""The benchmark results as a markdown table, each figure next to its goal."""

from __future__ import annotations

import re
from pathlib import Path

GOALS = {
    "ratio": 1.3,
    "placement_per_s": 200,
    "fraction_of_ceiling": 0.5,
    "webhook_p99_ms": 5.0,
    "rss_mb": 200,
    "restart_s": 5.0,
    "target_ready_s": 5.0,
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
                f"≤ {GOALS['rss_mb']}",
                _verdict(agent["peak_rss_mb"] <= GOALS["rss_mb"]),
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
