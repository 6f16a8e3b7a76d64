"""How ``status`` prints its report: tables like ``kubectl get`` for people, JSON or YAML of the
documented schema for scripts.

What the clusters wrote (a condition's message, a pod's reason) is printed as text only: control
characters, which a terminal would obey, become spaces, and formatting characters (bidirectional
overrides) are dropped; a Target's server, or anyone who may write those fields, chooses them.
JSON and YAML carry them as they are, escaped as those formats escape.

Colour only marks what needs a look (a target not Ready in red, pods still Pending in yellow)
and is used only when the caller says the output is a terminal that accepts it
(:func:`use_colour`): piped into a file or grep, a table is plain text.
"""

from __future__ import annotations

import os
from typing import TextIO

import orjson
import yaml

from ..api.quantity import QuantityError, is_binary, parse
from ..virtual_kubelet.delegate_events import printable
from .status_report import target_label

RED, GREEN, YELLOW = "31", "32", "33"
NONE = "<none>"
GAP = "   "  # between columns, as kubectl
MAX_SHOWN = 4096  # characters of one cell, or of one line of text about a target


def use_colour(stream: TextIO, environ: dict[str, str] | None = None) -> bool:
    """Colour when ``stream`` is a terminal and NO_COLOR is unset or empty (no-color.org)."""
    if (os.environ if environ is None else environ).get("NO_COLOR"):
        return False
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


Cell = tuple[str, str | None]  # text, colour


def table(header: list[str], rows: list[list[Cell]], colour: bool) -> list[str]:
    """Columns aligned on the text as seen (colour codes take no room)."""
    rows = [[(printable(text, MAX_SHOWN), code) for text, code in row] for row in rows]
    widths = [max([len(header[i]), *(len(row[i][0]) for row in rows)]) for i in range(len(header))]
    lines = [GAP.join(h.ljust(w) for h, w in zip(header, widths, strict=True)).rstrip()]
    for row in rows:
        cells = []
        for (text, code), width in zip(row, widths, strict=True):
            padding = " " * (width - len(text))
            painted = f"\033[{code}m{text}\033[0m" if colour and code and text else text
            cells.append(painted + padding)
        lines.append(GAP.join(cells).rstrip())
    return lines


BYTE_UNITS = (("Ti", 1024**4), ("Gi", 1024**3), ("Mi", 1024**2), ("Ki", 1024))


def readable(resource: str, quantity: str) -> str:
    """A quantity as a person reads it: bytes in the largest binary unit, with one decimal at
    most (``125244988Ki`` is ``119.4Gi``), as kubectl's tables print memory; other resources,
    and what is not a quantity, as they are."""
    if not is_binary(resource):
        return quantity
    try:
        amount = parse(quantity)
    except QuantityError:
        return quantity
    for unit, size in BYTE_UNITS:
        if abs(amount) >= size:
            scaled = float(amount / size)
            text = f"{scaled:.1f}".removesuffix(".0")
            return f"{text}{unit}"
    return f"{float(amount):.0f}"


def _used(node: dict, resource: str) -> str:
    requested = readable(resource, node["requested"].get(resource, "0"))
    allocatable = (node["allocatable"] or {}).get(resource)
    return f"{requested}/{readable(resource, allocatable) if allocatable is not None else '?'}"


STATUS_COLOURS = {"True": GREEN, "False": RED}
NODE_COLOURS = {"Ready": GREEN, "NotReady": RED, "Unknown": YELLOW, "NotFound": YELLOW}
NODE_WORDS = {"NotFound": NONE, "NotReadable": "?"}


def target_lines(report: dict, colour: bool) -> list[str]:
    everywhere = report["namespace"] is None
    targets = report["targets"]
    if not targets:
        where = "" if everywhere else f" in namespace {report['namespace']}"
        return [f"No Targets{where}, and no ClusterTargets."]
    header = ["TARGET", "READY", "REASON", "VIRTUAL NODE", "NODE"]
    header += ["CPU REQ/ALLOC", "MEMORY REQ/ALLOC", "PODS REQ/ALLOC"]
    rows = []
    for target in targets:
        node = target["virtualNode"]
        row: list[Cell] = [
            (target_label(target, node["name"]), None),
            (target["status"], STATUS_COLOURS.get(target["status"], YELLOW)),
            (target["reason"] or NONE, None),
            (node["name"], None),
            (NODE_WORDS.get(node["status"], node["status"]), NODE_COLOURS.get(node["status"])),
            *((_used(node, r), None) for r in ("cpu", "memory", "pods")),
        ]
        if everywhere:
            row.insert(0, (target["namespace"] or "", None))
        rows.append(row)
    if everywhere:
        header.insert(0, "NAMESPACE")
    lines = table(header, rows, colour)
    for target in targets:
        if not target["ready"]:
            where = f"{target['namespace']}/" if target["namespace"] else ""
            why = f" ({target['reason']})" if target["reason"] else ""
            message = "; ".join(p for p in (target["message"], target["hint"]) if p)
            line = f"{target['kind']} {where}{target['name']} is not Ready{why}: {message}"
            lines.append(printable(line, MAX_SHOWN))
    return lines


def pending_reason(workload: dict) -> str:
    reasons = workload["pendingReasons"]
    if not reasons:
        return ""
    first = reasons[0]
    if first["reason"] is None and first["message"] is None:
        text = "waiting for the scheduler"
    else:
        text = ": ".join(p for p in (first["reason"], first["message"]) if p)
    others = len(reasons) - 1
    return text + (f" (and {others} other reason{'s' * (others > 1)})" if others else "")


def workload_lines(report: dict, colour: bool) -> list[str]:
    everywhere = report["namespace"] is None
    workloads = report["workloads"]
    if not workloads:
        where = "" if everywhere else f" in namespace {report['namespace']}"
        return [f"No proxy pods{where}."]
    header = ["WORKLOAD", "PODS", "PLACED", "PENDING", "REASON"]
    rows = []
    for workload in workloads:
        placed = ",".join(
            f"{target_label(p['target'], p['virtualNode'])}={p['pods']}" for p in workload["placed"]
        )
        row: list[Cell] = [
            (f"{workload['kind'].lower()}/{workload['name']}", None),
            (str(workload["pods"]), None),
            (placed or NONE, None),
            (str(workload["pending"]), YELLOW if workload["pending"] else None),
            (pending_reason(workload), None),
        ]
        if everywhere:
            row.insert(0, (workload["namespace"], None))
        rows.append(row)
    if everywhere:
        header.insert(0, "NAMESPACE")
    return table(header, rows, colour)


def problem_lines(report: dict, colour: bool) -> list[str]:
    """What keeps pods from being elected, a line each: what is wrong, then what to do; then the
    workloads whose pods run here although they look elected."""
    lines = [
        printable(f"{problem['message']}; {problem['hint']}", MAX_SHOWN)
        for problem in report["problems"]
    ]
    if report["notElected"]:
        header = "Pods that run in this cluster although they look elected:"
        lines += ["", f"\033[{RED}m{header}\033[0m" if colour else header]
    for workload in report["notElected"]:
        name = f"{workload['kind'].lower()}/{workload['name']}"
        where = f" in namespace {workload['namespace']}" if report["namespace"] is None else ""
        lines.append("  " + printable(f"{name}{where}: {workload['message']}", MAX_SHOWN))
    return lines[1:] if lines and lines[0] == "" else lines


def render_table(report: dict, colour: bool = False) -> str:
    lines = [*target_lines(report, colour), "", *workload_lines(report, colour)]
    problems = problem_lines(report, colour)
    return "\n".join([*lines, *(["", *problems] if problems else [])]) + "\n"


def render(report: dict, output: str, colour: bool = False) -> str:
    """The report as ``output`` says: ``json``, ``yaml``, or tables (anything else)."""
    if output == "json":
        return orjson.dumps(report, option=orjson.OPT_INDENT_2).decode() + "\n"
    if output == "yaml":
        return yaml.safe_dump(report, sort_keys=False, allow_unicode=True, width=1000)
    return render_table(report, colour)
