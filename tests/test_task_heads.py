"""The task heads: span question answering (simple and XLNet's beam head), token classification, multiple choice.

Against transformers' XLNet heads (random weights, imported: equal outputs and memories over two segments), against
themselves (segment by segment equals one long read; absent choices change nothing), through the Auto classes and
remote code, and with bad input (named errors).
"""

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from transformers import (
    AutoConfig,
    AutoModelForMultipleChoice,
    AutoModelForQuestionAnswering,
    AutoModelForTokenClassification,
    XLNetConfig,
    XLNetForMultipleChoice,
    XLNetForQuestionAnswering,
    XLNetForQuestionAnsweringSimple,
    XLNetForSequenceClassification,
    XLNetForTokenClassification,
    XLNetLMHeadModel,
)

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

V = 40
SMALL_BI = dict(vocab_size=V, d_model=16, n_layer=2, n_head=2, d_head=8, d_inner=32, mem_len=8, reuse_len=None,
                dropout=0.1, dropatt=0.1, num_labels=3)


def xlnet_config(**overrides):
    values = dict(vocab_size=V, d_model=16, n_layer=2, n_head=2, d_inner=32, ff_activation="gelu", mem_len=6,
                  dropout=0.0, initializer_range=0.3, num_labels=3, start_n_top=3, end_n_top=2)
    return XLNetConfig(**{**values, **overrides})


def causal_config(**overrides):
    return TransformerXLConfig.from_preset("debug", **{"num_labels": 3, "mem_len": 32, **overrides})


def bi_config(**overrides):
    return TransformerXLConfig.from_preset("xlnet-base", **{**SMALL_BI, **overrides})


def segments(batch=2, length=7, seed=0):
    generator = torch.Generator().manual_seed(seed)
    x = torch.randint(0, V, (batch, length), generator=generator)
    types = torch.tensor([[0] * (length - 3) + [1, 1, 2]] * batch)
    return x, types


# --- transformers' XLNet heads, imported ----------------------------------------------------------------------------

def two_segment_outputs(model, fields, **extra):
    """Two segments with memory: (outputs of the first, outputs of the second) as {field: tensor}."""
    x1, types = segments(seed=1)
    x2, _ = segments(seed=2)
    mask = torch.ones_like(x1)
    mask[0, :2] = 0  # left padding in the first segment of row 0
    first = model(x1, attention_mask=mask, token_type_ids=types, use_mems=True, **extra)
    second = model(x2, token_type_ids=types, mems=first.mems, use_mems=True, **extra)
    return [{f: getattr(out, f) for f in fields} | {"mems": out.mems} for out in (first, second)]


@pytest.mark.parametrize("reference_class, ours_class, fields", [
    (XLNetForQuestionAnsweringSimple, TransformerXLForQuestionAnsweringSimple, ("start_logits", "end_logits")),
    (XLNetForTokenClassification, TransformerXLForTokenClassification, ("logits",)),
    (XLNetForQuestionAnswering, TransformerXLForQuestionAnswering,
     ("start_top_log_probs", "start_top_index", "end_top_log_probs", "end_top_index", "cls_logits")),
])
def test_xlnet_heads_import_with_equal_outputs_and_memories(reference_class, ours_class, fields, tmp_path):
    torch.manual_seed(0)
    # transformers' simple QA head is Linear(d, num_labels) split in two: its checkpoints have num_labels=2
    labels = 2 if reference_class is XLNetForQuestionAnsweringSimple else 3
    reference = reference_class(xlnet_config(num_labels=labels)).eval()
    reference.save_pretrained(tmp_path / "xlnet")
    ours = ours_class.from_pretrained(tmp_path / "xlnet").eval()  # a transformers folder: converted on load
    assert ours.config.model_type == "transformer-xl" and ours.config.start_n_top == 3
    with torch.no_grad():
        want = two_segment_outputs(reference, fields)
        got = two_segment_outputs(ours, fields)
    for w, g in zip(want, got):
        for field in fields:
            torch.testing.assert_close(g[field], w[field], atol=1e-5, rtol=0, msg=field)
        assert len(g["mems"]) == len(w["mems"]) == 2
        for m_got, m_want in zip(g["mems"], w["mems"]):  # XLNet's memories are time-major [M, B, d]
            torch.testing.assert_close(m_got, m_want.transpose(0, 1), atol=1e-5, rtol=0)


def test_xlnet_beam_head_training_loss_equals_transformers():
    torch.manual_seed(0)
    reference = XLNetForQuestionAnswering(xlnet_config()).eval()
    from modeling_xl.xlnet_conversion import from_xlnet

    ours = from_xlnet(TransformerXLForQuestionAnswering, reference)
    x, types = segments()
    p_mask = (types != 0).float()
    labels = dict(start_positions=torch.tensor([1, 2]), end_positions=torch.tensor([3, 2]),
                  is_impossible=torch.tensor([0.0, 1.0]), cls_index=torch.tensor([6, 6]))
    want = reference(x, token_type_ids=types, p_mask=p_mask, **labels).loss
    got = ours(x, token_type_ids=types, p_mask=p_mask, **labels).loss
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)


def test_xlnet_multiple_choice_imports_with_equal_logits(tmp_path):
    torch.manual_seed(0)
    reference = XLNetForMultipleChoice(xlnet_config()).eval()
    reference.save_pretrained(tmp_path / "xlnet")
    ours = TransformerXLForMultipleChoice.from_pretrained(tmp_path / "xlnet").eval()
    x = torch.randint(0, V, (2, 4, 6))
    mask = torch.ones_like(x)
    mask[:, 1, :2] = 0  # left padding, as XLNet pads
    types = torch.tensor([0, 0, 0, 1, 1, 2]).expand(2, 4, -1)
    with torch.no_grad():
        want = reference(x, attention_mask=mask, token_type_ids=types, labels=torch.tensor([1, 3]))
        got = ours(x, attention_mask=mask, token_type_ids=types, labels=torch.tensor([1, 3]))
    torch.testing.assert_close(got.logits, want.logits, atol=1e-5, rtol=0)
    torch.testing.assert_close(got.loss, want.loss, atol=1e-5, rtol=0)


def test_transformers_xlnet_folders_load_through_from_pretrained(tmp_path):
    """A saved `XLNetLMHeadModel` / `XLNetForSequenceClassification` folder through our `from_pretrained`: every
    weight imported (logits equal), not a random model with a MISSING table."""
    torch.manual_seed(0)
    lm = XLNetLMHeadModel(xlnet_config()).eval()
    lm.save_pretrained(tmp_path / "lm")
    ours = TransformerXLForPermutationLM.from_pretrained(tmp_path / "lm").eval()
    x = torch.randint(0, V, (2, 6))
    perm = torch.zeros(2, 6, 6)
    perm[:, :, [1, 4]] = 1.0
    mapping = torch.eye(6)[None, [1, 4]].expand(2, -1, -1)
    torch.testing.assert_close(ours(x, perm, mapping).logits,
                               lm(x, perm_mask=perm, target_mapping=mapping).logits, atol=1e-5, rtol=0)
    lm.save_pretrained(tmp_path / "sharded", max_shard_size="20KB")  # model.safetensors.index.json + shards
    assert len(list((tmp_path / "sharded").glob("model-*.safetensors"))) > 1
    sharded = TransformerXLForPermutationLM.from_pretrained(tmp_path / "sharded").eval()
    torch.testing.assert_close(sharded(x, perm, mapping).logits, ours(x, perm, mapping).logits, rtol=0, atol=0)
    # a new head on the LM's backbone: the head is reported as newly initialised; dtype and device apply
    tagger, info = TransformerXLForTokenClassification.from_pretrained(
        tmp_path / "lm", output_loading_info=True, dtype="bfloat16", device_map="cpu")
    assert info["missing_keys"] == {"classifier.weight", "classifier.bias"} and not info["mismatched_keys"]
    assert tagger.classifier.weight.dtype == torch.bfloat16 and tagger.transformer.word_emb.weight.device.type == "cpu"
    classifier = XLNetForSequenceClassification(xlnet_config()).eval()
    classifier.save_pretrained(tmp_path / "cls")
    assert TransformerXLConfig.from_pretrained(tmp_path / "cls").num_labels == 3
    ours = TransformerXLForSequenceClassification.from_pretrained(tmp_path / "cls").eval()
    torch.testing.assert_close(ours(x).logits, classifier(x).logits, atol=1e-5, rtol=0)
    # another number of labels: refused by name, or a new head on request (the backbone still imported)
    with pytest.raises(ValueError, match=r"logits_proj.bias' has shape \(3,\).*expects \(5,\).*ignore_mismatched_sizes"):
        TransformerXLForSequenceClassification.from_pretrained(tmp_path / "cls", num_labels=5)
    five = TransformerXLForSequenceClassification.from_pretrained(tmp_path / "cls", num_labels=5,
                                                                  ignore_mismatched_sizes=True)
    torch.testing.assert_close(five.transformer.word_emb.weight, classifier.transformer.word_embedding.weight)


# --- our heads on both backbones ------------------------------------------------------------------------------------

def test_token_classification_segment_by_segment_equals_one_long_read():
    """Causal backbone with memory as long as the document: tagging it 4 tokens at a time (memory carried, right
    padding in row 1) gives the logits and the loss of one read of the whole document."""
    torch.manual_seed(0)
    model = TransformerXLForTokenClassification(causal_config()).eval()
    x = torch.randint(1, 97, (2, 11))
    mask = torch.ones_like(x)
    mask[1, 7:] = 0
    labels = torch.randint(0, 3, (2, 11)).masked_fill(mask == 0, -100)
    labels[0, 0] = -100
    whole = model(x, attention_mask=mask, labels=labels)
    pieces = model(x, attention_mask=mask, labels=labels, segment_len=4)
    real = mask.bool()
    torch.testing.assert_close(pieces.logits[real], whole.logits[real], atol=1e-5, rtol=0)
    torch.testing.assert_close(pieces.loss, whole.loss, atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match="expected right padding"):
        model(x, attention_mask=mask.flip(1), segment_len=4)


def test_token_classification_long_documents_train_every_segment():
    model = TransformerXLForTokenClassification(bi_config())
    model.train()
    x = torch.randint(0, V, (2, 10))
    out = model(x, labels=torch.randint(0, 3, (2, 10)), segment_len=4)
    out.loss.backward()
    assert out.logits.shape == (2, 10, 3)
    assert model.classifier.weight.grad is not None and model.transformer.word_emb.weight.grad.abs().sum() > 0
    with pytest.raises(ValueError, match="cannot hide memory positions"):
        model(x, attention_mask=torch.ones_like(x).index_fill(1, torch.tensor([9]), 0), segment_len=4)


@pytest.mark.parametrize("config", [causal_config, bi_config])
def test_multiple_choice_absent_choices_change_nothing(config):
    """A question with 3 choices beside one with 5: the absent choices score the dtype's lowest value, and the
    present ones score as when each question is asked alone."""
    torch.manual_seed(0)
    model = TransformerXLForMultipleChoice(config()).eval()
    x = torch.randint(1, V, (2, 5, 6))
    mask = torch.ones_like(x)
    mask[0, 3:] = 0  # question 0 has 3 choices
    out = model(x, attention_mask=mask, labels=torch.tensor([2, 4]))
    alone = model(x[:1, :3], attention_mask=mask[:1, :3]).logits
    torch.testing.assert_close(out.logits[0, :3], alone[0], atol=1e-5, rtol=0)
    assert (out.logits[0, 3:] == torch.finfo(out.logits.dtype).min).all()
    assert torch.isfinite(out.loss)
    with pytest.raises(ValueError, match=r"labels\[0\]=4 names an absent choice"):
        model(x, attention_mask=mask, labels=torch.tensor([4, 4]))
    with pytest.raises(ValueError, match=r"labels contains 5; expected choice indices in \[0, num_choices=5\)"):
        model(x, attention_mask=mask, labels=torch.tensor([0, 5]))


def test_bad_input_gets_named_errors():
    simple = TransformerXLForQuestionAnsweringSimple(causal_config())
    beam = TransformerXLForQuestionAnswering(causal_config())
    tagger = TransformerXLForTokenClassification(causal_config())
    x = torch.randint(1, 97, (2, 6))
    # outside the window: ignored by the simple head (transformers' rule), refused by the beam head
    out = simple(x, start_positions=torch.tensor([2, 9]), end_positions=torch.tensor([3, 9]))
    assert torch.isfinite(out.loss)
    with pytest.raises(ValueError, match=r"start_positions contains 9; expected token positions in \[0, 6\)"):
        beam(x, start_positions=torch.tensor([2, 9]), end_positions=torch.tensor([3, 4]))
    with pytest.raises(ValueError, match=r"p_mask has shape \(2, 5\); expected \[batch=2, seq_len=6\]"):
        beam(x, p_mask=torch.zeros(2, 5))
    with pytest.raises(ValueError, match=r"labels has shape \(2, 5\); expected one label per token \(2, 6\)"):
        tagger(x, labels=torch.zeros(2, 5, dtype=torch.long))
    with pytest.raises(ValueError, match=r"labels contains 7; expected tag ids in \[0, num_labels=3\)"):
        tagger(x, labels=torch.full((2, 6), 7))
    with pytest.raises(ValueError, match="attention_mask marks no real token in sequences \\[1\\]"):
        tagger(x, attention_mask=torch.tensor([[1] * 6, [0] * 6]))


def test_beam_head_inference_shapes_and_probabilities():
    model = TransformerXLForQuestionAnswering(bi_config(start_n_top=4, end_n_top=3)).eval()
    x, types = segments()
    p_mask = (types != 0).float()
    out = model(x, token_type_ids=types, p_mask=p_mask)
    assert out.start_top_index.shape == (2, 4) and out.end_top_index.shape == (2, 12) and out.cls_logits.shape == (2,)
    assert (out.start_top_index < 4).all() and (out.end_top_index < 4).all()  # never in the masked question part
    assert (out.start_top_log_probs[:, :-1] >= out.start_top_log_probs[:, 1:]).all()


# --- Auto classes, saved folders, remote code -----------------------------------------------------------------------

@pytest.mark.parametrize("lm_class, config", [(TransformerXLForCausalLM, causal_config),
                                              (TransformerXLForPermutationLM, bi_config)])
def test_language_model_folders_start_every_task_head(lm_class, config, tmp_path):
    lm = lm_class(config())
    lm.save_pretrained(tmp_path)
    auto_map = json.loads((tmp_path / "config.json").read_text())["auto_map"]
    assert auto_map["AutoModelForQuestionAnswering"].endswith("TransformerXLForQuestionAnsweringSimple")
    assert auto_map["AutoModelForTokenClassification"].endswith("TransformerXLForTokenClassification")
    assert auto_map["AutoModelForMultipleChoice"].endswith("TransformerXLForMultipleChoice")
    for auto, head in ((AutoModelForQuestionAnswering, TransformerXLForQuestionAnsweringSimple),
                       (AutoModelForTokenClassification, TransformerXLForTokenClassification),
                       (AutoModelForMultipleChoice, TransformerXLForMultipleChoice)):
        model, info = auto.from_pretrained(tmp_path, output_loading_info=True)
        assert isinstance(model, head)
        assert not [k for k in info["missing_keys"] if k.startswith("transformer.")]
        for name, param in lm.transformer.state_dict().items():
            torch.testing.assert_close(model.transformer.state_dict()[name], param)


def test_a_task_folder_maps_task_heads_and_no_language_model(tmp_path):
    TransformerXLForQuestionAnswering(bi_config()).save_pretrained(tmp_path)
    auto_map = AutoConfig.from_pretrained(tmp_path).auto_map
    assert auto_map["AutoModelForQuestionAnswering"] == "modeling_question_answering.TransformerXLForQuestionAnswering"
    assert "AutoModelForPreTraining" not in auto_map and "AutoModelForCausalLM" not in auto_map
    assert auto_map["AutoModel"] == "modeling_permutation_lm.TransformerXLPermutationModel"


REMOTE = textwrap.dedent("""
    import sys, torch
    sys.modules["modeling_xl"] = None  # the code must come from the checkpoint folders
    from transformers import AutoModelForMultipleChoice, AutoModelForQuestionAnswering, AutoModelForTokenClassification
    x = torch.load(sys.argv[4], weights_only=True)
    out = {}
    beam = AutoModelForQuestionAnswering.from_pretrained(sys.argv[3], trust_remote_code=True).eval()
    out["beam"] = {"qa_class": type(beam).__name__, "start": beam(x).start_top_log_probs}
    for folder in sys.argv[1:3]:
        qa = AutoModelForQuestionAnswering.from_pretrained(folder, trust_remote_code=True).eval()
        tagger = AutoModelForTokenClassification.from_pretrained(folder, trust_remote_code=True).eval()
        chooser = AutoModelForMultipleChoice.from_pretrained(folder, trust_remote_code=True).eval()
        for model in (qa, tagger, chooser):
            assert type(model).__module__.startswith("transformers_modules"), type(model).__module__
        out[folder] = {"start": qa(x).start_logits, "tags": tagger(x).logits, "choices": chooser(x[None]).logits,
                       "qa_class": type(qa).__name__}
    torch.save(out, sys.argv[5])
""")


def test_remote_code_loads_every_task_head_in_a_fresh_process(tmp_path):
    torch.manual_seed(0)
    heads = {"simple": TransformerXLForQuestionAnsweringSimple(causal_config()),
             "beam_tagger": TransformerXLForTokenClassification(bi_config())}
    heads["simple"].save_pretrained(tmp_path / "simple")
    heads["beam_tagger"].save_pretrained(tmp_path / "tagger")
    beam = TransformerXLForQuestionAnswering(bi_config()).eval()
    beam.save_pretrained(tmp_path / "beam")  # XLNet's head: its own folder maps AutoModelForQuestionAnswering to it
    x = torch.randint(1, V, (2, 5))
    torch.save(x, tmp_path / "x.pt")
    (tmp_path / "remote.py").write_text(REMOTE)
    env = {**os.environ, "HF_MODULES_CACHE": str(tmp_path / "modules"), "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, str(tmp_path / "remote.py"), str(tmp_path / "simple"),
                           str(tmp_path / "tagger"), str(tmp_path / "beam"), str(tmp_path / "x.pt"),
                           str(tmp_path / "out.pt")],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = torch.load(tmp_path / "out.pt", weights_only=True)
    simple = heads["simple"].eval()
    torch.testing.assert_close(got[str(tmp_path / "simple")]["start"], simple(x).start_logits)
    tagger = heads["beam_tagger"].eval()
    torch.testing.assert_close(got[str(tmp_path / "tagger")]["tags"], tagger(x).logits)
    assert got[str(tmp_path / "tagger")]["qa_class"] == "TransformerXLForQuestionAnsweringSimple"
    assert got["beam"]["qa_class"] == "TransformerXLForQuestionAnswering"
    torch.testing.assert_close(got["beam"]["start"], beam(x).start_top_log_probs)


def test_squad_metric_follows_the_official_v1_definition():
    """Normalisation (case, punctuation, articles, spaces), best gold answer per question, a missing prediction 0."""
    import evaluate

    from modeling_xl.metrics import METRICS_DIR

    metric = evaluate.load(str(METRICS_DIR / "squad"))
    references = [{"id": "a", "answers": {"text": ["Denver Broncos", "the Broncos"], "answer_start": [0, 0]}},
                  {"id": "b", "answers": {"text": ["1990 census"], "answer_start": [4]}},
                  {"id": "c", "answers": {"text": ["x"], "answer_start": [0]}}]
    predictions = [{"id": "a", "prediction_text": "The  Denver BRONCOS!"}, {"id": "b", "prediction_text": "in 1990"}]
    scores = metric.compute(predictions=predictions, references=references[:2])
    assert scores == pytest.approx({"exact_match": 50.0, "f1": 75.0})  # b: 1 word in common, P = R = 1/2
    module = sys.modules[type(metric).__module__]
    # "Broncos" matches the gold "the Broncos" exactly once normalised; b and c have no prediction: 0 each
    assert module.squad_v1({"a": "Broncos"}, references) == pytest.approx({"exact_match": 100 / 3, "f1": 100 / 3})
