"""Score completions with a pretrained Hugging Face reward model (the episode's instant reward).

``torch`` and ``transformers`` are imported inside methods only, so ``import grpo_gym.rewards`` works on a
machine without them; the model itself is loaded on the first call to :meth:`RewardModelScorer.score`
(or :meth:`RewardModelScorer.load`).
"""

from __future__ import annotations

import inspect
import os
import re
from pathlib import Path
from typing import Any

import numpy as np

from grpo_gym.hub import check_hf_source, check_hub_reachable, trust_kwargs
from grpo_gym.validation import ArgumentError, check_int, check_path

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")

_WHAT_TO_PASS = (
    "pass a directory written by `model.save_pretrained(dir)` and `tokenizer.save_pretrained(dir)` of a "
    "transformers sequence-classification model with num_labels=1 or 2 "
    "(or the name of such a model already in the local Hugging Face cache)"
)


MAX_CHARS_PER_TOKEN = 64
"""Texts longer than ``64 * max_length`` characters are cut (on the side truncation keeps) before tokenizing."""
_DEVICE = re.compile(r"^(auto|cpu|cuda|mps|xpu|npu|hpu|meta)(:\d+)?$")


def _check_device(device: Any) -> Any:
    """A device string (``"cpu"``, ``"cuda:1"``, ``"auto"``) or a ``torch.device``; anything else is refused."""
    if type(device).__module__ == "torch" and type(device).__name__ == "device":
        return device
    if isinstance(device, str) and _DEVICE.match(device):
        return device
    raise ArgumentError(f"device must be 'auto', 'cpu', 'cuda', 'cuda:<index>' (or a torch.device), got {device!r}")


class RewardModelScorer:
    """A sequence-classification model that scores ``(prompt, completion)`` pairs in ``[0, 1]``.

    Each pair is encoded as a tokenizer *text pair* (``tokenizer(prompt, completion)``), truncated
    ``"longest_first"`` to ``max_length`` tokens and right-padded. A text longer than ``64 * max_length``
    characters is first cut to that many on the side truncation keeps (the start, unless the tokenizer's
    ``truncation_side`` is ``"left"``), so a huge prompt costs ``O(max_length)`` tokenization; the tokens kept
    are the same whenever the kept part holds at least ``max_length`` tokens. The score of a model with one output
    (``num_labels=1``) is ``sigmoid(logit)``; with two outputs it is the softmax probability of label 1
    ("good"). Other label counts are rejected when loading. Scoring runs in eval mode without gradients, in
    batches of ``batch_size``; scores do not depend on the batch size beyond float rounding.

    If the tokenizer has no pad token, its EOS token is used as padding; when it has neither, a ``[PAD]``
    token is added and the model's embeddings are resized. The model's ``config.pad_token_id`` is set to
    match (decoder models read it to find the last real token).

    The loaded model is not pickled: a pickled or copied scorer reloads it lazily from ``path``.

    :param path: a local directory written by ``save_pretrained`` (model and tokenizer), or a hub model name
        available offline in the Hugging Face cache
    :param batch_size: pairs per forward pass
    :param device: torch device to run on (``"cpu"``, ``"cuda"``, ``"cuda:1"``, or ``"auto"``: CUDA when
        available)
    :param max_length: tokens kept per pair (prompt and completion together)
    :param trust_remote_code: run the folder's own model/tokenizer code (``"auto_map"``); refused otherwise, with
        a clear error, when the scorer is made (see :mod:`grpo_gym.hub`). Opt in only for code you have read; an
        env record never carries it
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        batch_size: int = 16,
        device: str = "cpu",
        max_length: int = 512,
        trust_remote_code: bool = False,
    ) -> None:
        self.path = check_path("path", path, what="a reward model folder (or a hub name)")
        self.trust_remote_code: bool = trust_kwargs(trust_remote_code)["trust_remote_code"]
        local = Path(self.path).expanduser()
        if local.exists():
            if not local.is_dir():
                raise ValueError(f"reward model path {self.path!r} is a file, not a directory: {_WHAT_TO_PASS}")
            if not (local / "config.json").is_file():
                raise ValueError(f"reward model directory {self.path!r} has no config.json: {_WHAT_TO_PASS}")
            self.path = str(local)
        elif not _HUB_ID.match(self.path):
            raise ValueError(f"reward model path {self.path!r} does not exist: {_WHAT_TO_PASS}")
        check_hf_source(self.path, trust_remote_code=self.trust_remote_code, what="reward model folder")
        self.batch_size: int = check_int("batch_size", batch_size, low=1)  # type: ignore[assignment]
        self.max_length: int = check_int("max_length", max_length, low=2)  # type: ignore[assignment]
        self.device = _check_device(device)
        self._model: Any = None
        self._tokenizer: Any = None
        self._input_names: list[str] = []

    def __repr__(self) -> str:
        return f"RewardModelScorer({self.path!r}, batch_size={self.batch_size}, device={self.device!r})"

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_model"] = state["_tokenizer"] = None
        return state

    @property
    def loaded(self) -> bool:
        """Whether the model and tokenizer are in memory."""
        return self._model is not None

    def load(self) -> RewardModelScorer:
        """Load the tokenizer and model now (``score`` does it on first use). Returns ``self``.

        :raises ValueError: when ``path`` does not hold a loadable sequence-classification model
        """
        if self._model is not None:
            return self
        import torch
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        safety = check_hf_source(self.path, trust_remote_code=self.trust_remote_code, what="reward model folder")
        check_hub_reachable(self.path, "reward model")
        try:
            tokenizer = AutoTokenizer.from_pretrained(self.path, **safety)
            model, info = AutoModelForSequenceClassification.from_pretrained(
                self.path, output_loading_info=True, **safety
            )
        except Exception as exc:
            cause = " ".join(str(exc).split())[:500]
            raise ValueError(
                f"could not load a reward model from {self.path!r}: {_WHAT_TO_PASS}. Cause: {cause}"
            ) from exc
        untrained = sorted(info.get("missing_keys") or [])
        if untrained:  # a causal LM (or any model without a trained head): its score layer would be random
            shown = ", ".join(untrained[:3]) + (", ..." if len(untrained) > 3 else "")
            raise ValueError(
                f"reward model {self.path!r} has no trained weights for {shown}: it is not a sequence-classification "
                f"model (a causal LM's folder gets a random score head); {_WHAT_TO_PASS}"
            )
        broken = next(
            (n for n, t in model.state_dict().items() if t.is_floating_point() and not t.isfinite().all()), None
        )
        if broken is not None:  # (grpo_gym cannot use algorithms' check_finite_weights) every score would read 0
            raise ValueError(
                f"reward model {self.path!r} has NaN or infinite values in {broken!r}: every score would be NaN, read "
                "as 0; download or save it again from finite weights"
            )
        num_labels = int(model.config.num_labels)
        if num_labels not in (1, 2):
            raise ValueError(f"reward model {self.path!r} has num_labels={num_labels}; {_WHAT_TO_PASS}")
        if tokenizer.pad_token is None:
            if tokenizer.eos_token is not None:
                tokenizer.pad_token = tokenizer.eos_token
            else:
                tokenizer.add_special_tokens({"pad_token": "[PAD]"})
                model.resize_token_embeddings(len(tokenizer))
        tokenizer.padding_side = "right"
        model.config.pad_token_id = tokenizer.pad_token_id
        device = self.device
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        accepted = inspect.signature(model.forward).parameters
        self._input_names = [n for n in ("input_ids", "attention_mask", "token_type_ids") if n in accepted]
        self._tokenizer, self._model = tokenizer, model.to(device).eval()
        return self

    def score(self, prompts: list[str], completions: list[str]) -> np.ndarray:
        """Score each ``(prompts[i], completions[i])`` pair.

        :param prompts: the prompt texts (may be empty strings)
        :param completions: the completion texts, as many as ``prompts``
        :return: float64 array of shape ``(len(prompts),)`` with values in ``[0, 1]``
        """
        if len(prompts) != len(completions):
            raise ValueError(f"got {len(prompts)} prompts but {len(completions)} completions")
        if not prompts:
            return np.zeros(0, dtype=np.float64)
        import torch

        self.load()
        keep = MAX_CHARS_PER_TOKEN * self.max_length
        head = getattr(self._tokenizer, "truncation_side", "right") != "left"

        def bound(text: object) -> str:
            text = str(text)
            return text if len(text) <= keep else (text[:keep] if head else text[-keep:])

        scores = []
        with torch.inference_mode():
            for start in range(0, len(prompts), self.batch_size):
                stop = start + self.batch_size
                encoded = self._tokenizer(
                    [bound(p) for p in prompts[start:stop]],
                    [bound(c) for c in completions[start:stop]],
                    truncation="longest_first",
                    max_length=self.max_length,
                    padding=True,
                    return_tensors="pt",
                )
                batch = {n: encoded[n].to(self._model.device) for n in self._input_names if n in encoded}
                logits = self._model(**batch).logits.float()  # (B, num_labels)
                if logits.shape[-1] == 1:
                    probs = torch.sigmoid(logits[:, 0])
                else:
                    probs = torch.softmax(logits, dim=-1)[:, 1]
                scores.append(probs.cpu().numpy().astype(np.float64))
        return np.clip(np.nan_to_num(np.concatenate(scores), nan=0.0), 0.0, 1.0)
