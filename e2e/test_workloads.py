"""Kubernetes' built-in controllers drive elected pods as they drive their own: Jobs (parallel,
indexed, with a backoff limit, with a pod failure policy), CronJobs, StatefulSets, Deployments
rolling out and ReplicaSets scaled to zero and back. The controllers see only proxy pods; what
they decide on (phase, readiness, exit codes) is the delegates', mirrored."""

from __future__ import annotations

import json
import re

from e2e.scenarios import (
    SOURCE,
    TARGET,
    PodEvents,
    delegates_of,
    finished,
    get,
    job,
    live,
    pod_template,
    proxies_of,
    ready,
    replicated,
    running_and_ready,
    timed,
)
from multicluster_scheduler.api.keys import PREFIX
from testbed import wait_for
from testbed.kubectl import Kubectl

INDEX = "batch.kubernetes.io/job-completion-index"
FIELD = re.compile(r"metadata\.(labels|annotations)\['([^']+)'\]")


def by_parent(kubectl: Kubectl, namespace: str, selector: str) -> dict[str, dict]:
    """Delegates of the selected proxy pods, in either cluster, by their proxy pod's uid."""
    found = delegates_of(kubectl, namespace, selector)
    return {
        d["metadata"]["labels"][PREFIX + "parent-uid"]: d for d in found[SOURCE] + found[TARGET]
    }


def test_a_parallel_job_counts_every_completion(workloads, kubectl: Kubectl):
    namespace, _ = workloads
    with (
        PodEvents(kubectl, namespace, "job-name=batch") as events,
        timed("Job, parallelism 3, completions 6, complete"),
    ):
        kubectl.apply(SOURCE, job("batch", parallelism=3, completions=6), "-n", namespace)
        wait_for(
            lambda: (finished(kubectl, namespace, "batch") or {}).get("type") == "Complete",
            120,
            what="the Job complete",
        )
    most = max(len(live(list(current.values()))) for _, current in events.states())
    assert get(kubectl, SOURCE, "job", "batch", namespace)["status"]["succeeded"] == 6
    found = proxies_of(kubectl, namespace, "job-name=batch")
    assert [p["status"]["phase"] for p in found] == ["Succeeded"] * 6
    assert most == 3, f"{most} pods ran at once, parallelism is 3"
    placed = by_parent(kubectl, namespace, "job-name=batch")
    assert set(placed) == {p["metadata"]["uid"] for p in found}, "one delegate per proxy pod"
    assert all(d["status"]["phase"] == "Succeeded" for d in placed.values())
    spread = delegates_of(kubectl, namespace, "job-name=batch")
    print(f"delegates: {len(spread[SOURCE])} in {SOURCE}, {len(spread[TARGET])} in {TARGET}")


def field_value(pod: dict, path: str) -> str | None:
    """What the downward API gives a container for ``metadata.labels['k']`` (or annotations)
    of ``pod``: the kubelet in the target resolves it against the delegate."""
    match = FIELD.fullmatch(path)
    assert match, f"unexpected field path {path}"
    return (pod["metadata"].get(match[1]) or {}).get(match[2])


def test_an_indexed_job_gives_each_delegate_its_proxy_pods_index(workloads, kubectl: Kubectl):
    namespace, _ = workloads
    manifest = job("indexed", completions=3, parallelism=3, completionMode="Indexed")
    with timed("Indexed Job, 3 completions, complete"):
        kubectl.apply(SOURCE, manifest, "-n", namespace)
        wait_for(
            lambda: (finished(kubectl, namespace, "indexed") or {}).get("type") == "Complete",
            120,
            what="the Job complete",
        )
    assert get(kubectl, SOURCE, "job", "indexed", namespace)["status"]["completedIndexes"] == "0-2"
    placed = by_parent(kubectl, namespace, "job-name=indexed")
    indexes = []
    for proxy in proxies_of(kubectl, namespace, "job-name=indexed"):
        index = proxy["metadata"]["annotations"][INDEX]
        assert proxy["metadata"]["labels"][INDEX] == index
        indexes.append(index)
        delegate = placed[proxy["metadata"]["uid"]]
        assert delegate["metadata"]["annotations"][INDEX] == index
        assert delegate["metadata"]["labels"][PREFIX + "job-completion-index"] == index
        assert delegate["spec"]["hostname"] == f"indexed-{index}"
        (env,) = [
            e
            for e in delegate["spec"]["containers"][0]["env"]
            if e["name"] == "JOB_COMPLETION_INDEX"
        ]
        path = env["valueFrom"]["fieldRef"]["fieldPath"]
        assert field_value(delegate, path) == index, f"JOB_COMPLETION_INDEX from {path}"
    assert sorted(indexes) == ["0", "1", "2"]


def test_a_job_that_keeps_failing_stops_at_its_backoff_limit(workloads, kubectl: Kubectl):
    namespace, _ = workloads
    with timed("Job, backoffLimit 2, pods failing, Failed"):
        kubectl.apply(SOURCE, job("flaky", exit_code=1, backoffLimit=2), "-n", namespace)
        wait_for(lambda: finished(kubectl, namespace, "flaky"), 120, what="the Job finished")
    condition = finished(kubectl, namespace, "flaky")
    assert condition
    assert (condition["type"], condition["reason"]) == ("Failed", "BackoffLimitExceeded")
    assert get(kubectl, SOURCE, "job", "flaky", namespace)["status"]["failed"] == 3
    found = proxies_of(kubectl, namespace, "job-name=flaky")
    assert [p["status"]["phase"] for p in found] == ["Failed"] * 3, "backoffLimit + 1 pods"
    placed = by_parent(kubectl, namespace, "job-name=flaky")
    assert set(placed) == {p["metadata"]["uid"] for p in found}
    assert all(d["status"]["phase"] == "Failed" for d in placed.values()), "none left running"
    kubectl(SOURCE, "delete", "job", "flaky", "-n", namespace)
    wait_for(
        lambda: (
            not proxies_of(kubectl, namespace, "job-name=flaky")
            and not any(delegates_of(kubectl, namespace, "job-name=flaky").values())
        ),
        60,
        what="no proxy pod and no delegate left once the Job is deleted",
    )


def exit_code_rule(action: str) -> dict:
    return {
        "rules": [
            {
                "action": action,
                "onExitCodes": {"containerName": "main", "operator": "In", "values": [1]},
            }
        ]
    }


def failed(kubectl: Kubectl, namespace: str, name: str) -> list[dict]:
    """The Job's failed pods."""
    found = proxies_of(kubectl, namespace, f"job-name={name}")
    return [p for p in found if p["status"].get("phase") == "Failed"]


def test_a_pod_failure_policy_reads_the_delegates_exit_codes(workloads, kubectl: Kubectl):
    """The Job controller judges the proxy pod's container statuses: the delegate's, mirrored.
    ``FailJob`` on exit code 1 fails the Job at the first failure, backoffLimit or not;
    ``Ignore`` on it lets a Job with backoffLimit 0 outlive failure after failure."""
    namespace, _ = workloads
    fail = job("fail", exit_code=1, backoffLimit=6, podFailurePolicy=exit_code_rule("FailJob"))
    ignore = job("ignore", exit_code=1, backoffLimit=0, podFailurePolicy=exit_code_rule("Ignore"))
    with timed("Jobs with a pod failure policy, FailJob Failed and Ignore past 2 failures"):
        kubectl.apply(SOURCE, fail, "-n", namespace)
        kubectl.apply(SOURCE, ignore, "-n", namespace)
        wait_for(lambda: finished(kubectl, namespace, "fail"), 60, what="the Job failed")
        wait_for(
            lambda: len(failed(kubectl, namespace, "ignore")) >= 2,
            60,
            what="two failed pods of the Job that ignores exit code 1",
        )
    condition = finished(kubectl, namespace, "fail")
    assert condition
    assert (condition["type"], condition["reason"]) == ("Failed", "PodFailurePolicy")
    assert "exit code 1" in condition["message"]
    (proxy,) = proxies_of(kubectl, namespace, "job-name=fail")
    (status,) = proxy["status"]["containerStatuses"]
    assert status["state"]["terminated"]["exitCode"] == 1
    assert finished(kubectl, namespace, "ignore") is None
    assert not get(kubectl, SOURCE, "job", "ignore", namespace)["status"].get("failed")


def cronjob(name: str, schedule: str) -> dict:
    return {
        "apiVersion": "batch/v1",
        "kind": "CronJob",
        "metadata": {"name": name},
        "spec": {
            "schedule": schedule,
            "successfulJobsHistoryLimit": 1,
            "concurrencyPolicy": "Forbid",
            "jobTemplate": {
                "spec": {
                    "backoffLimit": 0,
                    "template": pod_template(exit_code=0, restartPolicy="Never"),
                }
            },
        },
    }


def test_a_cronjob_runs_again_and_keeps_one_successful_job(workloads, kubectl: Kubectl):
    """Kubernetes accepts robfig/cron's ``@every`` form and its CronJob controller supports it:
    a run every 20 seconds instead of every minute. Its Jobs are named after the minute of
    their run, so runs in the same minute are one Job: the second Job comes within 80 s."""
    namespace, _ = workloads
    seen: list[str] = []

    def jobs() -> list[dict]:
        found = kubectl.json(SOURCE, "get", "jobs", "-n", namespace)["items"]
        for item in found:
            if item["metadata"]["name"] not in seen:
                seen.append(item["metadata"]["name"])
        return found

    def second_run_done_and_first_gone() -> bool:
        found = jobs()
        return (
            len(seen) >= 2
            and [j["metadata"]["name"] for j in found] == [seen[-1]]
            and (finished(kubectl, namespace, seen[-1]) or {}).get("type") == "Complete"
        )

    with timed("CronJob, two runs complete and the first one's Job deleted"):
        kubectl.apply(SOURCE, cronjob("tick", "@every 20s"), "-n", namespace)
        wait_for(second_run_done_and_first_gone, 150, what="a second run, the first deleted")
    first, last = seen[0], seen[-1]
    cron = get(kubectl, SOURCE, "cronjob", "tick", namespace)
    assert cron["status"].get("lastSuccessfulTime")
    wait_for(
        lambda: (
            not proxies_of(kubectl, namespace, f"job-name={first}")
            and not any(delegates_of(kubectl, namespace, f"job-name={first}").values())
        ),
        30,
        what="the deleted Job's proxy pods and delegates gone",
    )
    (proxy,) = proxies_of(kubectl, namespace, f"job-name={last}")
    assert proxy["status"]["phase"] == "Succeeded"
    print(f"Jobs seen: {seen}")


def ordinal(pod: dict) -> int:
    return int(pod["metadata"]["name"].rsplit("-", 1)[1])


def order_violations(events: PodEvents, manual: str) -> list[str]:
    """What the API server's log of the StatefulSet's proxy pods shows against OrderedReady: a
    pod created before its predecessor was Ready; a pod deleted (the one deleted by hand, uid
    ``manual``, aside) while one of a higher ordinal existed, or while another was going."""
    found = []
    deleting: set[str] = set()
    for event, current in events.states():
        pod = event["object"]
        meta, n = pod["metadata"], ordinal(pod)
        if event["type"] == "ADDED" and n > 0:
            before = current.get(f"web-{n - 1}")
            if not (before and running_and_ready(before)):
                found.append(f"web-{n} created before web-{n - 1} was Ready")
        if meta.get("deletionTimestamp") and meta["uid"] != manual and meta["uid"] not in deleting:
            deleting.add(meta["uid"])
            if any(ordinal(p) > n for p in current.values()):
                found.append(f"web-{n} deleted while {sorted(current)} existed")
            going = [p for p in current.values() if p["metadata"].get("deletionTimestamp")]
            if len(going) > 1:
                found.append(f"web-{n} deleted while {len(going) - 1} other went")
    return found


def test_a_statefulset_keeps_its_order_and_names_beside_a_namesake_in_the_target(
    workloads, kubectl: Kubectl
):
    namespace, _ = workloads
    # A StatefulSet of the same name in cluster2, not elected: its pods are web-0 and web-1.
    native = replicated("StatefulSet", "web", 2, serviceName="web")
    del native["spec"]["template"]["metadata"]["annotations"]
    kubectl.apply(TARGET, native, "-n", namespace)
    elected = replicated("StatefulSet", "web", 3, serviceName="web")
    elected["spec"]["podManagementPolicy"] = "OrderedReady"
    with PodEvents(kubectl, namespace, "app=web") as events:
        with timed("StatefulSet, 3 replicas created in order and Ready"):
            kubectl.apply(SOURCE, elected, "-n", namespace)
            wait_for(
                lambda: len(ready(proxies_of(kubectl, namespace, "app=web"))) == 3,
                90,
                what="3 replicas Ready",
            )
        found = proxies_of(kubectl, namespace, "app=web")
        assert [p["metadata"]["name"] for p in found] == ["web-0", "web-1", "web-2"]
        placed = by_parent(kubectl, namespace, "app=web")
        assert set(placed) == {p["metadata"]["uid"] for p in found}
        names = {d["metadata"]["name"] for d in placed.values()}
        assert not names & {"web-0", "web-1", "web-2"}
        for proxy in found:
            delegate = placed[proxy["metadata"]["uid"]]
            assert delegate["spec"]["hostname"] == proxy["metadata"]["name"]
        # The namesake in cluster2 runs its own two pods, and neither adopts the other's.
        wait_for(
            lambda: (
                get(kubectl, TARGET, "statefulset", "web", namespace)["status"].get("readyReplicas")
                == 2
            ),
            60,
            what="the StatefulSet in cluster2 Ready",
        )
        natives = kubectl.json(TARGET, "get", "pods", "-n", namespace, "-l", "app=web")["items"]
        assert sorted(p["metadata"]["name"] for p in natives) == ["web-0", "web-1"]
        assert all(running_and_ready(p) for p in natives)
        assert get(kubectl, SOURCE, "statefulset", "web", namespace)["status"]["replicas"] == 3

        # Stable identity: web-1 deleted comes back as web-1, with a delegate of its own.
        old = next(p for p in found if p["metadata"]["name"] == "web-1")["metadata"]["uid"]
        with timed("StatefulSet, web-1 deleted and back Ready"):
            kubectl(SOURCE, "delete", "pod", "web-1", "-n", namespace, "--wait=false")

            def replaced() -> dict | None:
                pod = get(kubectl, SOURCE, "pod", "web-1", namespace)
                fresh = pod["metadata"]["uid"] != old
                return pod if fresh and running_and_ready(pod) else None

            new = wait_for(replaced, 60, what="web-1 back, Ready")
        placed = by_parent(kubectl, namespace, "app=web")
        assert old not in placed
        assert placed[new["metadata"]["uid"]]["spec"]["hostname"] == "web-1"

        with timed("StatefulSet, scaled from 3 to 1"):
            kubectl(SOURCE, "scale", "statefulset", "web", "-n", namespace, "--replicas=1")
            wait_for(
                lambda: (
                    [p["metadata"]["name"] for p in proxies_of(kubectl, namespace, "app=web")]
                    == ["web-0"]
                    and len(by_parent(kubectl, namespace, "app=web")) == 1
                ),
                60,
                what="web-0 alone, with its delegate",
            )
    assert not order_violations(events, old)
    created = [e["object"]["metadata"]["name"] for e in events.events if e["type"] == "ADDED"]
    assert created == ["web-0", "web-1", "web-2", "web-1"]
    deleted = [e["object"]["metadata"]["name"] for e in events.events if e["type"] == "DELETED"]
    assert deleted == ["web-1", "web-2", "web-1"]
    assert len(kubectl.json(TARGET, "get", "pods", "-n", namespace, "-l", "app=web")["items"]) == 2


def test_a_rolling_update_never_has_fewer_ready_replicas_than_asked(workloads, kubectl: Kubectl):
    namespace, _ = workloads
    replicas = 4
    strategy = {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}}
    kubectl.apply(
        SOURCE, replicated("Deployment", "roll", replicas, strategy=strategy), "-n", namespace
    )
    wait_for(
        lambda: len(ready(proxies_of(kubectl, namespace, "app=roll"))) == replicas,
        60,
        what="4 replicas Ready",
    )
    before = {p["metadata"]["uid"] for p in proxies_of(kubectl, namespace, "app=roll")}
    patch = {"spec": {"template": {"metadata": {"annotations": {"rollout": "2"}}}}}
    with (
        PodEvents(kubectl, namespace, "app=roll") as events,
        timed("Deployment, rolling update of 4 replicas, maxUnavailable 0, maxSurge 1"),
    ):
        kubectl(SOURCE, "patch", "deployment", "roll", "-n", namespace, "-p", json.dumps(patch))
        status = kubectl.run(
            SOURCE, "rollout", "status", "deployment/roll", "-n", namespace, "--timeout=120s",
            check=False, timeout=150,
        )  # fmt: skip
    assert status.returncode == 0, status.stdout + status.stderr
    assert "successfully rolled out" in status.stdout
    fewest, most = events.extremes()
    assert fewest == replicas, f"{fewest} replicas Ready at one time during the rollout"
    assert most == replicas + 1, "maxSurge 1: one replica more at most, and used"
    wait_for(
        lambda: (
            len(live(proxies_of(kubectl, namespace, "app=roll"))) == replicas
            and sum(len(d) for d in delegates_of(kubectl, namespace, "app=roll").values())
            == replicas
        ),
        30,
        what="the old replicas and their delegates gone",
    )
    found = proxies_of(kubectl, namespace, "app=roll")
    assert not before & {p["metadata"]["uid"] for p in found}
    assert all(p["metadata"]["annotations"]["rollout"] == "2" for p in found)
    placed = by_parent(kubectl, namespace, "app=roll")
    assert set(placed) == {p["metadata"]["uid"] for p in found}
    assert all(d["metadata"]["annotations"]["rollout"] == "2" for d in placed.values())


def test_a_replicaset_scaled_to_zero_and_back(workloads, kubectl: Kubectl):
    namespace, _ = workloads
    replicas = 4

    def running(count: int) -> bool:
        found = proxies_of(kubectl, namespace, "app=rs")
        placed = delegates_of(kubectl, namespace, "app=rs")
        return (
            len(found) == count
            and len(ready(found)) == count
            and sum(len(d) for d in placed.values()) == count
        )

    with timed("ReplicaSet, 4 replicas Running"):
        kubectl.apply(SOURCE, replicated("ReplicaSet", "rs", replicas), "-n", namespace)
        wait_for(lambda: running(replicas), 60, what="4 replicas Running")
    with timed("ReplicaSet, scaled to 0, every proxy pod and delegate gone"):
        kubectl(SOURCE, "scale", "replicaset", "rs", "-n", namespace, "--replicas=0")
        wait_for(
            lambda: (
                not proxies_of(kubectl, namespace, "app=rs")
                and not any(
                    kubectl.json(c, "get", "pods", "-n", namespace, "-l", PREFIX + "app=rs")[
                        "items"
                    ]
                    for c in (SOURCE, TARGET)
                )
            ),
            60,
            what="no proxy pod and no delegate",
        )
    with timed("ReplicaSet, scaled back to 4, Running"):
        kubectl(SOURCE, "scale", "replicaset", "rs", "-n", namespace, f"--replicas={replicas}")
        wait_for(lambda: running(replicas), 60, what="4 replicas Running again")
    placed = by_parent(kubectl, namespace, "app=rs")
    assert set(placed) == {p["metadata"]["uid"] for p in proxies_of(kubectl, namespace, "app=rs")}
