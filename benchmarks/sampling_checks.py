"""Does our sampler draw from the distribution Hugging Face's ``generate`` draws from? Four checks on one start
(issue 30's list of suspects for a heavier lower tail than TRL's):

1. **top-p**: our nucleus (``sampler._filtered``) against transformers' ``TopPLogitsWarper`` on the same logits (the
   logits of every step of sampled completions): the ids each keeps, and the total variation between the two
   renormalised distributions;
2. **the fused decoder**: our Llama-family decoder (fused q/k/v and gate/up projections, a preallocated cache)
   against the model's own forward (``decoder="hf"``) on the same prompts and noise: the largest logit difference
   and the share of completions whose tokens differ;
3. **padding**: the log-probs of the same completions with each prompt left-padded to a 512-token window against
   unpadded (our position ids from the mask);
4. **the sampled outcome**: many completions of the same prompts from our sampler and from ``model.generate``
   (``do_sample=True``, same temperature and top-p, as TRL samples without vLLM): the success rate of each, per
   prompt, and the mean completion length.

Run::

    python benchmarks/sampling_checks.py --folder /tmp/robustness/start_c --samples 256 --prompts 16

It prints a small table (markdown) to paste into RESULTS.md.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # run as a script: benchmarks/ is not a package


def make_env(folder: str) -> Any:
    import gymnasium as gym
    from carry_start import ENV_KWARGS

    import grpo_gym  # noqa: F401  (registers R1Zero-v0)

    return gym.make("R1Zero-v0", tokenizer=folder, **ENV_KWARGS).unwrapped


def prompts_of(env: Any, n: int) -> tuple[list[Any], list[list[int]]]:
    """``n`` held-out problems and their prompt ids (the env's own encoding, as both trainers see it)."""
    problems = env.eval_problems(n, env.difficulty, 7)  # held-out seeds, not the benchmark's held-out set (0)
    ids = []
    for problem in problems:
        obs, _ = env.reset(options={"problem": problem})
        ids.append(obs["input_ids"][obs["attention_mask"] == 1].tolist())
    return problems, ids


def batch(ids: list[list[int]], pad: int, width: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-padded ``(B, width)`` ids and mask (``width``: the longest prompt when None)."""
    width = width or max(map(len, ids))
    out = torch.full((len(ids), width), pad, dtype=torch.long)
    mask = torch.zeros((len(ids), width), dtype=torch.long)
    for row, prompt in enumerate(ids):
        out[row, width - len(prompt) :] = torch.tensor(prompt)
        mask[row, width - len(prompt) :] = 1
    return out, mask


def check_top_p(model: Any, ids: torch.Tensor, mask: torch.Tensor, completions: Any, top_p: float) -> dict[str, float]:
    from transformers.generation.logits_process import TopPLogitsWarper

    from algorithms.common.generation.completion_pass import completion_logits
    from algorithms.common.generation.sampler import _filtered

    logits = completion_logits(model, ids, mask, completions.tokens, completions.mask).float()  # (N, V)
    ours = torch.isfinite(_filtered(logits, top_p, 0))
    theirs = torch.isfinite(TopPLogitsWarper(top_p)(None, logits.clone()))
    p_ours = torch.softmax(logits.masked_fill(~ours, -torch.inf), -1)
    p_theirs = torch.softmax(logits.masked_fill(~theirs, -torch.inf), -1)
    tv = 0.5 * (p_ours - p_theirs).abs().sum(-1)
    return {
        "rows": float(len(logits)),
        "rows with another nucleus": float((ours != theirs).any(-1).float().mean()),
        "mean ids kept (ours, HF)": f"{ours.sum(-1).float().mean():.2f}, {theirs.sum(-1).float().mean():.2f}",
        "max total variation": float(tv.max()),
    }


def check_decoders(model: Any, ids: torch.Tensor, mask: torch.Tensor, settings: dict[str, Any]) -> dict[str, float]:
    from algorithms.common.generation.completion_pass import completion_logits
    from algorithms.common.generation.sampler import sample

    runs = {}
    for decoder in ("llama", "hf"):
        generator = torch.Generator().manual_seed(0)
        runs[decoder] = sample(model, ids, mask, generator=generator, decoder=decoder, **settings)
    same = (runs["llama"].tokens == runs["hf"].tokens).all(-1)
    a, b = runs["llama"], runs["hf"]
    both = a.mask & b.mask & (a.tokens == b.tokens).cumprod(-1).bool()  # the common prefix of each pair
    reference = completion_logits(model, ids, mask, a.tokens, a.mask).float()  # the plain forward's logits
    return {
        "completions": float(len(ids)),
        "share with other tokens": float(1 - same.float().mean()),
        "max |log-prob difference| on the common prefix": float((a.log_probs - b.log_probs)[both].abs().max()),
        "plain forward's logits: finite": float(torch.isfinite(reference).all()),
    }


def check_padding(model: Any, ids: list[list[int]], pad: int, completions: Any) -> dict[str, float]:
    from algorithms.common.generation.completion_pass import completion_log_probs

    tight, tight_mask = batch(ids, pad)
    wide, wide_mask = batch(ids, pad, 512)
    tokens, cmask = completions.tokens, completions.mask
    a = completion_log_probs(model, tight, tight_mask, tokens, cmask, layout="padded")[0]
    b = completion_log_probs(model, wide, wide_mask, tokens, cmask, layout="padded")[0]
    c = completion_log_probs(model, tight, tight_mask, tokens, cmask, layout="packed")[0]
    return {
        "max |log-prob difference|, 512-token window vs unpadded": float((a - b)[cmask].abs().max()),
        "max |log-prob difference|, packed vs padded": float((a - c)[cmask].abs().max()),
    }


def check_outcomes(
    model: Any, env: Any, problems: list[Any], ids: list[list[int]], samples: int, settings: dict
) -> str:
    """Per prompt: the success rate of ``samples`` completions from ours and from ``generate``."""
    from algorithms.common.generation.sampler import sample

    rows, pad = [], env.codec.pad_id
    eos = settings["eos_token_id"]
    for problem, prompt in zip(problems, ids, strict=True):
        rates, lengths = [], []
        for who in ("ours", "hf"):
            prompt_ids, prompt_mask = batch([prompt] * samples, pad)
            if who == "ours":
                out = sample(model, prompt_ids, prompt_mask, generator=torch.Generator().manual_seed(1), **settings)
                tokens, lengths_ = out.tokens, out.lengths
            else:
                torch.manual_seed(1)
                generated = model.generate(
                    input_ids=prompt_ids, attention_mask=prompt_mask, do_sample=True, top_p=settings["top_p"],
                    top_k=0, temperature=settings["temperature"], max_new_tokens=settings["max_new_tokens"],
                    eos_token_id=eos, pad_token_id=pad,
                )[:, prompt_ids.shape[1] :]  # fmt: skip
                tokens = torch.full((samples, settings["max_new_tokens"]), pad, dtype=torch.long)
                tokens[:, : generated.shape[1]] = generated
                ended = (tokens == eos).float().cumsum(-1)
                lengths_ = ((ended == 0) | ((ended == 1) & (tokens == eos))).sum(-1)
            successes = []
            for row in tokens.numpy():
                successes.append(bool(env.score_completion(problem, row)[4]["is_success"]))
            rates.append(float(np.mean(successes)))
            lengths.append(float(lengths_.float().mean()))
        rows.append((problem.prompt.strip(), *rates, *lengths))
    lines = ["| prompt | success, ours | success, HF generate | length, ours | length, HF |", "|---|---|---|---|---|"]
    lines += [f"| `{p}` | {a:.3f} | {b:.3f} | {c:.1f} | {d:.1f} |" for p, a, b, c, d in rows]
    ours, theirs = np.mean([r[1] for r in rows]), np.mean([r[2] for r in rows])
    se = np.sqrt(ours * (1 - ours) / (samples * len(rows)) + theirs * (1 - theirs) / (samples * len(rows)))
    lines.append(f"| **mean** | **{ours:.3f}** | **{theirs:.3f}** (difference {ours - theirs:+.3f}, "
                 f"standard error {se:.3f}) | | |")  # fmt: skip
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--folder", required=True, help="the start (a Hugging Face folder: model + tokenizer)")
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--samples", type=int, default=256, help="completions per prompt in check 4")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    from algorithms.common.generation.sampler import sample
    from algorithms.common.model.loading import load_model

    env = make_env(args.folder)
    model = load_model(args.folder).eval()
    problems, ids = prompts_of(env, args.prompts)
    codec = env.codec
    settings = {"max_new_tokens": env.max_new_tokens, "eos_token_id": codec.eos_id, "pad_token_id": codec.pad_id,
                "temperature": 1.0, "top_p": 0.92, "vocab_size": codec.vocab_size}  # fmt: skip
    start = time.perf_counter()
    prompt_ids, prompt_mask = batch([p for p in ids for _ in range(8)], env.codec.pad_id)
    completions = sample(model, prompt_ids, prompt_mask, generator=torch.Generator().manual_seed(0), **settings)
    with torch.no_grad():
        checks = {
            "1. top-p, ours vs TopPLogitsWarper": check_top_p(model, prompt_ids, prompt_mask, completions, 0.92),
            "2. fused decoder vs the model's forward": check_decoders(model, prompt_ids, prompt_mask, settings),
            "3. padding and layout": check_padding(
                model, [p for p in ids for _ in range(8)], codec.pad_id, completions
            ),
        }
        outcomes = check_outcomes(model, env, problems, ids, args.samples, settings)
    for name, figures in checks.items():
        print(f"**{name}**: " + "; ".join(f"{k} {v:.3g}" if isinstance(v, float) else f"{k} {v}"
                                          for k, v in figures.items()))  # fmt: skip
    print(f"\n**4. sampled outcomes**, {args.samples} completions per prompt:\n\n{outcomes}")
    print(f"\n({time.perf_counter() - start:.0f} s)")


if __name__ == "__main__":
    main()
