"""Checks every head shares (STYLE: one tester over all heads): determinism, save/load, gradients, memory."""

import pytest
import torch

from modeling_xl import (
    TransformerXLConfig,
    TransformerXLForCausalLM,
    TransformerXLForMultipleChoice,
    TransformerXLForPermutationLM,
    TransformerXLForQuestionAnswering,
    TransformerXLForQuestionAnsweringSimple,
    TransformerXLForSequenceClassification,
    TransformerXLForTokenClassification,
)

SMALL_BI = dict(vocab_size=50, d_model=16, n_layer=2, n_head=2, d_head=8, d_inner=32, mem_len=16, reuse_len=None,
                dropout=0.1, dropatt=0.1)


def causal():
    model = TransformerXLForCausalLM(TransformerXLConfig.from_preset("debug", dropout=0.1, dropatt=0.1))
    x = torch.randint(0, 97, (2, 6))
    return model, dict(input_ids=x), dict(input_ids=x, labels=x)


def classification():
    model = TransformerXLForSequenceClassification(TransformerXLConfig.from_preset("debug", num_labels=3))
    x = torch.randint(0, 97, (2, 6))
    return model, dict(input_ids=x), dict(input_ids=x, labels=torch.tensor([0, 2]))


def permutation_lm():
    model = TransformerXLForPermutationLM(TransformerXLConfig.from_preset("xlnet-base", **SMALL_BI))
    x = torch.randint(0, 50, (2, 6))
    perm = torch.zeros(2, 6, 6)
    perm[:, :, 4:] = 1.0  # positions 4 and 5 are targets: nobody sees their content
    mapping = torch.zeros(2, 2, 6)
    mapping[:, 0, 4] = mapping[:, 1, 5] = 1.0
    segments = torch.tensor([[0, 0, 0, 1, 1, 2]] * 2)  # A A A B B <cls>: the segment terms take part too
    inputs = dict(input_ids=x, perm_mask=perm, target_mapping=mapping, token_type_ids=segments)
    return model, inputs, dict(inputs, labels=x[:, 4:])


def question_answering_simple():
    model = TransformerXLForQuestionAnsweringSimple(TransformerXLConfig.from_preset("xlnet-base", **SMALL_BI))
    x, types = torch.randint(0, 50, (2, 6)), torch.tensor([[0, 0, 0, 1, 1, 2]] * 2)  # P <sep> Q <sep> <cls>
    return model, dict(input_ids=x, token_type_ids=types), dict(
        input_ids=x, token_type_ids=types, start_positions=torch.tensor([1, 2]), end_positions=torch.tensor([3, 2]))


def question_answering_beam():
    model = TransformerXLForQuestionAnswering(TransformerXLConfig.from_preset("debug", start_n_top=2, end_n_top=2))
    x = torch.randint(0, 97, (2, 6))
    p_mask = torch.tensor([[0, 0, 0, 1, 1, 1]] * 2)
    return model, dict(input_ids=x, p_mask=p_mask), dict(
        input_ids=x, p_mask=p_mask, start_positions=torch.tensor([1, 2]), end_positions=torch.tensor([2, 2]),
        is_impossible=torch.tensor([0.0, 1.0]), cls_index=torch.tensor([5, 5]))


def token_classification():
    model = TransformerXLForTokenClassification(TransformerXLConfig.from_preset("debug", num_labels=4))
    x = torch.randint(0, 97, (2, 6))
    return model, dict(input_ids=x), dict(input_ids=x, labels=torch.randint(0, 4, (2, 6)))


def multiple_choice():
    model = TransformerXLForMultipleChoice(TransformerXLConfig.from_preset("xlnet-base", **SMALL_BI))
    x, types = torch.randint(0, 50, (2, 3, 6)), torch.tensor([0, 0, 0, 1, 1, 2]).expand(2, 3, -1)
    return model, dict(input_ids=x, token_type_ids=types), dict(input_ids=x, token_type_ids=types,
                                                                labels=torch.tensor([0, 2]))


HEADS = {"causal": causal, "classification": classification, "permutation_lm": permutation_lm,
         "question_answering_simple": question_answering_simple, "question_answering_beam": question_answering_beam,
         "token_classification": token_classification, "multiple_choice": multiple_choice}


def first_output(out):
    """The main output of a head: logits, or the start logits / top start probabilities of the QA heads."""
    for field in ("logits", "start_logits", "start_top_log_probs"):
        if getattr(out, field, None) is not None:
            return getattr(out, field)
    raise AssertionError(f"no main output in {list(out.keys())}")


@pytest.mark.parametrize("head", HEADS)
def test_eval_is_deterministic_and_survives_save_load(head, tmp_path):
    model, inputs, _ = HEADS[head]()
    model.eval()
    first = first_output(model(**inputs))
    torch.testing.assert_close(first_output(model(**inputs)), first, rtol=0, atol=0)
    model.save_pretrained(tmp_path)
    loaded = type(model).from_pretrained(tmp_path).eval()
    torch.testing.assert_close(first_output(loaded(**inputs)), first)


@pytest.mark.parametrize("head", HEADS)
def test_training_loss_reaches_every_parameter(head):
    model, _, train_inputs = HEADS[head]()
    model.train()
    loss = model(**train_inputs).loss
    assert torch.isfinite(loss)
    loss.backward()
    missing = [name for name, p in model.named_parameters() if p.grad is None]
    if head not in ("permutation_lm",):  # the query stream's mask embedding serves pretraining only (as XLNet's)
        missing = [name for name in missing if name != "transformer.mask_emb"]
    assert not missing, missing


@pytest.mark.parametrize("head", ["causal", "permutation_lm", "question_answering_simple", "token_classification"])
def test_memory_is_returned_detached_and_accepted_back(head):
    model, inputs, _ = HEADS[head]()
    model.train()
    out = model(**inputs, **({} if head in ("causal", "permutation_lm") else {"use_mems": True}))
    assert out.mems is not None and len(out.mems) == model.config.n_layer
    assert all(not m.requires_grad for m in out.mems)
    again = model(**inputs, mems=out.mems)
    assert first_output(again).shape == first_output(out).shape
