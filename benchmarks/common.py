"""What the benchmarks share: memory and CPU readings from /proc, the CPU's name and flags, workers in their own
process, TRL's view of the env's problems and reward, and writing RESULTS.md."""

from __future__ import annotations

import json
import os
import platform
import re
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


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


def cpu_flags() -> str:
    """The CPU's matrix and vector flags that decide its float32 and bf16 speed (AVX2, AVX-512, AMX), from
    ``/proc/cpuinfo``; ``"none of ..."`` when it has none of them."""
    wanted = ("avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16", "amx_int8")
    with open("/proc/cpuinfo") as info:
        flags = next((line.split(":", 1)[1].split() for line in info if line.startswith("flags")), [])
    present = [flag for flag in wanted if flag in flags]
    return ", ".join(present) if present else f"none of {', '.join(wanted)}"


def usage() -> tuple[float, float, float]:
    """Now: wall seconds, the CPU seconds of this process and of the workers it ran (children waited for, as
    :func:`run_worker` does), the machine's busy CPU seconds (for :func:`others_share`)."""
    times = os.times()
    return time.perf_counter(), time.process_time() + times.children_user + times.children_system, busy_cpu_seconds()


def others_share(start: tuple[float, float, float], end: tuple[float, float, float]) -> float:
    """The share of the machine's CPUs that other processes used between two :func:`usage` readings: the noise
    on a timing made on a shared machine (0: the machine was ours alone)."""
    (wall0, own0, machine0), (wall1, own1, machine1) = start, end
    others = (machine1 - machine0) - (own1 - own0)
    return max(0.0, others) / (max(wall1 - wall0, 1e-9) * (os.cpu_count() or 1))


def run_worker(script: str, name: str, settings: dict[str, Any]) -> dict[str, Any]:
    """Run ``script --worker name --settings <json>`` in a fresh interpreter (its own memory, threads and imports);
    its result comes back as JSON on the last line of its stdout."""
    command = [sys.executable, script, "--worker", name, "--settings", json.dumps(settings)]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        sys.stderr.write(done.stdout + done.stderr)
        raise SystemExit(f"the {name} worker failed (exit {done.returncode})")
    return json.loads(done.stdout.strip().splitlines()[-1])


def trl_dataset(env: Any, problems: list[Any], group_size: int = 8) -> tuple[Any, Callable[..., list[float]]]:
    """A ``datasets.Dataset`` of ``problems`` for TRL's ``GRPOTrainer`` (the env's prompt text, the answer, the
    problem's index) and a TRL reward function that gives each completion the env's composite reward for its
    problem (``score_completion`` of the completion's ids, padded like an action). ``env``: an unwrapped
    ``R1ZeroEnv``."""
    import numpy as np
    from datasets import Dataset

    dataset = Dataset.from_dict(
        {
            "prompt": [env.formatter.prompt(problem.prompt) for problem in problems],
            "answer": [problem.answer for problem in problems],
            "problem_id": list(range(len(problems))),
        }
    )

    def composite_reward(completion_ids: list[list[int]], problem_id: list[int], **_: Any) -> list[float]:
        """The env's reward (``reset`` with the problem + ``step`` of the completion, padded like an action); each
        call's :func:`rollout_stats` are appended to ``composite_reward.history``."""
        rewards, infos = [], []
        for ids, index in zip(completion_ids, problem_id, strict=True):
            action = np.full(env.max_new_tokens, env.codec.pad_id, dtype=np.int64)
            action[: len(ids)] = ids
            _, reward, _, _, info = env.score_completion(problems[index], action)
            rewards.append(reward)
            infos.append(info)
        lengths = [len(ids) for ids in completion_ids]
        composite_reward.history.append(rollout_stats(rewards, infos, lengths, group_size))
        return rewards

    composite_reward.history = []
    return dataset, composite_reward


def rollout_stats(
    rewards: list[float], infos: list[dict[str, Any]], lengths: list[int], group_size: int = 8
) -> dict[str, float]:
    """One rollout's training figures, the same for both trainers: success rate, mean reward, the share of
    well-formed completions (syntax credit), the mean completion length in tokens (EOS included), and the
    advantages' raw material: the mean within-group reward std and the share of groups whose rewards are all
    equal (rewards in group order, ``group_size`` each)."""
    import numpy as np

    syntax = [(info.get("reward_components") or {}).get("syntax") or 0.0 for info in infos]
    groups = np.asarray(rewards, dtype=float).reshape(-1, group_size) if len(rewards) % group_size == 0 else None
    return {
        "group_reward_std": float(groups.std(axis=1, ddof=1).mean()) if groups is not None else float("nan"),
        "frac_uniform_groups": float((np.ptp(groups, axis=1) == 0).mean()) if groups is not None else float("nan"),
        "success": float(np.mean([bool(info.get("is_success")) for info in infos])),
        "reward": float(np.mean(rewards)),
        "well_formed": float(np.mean([value > 0 for value in syntax])),
        "length": float(np.mean(lengths)),
    }


def record_optimizer_steps(history: list[dict[str, float]]) -> Callable[[], None]:
    """Append, at every optimizer step of this process (any trainer's: torch's global step hooks), the clipped
    gradient's norm, the size of the step ``||theta_new - theta_old||``, and Adam's state after it (the norm of the
    first moment, the mean of the second) to ``history``; returns a function that removes the hooks."""
    import torch
    from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

    before: dict[int, list[Any]] = {}

    def pre(optimizer: Any, *_: Any) -> None:
        params = [p for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
        before[id(optimizer)] = [p.detach().clone() for p in params]

    def post(optimizer: Any, *_: Any) -> None:
        params = [p for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
        old = before.pop(id(optimizer), None)
        if not params or old is None:
            return
        grads = torch.cat([p.grad.detach().flatten().float() for p in params])
        step = torch.cat([(p.detach() - q).flatten().float() for p, q in zip(params, old, strict=True)])
        states = [optimizer.state.get(p, {}) for p in params]
        first = [s["exp_avg"].flatten() for s in states if "exp_avg" in s]
        second = [s["exp_avg_sq"].flatten() for s in states if "exp_avg_sq" in s]
        history.append(
            {
                "clipped_grad_norm": float(grads.norm()),
                "step_norm": float(step.norm()),
                "adam_m_norm": float(torch.cat(first).norm()) if first else float("nan"),
                "adam_v_mean": float(torch.cat(second).mean()) if second else float("nan"),
                "lr": float(optimizer.param_groups[0]["lr"]),
            }
        )

    handles = [
        register_optimizer_step_pre_hook(pre),
        register_optimizer_step_post_hook(post),
    ]
    return lambda: [handle.remove() for handle in handles]
