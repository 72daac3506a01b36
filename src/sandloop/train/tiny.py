"""``--model tiny``: a character-level tokenizer and a ~0.5 M-parameter Llama built from scratch,
plus the supervised warm-up on reference solutions. Nothing is downloaded.

The tokenizer has one token per printable ASCII character and newline, plus ``<pad>``, ``<eos>``
and ``<unk>``; it is a ``tokenizers`` model wrapped in ``PreTrainedTokenizerFast``, so it saves and
loads like any Hugging Face tokenizer and TRL uses it unchanged.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import Any

import torch

__all__ = ["build_tiny", "char_tokenizer", "prompt_text", "sft_warmup"]

PAD, EOS, UNK = "<pad>", "<eos>", "<unk>"


def char_tokenizer() -> Any:
    """A ``PreTrainedTokenizerFast`` with one token per character (printable ASCII + newline)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    chars = ["\n"] + [chr(c) for c in range(32, 127)]
    vocab = {PAD: 0, EOS: 1, UNK: 2} | {ch: i + 3 for i, ch in enumerate(chars)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tok.decoder = decoders.Fuse()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token=PAD, eos_token=EOS,
                                   unk_token=UNK, padding_side="left")
    return fast


def build_tiny(seed: int, tokenizer: Any, *, hidden: int = 128, layers: int = 2) -> Any:
    """A randomly initialised Llama (``hidden`` wide, ``layers`` deep) for ``tokenizer``."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=2 * hidden,
                      num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=4,
                      max_position_embeddings=128, pad_token_id=tokenizer.pad_token_id,
                      eos_token_id=tokenizer.eos_token_id, bos_token_id=tokenizer.eos_token_id,
                      tie_word_embeddings=True)
    model = LlamaForCausalLM(cfg)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.bos_token_id = tokenizer.eos_token_id
    return model


def prompt_text(prompt: str) -> str:
    """What the model is shown for a task prompt (the completion starts right after it)."""
    return prompt + "\n"


def sft_warmup(model: Any, tokenizer: Any, pairs: Sequence[tuple[str, str, int]], *,
               steps: int, seed: int, lr: float = 3e-3, batch_size: int = 32,
               check_every: int = 0, done: Callable[[int], bool] | None = None) -> list[float]:
    """Teacher-forced training on (prompt, completion, stratum) triples, loss on the completion
    and its ``<eos>`` only; each example's stratum (a tier) is drawn uniformly first, so a large
    tier does not crowd out a small one. Returns the loss of each step. Deterministic.

    With ``done``, every ``check_every`` steps ``done(steps so far)`` is asked (the model in eval
    mode) whether the warm-up may stop there; ``steps`` is then the most it runs."""
    if steps <= 0 or not pairs:
        return []
    rng = random.Random(seed)
    torch.manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    eos = tokenizer.eos_token_id
    pad = tokenizer.pad_token_id
    strata: dict[int, list[tuple[list[int], list[int]]]] = {}
    for prompt, completion, stratum in pairs:
        p = tokenizer(prompt_text(prompt), add_special_tokens=False)["input_ids"]
        c = tokenizer(completion, add_special_tokens=False)["input_ids"] + [eos]
        strata.setdefault(stratum, []).append((p, c))
    keys = sorted(strata)
    losses: list[float] = []
    model.train()
    for _ in range(steps):
        batch = [rng.choice(strata[rng.choice(keys)]) for _ in range(batch_size)]
        width = max(len(p) + len(c) for p, c in batch)
        ids = torch.full((len(batch), width), pad, dtype=torch.long)
        labels = torch.full((len(batch), width), -100, dtype=torch.long)
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        for i, (p, c) in enumerate(batch):
            seq = p + c
            ids[i, :len(seq)] = torch.tensor(seq)
            labels[i, len(p):len(seq)] = torch.tensor(c)
            mask[i, :len(seq)] = 1
        out = model(input_ids=ids, attention_mask=mask, labels=labels)
        opt.zero_grad()
        out.loss.backward()
        opt.step()
        losses.append(float(out.loss.detach()))
        if done is not None and check_every > 0 and len(losses) % check_every == 0:
            model.eval()
            if done(len(losses)):
                break
            model.train()
    model.eval()
    return losses
