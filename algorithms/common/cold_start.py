"""The cold-start stage: supervised fine-tuning on gold solutions before RL.

Targets are checked: a task problem without gold reasoning (a data row without ``solution``, most reasoning-gym
families) gets the env's stand-in reasoning (``<think>The answer is X.</think>``) so the target stays well formed,
and a warning says how many examples had one; ``sft_data`` responses that do not follow the template are counted
and warned about too. A task that gives no gold answer at all (some reasoning-gym families) fails with an error
that asks for ``sft_data``.

Whether a model needs the stage: ``cold_start="auto"`` runs it for a built-in model (a fresh initialisation) and not
for a model from a folder or hub name, taken as pretrained. A folder can hold an untrained model too (one saved right
after ``from_config``): :func:`check_pretrained` measures how well the model predicts the task's gold solutions and
warns, naming ``cold_start=True``, when it does no better than a uniform guess over its vocabulary."""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import torch as th

from algorithms.common.generation.sampler import position_ids_from_mask
from algorithms.common.losses import aggregate
from algorithms.common.progress import progress
from algorithms.common.rollout.batch import left_pad, right_pad
from algorithms.common.runtime.sharding import clip_grad_norm
from grpo_gym.gold import ENV_TOKEN, TURN_END, episode_turns
from grpo_gym.rewards import parse_completion
from grpo_gym.tasks.base import HELD_OUT_SEED
from grpo_gym.validation import MAX_LINE_BYTES, read_lines, user_stacklevel


def load_sft_rows(path: str | os.PathLike, max_line_bytes: int = MAX_LINE_BYTES) -> list[tuple[str, str]]:
    """Read ``(prompt, response)`` pairs from a JSONL file of ``{"prompt": ..., "response": ...}`` rows.

    The file must be UTF-8 with lines of at most ``max_line_bytes`` bytes (16 MiB by default,
    :data:`grpo_gym.validation.MAX_LINE_BYTES`); a longer line, a line that is not UTF-8 or not such an object
    is a ``ValueError`` naming the file and the line.

    :param path: the JSONL file
    :param max_line_bytes: the longest accepted line, in bytes
    """
    rows = []
    for number, line in read_lines(path, max_line_bytes=max_line_bytes, what="sft_data file"):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            fields = (row.get("prompt"), row.get("response")) if isinstance(row, dict) else (None, None)
            if not all(isinstance(field, str) for field in fields):
                raise TypeError("'prompt' and 'response' must be strings")
            rows.append((row["prompt"], row["response"]))
        except (json.JSONDecodeError, RecursionError, TypeError) as error:
            raise ValueError(
                f"{path}:{number}: each line must be a JSON object with 'prompt' and 'response' "
                f"({type(error).__name__}: {error})"
            ) from None
    if not rows:
        raise ValueError(f"sft_data file {path!r} holds no rows")
    return rows


def sft_examples(env: Any, n: int, data: list[tuple[str, str]] | None, rng: np.random.Generator) -> list[Any]:
    """Tokenized examples: ``n`` from ``data`` rows (sampled with ``rng``), or the env task's gold solutions, ``n``
    model turns of them (with tools, one whole episode per example: :mod:`grpo_gym.gold`)."""
    if data is None:
        episodes = env.has_attr("tools") and env.get_attr("tools", indices=[0])[0] is not None
        return env.env_method("gold_examples", n, None, episodes, indices=[0])[0]
    picks = rng.integers(len(data), size=n)
    return [env.env_method("encode_example", *data[i], indices=[0])[0] for i in picks]


def supervised_finetune(
    policy: Any,
    env: Any,
    steps: int,
    batch_size: int,
    learning_rate: float,
    data: str | None = None,
    generator: th.Generator | None = None,
    logger: Any = None,
    verbose: int = 0,
    log_interval: int = 50,
    progress_bar: bool = False,
    loss_weight: float = 1.0,
    callback: Callable[[int], bool] | None = None,
) -> dict[str, float]:
    """Minimise the completion tokens' negative log-likelihood for ``steps`` steps (its own AdamW optimizer).

    Logs ``sft/loss`` and ``sft/mean_token_prob`` (the mean probability of the gold tokens) every
    ``log_interval`` steps, at the SFT step count.

    :param policy: a :class:`TransformerPolicy`
    :param env: the VecEnv whose tokenizer, template and task make the examples
    :param steps: gradient steps
    :param batch_size: examples per step
    :param learning_rate: AdamW learning rate (cosine-decayed to 10% over the steps)
    :param data: a JSONL file of prompt/response rows instead of the task's gold solutions
    :param generator: seeds the choice of rows
    :param logger: an SB3 logger (optional)
    :param verbose: print progress when >= 1
    :param log_interval: steps between logged values
    :param progress_bar: show the steps done: a bar on a terminal, a line per tenth otherwise
        (:func:`~algorithms.common.progress.progress`)
    :param loss_weight: what this process's loss is multiplied by before its backward (1 / processes when the
        processes run the same batch on a sharded model, whose backward sums their gradients)
    :param callback: called with the step number after each step; ``False`` stops the stage there (as an SB3
        callback's ``on_step``): a time budget, or held-out scores along the way
    """
    rows = load_sft_rows(data) if data is not None else None
    if rows is not None:
        check_responses(rows, data)  # type: ignore[arg-type]
    stand_ins_before = _stand_ins(env)
    seed = int(th.randint(2**31 - 1, (1,), generator=generator).item()) if generator is not None else 0
    rng = np.random.default_rng(seed)
    optimizer = th.optim.AdamW(policy.parameters(), lr=learning_rate, weight_decay=0.0)
    scheduler = th.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=max(steps, 1), eta_min=learning_rate / 10)
    stats: dict[str, float] = {}
    shown = progress(steps, "cold start (SFT steps)") if progress_bar else None
    for step in range(1, steps + 1):
        log_probs, completion_mask = _example_log_probs(policy, sft_examples(env, batch_size, rows, rng))
        loss = -aggregate(log_probs, completion_mask, mode="token")
        optimizer.zero_grad(set_to_none=True)
        (loss * loss_weight).backward()
        clip_grad_norm(policy.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        if shown is not None:
            shown.update(step)
        if step % log_interval == 0 or step == steps:
            stats = {"loss": loss.item(), "mean_token_prob": log_probs.detach().exp()[completion_mask].mean().item()}
            if logger is not None:
                for key, value in stats.items():
                    logger.record(f"sft/{key}", value)
                logger.record("sft/step", step)
                logger.dump(step=step)
            elif verbose:
                print(f"sft step {step}/{steps}: loss {stats['loss']:.4f}")
        if callback is not None and callback(step) is False:
            break
    if shown is not None:
        shown.close()
    if rows is None:
        _warn_stand_ins(env, _stand_ins(env) - stand_ins_before, steps * batch_size)
    return stats


def _example_log_probs(policy: Any, examples: list[Any]) -> tuple[th.Tensor, th.Tensor]:
    """``(B, C)`` log-probs of the examples' completions, in the cold start's precision, and the mask of the tokens
    trained on; episode examples ``(prompt, completion, roles)`` through :func:`_episode_log_probs`, or as one
    example per turn when a turn's context is longer than the policy's window (a rollout cuts it)."""
    if examples and len(examples[0]) == 3:
        turns = [turn for example in examples for turn in episode_turns(example)]
        if max(len(context) for context, _ in turns) <= policy.context_limit:
            return _episode_log_probs(policy, examples)
        examples = turns
    device = next(policy.parameters()).device
    prompts = [th.as_tensor(p[-policy.context_limit :]) for p, _ in examples]  # what rollouts show the policy
    prompt_ids, prompt_mask = left_pad(prompts, policy.pad_token_id)
    completion_ids, completion_mask = right_pad([th.as_tensor(c) for _, c in examples], policy.pad_token_id)
    batch = (prompt_ids, prompt_mask, completion_ids, completion_mask)
    log_probs, _ = policy.log_probs(*(t.to(device) for t in batch), stage="sft")
    return log_probs, completion_mask.to(device)


def episode_logits(policy: Any, examples: list[Any]) -> tuple[th.Tensor, th.Tensor, th.Tensor, th.Tensor]:
    """One forward pass over episode examples ``(prompt, completion, roles)`` (:mod:`grpo_gym.gold`: the model's turns,
    the env's tokens, each turn's EOS), in the cold start's precision, each turn seeing the context a rollout shows it:
    a turn's EOS is hidden from every later position (attention mask 0; the positions after it continue without it).

    :return: the ``(B, C, V)`` logits predicting each completion token (ids ``< vocab_size``), the ``(B, C)``
        completion ids, which of them are present (not padding) and their roles (``ENV_TOKEN`` on padding), on the
        policy's device
    """
    device = next(policy.parameters()).device
    prompts = [th.as_tensor(p[-policy.context_limit :]) for p, _, _ in examples]  # what rollouts show the policy
    prompt_ids, prompt_mask = left_pad(prompts, policy.pad_token_id)
    completion_ids, present = right_pad([th.as_tensor(c) for _, c, _ in examples], policy.pad_token_id)
    roles, _ = right_pad([th.as_tensor(r).long() for _, _, r in examples], ENV_TOKEN)  # (B, C)
    visible = present & (roles != TURN_END)  # (B, C): what later positions attend to
    attention = th.cat([prompt_mask, visible.long()], dim=1).to(device)  # (B, T + C)
    ids = th.cat([prompt_ids, completion_ids], dim=1).to(device)
    with policy.autocast("sft"):
        logits = policy.model(
            input_ids=ids, attention_mask=attention, position_ids=position_ids_from_mask(attention), use_cache=False
        ).logits[:, prompt_ids.shape[1] - 1 : -1, : policy.vocab_size]  # (B, C, V)
    return logits, completion_ids.to(device), present.to(device), roles.to(device)


def _episode_log_probs(policy: Any, examples: list[Any]) -> tuple[th.Tensor, th.Tensor]:
    """``(B, C)`` log-probs of episode examples' completion tokens (:func:`episode_logits`), one forward pass per
    batch, and the mask of those trained on (the model's tokens and EOSes); the log-prob definition is the sampler's
    (full softmax of the temperature-scaled logits over the vocabulary)."""
    logits, targets, present, roles = episode_logits(policy, examples)
    scaled = logits.float() / policy.temperature
    log_probs = scaled.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - th.logsumexp(scaled, dim=-1)  # (B, C)
    trained = present & (roles != ENV_TOKEN)
    return th.where(trained, log_probs, 0.0), trained


def gold_nll(policy: Any, env: Any, n: int = 8) -> float | None:
    """The model's mean negative log-likelihood per token (nats) of the gold solutions of ``n`` problems drawn from
    held-out seeds (the env's own random stream is not touched), or ``None`` when the task gives no gold answer."""
    task = env.get_attr("task", indices=[0])[0]
    difficulty = float(env.get_attr("difficulty", indices=[0])[0])
    examples = []
    try:
        for i in range(n):
            problem = task.sample_seeded(difficulty, HELD_OUT_SEED + i)
            reasoning, answer = task.solution(problem)
            target = f"<think>{reasoning}</think><answer>{answer}</answer>"
            examples.append(env.env_method("encode_example", problem.prompt_input, target, indices=[0])[0])
    except Exception:  # a task without gold answers (some reasoning-gym families): nothing to measure
        return None
    with th.no_grad():
        log_probs, mask = _example_log_probs(policy, examples)
    return float(-log_probs[mask].mean())


UNTRAINED = 0.9
"""A model whose gold-solution NLL is above this fraction of ``log(vocabulary size)`` is taken as untrained."""


def check_pretrained(policy: Any, env: Any, sft_steps: int, verbose: int = 0) -> bool:
    """Whether the model (from a folder or hub name, ``cold_start="auto"``) predicts the task's gold solutions better
    than a uniform guess; when not, warn that the cold start does not run and how to run it."""
    nll = gold_nll(policy, env)
    uniform = float(np.log(policy.vocab_size))
    if nll is not None and nll > UNTRAINED * uniform:
        warnings.warn(
            f"the model {policy.model_name!r} predicts the task's gold solutions like an untrained one ({nll:.2f} "
            f"nats per token; a uniform guess over its {policy.vocab_size} tokens is {uniform:.2f}), but a model from "
            f"a folder or hub name is taken as pretrained: the cold start ({sft_steps} steps) does not run under "
            "cold_start='auto'. Pass cold_start=True to run it (-params cold_start:True on the command line), or "
            "cold_start=False to skip it without this check",
            UserWarning,
            stacklevel=user_stacklevel(),
        )
        return False
    if verbose >= 1:
        name = policy.model_name
        print(f"cold start skipped: {name!r} is taken as pretrained (cold_start='auto'); cold_start=True runs it")
    return True


def check_responses(rows: list[tuple[str, str]], path: str) -> int:
    """Warn when ``sft_data`` responses do not follow the ``<think>…</think><answer>…</answer>`` template (the env
    would score them as malformed); returns how many do not."""
    bad = [(i, parse_completion(response).reason) for i, (_, response) in enumerate(rows, start=1)]
    bad = [(i, reason) for i, reason in bad if reason]
    if bad:
        first, reason = bad[0]
        warnings.warn(
            f"{len(bad)} of {len(rows)} sft_data rows of {path!r} have a response the env scores as malformed "
            f"(row {first}: {reason}); the cold start would teach that format",
            UserWarning,
            stacklevel=3,
        )
    return len(bad)


def _stand_ins(env: Any) -> int:
    return int(env.get_attr("gold_stand_ins", indices=[0])[0])


def _warn_stand_ins(env: Any, count: int, total: int) -> None:
    """Say how many cold-start examples had no gold reasoning (and got the env's stand-in)."""
    if count:
        task = env.get_attr("task", indices=[0])[0].name
        named = "name a column of gold reasoning, task_kwargs={'solution': '<column>'}" if task == "dataset" else None
        warnings.warn(
            f"{count} of {total} cold-start examples (task {task!r}) had no gold reasoning (no 'solution'): their "
            "targets use the stand-in '<think>The answer is X.</think><answer>X</answer>'; "
            f"{named or 'give the rows a solution column'}, pass cold_start_kwargs={{'data': ...}} (prompt/response "
            "rows with real reasoning), or cold_start=False",
            UserWarning,
            stacklevel=3,
        )
