"""The header a results table carries: hardware, date, commit and command.

docs/results.md asks every number for where, when, at which commit and by which command
it was measured; a bench that prints them with its table cannot get them wrong later.
"""

from __future__ import annotations

import os
import platform
import subprocess
from dataclasses import dataclass
from datetime import UTC, datetime

import psutil

from core.paths import ROOT


@dataclass(frozen=True)
class RunHeader:
    hardware: str
    date_utc: str
    commit: str
    command: str

    def markdown(self) -> str:
        return (f"> **Hardware:** {self.hardware}. **Command:** `{self.command}`. "
                f"**Commit / date:** `{self.commit}`, {self.date_utc}.")


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.partition(":")[2].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _commit() -> str:
    """HEAD's short hash, marked when tracked files differ from it (the run measured those)."""
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()

    try:
        head = git("rev-parse", "--short", "HEAD")
        return head + (" + uncommitted changes" if git("status", "--porcelain", "--untracked-files=no") else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown (no git checkout)"


def run_header(command: str, software: str = "") -> RunHeader:
    """This machine, now, this checkout; `software` adds e.g. the engine's version."""
    memory_gib = psutil.virtual_memory().total / 2**30
    hardware = f"{_cpu_model()}, {os.cpu_count()} cores, {memory_gib:.0f} GiB RAM"
    return RunHeader(hardware + (f"; {software}" if software else ""),
                     datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"), _commit(), command)
