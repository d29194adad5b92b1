"""Ours against TRL's ``GRPOTrainer`` term by term on ONE rollout: advantages, update log-probs, ratios, loss,
gradient and the optimizer's first step (issue 23).

One rollout of ours (K x G completions from the start folder, ``--seed``, float32) is fed to both trainers:

- **Ours**: :func:`algorithms.grpo.update.minibatch_loss` on the rollout, backward, the guarded step (clip, AdamW),
  in several configurations from the same weights (defaults; each difference to TRL removed in turn; the mixed
  precisions of a bf16 CPU's ``auto``, forced per stage, with and without the sampler correction).
- **TRL**: a real ``GRPOTrainer`` (``max_steps=1``) whose ``rollout_func`` returns ours' rollout (prompt ids,
  completion ids, sampler log-probs) and whose reward function returns ours' rewards in the same order; its
  advantages are read from ``_generate_and_score_completions``, its update log-probs from the trainer's own
  ``_get_per_token_logps_and_entropies`` on the same rows before the step, its gradient at
  ``on_pre_optimizer_step`` (after its clip) and its weights after the step.

Reported: each term's largest difference, the loss, the pre-clip gradient norm, the cosine of each configuration's
gradient and first step with TRL's, the step's size, and for mixed precisions the ratio's spread and the sampler
KL. Run::

    python benchmarks/trainer_terms.py --folder <start folder> --env b --results benchmarks/RESULTS.md
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # run as a script: benchmarks/ is not a package
import torch
from common import cpu_flags, cpu_name, update_results

SECTION = "## Term by term: ours vs TRL GRPOTrainer on one rollout"
STAGES_MIXED = {"sampling": None, "update": torch.bfloat16, "sft": None}  # what a bf16 CPU's "auto" may pick


def flat(tensors: list[torch.Tensor]) -> torch.Tensor:
    return torch.cat([t.detach().flatten().double() for t in tensors])


def cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(torch.nn.functional.cosine_similarity(a, b, dim=0))


def our_rollout(args: argparse.Namespace, env_kwargs: dict[str, Any]) -> tuple[Any, Any]:
    """An ours model (float32) and one fresh rollout of it (``RolloutBatch``, rows grouped by problem)."""
    import gymnasium as gym

    import grpo_gym  # noqa: F401
    from algorithms import GRPO

    env = gym.make("R1Zero-v0", tokenizer=args.folder, **env_kwargs)
    model = GRPO("TransformerPolicy", env, policy_kwargs={"model": args.folder}, cold_start=False, seed=args.seed,
                 device="cpu", learning_rate=args.lr, beta=0.0, mixed_precision="no")  # fmt: skip
    _, callback = model._setup_learn(model.n_groups * model.group_size, None, True, "terms", False)
    callback.on_training_start(locals(), globals())
    model.collect_rollouts(model.env, callback)
    return model, model._rollout


def our_step(model: Any, batch: Any, initial: dict[str, Any], config: dict[str, Any]) -> dict[str, Any]:
    """One update of ours on ``batch`` from the weights ``initial`` with ``config`` (loss settings, weight decay,
    per-stage precision, sampler correction): loss, log-probs, pre-clip gradient, step."""
    from algorithms.common import sampler_correction
    from algorithms.common.rollout.batch import sampler_kl_of_fresh
    from algorithms.grpo import update

    policy = model.policy
    policy.model.load_state_dict(initial["state"])
    policy.autocast_dtypes = config.get("dtypes", {})
    optimizer = torch.optim.AdamW(policy.parameters(), lr=model.learning_rate, weight_decay=config["weight_decay"])
    policy.optimizer = optimizer
    settings = update.LossSettings(0.2, 0.2, config["ent_coef"], 0.0, config["aggregation"], 0.5)
    kl = None
    if config.get("tis"):
        batch, kl = sampler_correction.correct_fresh_rollout(policy, batch, 2.0)
    loss, stats, log_probs = update.minibatch_loss(policy, batch, settings)
    if kl is None:
        kl = sampler_kl_of_fresh(batch, log_probs.detach())
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    parameters = list(policy.model.parameters())
    gradient = flat([p.grad for p in parameters])
    norm = torch.nn.utils.clip_grad_norm_(parameters, 0.5)
    optimizer.step()
    mask = batch.completion_mask
    log_ratio = (log_probs.detach() - batch.old_log_probs)[mask]
    return {
        "loss": float(loss.detach()),
        "log_probs": log_probs.detach(),
        "gradient": gradient,
        "grad_norm": float(norm),
        "step": flat(parameters) - initial["flat"],
        "max_log_ratio": float(log_ratio.abs().max()),
        "clipped": float(stats["clip_fraction"]),
        "sampler_kl": float(kl),
    }


def trl_step(args: argparse.Namespace, batch: Any, rewards: list[float], texts: list[str]) -> dict[str, Any]:
    """TRL's ``GRPOTrainer`` on ours' rollout (see the module doc)."""
    import trl
    from datasets import Dataset
    from transformers import TrainerCallback

    rows = len(batch)
    group = rows // len(texts)
    prompt_ids = [ids[mask.bool()].tolist() for ids, mask in zip(batch.prompt_ids, batch.prompt_mask, strict=True)]
    completion_ids = [ids[m].tolist() for ids, m in zip(batch.completion_ids, batch.completion_mask, strict=True)]
    sampler = [lp[m].tolist() for lp, m in zip(batch.old_log_probs, batch.completion_mask, strict=True)]
    seen: dict[str, Any] = {}

    def rollout(prompts: list[Any], trainer: Any) -> dict[str, Any]:
        return {"prompt_ids": prompt_ids, "completion_ids": completion_ids, "logprobs": sampler}

    def reward(completions: list[Any], **kwargs: Any) -> list[float]:
        return list(rewards)

    class Capture(TrainerCallback):
        def on_pre_optimizer_step(self, *a: Any, **k: Any) -> None:
            seen["clipped_gradient"] = flat([p.grad for p in trainer.model.parameters()])

    with tempfile.TemporaryDirectory() as out:
        config = trl.GRPOConfig(output_dir=out, use_cpu=True, bf16=False, fp16=False, gradient_checkpointing=False,
                                per_device_train_batch_size=rows, num_generations=group, shuffle_dataset=False,
                                max_completion_length=batch.completion_ids.shape[1], max_steps=1,
                                learning_rate=args.lr, lr_scheduler_type="constant", max_grad_norm=0.5, beta=0.0,
                                temperature=1.0, report_to="none", logging_steps=1, save_strategy="no",
                                disable_tqdm=True, seed=args.seed)  # fmt: skip
        dataset = Dataset.from_dict({"prompt": texts})
        trainer = trl.GRPOTrainer(model=args.folder, reward_funcs=reward, args=config, train_dataset=dataset,
                                  rollout_func=rollout, callbacks=[Capture()])  # fmt: skip
        initial = flat(list(trainer.model.parameters()))
        generate = trainer._generate_and_score_completions

        def generate_and_keep(inputs: Any) -> Any:
            output = generate(inputs)
            seen["output"] = output
            ids = torch.cat([output["prompt_ids"], output["completion_ids"]], dim=1)
            mask = torch.cat([output["prompt_mask"], output["completion_mask"]], dim=1)
            with torch.no_grad():
                seen["log_probs"] = trainer._get_per_token_logps_and_entropies(
                    trainer.model, ids, mask, output["completion_ids"].shape[1]
                )[0]
            return output

        trainer._generate_and_score_completions = generate_and_keep
        trainer.train()
        logs = next(entry for entry in trainer.state.log_history if "grad_norm" in entry)
        optimizer = trainer.optimizer.optimizer if hasattr(trainer.optimizer, "optimizer") else trainer.optimizer
        return {
            "advantages": seen["output"]["advantages"],
            "log_probs": seen["log_probs"],
            "completion_mask": seen["output"]["completion_mask"].bool(),
            "loss": logs.get("loss"),
            "grad_norm": logs["grad_norm"],
            "clipped_gradient": seen["clipped_gradient"],
            "step": flat(list(trainer.model.parameters())) - initial,
            "optimizer": {
                **{key: optimizer.defaults[key] for key in ("lr", "betas", "eps")},
                "weight_decay": sorted({group["weight_decay"] for group in optimizer.param_groups}),
            },
        }


CONFIGS = {
    "ours, defaults (sequence aggregation, entropy bonus 0.01, weight decay 0.01)": {
        "aggregation": "sequence", "ent_coef": 0.01, "weight_decay": 0.01},
    "ours, token aggregation (TRL's dapo)": {"aggregation": "token", "ent_coef": 0.01, "weight_decay": 0.01},
    "ours, no entropy bonus": {"aggregation": "sequence", "ent_coef": 0.0, "weight_decay": 0.01},
    "ours, weight decay 0": {"aggregation": "sequence", "ent_coef": 0.01, "weight_decay": 0.0},
    "ours, all three as TRL": {"aggregation": "token", "ent_coef": 0.0, "weight_decay": 0.0},
    "ours as TRL, sampled float32 / update bf16, no correction": {
        "aggregation": "token", "ent_coef": 0.0, "weight_decay": 0.0, "dtypes": STAGES_MIXED},
    "ours as TRL, sampled float32 / update bf16, TIS": {
        "aggregation": "token", "ent_coef": 0.0, "weight_decay": 0.0, "dtypes": STAGES_MIXED, "tis": True},
}  # fmt: skip


def compare(args: argparse.Namespace, env_kwargs: dict[str, Any]) -> str:
    torch.manual_seed(args.seed)
    model, batch = our_rollout(args, env_kwargs)
    state = {key: value.detach().clone() for key, value in model.policy.model.state_dict().items()}
    initial = {"state": state, "flat": flat(list(model.policy.model.parameters()))}
    rewards = batch.returns.tolist()
    group = model.group_size
    texts = [f"problem {k}" for k in range(len(batch) // group)]  # rollout_func gives the ids: any text does
    trl = trl_step(args, batch, rewards, texts)
    ours = {name: our_step(model, batch, initial, config) for name, config in CONFIGS.items()}
    mask = batch.completion_mask
    base = next(iter(ours.values()))
    signal = int((batch.returns.view(-1, group).std(dim=1) > 0).sum())
    trl_log_probs = trl["log_probs"][trl["completion_mask"]]  # (tokens,): row-major, as ours' [mask]
    lines = [
        f"Command: `python benchmarks/trainer_terms.py {' '.join(sys.argv[1:])}`; {cpu_name()} ({cpu_flags()}), "
        f"torch {torch.__version__}, trl {__import__('trl').__version__}. One rollout of K={len(batch) // group} x "
        f"G={group} ({int(mask.sum())} completion tokens, {signal} of the groups with rewards that differ), sampled by "
        f"ours in float32 from `{os.path.basename(args.folder)}`, seed {args.seed}, learning "
        f"rate {args.lr:g}, beta 0, clip 0.2, gradient clip 0.5.",
        "",
        "| term | ours | TRL | largest difference |",
        "|---|---|---|---|",
        "| advantages | (r - mean) / (std + 1e-4), Bessel std | same | "
        f"{float((batch.advantages - trl['advantages']).abs().max()):.1e} |",
        f"| update log-probs (full softmax at temperature 1, not top-p) | float32 | float32 | "
        f"{float((base['log_probs'][mask] - trl_log_probs).abs().max()):.1e} |",
        f"| ratio at the first step | pi / pi_sampler: max abs log-ratio {base['max_log_ratio']:.1e} | 1 (old = "
        "detached current) | - |",
        f"| loss value | {base['loss']:.3g} | {float(trl['loss']):.3g} | aggregation and entropy bonus differ |",
        f"| AdamW (lr, betas, eps, weight decay) | {args.lr:g}, (0.9, 0.999), 1e-08, 0.01 | "
        f"{trl['optimizer']['lr']:g}, {tuple(trl['optimizer']['betas'])}, {trl['optimizer']['eps']:g}, "
        f"{trl['optimizer']['weight_decay']} (per parameter group) | weight decay |",
        f"| pre-clip gradient norm | {base['grad_norm']:.4f} | {trl['grad_norm']:.4f} | |",
        "",
        "| ours' configuration | pre-clip grad norm | cosine with TRL's (clipped) gradient | first step: "
        "cosine with TRL's | step size / TRL's | max abs log-ratio | clip fraction | sampler KL |",
        "|---|---|---|---|---|---|---|---|",
    ]
    trl_step_norm = float(trl["step"].norm())
    for name, result in ours.items():
        lines.append(
            f"| {name} | {result['grad_norm']:.4f} | {cosine(result['gradient'], trl['clipped_gradient']):.6f} | "
            f"{cosine(result['step'], trl['step']):.6f} | {float(result['step'].norm()) / trl_step_norm:.4f} | "
            f"{result['max_log_ratio']:.1e} | {result['clipped']:.4f} | {result['sampler_kl']:.1e} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--folder", required=True, help="the start (a Hugging Face folder with its tokenizer)")
    parser.add_argument("--env", choices=["a", "b"], default="b", help="the start's env (learning_robustness.py)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--results", type=Path)
    args = parser.parse_args()
    torch.set_num_threads(1)
    from learning_robustness import start_env_kwargs

    body = compare(args, start_env_kwargs(args.env))
    print(body)
    if args.results:
        update_results(args.results, SECTION, f"start {args.env}, seed {args.seed}, lr {args.lr:g}", body)


if __name__ == "__main__":
    main()
