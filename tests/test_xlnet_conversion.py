"""Import of transformers XLNet checkpoints: key map coverage, shape checks, folders, classification-head weights."""

import pytest
import torch
from transformers import XLNetConfig, XLNetForSequenceClassification, XLNetLMHeadModel, XLNetModel

from modeling_xl import TransformerXLForPermutationLM, TransformerXLPermutationModel
from modeling_xl.xlnet_conversion import (
    BACKBONE_KEY_MAP,
    config_from_xlnet,
    convert_xlnet_state_dict,
    from_xlnet,
    xlnet_head_state_dict,
)

V = 40


def xlnet_config(**overrides):
    values = dict(vocab_size=V, d_model=16, n_layer=2, n_head=2, d_inner=32, ff_activation="gelu", mem_len=5,
                  dropout=0.0, initializer_range=0.3, num_labels=3)
    return XLNetConfig(**{**values, **overrides})


def test_key_map_covers_every_parameter_and_every_source_key():
    reference = XLNetLMHeadModel(xlnet_config())
    config = config_from_xlnet(reference.config)
    converted = convert_xlnet_state_dict(reference.state_dict(), config)
    ours = TransformerXLForPermutationLM(config).state_dict()
    assert set(ours) - set(converted) == {"lm_head.weight"}  # tied to the embedding
    assert set(converted) <= set(ours)
    for key, tensor in converted.items():
        assert tensor.shape == ours[key].shape, key
    assert sum("{}" in k for k in BACKBONE_KEY_MAP) == 15
    q, k, v = (reference.transformer.layer[1].rel_attn.__getattr__(p).detach() for p in "qkv")
    torch.testing.assert_close(converted["transformer.layers.1.attn.qkv_net.weight"][16:32], k.reshape(16, -1).t())


def test_folder_round_trip_equals_transformers(tmp_path):
    reference = XLNetLMHeadModel(xlnet_config()).eval()
    reference.save_pretrained(tmp_path / "xlnet")
    # converted on load, then saved in this package's format
    TransformerXLForPermutationLM.from_pretrained(tmp_path / "xlnet").save_pretrained(tmp_path / "ours")
    loaded = TransformerXLForPermutationLM.from_pretrained(tmp_path / "ours").eval()
    x = torch.randint(0, V, (2, 6))
    target_mapping = torch.eye(6)[None, [1, 4]].expand(2, -1, -1)
    perm_mask = torch.zeros(2, 6, 6)
    perm_mask[:, :, [1, 4]] = 1.0
    torch.testing.assert_close(loaded(x, perm_mask, target_mapping).logits,
                               reference(x, perm_mask=perm_mask, target_mapping=target_mapping).logits,
                               atol=1e-5, rtol=0)


def test_sequence_classification_weights_arrive_and_reproduce_transformers_logits():
    reference = XLNetForSequenceClassification(xlnet_config()).eval()
    config = config_from_xlnet(reference.config)
    head = xlnet_head_state_dict(reference.state_dict())
    assert {k: tuple(v.shape) for k, v in head.items()} == {
        "sequence_summary.summary.weight": (16, 16), "sequence_summary.summary.bias": (16,),
        "logits_proj.weight": (3, 16), "logits_proj.bias": (3,)}
    torch.testing.assert_close(head["logits_proj.weight"], reference.logits_proj.weight.detach())
    torch.testing.assert_close(head["sequence_summary.summary.bias"],
                               reference.sequence_summary.summary.bias.detach())
    # The backbone of a classification checkpoint loads too; with the mapped head it gives transformers' logits.
    backbone = from_xlnet(TransformerXLPermutationModel, reference)
    x, tt = torch.randint(0, V, (2, 7)), torch.tensor([[0, 0, 0, 1, 1, 1, 2]] * 2)
    attention_mask = torch.ones(2, 7)
    attention_mask[0, :2] = 0.0
    hidden = backbone(x, token_type_ids=tt, attention_mask=attention_mask).last_hidden_state[:, -1]
    summary = torch.tanh(hidden @ head["sequence_summary.summary.weight"].t() + head["sequence_summary.summary.bias"])
    logits = summary @ head["logits_proj.weight"].t() + head["logits_proj.bias"]
    want = reference(x, token_type_ids=tt, attention_mask=attention_mask).logits
    torch.testing.assert_close(logits, want, atol=1e-5, rtol=0)
    assert xlnet_head_state_dict(XLNetLMHeadModel(xlnet_config()).state_dict()) == {}


def test_bare_xlnet_model_loads_into_backbone():
    reference = XLNetModel(xlnet_config()).eval()
    ours = from_xlnet(TransformerXLPermutationModel, reference)
    x = torch.randint(0, V, (2, 5))
    torch.testing.assert_close(ours(x).last_hidden_state, reference(x).last_hidden_state, atol=1e-5, rtol=0)


def test_bad_checkpoints_raise_naming_the_key():
    reference = XLNetLMHeadModel(xlnet_config())
    config = config_from_xlnet(reference.config)
    state = dict(reference.state_dict())
    wrong = dict(state, **{"transformer.layer.0.ff.layer_1.weight": torch.zeros(31, 16)})
    with pytest.raises(ValueError, match=r"transformer.layers.0.ff.layer_1.weight.*expected \(32, 16\)"):
        convert_xlnet_state_dict(wrong, config)
    missing = {k: v for k, v in state.items() if k != "transformer.layer.1.rel_attn.seg_embed"}
    with pytest.raises(ValueError, match="lacks 'transformer.layer.1.rel_attn.seg_embed'"):
        convert_xlnet_state_dict(missing, config)
    with pytest.raises(ValueError, match="no counterpart here: \\['pooler.weight'\\]"):
        convert_xlnet_state_dict(dict(state, **{"pooler.weight": torch.zeros(2, 16)}), config)
    bad_shape = dict(state, **{"transformer.layer.0.rel_attn.q": torch.zeros(15, 2, 8)})
    with pytest.raises(ValueError, match="cannot be converted to 'transformer.layers.0.attn.qkv_net.weight'"):
        convert_xlnet_state_dict(bad_shape, config)
    with pytest.raises(ValueError, match="ff_activation='gelu_new' is not supported"):
        config_from_xlnet(xlnet_config(ff_activation="gelu_new"))
    with pytest.raises(ValueError, match="is not a folder"):
        from_xlnet(TransformerXLForPermutationLM, "/nonexistent/xlnet")
