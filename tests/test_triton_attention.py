"""The flash-style Triton relative attention against the reference, on the CPU under triton's interpreter.

`TRITON_INTERPRET=1` is set by conftest.py before anything imports triton (the interpreter must be on from triton's
import), and for every test here; the kernel module, imported on first use, is imported again if it was first
imported without it. The kernels then run as numpy on the CPU: slow but exact, enough at small shapes. The same comparisons on CUDA in fp32 / bf16 / fp16 are section (a) of
benchmarks/gpu_check.py.
"""

import importlib
import importlib.util
import os
import sys

import pytest
import torch

if importlib.util.find_spec("triton") is None:
    pytest.skip("triton is not installed (pip install triton; the dev extra has it)", allow_module_level=True)
os.environ["TRITON_INTERPRET"] = "1"

from modeling_xl import TransformerXLConfig, TransformerXLForCausalLM  # noqa: E402
from modeling_xl import kernel_registry as kernels  # noqa: E402
from modeling_xl import kernel_registry as ra  # noqa: E402
from modeling_xl import relative_attention_triton as tra  # noqa: E402
from modeling_xl.relative_attention import relative_attention  # noqa: E402
from modeling_xl.relative_attention_triton import key_ranges, triton_relative_attention  # noqa: E402
from modeling_xl.relative_positions import causal_mask, with_key_padding  # noqa: E402


@pytest.fixture(autouse=True)
def interpreter(monkeypatch):
    """The interpreter on, and the kernels made under it (another test of the session may have imported the kernel
    module while the variable was unset: its functions would then be compiled-mode ones)."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    module = sys.modules.get("modeling_xl.relative_attention_triton_kernels")
    if module is not None and type(module.forward_kernel).__name__ != "InterpretedFunction":
        importlib.reload(module)


def inputs(batch, heads, qlen, klen, d_head, rlen=None, dtype=torch.float32, seed=0):
    gen = torch.Generator().manual_seed(seed)
    shapes = [(batch, heads, qlen, d_head), (batch, heads, klen, d_head), (batch, heads, klen, d_head),
              (heads, rlen or klen, d_head), (heads, d_head), (heads, d_head)]
    return [torch.randn(*s, generator=gen).to(dtype).requires_grad_() for s in shapes]


def assert_matches(args, mask, shift, atol=2e-5):
    """Output and every input's gradient of the kernel equal the reference's (float64 reference from the same
    values)."""
    reference = [x.detach().double().requires_grad_() for x in args]
    want, _ = relative_attention(*reference, mask, shift)
    got, probs = triton_relative_attention(*args, mask, shift)
    assert probs is None and got.dtype == args[1].dtype and got.shape == want.shape
    grad = torch.randn(want.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    want_grads = torch.autograd.grad(want, reference, grad)
    got_grads = torch.autograd.grad(got, args, grad.to(got.dtype))
    torch.testing.assert_close(got.double(), want, atol=atol, rtol=atol)
    for name, g, w in zip(("q", "key", "value", "r", "u", "v"), got_grads, want_grads):
        assert g.dtype == args[0].dtype
        torch.testing.assert_close(g.double(), w, atol=atol * 4, rtol=atol * 4, msg=f"gradient of {name}")


@pytest.mark.parametrize("batch,heads,qlen,mlen,d_head", [(2, 2, 20, 13, 24), (1, 3, 37, 0, 41), (2, 1, 16, 40, 16)])
def test_causal_with_memory_matches_reference(batch, heads, qlen, mlen, d_head):
    """Queries and keys not multiples of the 16-wide tiles, head widths not a power of two, no memory and a memory
    longer than the segment."""
    args = inputs(batch, heads, qlen, qlen + mlen, d_head)
    assert_matches(args, causal_mask(qlen, mlen), qlen - 1)


def test_same_length_matches_reference():
    """same_length hides the oldest keys: whole key blocks before a query block are skipped (`key_ranges`)."""
    qlen, mlen = 20, 30
    args = inputs(2, 2, qlen, qlen + mlen, 16)
    assert_matches(args, causal_mask(qlen, mlen, same_length=True, mem_len=18), qlen - 1)


def test_padding_mask_per_row_matches_reference():
    """A [B, 1, T, K] mask (padding keys of a left-padded batch) differs per row; each row gets its own key ranges."""
    qlen, mlen = 17, 30
    attention_mask = torch.ones(2, qlen, dtype=torch.long)
    attention_mask[0, :5] = 0
    mask = with_key_padding(causal_mask(qlen, mlen), attention_mask, mlen)
    assert_matches(inputs(2, 3, qlen, qlen + mlen, 16), mask, qlen - 1)


def test_unmasked_bidirectional_table_matches_reference():
    """No mask, XLNet's table (distances K .. -T+1, R = K + T, shift T): every key is seen and described."""
    qlen, mlen = 20, 12
    args = inputs(2, 2, qlen, qlen + mlen, 32, rlen=2 * qlen + mlen)
    assert_matches(args, None, qlen)


def test_clamped_table_matches_reference():
    """clamp_len lives in the table (repeated rows); the kernel reads rows by index, so it needs nothing else."""
    from modeling_xl.relative_positions import relative_positions, sinusoid_table

    qlen, mlen, d_head, heads = 18, 14, 16, 2
    pos = relative_positions(qlen + mlen, clamp_len=9)
    table = sinusoid_table(pos, heads * d_head).view(-1, heads, d_head).transpose(0, 1).contiguous()
    args = inputs(1, heads, qlen, qlen + mlen, d_head)
    args[3] = table.requires_grad_()
    assert_matches(args, causal_mask(qlen, mlen), qlen - 1)


def test_half_precision_within_rounding():
    """float16 inputs: computed in float16 with float32 accumulation, gradients back in float16."""
    qlen, mlen = 20, 12
    args = inputs(1, 2, qlen, qlen + mlen, 32, dtype=torch.float16)
    assert_matches(args, causal_mask(qlen, mlen), qlen - 1, atol=3e-3)


@pytest.mark.parametrize("table_gradient", ["bands", "atomic"])
def test_table_gradient_by_bands_and_by_atomics_match_reference(monkeypatch, table_gradient):
    """Both ways of adding up the position table's gradient, on a table with rows no tile reaches (R > K + T) and
    band rows outside it; the bands' sum is the same bit for bit run after run (no atomics)."""
    monkeypatch.setattr(tra, "TABLE_GRADIENT", table_gradient)
    qlen, mlen = 21, 19
    args = inputs(2, 2, qlen, qlen + mlen, 16, rlen=2 * qlen + mlen + 3)
    assert_matches(args, causal_mask(qlen, mlen), qlen)
    if table_gradient == "bands":
        grads = [torch.autograd.grad(triton_relative_attention(*args, None, qlen)[0].sum(), args[3])[0]
                 for _ in range(2)]
        assert torch.equal(*grads)


def test_sum_bands_against_a_loop_over_tiles():
    """Every tile's band added row by row into the table (what the atomic kernel does), against `sum_bands`."""
    gen = torch.Generator().manual_seed(0)
    block, shift, rlen = 4, 5, 23
    bands = torch.randn(2, 3, 3, 5, 2 * block, 6, generator=gen, dtype=torch.float64)
    want = torch.zeros(3, rlen, 6, dtype=torch.float64)
    for q in range(3):
        for k in range(5):
            for c in range(2 * block):
                row = k * block - q * block - (block - 1) + shift + c
                if 0 <= row < rlen:
                    want[:, row] += bands[:, :, q, k, c].sum(0)
    torch.testing.assert_close(tra.sum_bands(bands, block, shift, rlen), want)
    with pytest.raises(ValueError, match="expected 2 \\* block = 6"):
        tra.sum_bands(bands, 3, shift, rlen)


def test_key_ranges_against_a_loop():
    """The docstring's example, and per-row masks against a naive loop over rows."""
    ranges = key_ranges(causal_mask(4, 2), 1, 4, 6, 2)
    assert ranges.tolist() == [[[0, 4], [0, 6]]]
    mask = torch.rand(3, 1, 9, 13) > 0.6
    mask[1, 0, 2] = True  # a row with no visible key: it counts as seeing every key
    got = key_ranges(mask, 3, 9, 13, 4)
    for b in range(3):
        for block in range(3):
            firsts, ends = [], []
            for row in range(block * 4, min(block * 4 + 4, 9)):
                seen = (~mask[b, 0, row]).nonzero().flatten().tolist()
                firsts.append(seen[0] if seen else 0)
                ends.append(seen[-1] + 1 if seen else 13)
            assert got[b, block].tolist() == [min(firsts), max(ends)]


def test_dropout_is_refused_with_its_value():
    args = inputs(1, 1, 4, 4, 16)
    with pytest.raises(ValueError, match=r"dropout_p=0\.1"):
        triton_relative_attention(*args, causal_mask(4, 0), 3, dropout_p=0.1)


def test_model_with_triton_equals_eager_over_two_segments(tmp_path):
    """attn_implementation="triton" through from_pretrained: loss and every gradient equal the eager model's, with a
    memory, same_length and clamp_len; the kernel really runs (counted)."""
    config = TransformerXLConfig.from_preset("debug", same_length=True, clamp_len=6, mem_len=10)
    torch.manual_seed(0)
    TransformerXLForCausalLM(config).save_pretrained(tmp_path)
    ids = torch.randint(0, config.vocab_size, (2, 12))

    def run(model):
        model.zero_grad()
        first = model(input_ids=ids, labels=ids)
        second = model(input_ids=ids.flip(1), labels=ids.flip(1), mems=first.mems)
        (first.loss + second.loss).backward()
        return second.loss.detach(), {n: p.grad for n, p in model.named_parameters() if p.grad is not None}

    eager = TransformerXLForCausalLM.from_pretrained(tmp_path, attn_implementation="eager")
    fast = TransformerXLForCausalLM.from_pretrained(tmp_path, attn_implementation="triton")
    assert fast.config._attn_implementation == "triton"
    calls = []
    original = kernels.kernel("relative_attention.triton", "cpu")
    kernels.register_kernel("relative_attention.triton", "cpu", lambda *a, **k: calls.append(1) or original(*a, **k))
    try:
        fast_loss, fast_grads = run(fast)
    finally:
        kernels.register_kernel("relative_attention.triton", "cpu", original)
    eager_loss, eager_grads = run(eager)
    assert len(calls) == 2 * config.n_layer
    torch.testing.assert_close(fast_loss, eager_loss, atol=1e-5, rtol=1e-5)
    assert fast_grads.keys() == eager_grads.keys()
    for name in eager_grads:
        torch.testing.assert_close(fast_grads[name], eager_grads[name], atol=1e-5, rtol=1e-4, msg=name)


def test_triton_falls_back_where_it_cannot_run():
    """Attention dropout and returned probabilities take the other paths (the kernel has neither)."""
    assert ra.attention_implementation("triton", 0.0, False, "cpu") == "triton"
    assert ra.attention_implementation("triton", 0.1, False, "cpu") == "fused"
    assert ra.attention_implementation("triton", 0.0, True, "cpu") == "eager"
    assert ra.attention_implementation("triton", 0.0, False, "cpu", streams=True) != "triton"
