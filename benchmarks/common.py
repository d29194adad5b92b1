"""What the benchmarks share: memory and CPU readings from /proc, the CPU's name, and writing RESULTS.md."""

from __future__ import annotations

import os
import platform
import re
from pathlib import Path


def memory_mib() -> dict[str, float]:
    """Current (``VmRSS``) and peak (``VmHWM``) resident set size of this process, in MiB."""
    fields = {}
    with open("/proc/self/status") as status:
        for line in status:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                fields[key] = int(value.split()[0]) / 1024  # kB
    return {"rss": fields["VmRSS"], "peak": fields["VmHWM"]}


def busy_cpu_seconds() -> float:
    """CPU seconds all processes of the machine have used since boot (``/proc/stat``, idle and iowait excluded)."""
    with open("/proc/stat") as stat:
        user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in stat.readline().split()[1:9])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def cpu_name() -> str:
    """The CPU's model name from ``/proc/cpuinfo``."""
    with open("/proc/cpuinfo") as info:
        names = [line.split(":", 1)[1].strip() for line in info if line.startswith("model name")]
    return f'"{names[0]}"' if names else platform.machine()


def update_results(path: Path, section: str, title: str, body: str) -> None:
    """Put ``### title`` + ``body`` into the ``section`` (a ``## `` heading line) of ``path``, replacing a
    subsection of the same title; the section is appended at the end when absent. Other sections stay as they are."""
    text = path.read_text() if path.exists() else "# Benchmark results\n"
    block = f"### {title}\n\n{body.strip()}\n"
    start = text.find(section)
    if start < 0:
        path.write_text(f"{text.rstrip()}\n\n{section}\n\n{block}")
        return
    following = re.search(r"^## ", text[start + len(section) :], flags=re.MULTILINE)
    end = start + len(section) + following.start() if following else len(text)
    section = text[start:end].rstrip()
    old = re.search(rf"^### {re.escape(title)}\n.*?(?=^### |\Z)", section, flags=re.MULTILINE | re.DOTALL)
    section = section[: old.start()] + block + "\n" + section[old.end() :] if old else f"{section}\n\n{block}"
    rest = text[end:]
    path.write_text(text[:start] + section.rstrip() + "\n" + ("\n" + rest if rest else ""))
