"""The flash-style Triton relative attention against the reference, on the CPU under triton's interpreter.

`TRITON_INTERPRET=1` is set by conftest.py before anything imports triton (the interpreter must be on from triton's
import), and for every test here; the kernel module, imported on first use, is imported again if it was first
imported without it. The kernels then run as numpy on the CPU: slow but exact, enough at small shapes. The same comparisons on CUDA in fp32 / bf16 / fp16 are section (a) of
benchmarks/gpu_check.py.
"""

import copy
import importlib
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
if importlib.util.find_spec("triton") is None:
    pytest.skip("triton is not installed (pip install triton; the dev extra has it)", allow_module_level=True)
os.environ["TRITON_INTERPRET"] = "1"

from modeling_xl import TransformerXLConfig, TransformerXLForCausalLM, TransformerXLForPermutationLM  # noqa: E402
from modeling_xl import kernel_registry as kernels  # noqa: E402
from modeling_xl import kernel_registry as ra  # noqa: E402
from modeling_xl import relative_attention_triton as tra  # noqa: E402
from modeling_xl.relative_attention import relative_attention  # noqa: E402
from modeling_xl.relative_attention_triton import key_ranges, triton_relative_attention  # noqa: E402
from modeling_xl.relative_positions import causal_mask, with_key_padding  # noqa: E402
from modeling_xl.two_stream_attention import Stream, segment_mismatch, two_stream_attention  # noqa: E402
from modeling_xl.two_stream_attention_triton import triton_two_stream_attention  # noqa: E402


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
    qlen, mlen = 17, 19
    args = inputs(1, 2, qlen, qlen + mlen, 16, rlen=2 * qlen + mlen + 3)
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


@pytest.fixture
def autotuned(monkeypatch):
    """The interpreter's tiles autotuned over two candidates, nothing chosen yet; returns the shapes timed."""
    monkeypatch.setitem(tra.TILES, "cpu", "autotune")
    monkeypatch.setitem(tra.CANDIDATES, "cpu", [(16, 1), (32, 1)])
    monkeypatch.setattr(tra, "CHOSEN", {})
    monkeypatch.setattr(tra, "TIMED_CALLS", 1)
    timed, fastest = [], tra._fastest

    def counted(candidates, inputs, backward):
        timed.append((tuple(inputs[0].shape), backward))
        return fastest(candidates, inputs, backward)

    monkeypatch.setattr(tra, "_fastest", counted)
    return timed


def test_autotuned_tiles_are_timed_once_per_shape_and_match_reference(autotuned):
    """Forward and backward with the tile autotuning chose, equal to the reference; a shape is timed once."""
    args = inputs(1, 1, 17, 25, 16)
    assert_matches(args, causal_mask(17, 8), 16)
    assert_matches(args, causal_mask(17, 8), 16)
    assert_matches(inputs(1, 1, 33, 33, 16), causal_mask(33, 0), 32)
    with torch.no_grad():  # no backward follows: the forward alone is timed, a choice of its own
        triton_relative_attention(*args, causal_mask(17, 8), 16)
    assert autotuned == [((1, 1, 17, 16), True), ((1, 1, 33, 16), True), ((1, 1, 17, 16), False)]
    assert len(tra.CHOSEN) == 3 and set(tra.CHOSEN.values()) <= {(16, 1), (32, 1)}


def test_autotuning_skips_the_tiles_the_compiler_refuses(autotuned, monkeypatch):
    from triton.runtime.errors import OutOfResources

    launch = tra.launch_forward

    def refusing(*args):
        if args[-1] == (32, 1):
            raise OutOfResources(262144, 232448, "shared memory")
        return launch(*args)

    monkeypatch.setattr(tra, "launch_forward", refusing)
    args = inputs(1, 2, 20, 20, 16)
    assert_matches(args, causal_mask(20, 0), 19)
    assert list(tra.CHOSEN.values()) == [(16, 1)]
    monkeypatch.setitem(tra.CANDIDATES, "cpu", [(32, 1)])
    with pytest.raises(RuntimeError, match=r"no tile of \[\(32, 1\)\] ran .*out of resource: shared memory"):
        triton_relative_attention(*inputs(1, 2, 24, 24, 16), causal_mask(24, 0), 23)


def test_every_kernel_variant_compiles_for_cuda():
    """The forward and both backward kernels, with and without the segment term and either table gradient, compile
    for CUDA (a module-level constant that was not a constexpr once passed every interpreter test and failed on the
    GPU), in a process of their own without the interpreter (tests/triton_cuda_compile.py)."""
    pytest.importorskip("triton.backends.nvidia", reason="triton's CUDA backend (compiler and ptxas) is not installed")
    env = {name: value for name, value in os.environ.items() if name != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    script = REPO / "tests" / "triton_cuda_compile.py"
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=600)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    assert "compiled 8 kernel variants" in result.stdout


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
    (_, q_g, key, value, r, u, v, s, seg_embed), _, query = two_stream_inputs(1)
    with pytest.raises(ValueError, match=r"dropout_p=0\.2"):
        triton_two_stream_attention(q_g, key, value, r, (u, v, s), seg_embed, 18, query, dropout_p=0.2)


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


def test_a_row_that_sees_no_key_weighs_every_key_alike():
    """As the reference does (every score the same minimum): uniform weights, and no gradient through its scores."""
    qlen, mlen = 18, 5
    mask = causal_mask(qlen, mlen).expand(2, 1, qlen, qlen + mlen).clone()
    mask[1, 0, 3] = True
    mask[0, 0, 17] = True
    assert_matches(inputs(2, 2, qlen, qlen + mlen, 16), mask, qlen - 1)


def two_stream_inputs(tables: int, seed: int = 0):
    """XLNet-shaped inputs of both streams: B 2, H 2, T 18, M 7, D 16, P 5 targets, the table of distances
    K .. -T + 1 (one or two tables), per-row masks, segments; prediction row 4 of batch row 0 is padding (present
    0) and stands where row 0 stands; query row 2 of batch row 1 sees no key."""
    gen = torch.Generator().manual_seed(seed)
    batch, heads, qlen, mlen, d_head, predict = 2, 2, 18, 7, 16, 5
    klen = qlen + mlen
    tensors = [torch.randn(*shape, generator=gen).requires_grad_() for shape in (
        (batch, heads, qlen, d_head), (batch, heads, predict, d_head), (batch, heads, klen, d_head),
        (batch, heads, klen, d_head), (tables, heads, klen + qlen, d_head), (heads, d_head), (heads, d_head),
        (heads, d_head), (2, heads, d_head))]
    content_mask = torch.rand(batch, qlen, klen, generator=gen) > 0.6
    content_mask[:, torch.arange(qlen), mlen + torch.arange(qlen)] = False  # the content stream sees itself
    mismatch = segment_mismatch(torch.randint(0, 2, (batch, qlen), generator=gen), mlen)
    positions = torch.stack([torch.randperm(qlen, generator=gen)[:predict] for _ in range(batch)])
    positions[0, 4] = positions[0, 0]
    present = torch.ones(batch, predict)
    present[0, 4] = 0
    query_mask = torch.rand(batch, qlen, klen, generator=gen) > 0.5
    query_mask[1, positions[1, 2]] = True
    content = Stream(content_mask[:, None], mismatch)
    return tensors, content, content.rows(query_mask, positions, present)


@pytest.mark.parametrize("tables", [1, 2])
def test_both_streams_match_the_reference(tables):
    """Output and every input's gradient (queries, keys, values, table, the three biases, the segment table) of the
    content stream and of the query stream (present rows), against `two_stream_attention` in float64."""
    tensors, content, query = two_stream_inputs(tables)
    q_h, q_g, key, value, r, u, v, s, seg_embed = tensors
    for stream, q in ((content, q_h), (query, q_g)):
        args = [q, key, value, r, u, v, s, seg_embed]
        reference = [x.detach().double().requires_grad_() for x in args]
        present = 1 if stream.present is None else stream.present[:, None, :, None]
        want = two_stream_attention(*reference[:4], reference[4:7], reference[7], 18, stream)[0] * present
        got, probs = triton_two_stream_attention(*args[:4], args[4:7], args[7], 18, stream)
        got = got * present
        assert probs is None and got.dtype == torch.float32
        torch.testing.assert_close(got.double(), want, atol=2e-5, rtol=2e-5)
        grad = torch.randn(want.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
        names = ("q", "key", "value", "r", "u", "v", "s", "seg_embed")
        for name, g, w in zip(names, torch.autograd.grad(got, args, grad.float()),
                              torch.autograd.grad(want, reference, grad)):
            torch.testing.assert_close(g.double(), w, atol=1e-4, rtol=1e-4, msg=f"gradient of {name}")
    assert query.distinct is True


def test_query_rows_at_a_repeated_position_are_left_to_another_path():
    tensors, _, query = two_stream_inputs(1)
    query.present[0, 4] = 1  # two present rows now stand at one position
    q_g, key, value, r, u, v, s, seg_embed = tensors[1:]
    assert triton_two_stream_attention(q_g, key, value, r, (u, v, s), seg_embed, 18, query) is None
    assert query.distinct is False


def test_permutation_lm_with_triton_equals_eager_over_two_segments():
    """attn_implementation="triton" for XLNet's two streams: loss and every gradient equal the eager model's over two
    segments with memory, segments, padding, a padded prediction row and two tables (bi_data; one table: above);
    the kernel really runs (counted). A target_mapping naming one position twice takes the SDPA path, with the same
    result."""
    config = TransformerXLConfig(vocab_size=50, d_model=32, n_layer=2, n_head=2, d_head=16, d_inner=32,
                                 adaptive=False, attn_type="bi", ff_activation="gelu", mem_len=6, reuse_len=4,
                                 dropout=0.0, dropatt=0.0, bi_data=True)
    torch.manual_seed(0)
    eager = TransformerXLForPermutationLM(config)
    fast = copy.deepcopy(eager)
    eager.set_attn_implementation("eager")
    fast.set_attn_implementation("triton")
    batch, length = 4, 8
    ids = torch.randint(0, 50, (batch, length))
    perm_mask = (torch.rand(batch, length, length) > 0.5).float()
    target_mapping = torch.nn.functional.one_hot(torch.tensor([[1, 4, 6], [2, 5, 0], [0, 7, 3], [6, 1, 2]]),
                                                 length).float()
    target_mapping[0, 2] = 0.0  # a padded prediction row
    perm_mask[:, torch.arange(length), torch.arange(length)] = 1.0  # a target never sees itself
    token_type_ids = torch.randint(0, 2, (batch, length))
    attention_mask = torch.ones(batch, length)
    attention_mask[1, :2] = 0.0

    def run(model, mapping):
        model.zero_grad()
        kwargs = dict(perm_mask=perm_mask, target_mapping=mapping, token_type_ids=token_type_ids,
                      attention_mask=attention_mask, labels=torch.randint(0, 50, mapping.shape[:2],
                                                                          generator=torch.Generator().manual_seed(2)))
        first = model(ids, **kwargs)
        second = model(ids.flip(1), mems=first.mems, **kwargs)
        (first.loss + second.loss).backward()
        return second.loss.detach(), {n: p.grad for n, p in model.named_parameters() if p.grad is not None}

    calls = []
    original = kernels.kernel("two_stream_attention.triton", "cpu")
    kernels.register_kernel("two_stream_attention.triton", "cpu", lambda *a, **k: calls.append(1) or original(*a, **k))
    try:
        results = {"fast": run(fast, target_mapping)}
        repeated = target_mapping.clone()
        repeated[2, 1] = repeated[2, 0]
        results["fast repeated"] = run(fast, repeated)
    finally:
        kernels.register_kernel("two_stream_attention.triton", "cpu", original)
    assert len(calls) == 2 * 2 * (2 * config.n_layer - 1)  # both streams, the last layer's query stream only
    for name, mapping in (("fast", target_mapping), ("fast repeated", repeated)):
        eager_loss, eager_grads = run(eager, mapping)
        fast_loss, fast_grads = results[name]
        torch.testing.assert_close(fast_loss, eager_loss, atol=1e-5, rtol=1e-5)
        assert fast_grads.keys() == eager_grads.keys()
        for param in eager_grads:
            torch.testing.assert_close(fast_grads[param], eager_grads[param], atol=1e-5, rtol=1e-4,
                                       msg=f"{name}: {param}")


def test_triton_falls_back_where_it_cannot_run():
    """Attention dropout and returned probabilities take the other paths (the kernel has neither)."""
    assert ra.attention_implementation("triton", 0.0, False, "cpu") == "triton"
    assert ra.attention_implementation("triton", 0.1, False, "cpu") == "fused"
    assert ra.attention_implementation("triton", 0.0, True, "cpu") == "eager"
    assert ra.attention_implementation("triton", 0.0, False, "cpu", streams=True) == "triton"
    assert ra.attention_implementation("triton", 0.1, False, "cpu", streams=True) == "fused"
