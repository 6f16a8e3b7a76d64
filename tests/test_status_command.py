"""``status``: the report computed from listed objects, its tables, JSON and YAML, colour only on
a terminal, exit codes, and what it reads (owners resolved, forbidden reads turned into
warnings, a missing namespace or context an error)."""

from __future__ import annotations

import asyncio
import datetime as dt
import io
import json

import orjson
import pytest
import yaml

from multicluster.errors import Forbidden, NotFound
from multicluster.resources import Resource
from multicluster_scheduler.cli import build_parser, kubectl_plugin, main
from multicluster_scheduler.connect.join import NO_STATUS_HINT
from multicluster_scheduler.connect.kubeconfig import ContextCluster
from multicluster_scheduler.connect.problems import ConnectError
from multicluster_scheduler.connect.remote import Context
from multicluster_scheduler.connect.status import observe
from multicluster_scheduler.connect.status_render import render, render_table, use_colour
from multicluster_scheduler.connect.status_report import (
    EXIT_NOT_READY,
    EXIT_READY,
    Observed,
    build_report,
    exit_code,
    proxy_requests,
    workload_of,
)

NS = "prod"
C1, C2 = "admiralty-namespace-prod-c1", "admiralty-namespace-prod-c2"
GPU = "admiralty-cluster-gpu"
UNSCHEDULABLE = "0/2 targets are available: 2 target(s) had no node matching Pod's node selector."


def target(name, ready="True", reason="Ready", message="", namespace=NS, generation=1, **spec):
    meta = {"name": name, "generation": generation}
    if namespace:
        meta["namespace"] = namespace
    obj = {"metadata": meta, "spec": spec or {"kubeconfigSecret": {"name": name}}}
    if ready is not None:
        condition = {
            "type": "Ready",
            "status": ready,
            "reason": reason,
            "message": message,
            "lastTransitionTime": "2026-11-26T10:00:00Z",
            "observedGeneration": 1,
        }
        obj["status"] = {"conditions": [condition]}
    return obj


def node(name, ready="True", cpu="12", memory="48Gi", pods="330"):
    resources = {"cpu": cpu, "memory": memory, "pods": pods}
    return {
        "metadata": {"name": name},
        "status": {
            "capacity": resources,
            "allocatable": resources,
            "conditions": [{"type": "Ready", "status": ready}],
        },
    }


def proxy(name, node_name=None, owner=None, phase="Running", scheduled=None, namespace=NS, **meta):
    pod = {
        "metadata": {"name": name, "namespace": namespace, **meta},
        "spec": {
            "schedulerName": "admiralty-proxy",
            "containers": [
                {"name": "c", "resources": {"requests": {"cpu": "100m", "memory": "32Mi"}}}
            ],
        },
        "status": {"phase": phase},
    }
    if node_name:
        pod["spec"]["nodeName"] = node_name
    if owner:
        kind, owner_name = owner
        pod["metadata"]["ownerReferences"] = [
            {"kind": kind, "name": owner_name, "uid": f"uid-{owner_name}", "controller": True}
        ]
    if scheduled:
        reason, message = scheduled
        pod["status"]["conditions"] = [
            {"type": "PodScheduled", "status": "False", "reason": reason, "message": message}
        ]
    return pod


NOW = dt.datetime(2026, 11, 26, 10, 0, 30, tzinfo=dt.UTC)
RS = ("ReplicaSet", "nginx-5d4f8")
CONTROLLERS = {("ReplicaSet", NS, "nginx-5d4f8"): ("Deployment", "nginx")}


def observed(**changes) -> Observed:
    """c1 Ready, c2 not Ready (its Secret is missing), a ClusterTarget gpu Ready without its
    virtual node yet; nginx's 10 pods: 6 on c1, 3 on c2, 1 pending; a picky bare pod pending."""
    proxies = [proxy(f"nginx-{i}", C1, RS) for i in range(6)]
    proxies += [proxy(f"nginx-{i}", C2, RS) for i in range(6, 9)]
    proxies += [proxy("nginx-9", owner=RS, phase="Pending", scheduled=("Unschedulable", "full"))]
    proxies += [proxy("picky", phase="Pending", scheduled=("Unschedulable", UNSCHEDULABLE))]
    values = {
        "context": "cluster1",
        "namespace": NS,
        "targets": [
            target("c2", "False", "SecretNotFound", "Secret prod/c2 not found"),
            target("c1", spec_self=None, self=True),
        ],
        "cluster_targets": [target("gpu", namespace=None)],
        "nodes": [node(C1), node(C2, ready="False")],
        "proxies": proxies,
        "controllers": CONTROLLERS,
        # The targets' conditions are 30 s old: gpu's virtual node may still be on its way.
        "now": NOW,
    }
    return Observed(**(values | changes))


def test_targets_their_readiness_virtual_nodes_and_use():
    report = build_report(observed())
    c1, c2, gpu = report["targets"]
    assert (c1["kind"], c1["namespace"], c1["name"], c1["self"]) == ("Target", NS, "c1", True)
    assert (c1["ready"], c1["status"], c1["reason"]) == (True, "True", "Ready")
    assert c1["virtualNode"] == {
        "name": C1,
        "status": "Ready",
        "capacity": {"cpu": "12", "memory": "48Gi", "pods": "330"},
        "allocatable": {"cpu": "12", "memory": "48Gi", "pods": "330"},
        "requested": {"cpu": "600m", "memory": "192Mi", "pods": "6"},
        "proxyPods": 6,
        "lastHeartbeatTime": None,
    }
    assert (c2["ready"], c2["reason"], c2["message"]) == (
        False,
        "SecretNotFound",
        "Secret prod/c2 not found",
    )
    assert c2["virtualNode"]["status"] == "NotReady"
    assert c2["virtualNode"]["requested"]["cpu"] == "300m"
    assert (gpu["kind"], gpu["namespace"], gpu["name"]) == ("ClusterTarget", None, "gpu")
    assert gpu["virtualNode"]["name"] == GPU
    assert gpu["virtualNode"]["status"] == "NotFound"
    assert gpu["virtualNode"]["allocatable"] is None
    assert report["ready"] is False
    assert exit_code(report) == EXIT_NOT_READY


def test_workloads_count_their_pods_per_target_and_the_pending_ones_with_reasons():
    report = build_report(observed())
    nginx, picky = report["workloads"]
    assert (nginx["kind"], nginx["name"], nginx["pods"], nginx["pending"]) == (
        "Deployment",
        "nginx",
        10,
        1,
    )
    assert nginx["placed"] == [
        {"target": {"kind": "Target", "namespace": NS, "name": "c1"}, "virtualNode": C1, "pods": 6},
        {"target": {"kind": "Target", "namespace": NS, "name": "c2"}, "virtualNode": C2, "pods": 3},
    ]
    assert nginx["pendingReasons"] == [{"reason": "Unschedulable", "message": "full", "pods": 1}]
    assert (picky["kind"], picky["name"], picky["placed"], picky["pending"]) == (
        "Pod",
        "picky",
        [],
        1,
    )
    assert picky["pendingReasons"][0]["message"] == UNSCHEDULABLE


def test_finished_terminating_and_undecided_pods_are_counted_apart():
    job = ("Job", "backup-28851840")
    controllers = {("Job", NS, "backup-28851840"): ("CronJob", "backup")}
    proxies = [
        proxy("b-0", C1, job, phase="Succeeded"),
        proxy("b-1", C1, job, phase="Failed"),
        proxy("b-2", C1, job, deletionTimestamp="2026-11-26T10:00:00Z"),
        proxy("b-3", owner=job, phase="Pending"),  # no PodScheduled yet: being placed
        {"metadata": {"name": "plain", "namespace": NS}, "spec": {}},  # not a proxy
    ]
    report = build_report(observed(proxies=proxies, controllers=controllers))
    (backup,) = report["workloads"]
    assert (backup["kind"], backup["name"]) == ("CronJob", "backup")
    assert (backup["succeeded"], backup["failed"], backup["terminating"]) == (1, 1, 1)
    assert (backup["pods"], backup["pending"], backup["placed"]) == (1, 1, [])
    assert backup["pendingReasons"] == [{"reason": None, "message": None, "pods": 1}]
    # A terminating proxy pod's delegate still holds its room; finished ones do not.
    assert report["targets"][0]["virtualNode"]["requested"]["pods"] == "1"


def test_workload_of_resolves_known_owners_and_keeps_others():
    assert workload_of(proxy("p", owner=RS), CONTROLLERS) == ("Deployment", "nginx")
    assert workload_of(proxy("p", owner=("ReplicaSet", "bare")), CONTROLLERS) == (
        "ReplicaSet",
        "bare",
    )
    assert workload_of(proxy("p", owner=("StatefulSet", "db")), {}) == ("StatefulSet", "db")
    assert workload_of(proxy("p"), {}) == ("Pod", "p")


def test_requests_as_the_scheduler_counts_them():
    pod = proxy("p")
    pod["spec"]["initContainers"] = [{"name": "i", "resources": {"requests": {"cpu": "2"}}}]
    pod["spec"]["overhead"] = {"memory": "8Mi"}
    assert proxy_requests(pod) == {"cpu": 2, "memory": 40 * 2**20, "pods": 1}


def test_a_target_without_status_or_with_a_stale_one_is_not_ready_and_says_why():
    fresh = target("c1", ready=None)
    stale = target("c3", generation=2)  # Ready for generation 1, since changed
    report = build_report(observed(targets=[fresh, stale], cluster_targets=[], proxies=[]))
    for entry in report["targets"]:
        assert (entry["ready"], entry["status"], entry["reason"], entry["message"]) == (
            False,
            "Unknown",
            None,
            None,
        )
        assert entry["hint"] == NO_STATUS_HINT
    assert exit_code(report) == EXIT_NOT_READY
    assert render_table(report).splitlines()[1].split()[:3] == ["c1", "Unknown", "<none>"]


def test_a_connecting_target_is_unknown_and_not_ready():
    connecting = target("c1", "Unknown", "Connecting", "connecting to https://c1:6443")
    report = build_report(observed(targets=[connecting], cluster_targets=[]))
    (entry,) = report["targets"]
    assert (entry["ready"], entry["status"], entry["reason"]) == (False, "Unknown", "Connecting")
    assert exit_code(report) == EXIT_NOT_READY
    coloured = render_table(report, colour=True)
    assert "\033[33mUnknown\033[0m" in coloured


def test_the_hint_for_a_known_reason_follows_the_message():
    unreachable = target("c2", "False", "Unreachable", "dial tcp: connection refused")
    report = build_report(observed(targets=[unreachable], cluster_targets=[]))
    (entry,) = report["targets"]
    assert entry["message"] == "dial tcp: connection refused"
    assert entry["hint"].startswith("the address in the Secret must be reachable")
    assert render_table(report).splitlines()[2] == (
        f"Target prod/c2 is not Ready (Unreachable): dial tcp: connection refused; {entry['hint']}"
    )


def test_all_ready_or_no_target_at_all_is_exit_code_0():
    report = build_report(observed(targets=[target("c1")], cluster_targets=[]))
    assert exit_code(report) == EXIT_READY
    empty = build_report(observed(targets=[], cluster_targets=[], proxies=[]))
    assert exit_code(empty) == EXIT_READY
    assert render_table(empty) == "No Targets in namespace prod, and no ClusterTargets.\n\n" + (
        "No proxy pods in namespace prod.\n"
    )


def test_tables():
    text = render_table(build_report(observed()))
    assert text == (
        "TARGET              READY   REASON           VIRTUAL NODE                  NODE       "
        "CPU REQ/ALLOC   MEMORY REQ/ALLOC   PODS REQ/ALLOC\n"
        f"c1                  True    Ready            {C1}   Ready      "
        "600m/12         192Mi/48Gi         6/330\n"
        f"c2                  False   SecretNotFound   {C2}   NotReady   "
        "300m/12         96Mi/48Gi          3/330\n"
        f"clustertarget/gpu   True    Ready            {GPU}         <none>     "
        "0/?             0/?                0/?\n"
        "Target prod/c2 is not Ready (SecretNotFound): Secret prod/c2 not found\n"
        "\n"
        "WORKLOAD           PODS   PLACED      PENDING   REASON\n"
        "deployment/nginx   10     c1=6,c2=3   1         Unschedulable: full\n"
        f"pod/picky          1      <none>      1         Unschedulable: {UNSCHEDULABLE}\n"
    )


def test_tables_of_all_namespaces_have_a_namespace_column():
    other = target("c1", namespace="dev")
    pods = [proxy("web-0", "admiralty-namespace-dev-c1", namespace="dev")]
    report = build_report(
        observed(namespace=None, targets=[other], cluster_targets=[], proxies=pods)
    )
    lines = render_table(report).splitlines()
    assert lines[0].split()[:2] == ["NAMESPACE", "TARGET"]
    assert lines[1].split()[:3] == ["dev", "c1", "True"]
    assert lines[3].split() == ["NAMESPACE", "WORKLOAD", "PODS", "PLACED", "PENDING", "REASON"]
    assert lines[4].split() == ["dev", "pod/web-0", "1", "c1=1", "0"]


def test_several_pending_reasons_show_the_most_common_and_count_the_others():
    proxies = [
        proxy("a", owner=RS, phase="Pending", scheduled=("Unschedulable", "full")),
        proxy("b", owner=RS, phase="Pending", scheduled=("Unschedulable", "full")),
        proxy("c", owner=RS, phase="Pending"),
    ]
    text = render_table(build_report(observed(proxies=proxies)))
    assert "deployment/nginx   3      <none>   3         Unschedulable: full (and 1 other " in text


def test_json_and_yaml_are_the_report():
    report = build_report(observed())
    assert json.loads(render(report, "json")) == report
    assert yaml.safe_load(render(report, "yaml")) == report
    assert list(report) == [
        "version",
        "context",
        "namespace",
        "ready",
        "targets",
        "workloads",
        "notElected",
        "problems",
        "warnings",
    ]
    assert report["version"] == 1


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_colour_only_on_a_terminal_without_no_color():
    assert use_colour(io.StringIO(), {}) is False
    assert use_colour(Terminal(), {}) is True
    assert use_colour(Terminal(), {"NO_COLOR": "1"}) is False
    assert use_colour(Terminal(), {"NO_COLOR": ""}) is True  # set but empty: no-color.org


def test_colours_mark_what_needs_a_look_and_keep_columns_aligned():
    report = build_report(observed())
    coloured = render(report, "table", colour=True)
    assert "\033[31mFalse\033[0m" in coloured
    assert "\033[31mNotReady\033[0m" in coloured
    assert "\033[32mTrue\033[0m" in coloured
    assert "\033[33m1\033[0m" in coloured
    plain = coloured
    for code in ("\033[31m", "\033[32m", "\033[33m", "\033[0m"):
        plain = plain.replace(code, "")
    assert plain == render_table(report)
    assert "\033[" not in render(report, "json", colour=True)


# -- reading the cluster ---------------------------------------------------------------------


def forbidden(plural: str) -> Forbidden:
    message = f'{plural} is forbidden: User "jane" cannot list resource "{plural}"'
    return Forbidden("x", body={"kind": "Status", "code": 403, "message": message})


class FakeClient:
    """Lists and gets from a dict of objects by plural; ``refused``: plurals that are 403."""

    def __init__(self, objects: dict[str, list[dict]], refused: tuple[str, ...] = ()) -> None:
        self.objects = objects
        self.refused = refused

    def _check(self, resource: Resource) -> None:
        if resource.plural in self.refused:
            raise forbidden(resource.plural)

    async def list(self, resource: Resource, namespace=None, **options):
        self._check(resource)
        return [
            o
            for o in self.objects.get(resource.plural, ())
            if namespace is None or o["metadata"].get("namespace") == namespace
        ], "1"

    async def get(self, resource: Resource, name: str, namespace=None):
        self._check(resource)
        for o in self.objects.get(resource.plural, ()):
            if o["metadata"]["name"] == name and o["metadata"].get("namespace") == namespace:
                return o
        details = {"name": name, "kind": resource.plural}
        raise NotFound("x", body={"kind": "Status", "code": 404, "details": details})


def context(objects: dict[str, list[dict]], refused: tuple[str, ...] = ()) -> Context:
    cluster = ContextCluster(context="cluster1", server="https://cluster1:6443")
    return Context("cluster1", cluster, FakeClient(objects, refused))  # type: ignore[arg-type]


def cluster_objects() -> dict[str, list[dict]]:
    replicaset = {
        "metadata": {
            "name": "nginx-5d4f8",
            "namespace": NS,
            "uid": "uid-nginx-5d4f8",
            "ownerReferences": [{"kind": "Deployment", "name": "nginx", "controller": True}],
        }
    }
    return {
        "namespaces": [{"metadata": {"name": NS}}],
        "targets": [target("c1")],
        "clustertargets": [target("gpu", namespace=None)],
        "nodes": [node(C1)],
        "pods": [proxy("nginx-0", C1, RS)],
        "replicasets": [replicaset],
    }


def test_observe_reads_targets_nodes_proxies_and_the_owners_of_replicasets():
    seen = asyncio.run(observe(context(cluster_objects()), NS))
    report = build_report(seen)
    assert [t["name"] for t in report["targets"]] == ["c1", "gpu"]
    assert report["workloads"][0]["kind"] == "Deployment"
    assert report["warnings"] == []


def test_what_a_tenant_may_not_read_is_left_out_with_a_warning():
    ctx = context(cluster_objects(), refused=("clustertargets", "nodes", "replicasets"))
    report = build_report(asyncio.run(observe(ctx, NS)))
    assert [t["name"] for t in report["targets"]] == ["c1"]
    assert report["targets"][0]["virtualNode"]["status"] == "NotReadable"
    assert report["workloads"][0]["kind"] == "ReplicaSet"
    warnings = report["warnings"]
    assert len(warnings) == 3
    assert warnings[0].startswith(
        "cannot list ClusterTargets in context cluster1 (403 Forbidden: clustertargets is "
        'forbidden: User "jane"'
    )
    assert warnings[0].endswith("they are left out")
    assert "readiness and allocatable are not shown" in warnings[1]
    assert "pods of such ReplicaSets are counted by ReplicaSet" in warnings[2]
    assert "?" in render_table(report).splitlines()[1]


def test_a_missing_namespace_or_forbidden_targets_are_errors_naming_the_context():
    objects = cluster_objects()
    with pytest.raises(ConnectError, match="namespace dev does not exist in context cluster1"):
        asyncio.run(observe(context(objects), "dev"))
    with pytest.raises(ConnectError) as refused:
        asyncio.run(observe(context(objects, refused=("targets",)), NS))
    assert str(refused.value).startswith(
        "cannot list Targets in namespace prod: context cluster1 (https://cluster1:6443) does not "
        "allow it (403 Forbidden)"
    )


# -- the command ------------------------------------------------------------------------------


def kubeconfig_file(tmp_path, server: str = "https://127.0.0.1:1") -> str:
    path = tmp_path / "kubeconfig"
    path.write_text(
        orjson.dumps(
            {
                "clusters": [{"name": "k", "cluster": {"server": server}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [{"name": "a", "context": {"cluster": "k", "user": "u"}}],
                "current-context": "a",
            }
        ).decode()
    )
    return str(path)


def test_an_unknown_context_is_exit_code_1(tmp_path, capsys):
    assert main(["status", "--kubeconfig", kubeconfig_file(tmp_path), "--context", "b"]) == 1
    out, err = capsys.readouterr()
    assert (out, err) == ("", "error: context 'b' is not in the kubeconfig (contexts: a)\n")


def test_an_unreachable_cluster_is_exit_code_1_naming_the_context(tmp_path, capsys):
    assert main(["status", "--kubeconfig", kubeconfig_file(tmp_path), "-A"]) == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith(
        "error: cannot list Targets in all namespaces: the API server of context a "
        "(https://127.0.0.1:1) does not answer"
    )


def test_namespace_and_all_namespaces_exclude_each_other(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["status", "-n", "x", "-A"])
    assert exit_info.value.code == 2
    assert "not allowed with argument -n/--namespace" in capsys.readouterr().err


def test_the_kubectl_plugin_is_the_same_command_named_as_kubectl_runs_it(monkeypatch, capsys):
    monkeypatch.setattr("sys.argv", ["kubectl-multicluster", "status", "--help"])
    with pytest.raises(SystemExit) as exit_info:
        kubectl_plugin()
    assert exit_info.value.code == 0
    help_text = capsys.readouterr().out
    assert help_text.startswith("usage: kubectl multicluster status [-h]")
    assert "examples:\n" in help_text


def test_every_status_option_says_its_default():
    parser = build_parser()
    status = parser._subparsers._group_actions[0].choices["status"]  # type: ignore[union-attr]
    for action in status._actions:
        if action.option_strings and action.dest != "help":
            assert "default" in status.formatter_class(prog="x")._get_help_string(action)


def test_what_clusters_wrote_reaches_the_terminal_as_text_only():
    """A Target's server chooses the message of its Ready condition (a Status it answers, C1
    controls kept), and proxy pods' reasons quote targets: a table printed to a terminal must
    not carry what it would obey (clear the screen, retitle the window, move the cursor back
    over other lines) nor bidirectional overrides that show text in another order."""
    hostile = "evil\x1b[2J\x9b2J\x1b]0;owned\x07\r\nfake line\u202edesrever\u200b"
    report = build_report(
        observed(
            targets=[target("c2", "False", "Unauthorized", hostile)],
            proxies=[proxy("p", phase="Pending", scheduled=("Unschedulable", hostile))],
        )
    )
    for colour in (False, True):
        text = render_table(report, colour)
        for obeyed in ("\x9b", "\x07", "\r", "\u202e", "\u200b"):
            assert obeyed not in text
        assert text.count("\x1b") == (text.count("\x1b[0m") * 2 if colour else 0)
        assert "evil [2J 2J ]0;owned fake linedesrever" in text


# -- what makes pods run at home without a word --------------------------------------------------


def heartbeat(name: str, when: str, ready: str = "True") -> dict:
    found = node(name, ready=ready)
    found["status"]["conditions"][0]["lastHeartbeatTime"] = when
    return found


def namespace(name: str, enabled: bool = True) -> dict:
    labels = {"multicluster-scheduler": "enabled"} if enabled else {}
    return {"metadata": {"name": name, "labels": labels}}


def local_pod(name: str, annotations: dict, owner=RS, namespace=NS, **labels) -> dict:
    pod = proxy(name, owner=owner, namespace=namespace, annotations=annotations, labels=labels)
    pod["spec"]["schedulerName"] = "default-scheduler"
    return pod


def test_a_target_whose_agent_is_silent_is_not_ready():
    nodes = [heartbeat(C1, "2026-11-26T09:59:50Z"), heartbeat(C2, "2026-11-26T09:50:00Z")]
    report = build_report(
        observed(targets=[target("c1"), target("c2")], cluster_targets=[], nodes=nodes)
    )
    c1, c2 = report["targets"]
    assert c1["ready"] is True
    assert c1["virtualNode"]["lastHeartbeatTime"] == "2026-11-26T09:59:50Z"
    assert (c2["ready"], c2["status"], c2["reason"]) == (False, "Unknown", "AgentNotSeen")
    assert c2["message"] == (
        f"no agent has written its virtual node {C2} for 10m (since 2026-11-26T09:50:00Z): no "
        "agent is running in context cluster1"
    )
    assert c2["hint"].startswith("the agents must run in this cluster: kubectl get pods -n")
    assert exit_code(report) == EXIT_NOT_READY


def test_a_ready_target_without_its_virtual_node_is_not_ready_once_it_should_have_one():
    later = NOW + dt.timedelta(minutes=5)
    report = build_report(observed(now=later))
    gpu = report["targets"][2]
    assert (gpu["ready"], gpu["reason"]) == (False, "AgentNotSeen")
    assert gpu["message"].startswith(f"its virtual node {GPU} does not exist: no agent keeps")
    # Within a minute of becoming Ready, the node may still be on its way.
    assert build_report(observed())["targets"][2]["ready"] is True


def test_after_an_uninstall_no_target_is_ready_and_the_leftovers_are_named():
    """helm uninstall leaves the CRDs, so the Targets and their last conditions stay; the
    webhook configuration and the virtual nodes go, and ReplicaSets make ordinary pods."""
    pods = [local_pod(f"nginx-{i}", {"multicluster.admiralty.io/elect": ""}) for i in range(3)]
    report = build_report(
        observed(
            targets=[target("c1")],
            cluster_targets=[],
            nodes=[],
            installed=False,
            namespaces={NS: namespace(NS)},
            pods=pods,
        )
    )
    (c1,) = report["targets"]
    assert (c1["ready"], c1["reason"]) == (False, "AgentNotSeen")
    assert c1["message"].startswith("multicluster-scheduler is not installed in context cluster1")
    assert [p["reason"] for p in report["problems"]] == ["NotInstalled"]
    (nginx,) = report["notElected"]
    assert (nginx["kind"], nginx["name"], nginx["pods"], nginx["reason"]) == (
        "Deployment",
        "nginx",
        3,
        "NotMutated",
    )
    assert exit_code(report) == EXIT_NOT_READY
    text = render_table(report)
    assert "multicluster-scheduler is not installed in context cluster1: no webhook" in text
    assert "Pods that run in this cluster although they look elected:" in text
    assert (
        "  deployment/nginx: 3 pods carry multicluster.admiralty.io/elect but are not proxy pods "
        "(made before the namespace was labelled, or while no webhook of multicluster-scheduler "
        "answered): they run in this cluster; once the webhook answers, delete them and their "
        "owner makes proxy pods"
    ) in text


def test_a_namespace_with_targets_that_is_not_enabled_and_its_elected_pods():
    pods = [local_pod(f"nginx-{i}", {"multicluster.admiralty.io/elect": ""}) for i in range(2)]
    pods.append(local_pod("nginx-x", {"multicluster.admiralty.io/elect": ""}, parent="x"))
    pods[-1]["metadata"]["labels"] = {"multicluster.admiralty.io/parent-uid": "u"}  # a delegate
    report = build_report(
        observed(
            targets=[target("c1"), target("c2")],
            namespaces={NS: namespace(NS, enabled=False)},
            pods=pods,
        )
    )
    (problem,) = report["problems"]
    assert problem == {
        "reason": "NamespaceNotEnabled",
        "namespace": NS,
        "message": "namespace prod has Targets c1, c2 but is not labelled "
        "multicluster-scheduler=enabled: no pod of it is elected, they all run in this cluster",
        "hint": "kubectl label namespace prod multicluster-scheduler=enabled",
    }
    (nginx,) = report["notElected"]
    assert nginx["message"] == (
        "2 pods carry multicluster.admiralty.io/elect but their namespace is not labelled "
        "multicluster-scheduler=enabled: they run in this cluster"
    )
    assert exit_code(report) == EXIT_NOT_READY


def test_pods_with_a_key_like_the_election_are_named_with_it():
    pods = [
        local_pod("web-0", {"multicluster.admiralty.io/elected": ""}),
        local_pod("job-0", {"multicluster.admiralty/elect": ""}, owner=("Job", "report")),
        local_pod("fine", {"app": "x"}),
    ]
    report = build_report(observed(namespaces={NS: namespace(NS)}, pods=pods))
    assert [(w["kind"], w["name"], w["reason"], w["keys"]) for w in report["notElected"]] == [
        ("Deployment", "nginx", "MisspeltKey", ["multicluster.admiralty.io/elected"]),
        ("Job", "report", "MisspeltKey", ["multicluster.admiralty/elect"]),
    ]
    assert report["notElected"][1]["message"] == (
        "1 pod carries multicluster.admiralty/elect, not multicluster.admiralty.io/elect: it runs "
        "in this cluster"
    )
    assert report["problems"] == []


def test_memory_reads_as_kubectl_prints_it():
    nodes = [node(C1, memory="125244988Ki"), node(C2)]
    text = render_table(build_report(observed(nodes=nodes)))
    assert "192Mi/119.4Gi" in text
    assert "96Mi/48Gi" in text


def test_observe_reads_the_namespaces_their_pods_and_whether_the_chart_is_installed():
    objects = cluster_objects()
    objects["namespaces"] = [namespace(NS, enabled=False)]
    objects["pods"].append(local_pod("web-0", {"multicluster.admiralty.io/elected": ""}))
    objects["mutatingwebhookconfigurations"] = []
    report = build_report(asyncio.run(observe(context(objects), NS)))
    assert [p["reason"] for p in report["problems"]] == ["NotInstalled", "NamespaceNotEnabled"]
    assert [w["name"] for w in report["notElected"]] == ["nginx"]
    assert report["notElected"][0]["kind"] == "Deployment"  # its ReplicaSet was read

    tenant = context(objects, refused=("pods", "mutatingwebhookconfigurations"))
    with pytest.raises(ConnectError):  # proxy pods are needed
        asyncio.run(observe(tenant, NS))
