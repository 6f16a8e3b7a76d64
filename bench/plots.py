"""The growth benchmark's curves as PNG plots, beside results.json: cost against the number of
targets (``growth-targets.png``) and of pods (``growth-pods.png``), each captioned with the
run's machine and versions.

matplotlib comes with the optional ``bench`` extra and is imported only here: without it the
figures are still written (results.json, results.md) and the plots are skipped with a message.
"""

from __future__ import annotations

import sys
from pathlib import Path

INSTALL_HINT = "pip install -e '.[bench]'"


def caption(results: dict) -> str:
    m = results.get("machine", {})
    v = results.get("versions", {})
    quick = " (quick: smoke sizes, not figures)" if results.get("quick") else ""
    return (
        f"Run {results.get('started', '?')}{quick}: {m.get('cpus')} CPUs ({m.get('cpu')}), "
        f"{m.get('memory_gib')} GiB, Linux {m.get('kernel')}, Python {m.get('python')}\n"
        + ", ".join(f"{k} {val}" for k, val in sorted(v.items()))
    )


def _panels(by: str, rows: list[dict]) -> list[tuple[str, dict[str, list[float]]]]:
    """(title, {line: values}) of every panel, rows in the order of ``by``."""
    if by == "targets":
        return [
            (
                "agent RSS (MB)",
                {
                    "agent": [r["burst"]["rss_mb"] for r in rows],
                    "its webhook process": [r["burst"]["webhook_rss_mb"] for r in rows],
                },
            ),
            (
                f"CPU per pod, burst of {rows[0]['burst']['pods']} (ms)",
                {
                    "source agent": [r["burst"]["cpu_ms_per_pod"]["source_agent"] for r in rows],
                    "all agents": [r["burst"]["cpu_ms_per_pod"]["agents"] for r in rows],
                },
            ),
            (
                "source agent at rest (% of a core)",
                {"CPU": [r["idle_cpu_percent"]["source_agent"] for r in rows]},
            ),
            (
                "placement (proxies bound/s, sustained)",
                {"bound/s": [r["burst"]["bound_per_s"] for r in rows]},
            ),
            (
                "Target created → virtual node Ready (s)",
                {
                    "p50": [r["ready"]["p50_s"] for r in rows],
                    "max": [r["ready"]["max_s"] for r in rows],
                },
            ),
        ]
    return [
        (
            "agent RSS (MB)",
            {
                "agent": [r["rss_mb"] for r in rows],
                "its webhook process": [r["webhook_rss_mb"] for r in rows],
            },
        ),
        (
            "CPU per pod added (ms)",
            {
                "source agent": [r["added"]["cpu_ms_per_pod"]["source_agent"] for r in rows],
                "all agents": [r["added"]["cpu_ms_per_pod"]["agents"] for r in rows],
            },
        ),
        (
            "source agent at rest (% of a core)",
            {"CPU": [r["idle_cpu_percent"]["source_agent"] for r in rows]},
        ),
        (
            "placement of the pods added (proxies bound/s)",
            {"bound/s": [r["added"]["bound_per_s"] for r in rows]},
        ),
        (
            "one more Target → virtual node Ready (s)",
            {
                "p50": [r["probe_ready"]["p50_s"] for r in rows],
                "max": [r["probe_ready"]["max_s"] for r in rows],
            },
        ),
    ]


def _figure(plt, results: dict, by: str, rows: list[dict], path: Path) -> None:
    xs = [r[by] for r in rows]
    fig, axes = plt.subplots(2, 3, figsize=(13, 7.5))
    flat = axes.flatten()
    for ax, (title, lines) in zip(flat, _panels(by, rows), strict=False):
        for label, ys in lines.items():
            ax.plot(xs, ys, marker="o", label=label)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel(by if by == "pods" else "targets")
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        if len(lines) > 1:
            ax.legend(fontsize=8)
    flat[-1].axis("off")
    fixed = (
        f"{rows[0]['targets']} targets"
        if by == "pods"
        else f"bursts of {results['growth']['burst']}"
    )
    fig.suptitle(f"multicluster-scheduler: cost against the number of {by} ({fixed})")
    fig.text(0.5, 0.01, caption(results), ha="center", fontsize=8)
    fig.tight_layout(rect=(0, 0.06, 1, 0.96))
    fig.savefig(path, dpi=100)
    plt.close(fig)


def write(results: dict, out: Path) -> list[Path]:
    """The plots of ``results["growth"]`` in ``out``; the paths written (none without
    matplotlib)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print(
            f"plots skipped: matplotlib is missing (install the bench extra: {INSTALL_HINT}); "
            "the figures are in results.json and results.md",
            file=sys.stderr,
        )
        return []
    growth = results["growth"]
    written = []
    for by, key in (("targets", "target_steps"), ("pods", "pod_steps")):
        rows = growth.get(key) or []
        if rows:
            path = out / f"growth-{by}.png"
            _figure(plt, results, by, rows, path)
            written.append(path)
    for path in written:
        print(f"plot written to {path}", file=sys.stderr)
    return written
