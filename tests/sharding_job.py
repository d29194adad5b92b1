"""FSDP2 jobs that tests/test_sharding.py starts under torchrun (its one-process references call the same functions).

``python -m torch.distributed.run --standalone --nproc_per_node 2 tests/sharding_job.py OUT MODE``:

- ``train``: the built-in ``tiny`` Llama (2 layers, 32 wide) sharded over the ranks in float32 samples from its
  gathered weights, trains 2 AdamW steps on a fixed batch (each rank its half, its loss weighted by its share),
  writes a sharded checkpoint and the gathered state (``step2.pt``), samples again, refreshes a sharded frozen
  reference from it, trains a third step (``step3.pt``); a copy with gradient checkpointing (both layers in one
  chunk, sharded as one group) trains 2 steps (``checkpointed_step2.pt``); then a LoRA copy with bf16 compute trains
  2 steps, samples from its gathered weights and exports its adapter folder (``lora.pt``, ``adapter/``).
- ``resume``: reads ``OUT/ckpt`` into a sharded model (``resumed_step2.pt``), trains the third step
  (``resumed_step3.pt``); does the same from the whole-model state of ``step2.pt`` (``from_full_state.pt``);
  then starts another save of ``OUT/ckpt`` during which rank 1 is killed with SIGKILL.

Rank 0 writes the files; ``OUT/facts_<rank>.json`` holds what each rank saw (shard sizes, dtypes).
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
import torch.distributed as dist
from torch import nn

from algorithms.common.generation.sampler import sample
from algorithms.common.model.gradient_checkpointing import checkpoint_every
from algorithms.common.model.loading import BUILTIN_EOS_ID, BUILTIN_PAD_ID, BUILTIN_VOCAB_SIZE, load_model
from algorithms.common.model.lora import apply_lora
from algorithms.common.runtime.sharding import (
    clip_grad_norm,
    copy_weights,
    device_mesh,
    full_optimizer_state_dict,
    full_state_dict,
    gathered_weights,
    load_full_state,
    shard_model,
)
from algorithms.common.saving.sharded import load_sharded, save_sharded

SIZE = {"num_hidden_layers": 2, "hidden_size": 32, "intermediate_size": 64, "num_attention_heads": 2,
        "num_key_value_heads": 1}  # fmt: skip
LORA = {"r": 4, "alpha": 8}
ROWS, COLUMNS, LEARNING_RATE = 4, 16, 1e-2


def rank_and_world() -> tuple[int, int]:
    return (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)


def build(
    lora: bool = False, compute_dtype: torch.dtype | None = None, checkpoint_layers: int = 0
) -> tuple[nn.Module, torch.optim.Optimizer]:
    """The tiny model (with LoRA adapters; with gradient checkpointing in chunks of ``checkpoint_layers``), sharded
    over the job's processes when there are several, and its AdamW over the trainable parameters (made after
    sharding)."""
    seed = rank_and_world()[0]  # each rank starts from other weights: shard_model copies rank 0's (seed 0) to all
    model = load_model("tiny", vocab_size=BUILTIN_VOCAB_SIZE, seed=seed, **SIZE).eval()
    if lora:
        model = apply_lora(model, LORA, seed=seed)
    if checkpoint_layers:
        checkpoint_every(model, checkpoint_layers)
    if rank_and_world()[1] > 1:
        shard_model(model, device_mesh("cpu"), compute_dtype, layers_per_group=max(1, checkpoint_layers))
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=LEARNING_RATE)
    return model, optimizer


def batch() -> torch.Tensor:
    """The fixed ``(ROWS, COLUMNS)`` batch of token ids."""
    return torch.randint(2, BUILTIN_VOCAB_SIZE, (ROWS, COLUMNS), generator=torch.Generator().manual_seed(0))


def train_step(model: nn.Module, optimizer: torch.optim.Optimizer) -> float:
    """One AdamW step on this rank's rows of the batch; the loss is weighted by the rows' share of the batch, so the
    summed gradients are those of the whole batch's mean loss. Returns the clipped gradient's norm."""
    rank, world = rank_and_world()
    rows = batch().chunk(world)[rank]
    loss = model(input_ids=rows, labels=rows).loss * (len(rows) / ROWS)
    loss.backward()
    norm = clip_grad_norm([p for p in model.parameters() if p.requires_grad], 1.0)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return float(norm)


def prompts() -> tuple[torch.Tensor, torch.Tensor]:
    """Two left-padded prompts (5 and 8 tokens)."""
    ids = torch.randint(2, BUILTIN_VOCAB_SIZE, (2, 8), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[0, :3] = 0
    return torch.where(mask.bool(), ids, BUILTIN_PAD_ID), mask


def sample_both(model: nn.Module) -> dict[str, torch.Tensor]:
    """Tokens and log-probs sampled by the project's Llama decoder and by the model's own forward (HF decoder)."""
    out = {}
    for decoder in ("llama", "hf"):
        generator = torch.Generator().manual_seed(0)
        done = sample(model, *prompts(), max_new_tokens=12, eos_token_id=BUILTIN_EOS_ID, pad_token_id=BUILTIN_PAD_ID,
                      vocab_size=BUILTIN_VOCAB_SIZE, generator=generator, decoder=decoder)  # fmt: skip
        out[f"{decoder}_tokens"], out[f"{decoder}_log_probs"] = done.tokens, done.log_probs
    return out


def gathered_sample(model: nn.Module, facts: dict) -> dict[str, torch.Tensor]:
    """:func:`sample_both` inside :func:`gathered_weights`, noting what the block saw."""
    with torch.no_grad(), gathered_weights(model):
        weights = list(model.parameters())
        facts["gathered_types"] = sorted({type(p).__name__ for p in weights})
        facts["gathered_dtypes"] = sorted({str(p.dtype) for p in weights})
        facts["gathered_numel"] = sum(p.numel() for p in weights)
        return sample_both(model)


def local_numel(model: nn.Module) -> int:
    return sum(p.to_local().numel() if hasattr(p, "to_local") else p.numel() for p in model.parameters())


def gathered(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    return {"model": full_state_dict(model), "optimizer": full_optimizer_state_dict(model, optimizer)}


def train(out: Path) -> None:
    rank, _ = rank_and_world()
    facts: dict = {}
    model, optimizer = build()
    facts["local_numel"] = local_numel(model)
    first = gathered_sample(model, facts)  # before any forward: FSDP's lazy initialisation happens in the block
    initial = full_state_dict(model)
    norms = [train_step(model, optimizer) for _ in range(2)]
    save_sharded(out / "ckpt", model, optimizer, write_extra=lambda folder: (folder / "extra.json").write_text("{}"))
    step2 = gathered(model, optimizer)
    second = gathered_sample(model, facts)
    check_reference(model, facts)
    norms.append(train_step(model, optimizer))
    step3 = gathered(model, optimizer)
    facts["norms"] = norms
    checkpointed, checkpointed_optimizer = build(checkpoint_layers=2)  # both layers in one chunk, one FSDP group
    for _ in range(2):
        train_step(checkpointed, checkpointed_optimizer)
    checkpointed_state = full_state_dict(checkpointed)
    if rank == 0:
        torch.save(checkpointed_state, out / "checkpointed_step2.pt")
        torch.save({"initial": initial, "first": first, "second": second}, out / "samples.pt")
        torch.save(step2, out / "step2.pt")
        torch.save(step3, out / "step3.pt")
    train_lora(out, facts)
    (out / f"facts_{rank}.json").write_text(json.dumps(facts))


def check_reference(model: nn.Module, facts: dict) -> None:
    """A frozen reference sharded like the policy (built from the initial weights), then refreshed from the policy
    shard by shard (what a reference rebuilt after the cold start needs): its logits become the policy's."""
    reference = load_model("tiny", vocab_size=BUILTIN_VOCAB_SIZE, seed=0, **SIZE).eval().requires_grad_(False)
    shard_model(reference, device_mesh("cpu"))
    with torch.no_grad():
        logits = model(input_ids=batch()).logits
        facts["reference_differed"] = not torch.equal(reference(input_ids=batch()).logits, logits)
        copy_weights(model, reference)
        facts["reference_refreshed"] = torch.equal(reference(input_ids=batch()).logits, logits)


def train_lora(out: Path, facts: dict) -> None:
    """LoRA with bf16 compute: 2 steps, then the adapter folder from the gathered state dict."""
    model, optimizer = build(lora=True, compute_dtype=torch.bfloat16)
    facts["lora_trainable"] = sorted({type(p).__name__ for p in model.parameters() if p.requires_grad})
    facts["lora_frozen"] = sorted({type(p).__name__ for p in model.parameters() if not p.requires_grad})
    with torch.no_grad(), gathered_weights(model):
        facts["lora_gathered_dtypes"] = sorted({str(p.dtype) for p in model.parameters()})
    initial = full_state_dict(model)
    facts["lora_norms"] = [train_step(model, optimizer) for _ in range(2)]
    facts["lora_master_dtypes"] = sorted({str(p.dtype) for p in model.parameters()})
    final = full_state_dict(model)
    samples = gathered_sample(model, {})  # the Llama decoder reads the gathered bf16 weights W + scaling * B @ A
    if rank_and_world()[0] == 0:
        model.save_pretrained(out / "adapter", state_dict=final)
        torch.save({"initial": initial, "final": final, "samples": samples}, out / "lora.pt")


def resume(out: Path) -> None:
    rank, _ = rank_and_world()
    model, optimizer = build()
    load_sharded(out / "ckpt", model, optimizer)
    loaded = gathered(model, optimizer)
    train_step(model, optimizer)
    stepped = gathered(model, optimizer)
    if rank == 0:
        torch.save(loaded, out / "resumed_step2.pt")
        torch.save(stepped, out / "resumed_step3.pt")
    from_file, file_optimizer = build()  # the whole-model state of an ordinary file, read by every rank
    whole = torch.load(out / "step2.pt")
    load_full_state(from_file, whole["model"], file_optimizer, whole["optimizer"])
    loaded = gathered(from_file, file_optimizer)
    train_step(from_file, file_optimizer)
    stepped = gathered(from_file, file_optimizer)
    if rank == 0:
        torch.save({"loaded": loaded, "stepped": stepped}, out / "from_full_state.pt")
    (out / f"resumed_{rank}").touch()
    kill_rank_one_while_saving(out / "ckpt", model, optimizer)


def kill_rank_one_while_saving(directory: Path, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """Save again; rank 1 is killed (SIGKILL) once its shard is written, before the checkpoint is complete."""
    from torch.distributed.checkpoint import FileSystemWriter

    write_data = FileSystemWriter.write_data

    def write_then_die(self, plan, planner):
        future = write_data(self, plan, planner)
        if rank_and_world()[0] == 1:
            future.wait()
            os.kill(os.getpid(), signal.SIGKILL)
        return future

    FileSystemWriter.write_data = write_then_die
    save_sharded(directory, model, optimizer)


if __name__ == "__main__":
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    folder, mode = Path(sys.argv[1]), sys.argv[2]
    {"train": train, "resume": resume}[mode](folder)
    dist.destroy_process_group()
