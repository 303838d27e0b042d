"""Small causal and permutation LMs with a batch for each, shared by tests that run both heads through the same
machinery (compiled autograd, FSDP2, torch.compile of a layer)."""

import torch

from modeling_xl import TransformerXLConfig, TransformerXLForCausalLM, TransformerXLForPermutationLM

VOCAB, BATCH, SEQ = 60, 2, 6


def small_lm(head: str, n_layer: int = 2, dropout: float = 0.0):
    """A fresh `head` ("causal" or "plm") model, tied input and output tables, in training mode."""
    common = dict(vocab_size=VOCAB, d_model=16, n_layer=n_layer, n_head=2, d_head=8, d_inner=32, mem_len=4,
                  dropout=dropout, dropatt=dropout)
    if head == "causal":
        return TransformerXLForCausalLM(TransformerXLConfig(**common, d_embed=16, cutoffs=[30], div_val=1)).train()
    config = TransformerXLConfig(**common, adaptive=False, attn_type="bi", ff_activation="gelu", reuse_len=3)
    return TransformerXLForPermutationLM(config).train()


def lm_batch(head: str) -> dict:
    """Random inputs with labels for `head`: the causal LM predicts its own ids, the permutation LM two targets per
    row under a random perm_mask."""
    ids = torch.randint(0, VOCAB, (BATCH, SEQ))
    if head == "causal":
        return dict(input_ids=ids, labels=ids)
    return dict(input_ids=ids, perm_mask=(torch.rand(BATCH, SEQ, SEQ) > 0.5).float(),
                target_mapping=torch.nn.functional.one_hot(torch.tensor([[1, 4], [2, 5]]), SEQ).float(),
                labels=torch.randint(0, VOCAB, (BATCH, 2)))
