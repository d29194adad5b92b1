"""Distillation of a trained policy into a smaller student, optionally through INT8 rounding (quantisation-aware).

Each step draws ``batch_size`` problems from the env's task, samples completions (the teacher's by default; with
``on_policy`` a share sampled by the student, as in GKD, Agarwal et al. 2024) and minimises, over every completion
token, the KL between the teacher's and the student's next-token distributions at temperature ``tau``::

    loss = tau**2 * mean_tokens[(1 - reverse_kl) * KL(p_T || p_S) + reverse_kl * KL(p_S || p_T)]
           + sft_coef * NLL(gold solution | prompt)

(``tau**2`` keeps the gradients' scale across temperatures, Hinton et al. 2015). Teacher and student must share a
tokenizer: the distributions are compared id by id. The student is returned as a GRPO model: ``save()`` writes a
normal zip that ``GRPO.load`` reads and ``learn()`` trains further.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch as th
import torch.nn.functional as F
from stable_baselines3.common.type_aliases import GymEnv
from stable_baselines3.common.utils import configure_logger
from tqdm.auto import tqdm

from algorithms.common.base_class import LMBaseAlgorithm
from algorithms.common.evaluation import held_out_problems
from algorithms.common.generation.completion_pass import completion_logits
from algorithms.common.losses import aggregate
from algorithms.common.model.loading import BUILTIN_MODELS, is_builtin_model
from algorithms.common.model.tokenizer_check import has_tokenizer, model_tokenizer
from algorithms.common.policies import TransformerPolicy
from algorithms.common.rollout.batch import left_pad, right_pad
from algorithms.deploy.loading import load_policy
from algorithms.deploy.quantize import prepare_qat, quantize_int8, save_int8, strip_qat
from algorithms.grpo import GRPO
from grpo_gym.validation import check_bool, check_float, check_int, read_json


def kl_terms(teacher_logits: th.Tensor, student_logits: th.Tensor, tau: float = 1.0) -> tuple[th.Tensor, th.Tensor]:
    """Per-token ``KL(p_T || p_S)`` and ``KL(p_S || p_T)``, both ``(N,)``, of ``(N, V)`` logits at temperature tau."""
    log_p = F.log_softmax(teacher_logits.float() / tau, dim=-1)  # (N, V)
    log_q = F.log_softmax(student_logits.float() / tau, dim=-1)
    forward = (log_p.exp() * (log_p - log_q)).sum(-1)  # (N,)
    reverse = (log_q.exp() * (log_q - log_p)).sum(-1)
    return forward, reverse


def student_policy_kwargs(student: str | os.PathLike | dict[str, Any]) -> dict[str, Any]:
    """The ``policy_kwargs`` that build a student: a built-in size (``"tiny"``), a dict of ``LlamaConfig`` fields
    over a built-in (``{"hidden_size": 64, "num_hidden_layers": 2}``; ``"model"`` picks the built-in, default
    tiny), a JSON file holding such a dict, or a Hugging Face folder (pretrained weights)."""
    if isinstance(student, (str, os.PathLike)) and str(student).endswith(".json"):
        try:
            text = Path(student).read_bytes()
        except OSError as error:
            raise ValueError(f"student config {os.fspath(student)!r} cannot be read ({error.strerror})") from None
        student = read_json(text, f"student config {os.fspath(student)!r}", fix="write an object of config fields")
    if isinstance(student, dict):
        overrides = dict(student)
        base = overrides.pop("model", "tiny")
        if not is_builtin_model(base):
            raise ValueError(f"student dict: 'model' must be a built-in size {tuple(BUILTIN_MODELS)}, got {base!r}")
        return {"model": base, "model_kwargs": overrides}
    if isinstance(student, (str, os.PathLike)):
        if is_builtin_model(student) or Path(student).is_dir():
            return {"model": os.fspath(student)}
        raise ValueError(
            f"student {os.fspath(student)!r} is neither a built-in size {tuple(BUILTIN_MODELS)}, a model folder, "
            "nor a JSON config file"
        )
    raise TypeError(f"student must be a name, a folder, a JSON file or a dict, not {type(student).__name__}")


def _teacher_policy(teacher: Any, device: th.device) -> tuple[TransformerPolicy, Any]:
    """``(policy, tokenizer or None)`` of a teacher given as a path, a trained algorithm or a policy."""
    if isinstance(teacher, LMBaseAlgorithm):
        return teacher.policy.to(device), None
    if isinstance(teacher, TransformerPolicy):
        return teacher.to(device), None
    if isinstance(teacher, (str, os.PathLike)):
        policy, tokenizer = load_policy(teacher, device=device)
        return policy, tokenizer if has_tokenizer(teacher) else None
    raise TypeError(f"teacher must be a path, a GRPO model or a TransformerPolicy, not {type(teacher).__name__}")


def check_shared_tokenizer(env_tokenizer: Any, teacher: TransformerPolicy, others: dict[str, Any]) -> None:
    """Raise a ``ValueError`` unless the teacher (and every tokenizer in ``others``) matches the env's tokenizer."""
    from grpo_gym.tokenizer import TokenCodec

    codec = TokenCodec(env_tokenizer)
    mine = (codec.vocab_size, codec.eos_id, codec.pad_id)
    fix = (
        "distil into a student built for the teacher's tokenizer (a built-in size or a config dict), and make the "
        "env with that tokenizer (gym.make('R1Zero-v0', tokenizer=<teacher folder>))"
    )
    theirs = (teacher.vocab_size, teacher.eos_token_id, teacher.pad_token_id)
    if theirs != mine:
        raise ValueError(
            f"teacher and student must share a tokenizer: the teacher's has {theirs[0]} tokens (EOS {theirs[1]}, pad "
            f"{theirs[2]}), the env's/student's {mine[0]} (EOS {mine[1]}, pad {mine[2]}); {fix}"
        )
    for name, tokenizer in others.items():
        if tokenizer is not None and tokenizer.get_vocab() != env_tokenizer.get_vocab():
            raise ValueError(
                f"teacher and student must share a tokenizer: the {name}'s ({len(tokenizer)} tokens) differs from "
                f"the env's ({len(env_tokenizer)} tokens); {fix}"
            )


def _prompts(env: Any, n: int, limit: int, pad_id: int) -> tuple[th.Tensor, th.Tensor, th.Tensor, th.Tensor]:
    """``n`` training prompts with their gold solutions: ``(prompt_ids, prompt_mask, gold_ids, gold_mask)``."""
    examples = env.env_method("gold_examples", n, indices=[0])[0]
    prompt_ids, prompt_mask = left_pad([th.as_tensor(p[-limit:]) for p, _ in examples], pad_id)
    gold_ids, gold_mask = right_pad([th.as_tensor(c) for _, c in examples], pad_id)
    return prompt_ids, prompt_mask, gold_ids, gold_mask


def _trim(tokens: th.Tensor, mask: th.Tensor) -> tuple[th.Tensor, th.Tensor]:
    width = max(int(mask.sum(dim=1).max()), 1)
    return tokens[:, :width], mask[:, :width]


def _completions(teacher, student, ids, mask, n_student, generator) -> tuple[th.Tensor, th.Tensor]:
    """``(B, C)`` completions and masks: the first ``n_student`` rows sampled by the student, the rest by the teacher,
    each with its own sampling settings and the student's completion budget."""
    budget = student.max_new_tokens
    parts = []
    if n_student:
        parts.append(student.generate(ids[:n_student], mask[:n_student], generator=generator, max_new_tokens=budget))
    if n_student < len(ids):
        parts.append(teacher.generate(ids[n_student:], mask[n_student:], generator=generator, max_new_tokens=budget))
    return _trim(th.cat([p.tokens for p in parts]), th.cat([p.mask for p in parts]))


def _logits(policy: TransformerPolicy, *batch: th.Tensor) -> th.Tensor:
    """``(N, V)`` logits of the batch's real completion tokens, over the tokenizer's ids."""
    with policy.autocast():
        return completion_logits(policy.model, *batch, pad_id=policy.pad_token_id)[:, : policy.vocab_size]


def distillation_kl(
    teacher: TransformerPolicy, student: TransformerPolicy, env: Any, n: int = 100, seed: int = 0
) -> float:
    """Mean per-token ``KL(teacher || student)`` over the teacher's completions of ``n`` held-out problems (at the
    env's difficulty, the evaluation's problem set), sampled with the teacher's settings and ``seed``."""
    problems = held_out_problems(env, n, float(env.get_attr("difficulty", indices=[0])[0]), seed)
    limit = min(teacher.context_limit, student.context_limit)
    prompts = [env.env_method("encode_example", p.prompt_input, "", indices=[0])[0][0][-limit:] for p in problems]
    device = student.device
    ids, mask = (t.to(device) for t in left_pad([th.as_tensor(p) for p in prompts], student.pad_token_id))
    generator = th.Generator(device=device).manual_seed(seed)
    with th.no_grad():
        out = teacher.generate(ids, mask, generator=generator, max_new_tokens=student.max_new_tokens)
        tokens, done = _trim(out.tokens, out.mask)
        forward, _ = kl_terms(_logits(teacher, ids, mask, tokens, done), _logits(student, ids, mask, tokens, done))
    return float(forward.mean())


@dataclass(frozen=True)
class DistillSettings:
    """The knobs of the distillation loop (see :func:`distill` for each)."""

    steps: int = 1000
    batch_size: int = 32
    learning_rate: float = 1e-3
    temperature: float = 1.0
    reverse_kl: float = 0.0
    on_policy: float = 0.0
    sft_coef: float = 0.0
    int8_qat: bool = False
    qat_start: float = 0.0
    max_grad_norm: float = 1.0
    log_interval: int = 50

    def __post_init__(self) -> None:
        """Every knob checked (finite numbers in range, integers, a boolean), before any work."""
        check_int("steps", self.steps, low=0)
        check_int("batch_size", self.batch_size, low=1)
        check_int("log_interval", self.log_interval, low=1)
        for name in ("learning_rate", "temperature", "max_grad_norm"):
            check_float(name, getattr(self, name), low=0.0, low_open=True)
        for name in ("reverse_kl", "on_policy", "qat_start"):
            check_float(name, getattr(self, name), low=0.0, high=1.0)
        check_float("sft_coef", self.sft_coef, low=0.0)
        check_bool("int8_qat", self.int8_qat)


def distill(
    teacher: str | os.PathLike | LMBaseAlgorithm | TransformerPolicy,
    student: str | os.PathLike | dict[str, Any] = "tiny",
    env: GymEnv | str = "R1Zero-v0",
    steps: int = 1000,
    batch_size: int = 32,
    learning_rate: float = 1e-3,
    temperature: float = 1.0,
    reverse_kl: float = 0.0,
    on_policy: float = 0.0,
    sft_coef: float = 0.0,
    int8_qat: bool = False,
    qat_start: float = 0.0,
    max_grad_norm: float = 1.0,
    log_interval: int = 50,
    grpo_kwargs: dict[str, Any] | None = None,
    save_path: str | os.PathLike | None = None,
    tensorboard_log: str | None = None,
    progress_bar: bool = False,
    verbose: int = 0,
    seed: int | None = None,
    device: th.device | str = "auto",
) -> GRPO:
    """Distil ``teacher`` into a new ``student`` on the env's task; returns the student as a :class:`GRPO` model.

    :param teacher: a GRPO zip, a ``save_pretrained`` folder, a trained GRPO model or a :class:`TransformerPolicy`
    :param student: a built-in size, a dict of config fields over a built-in, a JSON file of one, or a Hugging Face
        folder (see :func:`student_policy_kwargs`); it must use the teacher's tokenizer
    :param env: the env (or its id) whose task gives the prompts, gold solutions and tokenizer; made as for training
        the teacher (same tokenizer, template and completion budget)
    :param steps: gradient steps (0: return the untrained student)
    :param batch_size: prompts (one completion each) per step
    :param learning_rate: AdamW learning rate, cosine-decayed to a tenth over the steps
    :param temperature: tau, the temperature of both distributions in the KL (the loss is scaled by tau**2)
    :param reverse_kl: weight of ``KL(student || teacher)`` in the mix (0: forward KL only, 1: reverse only)
    :param on_policy: share of each batch's completions sampled by the student instead of the teacher (GKD)
    :param sft_coef: weight of the negative log-likelihood of the task's gold solutions (0: none)
    :param int8_qat: train through INT8 rounding (:func:`~algorithms.deploy.quantize.prepare_qat`) and, with
        ``save_path``, also write the INT8 export
    :param qat_start: with ``int8_qat``, the share of the steps trained in float before the rounding is switched on
    :param max_grad_norm: gradient-norm clip
    :param log_interval: steps between logged values (``distill/`` tags)
    :param grpo_kwargs: arguments of the returned :class:`GRPO` for later training (defaults: published GRPO, no
        cold start); its ``policy_kwargs`` are added to the student's
    :param save_path: write the student there as a GRPO zip, its ``save_pretrained`` folder next to it (the path
        without ``.zip``) and, with ``int8_qat``, the INT8 export (that folder + ``-int8``)
    :param tensorboard_log: the TensorBoard folder (runs go to ``<folder>/distill_<n>``)
    :param progress_bar: show a progress bar over the steps
    :param verbose: 0 silent, 1 the logged values
    :param seed: seeds the student's initialisation, the problems and the sampling
    :param device: ``"auto"``, ``"cpu"`` or ``"cuda"``
    """
    settings = DistillSettings(
        steps, batch_size, learning_rate, temperature, reverse_kl, on_policy, sft_coef, int8_qat, qat_start,
        max_grad_norm, log_interval,
    )  # fmt: skip
    kwargs = {"cold_start": False, **(grpo_kwargs or {})}
    policy_kwargs = {**student_policy_kwargs(student), **kwargs.pop("policy_kwargs", {})}
    model = GRPO("TransformerPolicy", env, policy_kwargs=policy_kwargs, seed=seed, device=device, **kwargs)
    model.get_env().reset()  # the env's seed applies before the distillation draws its problems
    teacher_policy, teacher_tokenizer = _teacher_policy(teacher, model.device)
    policy = model.policy
    for name in ("temperature", "top_p", "top_k"):  # the student samples as the teacher did, unless told otherwise
        if name not in policy_kwargs:
            setattr(policy, name, getattr(teacher_policy, name))
    env_tokenizer = model.get_env().get_attr("tokenizer", indices=[0])[0]
    tokenizers = {"teacher": teacher_tokenizer, "student": model_tokenizer(policy.model_name)}
    check_shared_tokenizer(env_tokenizer, teacher_policy, tokenizers)
    if steps > 0:
        _train(model, teacher_policy, settings, tensorboard_log, progress_bar, verbose)
    if model.ref_model is not None:  # the reference starts from the distilled weights, as after a cold start
        model.ref_model.load_state_dict(policy.model.state_dict())
    if save_path is not None:
        save_student(model, save_path, int8=int8_qat)
    return model


def student_paths(save_path: str | os.PathLike) -> tuple[Path, Path, Path]:
    """Where :func:`save_student` writes: the GRPO zip (``save_path``, ``.zip`` added when missing), its
    ``save_pretrained`` folder (the zip's path without ``.zip``) and the INT8 export (that folder + ``-int8``)."""
    zip_path = Path(save_path)
    zip_path = zip_path if zip_path.suffix == ".zip" else zip_path.with_name(zip_path.name + ".zip")
    folder = zip_path.with_name(zip_path.name[: -len(".zip")])
    return zip_path, folder, folder.with_name(folder.name + "-int8")


def save_student(model: GRPO, save_path: str | os.PathLike, int8: bool = False) -> list[Path]:
    """Write the student to :func:`student_paths` (the INT8 export only when ``int8``); returns the paths written."""
    zip_path, folder, int8_folder = student_paths(save_path)
    model.save(zip_path)
    model.save_pretrained(str(folder))
    written = [zip_path, folder]
    if int8:
        tokenizer = model.get_env().get_attr("tokenizer", indices=[0])[0]
        written.append(save_int8(quantize_int8(model.policy.model), int8_folder, tokenizer))
    return written


def _batch(model: GRPO, teacher: TransformerPolicy, settings: DistillSettings, generator: th.Generator):
    """One step's tensors: prompts, gold solutions, sampled completions, and the teacher's ``(N, V)`` logits."""
    student = model.policy
    limit = min(teacher.context_limit, student.context_limit)
    batch = [t.to(model.device) for t in _prompts(model.get_env(), settings.batch_size, limit, student.pad_token_id)]
    n_student = round(settings.on_policy * settings.batch_size)
    with th.no_grad():
        tokens, done = _completions(teacher, student, batch[0], batch[1], n_student, generator)
        target = _logits(teacher, batch[0], batch[1], tokens, done)  # (N, V)
    return batch, tokens, done, target


def _train(
    model: GRPO, teacher: TransformerPolicy, settings: DistillSettings, tensorboard_log, progress_bar, verbose
) -> None:
    """The distillation loop (see the module docstring); the student's layers are fake-quantised from step
    ``qat_start * steps`` when ``int8_qat``, and plain again at the end."""
    student, s = model.policy, settings
    logger = configure_logger(verbose, tensorboard_log, "distill", True)
    optimizer = th.optim.AdamW(student.parameters(), lr=s.learning_rate, weight_decay=0.0)
    schedule = th.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=s.steps, eta_min=s.learning_rate / 10)
    generator = th.Generator(device=model.device).manual_seed(int(th.randint(2**62, (1,)).item()))
    qat_step = round(s.qat_start * s.steps) if s.int8_qat else None
    history: dict[str, list[float]] = {}
    try:
        for step in tqdm(range(1, s.steps + 1), disable=not progress_bar, desc="distill"):
            if step - 1 == qat_step:
                prepare_qat(student.model)
            (prompt_ids, prompt_mask, gold_ids, gold_mask), tokens, done, target = _batch(model, teacher, s, generator)
            forward, reverse = kl_terms(target, _logits(student, prompt_ids, prompt_mask, tokens, done), s.temperature)
            loss = s.temperature**2 * ((1 - s.reverse_kl) * forward.mean() + s.reverse_kl * reverse.mean())
            stats = {"kl_forward": forward.mean().item(), "kl_reverse": reverse.mean().item()}
            if s.sft_coef > 0:
                log_probs, _ = student.log_probs(prompt_ids, prompt_mask, gold_ids, gold_mask)
                nll = -aggregate(log_probs, gold_mask, mode="token")
                loss = loss + s.sft_coef * nll
                stats["sft_loss"] = nll.item()
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            stats["grad_norm"] = float(th.nn.utils.clip_grad_norm_(student.parameters(), s.max_grad_norm))
            optimizer.step()
            schedule.step()
            stats.update(loss=loss.item(), completion_length=done.sum(1).float().mean().item())
            for key, value in stats.items():
                history.setdefault(key, []).append(value)
            if step % s.log_interval == 0 or step == s.steps:
                _dump(logger, history, step, optimizer, qat_step)
                history = {}
    finally:
        strip_qat(student.model)
        logger.close()


def _dump(logger: Any, history: dict[str, list[float]], step: int, optimizer: th.optim.Optimizer, qat_step) -> None:
    for key, values in history.items():
        logger.record(f"distill/{key}", sum(values) / len(values))
    logger.record("distill/learning_rate", optimizer.param_groups[0]["lr"])
    logger.record("distill/int8_qat", float(qat_step is not None and step > qat_step))
    logger.record("distill/step", step)
    logger.dump(step=step)
