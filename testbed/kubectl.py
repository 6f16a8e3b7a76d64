"""Drive test-bed clusters the way users do: with the real kubectl and helm binaries."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any


class CommandError(RuntimeError):
    def __init__(self, argv: list[str], proc: subprocess.CompletedProcess) -> None:
        super().__init__(
            f"{' '.join(argv)} exited {proc.returncode}:\n{proc.stdout}{proc.stderr}".strip()
        )
        self.stderr = proc.stderr


class Kubectl:
    def __init__(self, kubeconfig: Path, bin_dir: Path) -> None:
        self.kubeconfig = kubeconfig
        self.bin_dir = bin_dir

    def env(self) -> dict[str, str]:
        return dict(os.environ) | {
            "KUBECONFIG": str(self.kubeconfig),
            "PATH": f"{self.bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
        }

    def run(
        self,
        context: str,
        *args: str,
        stdin: str | None = None,
        check: bool = True,
        timeout: float = 60,
    ) -> subprocess.CompletedProcess:
        argv = [str(self.bin_dir / "kubectl"), "--context", context, *args]
        proc = subprocess.run(
            argv, input=stdin, capture_output=True, text=True, env=self.env(), timeout=timeout
        )
        if check and proc.returncode != 0:
            raise CommandError(argv, proc)
        return proc

    def __call__(self, context: str, *args: str, **kwargs) -> str:
        return self.run(context, *args, **kwargs).stdout

    def json(self, context: str, *args: str) -> Any:
        return json.loads(self(context, *args, "-o", "json"))

    def apply(self, context: str, manifest: dict | str, *args: str) -> str:
        text = manifest if isinstance(manifest, str) else json.dumps(manifest)
        return self(context, "apply", "-f", "-", *args, stdin=text)

    def helm(self, context: str, *args: str, home: Path) -> str:
        argv = [str(self.bin_dir / "helm"), "--kube-context", context, *args]
        env = self.env() | {
            "HELM_CACHE_HOME": str(home / "cache"),
            "HELM_CONFIG_HOME": str(home / "config"),
            "HELM_DATA_HOME": str(home / "data"),
        }
        proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120)
        if proc.returncode != 0:
            raise CommandError(argv, proc)
        return proc.stdout
