"""``python -m multicluster_scheduler.webhook.child``: the agent's webhook process.

Started by the agent (``server.WebhookProcess``), never by hand. It serves the webhook on its own
event loop, so admissions never wait behind the agent's controllers; counts its answers in a
small memory-mapped file the agent exports as metrics; gives its heap back to the system after
bursts of connections (``heap``); reads the key that seals saved manifests as the first line of
its stdin (base64), before it listens; prints ``started`` once it listens; reads
``{"reload": [CERT, KEY]}`` lines (JSON) on stdin; and exits when stdin closes (the agent
stops: requests in flight are answered first). If the agent dies at once (killed, out of
memory), so does the child, on Linux, as the two would in one container: a webhook whose agent
is gone must not go on answering. Ctrl-C on a terminal is the agent's to handle: the child
ignores SIGINT.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import binascii
import ctypes
import json
import logging
import mmap
import os
import signal
import sys
from pathlib import Path

from multicluster_scheduler.api.manifest_mac import KEY_BYTES, ManifestKey
from multicluster_scheduler.webhook import heap
from multicluster_scheduler.webhook.app import RESULTS, WebhookServer, smaller_tls_buffers

log = logging.getLogger("multicluster_scheduler.webhook.server")
TLS_READ_SIZE = 16 * 1024  # per connection, of which the API server opens hundreds in a burst


async def serve(args: argparse.Namespace, counts: memoryview) -> None:
    index = {result: i for i, result in enumerate(RESULTS)}

    def count(result: str) -> None:
        counts[index[result]] += 1

    loop = asyncio.get_running_loop()
    stdin = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(stdin), sys.stdin)
    key = manifest_key(await stdin.readline())
    if key is None:
        log.error("no manifest key on stdin: not serving")
        return
    cert_file, key_file = Path(args.cert_file), Path(args.key_file)
    server = WebhookServer(args.host, args.port, cert_file, key_file, count, key)

    def started() -> None:
        sys.stdout.write("started\n")
        sys.stdout.flush()

    server.server.on_started = started

    async def control() -> None:
        try:
            while line := await stdin.readline():
                try:
                    cert_file, key_file = json.loads(line)["reload"]
                    server.reload_certificate(Path(cert_file), Path(key_file))
                    log.info("webhook certificate reloaded")
                except Exception:  # a bad file or line must not end the control loop
                    log.exception("webhook certificate not reloaded")
        finally:
            server.server.should_exit = True  # the agent is gone, or stopping

    listening = asyncio.create_task(control())
    malloc = heap.glibc_heap()
    trimming = None
    if malloc is not None:
        trimming = asyncio.create_task(heap.trim_after_bursts(malloc.trim, malloc.in_use))
    try:
        await server.serve()
    finally:
        listening.cancel()
        if trimming is not None:
            trimming.cancel()


def manifest_key(line: bytes) -> ManifestKey | None:
    """The key of the first line of stdin (base64), or None when it holds none (the line is
    never shown: it is the key)."""
    try:
        secret = base64.b64decode(line.strip(), validate=True)
    except (binascii.Error, ValueError):
        return None
    return ManifestKey(secret) if len(secret) >= KEY_BYTES else None


PR_SET_PDEATHSIG = 1


def die_with(parent: int) -> None:
    """SIGKILL when ``parent`` dies (Linux); gone already, exit now."""
    prctl = getattr(ctypes.CDLL(None), "prctl", None)
    if prctl is not None:
        prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:
        os._exit(0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m multicluster_scheduler.webhook.child")
    parser.add_argument("--host", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--cert-file", required=True)
    parser.add_argument("--key-file", required=True)
    parser.add_argument(
        "--counts-fd", type=int, required=True, help="inherited file of the answer counters"
    )
    parser.add_argument("--log-level", default="info")
    parser.add_argument("--parent-pid", type=int, help="the agent's: the child dies with it")
    args = parser.parse_args(argv)
    if args.parent_pid:
        die_with(args.parent_pid)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s %(message)s"
    )
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    smaller_tls_buffers(TLS_READ_SIZE)
    counts = memoryview(mmap.mmap(args.counts_fd, 8 * len(RESULTS))).cast("Q")
    asyncio.run(serve(args, counts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
