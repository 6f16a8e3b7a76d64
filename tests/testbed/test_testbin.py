"""The pieces of the test-bed build that need no Go: pins, replaces and version stamping."""

from __future__ import annotations

import hashlib
import json
import textwrap

import pytest

from testbed.testbin import builder as testbin

GOMOD = textwrap.dedent(
    """\
    module k8s.io/kubernetes

    require (
    \tgithub.com/spf13/cobra v1.10.0
    \tk8s.io/api v0.0.0
    \tk8s.io/client-go v0.0.0
    \tk8s.io/kms v0.0.0
    )

    replace (
    \tk8s.io/api => ./staging/src/k8s.io/api
    \tk8s.io/client-go => ./staging/src/k8s.io/client-go
    \tk8s.io/kms => ./staging/src/k8s.io/kms
    \tk8s.io/sample-cli-plugin => ./staging/src/k8s.io/sample-cli-plugin
    )
    """
)


def test_staging_replaces_cover_required_staging_modules_only():
    assert testbin.staging_replaces(GOMOD, "v0.36.3") == [
        "\tk8s.io/api => k8s.io/api v0.36.3",
        "\tk8s.io/client-go => k8s.io/client-go v0.36.3",
        "\tk8s.io/kms => k8s.io/kms v0.36.3",
    ]


def test_pins_name_every_component_the_test_bed_runs():
    tools = {t.name: t for t in testbin.load_pins()}
    assert set(tools) == {"kubernetes", "etcd", "kwok", "helm"}
    kubernetes = tools["kubernetes"]
    assert kubernetes.version.startswith("v1.36.")
    assert kubernetes.staging_version == "v0." + kubernetes.version[3:]
    commands = {p.rsplit("/", 1)[1] for p in kubernetes.packages}
    assert commands == {"kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl"}
    assert tools["etcd"].version.startswith("v3.6.")
    assert tools["kwok"].stages, "kwok v0.8 ships no default stages"


def test_kubernetes_binaries_carry_their_version():
    tool = next(t for t in testbin.load_pins() if t.name == "kubernetes")
    flags = testbin.ldflags(tool).split(" -X ")
    for pkg in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version"):
        assert f"{pkg}.gitVersion={tool.version}" in flags
        assert f"{pkg}.gitMajor=1" in flags
        assert f"{pkg}.gitMinor=36" in flags
    helm = next(t for t in testbin.load_pins() if t.name == "helm")
    assert testbin.ldflags(helm).endswith(
        f"-X helm.sh/helm/v3/internal/version.version={helm.version}"
    )


def test_a_version_that_is_not_semantic_is_refused():
    tool = testbin.Tool(name="x", module="example.com/x", version="main", packages=[])
    with pytest.raises(testbin.BuildError, match=r"vMAJOR\.MINOR\.PATCH"):
        testbin.ldflags(tool)


def test_bin_dir_changes_with_any_pin(monkeypatch, tmp_path):
    monkeypatch.setenv("MCS_TESTBIN_CACHE", str(tmp_path))
    tools = testbin.load_pins()
    first = testbin.bin_dir(tools, "go1.26.0")
    bumped = [testbin.Tool(**{**t.__dict__, "stamp": {}}) if t.name == "helm" else t for t in tools]
    assert testbin.bin_dir(bumped, "go1.26.0") != first
    assert testbin.bin_dir(tools, "go1.27.0") != first
    assert testbin.bin_dir(tools, "go1.26.0") == first
    assert first.parent == tmp_path


def test_real_node_tools_are_a_group_of_their_own():
    tools = {t.name: t for t in testbin.load_pins(group="real-node")}
    assert set(tools) == {"kubelet", "containerd"}
    kubernetes = next(t for t in testbin.load_pins() if t.name == "kubernetes")
    assert tools["kubelet"].version == kubernetes.version, "kubelet matches the control plane"
    assert tools["kubelet"].packages == ["k8s.io/kubernetes/cmd/kubelet"]
    commands = {p.rsplit("/", 1)[1] for p in tools["containerd"].packages}
    assert commands == {"containerd", "containerd-shim-runc-v2", "ctr"}
    assert tools["containerd"].version.startswith("v2.")


def test_a_group_changes_neither_a_tools_cache_key_nor_the_test_beds_folder(monkeypatch, tmp_path):
    monkeypatch.setenv("MCS_TESTBIN_CACHE", str(tmp_path))
    tool = testbin.Tool(name="x", module="example.com/x", version="v1.0.0", packages=["a"])
    grouped = testbin.Tool(**{**tool.__dict__, "group": "real-node"})
    assert grouped.fingerprint() == tool.fingerprint()
    assert testbin.bin_dir(group="real-node", gover="go1.26.0") != testbin.bin_dir(gover="go1.26.0")


def test_argo_is_a_group_of_its_own_with_its_crds():
    tools = {t.name: t for t in testbin.load_pins(group="argo")}
    assert set(tools) == {"argo-workflows", "argoexec"}
    controller, executor = tools["argo-workflows"], tools["argoexec"]
    assert executor.version == controller.version, "the executor matches its controller"
    assert controller.packages == ["github.com/argoproj/argo-workflows/v4/cmd/workflow-controller"]
    assert executor.packages == ["github.com/argoproj/argo-workflows/v4/cmd/argoexec"]
    kinds = {path.rsplit("_", 1)[1].removesuffix(".yaml") for path in controller.crds}
    assert {"workflows", "workflowtaskresults", "workflowtemplates", "cronworkflows"} <= kinds
    assert testbin.ldflags(controller).endswith(
        f"-X github.com/argoproj/argo-workflows/v4.version={controller.version}"
    )


def test_symlinks_a_module_zip_left_out_are_restored_in_a_copy(tmp_path):
    module = tmp_path / "cache" / "m@v1.0.0"
    (module / "os").mkdir(parents=True)
    (module / "os" / "signal_darwin.go").write_text("package os\n")
    for path in (module / "os" / "signal_darwin.go", module / "os", module):
        path.chmod(0o555 if path.is_dir() else 0o444)  # as the module cache keeps them
    copy = testbin._with_symlinks(
        module, tmp_path / "module", {"os/signal_linux.go": "signal_darwin.go"}
    )
    assert (copy / "os" / "signal_linux.go").read_text() == "package os\n"
    assert not (module / "os" / "signal_linux.go").exists()
    with pytest.raises(testbin.BuildError, match="no such file"):
        testbin._with_symlinks(module, tmp_path / "again", {"os/x.go": "missing.go"})
    with pytest.raises(testbin.BuildError, match="in the module already"):
        testbin._with_symlinks(module, tmp_path / "third", {"os/signal_darwin.go": "x.go"})


def test_a_tool_without_crds_keeps_the_cache_key_it_had_before_crds_existed():
    tool = testbin.Tool(name="x", module="example.com/x", version="v1.0.0", packages=["a"])
    before = {k: v for k, v in tool.__dict__.items() if k not in ("group", "crds", "symlinks")}
    expected = hashlib.sha256(json.dumps(before, sort_keys=True).encode()).hexdigest()[:8]
    assert tool.fingerprint() == expected
    with_crds = testbin.Tool(**{**tool.__dict__, "crds": ["crd.yaml"]})
    assert with_crds.fingerprint() != tool.fingerprint()


def test_binaries_built_once_are_found_without_go(monkeypatch, tmp_path):
    monkeypatch.setenv("MCS_TESTBIN_CACHE", str(tmp_path))
    tools = testbin.load_pins()

    def no_go() -> str:
        raise testbin.BuildError("go is not installed: the test bed is built from Go modules")

    monkeypatch.setattr(testbin, "go_version", no_go)
    with pytest.raises(testbin.BuildError, match="go is not installed"):
        testbin.bin_dir(tools)
    for gover, complete in (("go1.25.1", True), ("go1.26.8", False)):
        folder = tmp_path / f"bin-{testbin._bin_key(tools, gover)}"
        folder.mkdir()
        (folder / "versions.json").write_text(json.dumps({"go": gover}))
        if complete:
            (folder / ".complete").touch()
    assert testbin.bin_dir(tools) == tmp_path / f"bin-{testbin._bin_key(tools, 'go1.25.1')}"
    assert testbin.build(group="") == testbin.bin_dir(tools)
