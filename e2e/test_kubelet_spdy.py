"""``kubectl exec`` and ``attach`` on proxy pods when the API server streams to kubelets over
SPDY, as API servers before 1.36 do: here the virtual nodes do not declare
``ExtendWebSocketsToKubelet``, so the 1.36 API server translates kubectl's WebSocket to SPDY
for them, as an older one would."""

from __future__ import annotations

import pytest

from e2e.scenarios import SOURCE
from e2e.test_kubelet_api import (  # noqa: F401  (tests and fixtures run here too)
    placed,
    test_errors_read_well,
    test_kubectl_attach_connects,
    test_kubectl_exec_runs_there_with_output_and_exit_code,
    test_kubectl_logs_returns_the_delegates_output,
)
from testbed import TestBed
from testbed.kubectl import Kubectl


@pytest.fixture(scope="module")
def installation(testbed: TestBed):
    from testbed.install import Installation

    install = Installation(testbed, agent_args=("--kubelet-websockets=false",))
    install.install()
    install.start_agents()
    yield install
    if install.installed:
        install.uninstall()


def test_the_api_server_translates_to_spdy_for_nodes_that_do_not_declare_websockets(
    placed,  # noqa: F811
    kubectl: Kubectl,
    installation,
):
    namespace, _, node = placed
    status = kubectl.json(SOURCE, "get", "node", node)["status"]
    assert "ExtendWebSocketsToKubelet" not in (status.get("declaredFeatures") or [])
    ran = kubectl.run(SOURCE, "exec", "debug-me", "-n", namespace, "-c", "main", "--", "true")
    assert ran.returncode == 0
    log = "".join(installation.agent_log(a) for a in installation.agents[SOURCE])
    assert "(SPDY) upstream=v5.channel.k8s.io" in log
