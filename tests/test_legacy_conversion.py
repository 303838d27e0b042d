"""Legacy transformers-4.35 Transformer-XL checkpoints load into ours with the same log-probs, NLL and memories.

The fixtures (tests/fixtures/legacy_transfo_xl, made by make_fixtures.py in a transformers==4.35.0 venv) hold tiny
random-weight legacy checkpoints and the legacy outputs over three segments with memory carried.
"""

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from modeling_xl import TransformerXLConfig, TransformerXLForCausalLM, TransformerXLModel
from modeling_xl.legacy_conversion import convert_key, read_legacy_weights

FIXTURES = Path(__file__).parent / "fixtures" / "legacy_transfo_xl"
CASES = ["case_a", "case_b", "case_c"]
REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))
import convert_transfo_xl  # noqa: E402


def legacy_mems(expected, prefix, n_layer):
    """Legacy time-first memories [M, B, d] -> ours [B, M, d]; an empty legacy memory means no memory."""
    mems = tuple(expected[f"{prefix}_{layer}"].transpose(0, 1) for layer in range(n_layer))
    return None if mems[0].size(1) == 0 else mems


def assert_matches_legacy(model, case):
    meta = json.loads((FIXTURES / case / "expected.json").read_text())
    expected = load_file(FIXTURES / case / "expected.safetensors")
    mems = legacy_mems(expected, "init_mems", meta["n_layer"])
    for s in range(meta["n_segments"]):
        ids = expected[f"input_ids_{s}"]
        out = model(ids, mems=mems)
        torch.testing.assert_close(out.logits, expected[f"log_probs_{s}"], atol=1e-5, rtol=0)
        nll = model(ids, mems=mems, labels=ids).losses
        torch.testing.assert_close(nll, expected[f"nll_{s}"], atol=1e-5, rtol=0)
        want = legacy_mems(expected, f"new_mems_{s}", meta["n_layer"])
        assert len(out.mems) == len(want)
        for got, ref in zip(out.mems, want):
            torch.testing.assert_close(got, ref, atol=1e-5, rtol=0)
        mems = out.mems


@pytest.mark.parametrize("case", CASES)
def test_legacy_checkpoint_matches_reference_outputs(case):
    model = TransformerXLForCausalLM.from_pretrained(FIXTURES / case)
    assert_matches_legacy(model, case)


@pytest.mark.parametrize("case", CASES)
def test_converted_checkpoint_round_trips_in_our_format(case, tmp_path):
    if case == "case_a":  # the command line once, the library function for the others
        proc = subprocess.run([sys.executable, str(REPO / "scripts" / "convert_transfo_xl.py"),
                               str(FIXTURES / case), str(tmp_path / "out")], capture_output=True, text=True,
                              timeout=120)
        assert proc.returncode == 0, proc.stderr[-2000:]
    else:
        convert_transfo_xl.convert(str(FIXTURES / case), str(tmp_path / "out"))
    assert (tmp_path / "out" / "model.safetensors").exists()
    assert json.loads((tmp_path / "out" / "config.json").read_text())["model_type"] == "transformer-xl"
    assert_matches_legacy(TransformerXLForCausalLM.from_pretrained(tmp_path / "out"), case)


def test_backbone_loads_from_legacy_checkpoint():
    expected = load_file(FIXTURES / "case_a" / "expected.safetensors")
    meta = json.loads((FIXTURES / "case_a" / "expected.json").read_text())
    backbone = TransformerXLModel.from_pretrained(FIXTURES / "case_a")
    out = backbone(expected["input_ids_0"], mems=legacy_mems(expected, "init_mems", meta["n_layer"]))
    torch.testing.assert_close(out.last_hidden_state, expected["last_hidden_0"], atol=1e-5, rtol=0)


def test_legacy_checkpoint_takes_config_overrides():
    """from_pretrained's config keyword arguments apply to a converted legacy checkpoint as to one of ours (the
    paper's evaluation lengthens mem_len / clamp_len); invalid or unknown ones raise naming them."""
    plain = TransformerXLForCausalLM.from_pretrained(FIXTURES / "case_a")
    model = TransformerXLForCausalLM.from_pretrained(FIXTURES / "case_a", mem_len=20, clamp_len=-1,
                                                     same_length=False, output_hidden_states=True)
    assert (plain.config.mem_len, plain.config.clamp_len, plain.config.same_length) == (6, 3, True)
    assert (model.config.mem_len, model.config.clamp_len, model.config.same_length) == (20, -1, False)
    assert model.config.output_hidden_states
    for name, value in plain.state_dict().items():
        assert torch.equal(model.state_dict()[name], value), name
    x = torch.randint(0, model.config.vocab_size, (1, 8))
    assert model(x).mems[0].size(1) == 8  # mem_len 20 keeps the whole segment (6 would keep 6)
    with pytest.raises(ValueError, match="mem_len=-3"):
        TransformerXLForCausalLM.from_pretrained(FIXTURES / "case_a", mem_len=-3)
    with pytest.raises(ValueError, match="memlen: not a TransformerXLConfig field"):
        TransformerXLForCausalLM.from_pretrained(FIXTURES / "case_a", memlen=3)


def test_legacy_checkpoint_as_classifier_and_config():
    """A classifier takes a legacy checkpoint's backbone (its head is new, with a warning), and TransformerXLConfig
    reads a legacy config.json (converted, with overrides)."""
    from modeling_xl import TransformerXLConfig, TransformerXLForSequenceClassification

    classifier = TransformerXLForSequenceClassification.from_pretrained(FIXTURES / "case_a", num_labels=2).eval()
    lm = TransformerXLForCausalLM.from_pretrained(FIXTURES / "case_a")
    x = torch.randint(0, lm.config.vocab_size, (2, 5))
    assert classifier.config.num_labels == 2 and classifier(x).logits.shape == (2, 2)
    torch.testing.assert_close(classifier.transformer(x).last_hidden_state, lm.transformer(x).last_hidden_state,
                               rtol=0, atol=0)
    config = TransformerXLConfig.from_pretrained(FIXTURES / "case_a", mem_len=9)
    assert config.mem_len == 9 and config.to_dict() == {**lm.config.to_dict(), "mem_len": 9}
    config, unused = TransformerXLConfig.from_pretrained(FIXTURES / "case_a", return_unused_kwargs=True, foo=1)
    assert unused == {"foo": 1}
    # transformers' own loading arguments are accepted (and reported) as for a checkpoint of ours
    _, info = TransformerXLForSequenceClassification.from_pretrained(
        FIXTURES / "case_a", num_labels=2, output_loading_info=True, ignore_mismatched_sizes=True, variant=None)
    assert info["missing_keys"] == {"logits_proj.weight", "logits_proj.bias", "sequence_summary.summary.weight",
                                    "sequence_summary.summary.bias"}


@pytest.mark.parametrize("case", CASES)
def test_auto_classes_load_a_legacy_checkpoint(case):
    """After `import modeling_xl`, AutoConfig and the AutoModel classes read a legacy folder (model_type "transfo-xl",
    unknown to transformers 5) as the classes do: converted config, converted weights, reference outputs."""
    from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, AutoModelForSequenceClassification

    from modeling_xl import TransformerXLConfig, TransformerXLForSequenceClassification

    config = AutoConfig.from_pretrained(FIXTURES / case, mem_len=9)
    assert type(config) is TransformerXLConfig and config.model_type == "transformer-xl" and config.mem_len == 9
    assert config.to_dict() == TransformerXLConfig.from_pretrained(FIXTURES / case, mem_len=9).to_dict()
    model = AutoModelForCausalLM.from_pretrained(FIXTURES / case)
    assert type(model) is TransformerXLForCausalLM
    assert_matches_legacy(model, case)
    assert type(AutoModel.from_pretrained(FIXTURES / case)) is TransformerXLModel
    classifier = AutoModelForSequenceClassification.from_pretrained(FIXTURES / case, num_labels=3)
    assert type(classifier) is TransformerXLForSequenceClassification and classifier.config.num_labels == 3
    assert AutoModelForCausalLM.from_pretrained(FIXTURES / case, dtype=torch.bfloat16).dtype == torch.bfloat16
    # dtype as a name and "auto" (the checkpoint's, float32 here; pipeline() passes "auto") were handed to .to()
    assert AutoModelForCausalLM.from_pretrained(FIXTURES / case, dtype="bfloat16").dtype == torch.bfloat16
    assert AutoModelForCausalLM.from_pretrained(FIXTURES / case, dtype="auto").dtype == torch.float32
    for device_map in ("cpu", {"": "cpu"}, "balanced", "auto"):  # strategies: a warning, the model on the CPU
        assert AutoModelForCausalLM.from_pretrained(FIXTURES / case, device_map=device_map).device.type == "cpu"
    from modeling_xl.legacy_conversion import resolve_device_map

    with pytest.raises(ValueError, match=r"device_map='gpu-ish' is invalid; expected a device"):
        resolve_device_map("gpu-ish")
    from modeling_xl.legacy_conversion import resolve_dtype

    for bad in ("half-ish", "int8", 3):
        with pytest.raises(ValueError, match=f"dtype={bad!r} is invalid; expected a floating-point torch dtype"):
            resolve_dtype(bad)


def test_every_legacy_key_has_a_name_and_unknown_keys_raise():
    for case in CASES:
        meta = json.loads((FIXTURES / case / "expected.json").read_text())
        for key in meta["legacy_state_dict"]:
            convert_key(key)  # raises on an unknown key
    with pytest.raises(ValueError, match="not a known Transformer-XL weight"):
        convert_key("transformer.layers.0.dec_attn.surprise")


def test_mismatched_shapes_and_pickles_are_refused(tmp_path):
    broken = tmp_path / "broken"
    shutil.copytree(FIXTURES / "case_a", broken)
    config = json.loads((broken / "config.json").read_text())
    config["d_inner"] += 1
    (broken / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"has shape .* expected"):
        TransformerXLForCausalLM.from_pretrained(broken)

    torch.save({"transformer.r_w_bias": argparse.Namespace(payload="arbitrary object")}, tmp_path / "evil.bin")
    with pytest.raises(ValueError, match="weights_only=True"):
        read_legacy_weights(str(tmp_path / "evil.bin"))


def test_convert_script_rejects_a_folder_that_is_not_legacy(tmp_path):
    with pytest.raises(ValueError, match="transfo-xl"):
        convert_transfo_xl.convert(str(tmp_path), str(tmp_path / "out"))
    with pytest.raises(ValueError, match="is not a folder"):
        convert_transfo_xl.convert(str(tmp_path / "missing"), str(tmp_path / "out"))


def test_convert_refuses_a_folder_holding_a_model_unless_overwrite(tmp_path):
    """A trained model (and its tokenizer) in out_dir was replaced without a word, leaving a tokenizer of another
    vocabulary beside the converted weights."""
    out = tmp_path / "out"
    TransformerXLForCausalLM(TransformerXLConfig.from_preset("debug")).save_pretrained(out)
    (out / "tokenizer.json").write_text("{}")
    (out / "README.md").write_text("the card of another model")
    before = (out / "model.safetensors").read_bytes()
    with pytest.raises(ValueError, match=r"out_dir=.* already holds config.json, model.safetensors, tokenizer.json; "
                                         "expected an empty or new folder, or --overwrite"):
        convert_transfo_xl.convert(str(FIXTURES / "case_a"), str(out))
    assert (out / "model.safetensors").read_bytes() == before
    convert_transfo_xl.convert(str(FIXTURES / "case_a"), str(out), overwrite=True)
    assert_matches_legacy(TransformerXLForCausalLM.from_pretrained(out), "case_a")
    assert not (out / "tokenizer.json").exists()  # case_a has no vocabulary: the other model's tokenizer went
    assert not (out / "README.md").exists()


def test_convert_writes_the_legacy_vocabulary_as_a_fast_tokenizer(tmp_path):
    legacy = tmp_path / "legacy"
    shutil.copytree(FIXTURES / "case_c", legacy)
    meta = json.loads((FIXTURES / "case_c" / "expected.json").read_text())
    symbols = ["<eos>", "<unk>"] + [f"w{i}" for i in range(meta["vocab_size"] - 2)]
    (legacy / "vocab.txt").write_text("\n".join(symbols) + "\n")
    convert_transfo_xl.convert(str(legacy), str(tmp_path / "out"))
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tmp_path / "out")
    assert tok("w3 w7 zzz")["input_ids"][:3] == [5, 9, 1]
