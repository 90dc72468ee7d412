"""What the Hugging Face comparison scripts share: AdamW steps of a model, their losses."""

from __future__ import annotations

from typing import Any, Iterable

import torch


def train_steps(model: Any, batches: Iterable[dict], autocast: bool = True) -> list[float]:
    """One AdamW step (lr 1e-4) per batch of keyword arguments (on the GPU), under bf16
    autocast unless ``autocast`` is off; each step's loss."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    losses = []
    for batch in batches:
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
            loss = model(**batch).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return losses
