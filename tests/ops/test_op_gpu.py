"""The fused sampling ops on CUDA (compiled Triton kernels): the same draws as the
CPU path for the same seed, capture in a CUDA graph, torch.compile. Skipped
without a CUDA device."""
import pytest
import torch

from ddpd.ops.multinomial import multinomial
from ddpd.ops.planner_mask import planner_mask
from ddpd.ops.planner_select import planner_select, planner_select_mask
from ddpd.ops.rng import philox_uniform
from ddpd.ops.sample_categorical import sample_categorical
from ddpd.ops.sample_from_hidden import sample_from_hidden

pytestmark = pytest.mark.gpu


def on(device, *tensors):
    return [t.to(device) if t is not None else None for t in tensors]


def agree(a, b, atol=1e-4):
    for x, y in zip(a, b):
        if x is None or y is None:  # an output not asked for
            assert x is None and y is None
        elif x.dtype.is_floating_point:
            torch.testing.assert_close(x.cpu(), y.cpu(), rtol=1e-4, atol=atol)
        else:
            assert torch.equal(x.cpu(), y.cpu())


def test_philox_uniform_cuda_is_the_cpu_stream_bit_for_bit():
    rows, cols = torch.tensor([0, 3, 2**40 + 1, -5]), torch.arange(50454) + 2**31
    cpu = philox_uniform(2**64 - 3, 11, rows, cols)
    assert torch.equal(philox_uniform(2**64 - 3, 11, rows.cuda(), cols.cuda()).cpu(), cpu)
    seed, offset = torch.tensor(-3, device="cuda"), torch.tensor(11, device="cuda")  # counters as tensors
    rows, cols = rows.cuda(), cols.cuda()
    assert torch.equal(philox_uniform(seed, offset, rows, cols).cpu(), cpu)  # also compiles it before the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = philox_uniform(seed, offset, rows, cols)
    seed.fill_(5)  # read at each replay, not baked in at the capture
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured.cpu(), philox_uniform(5, 11, rows.cpu(), cols.cpu()))


def test_a_cuda_generator_seeds_the_ops_and_the_samplers():
    """A CUDA generator raised torch's "Expected a 'cpu' device type for generator": the
    (seed, offset) pair is drawn on the generator's device, the same tokens for the same state."""
    from ddpd.ops.rng import seed_from_generator
    from ddpd.sampling.noise import make_noise

    generator = torch.Generator("cuda").manual_seed(3)
    logits = torch.randn(4, 50, device="cuda")
    state = generator.get_state()
    first = sample_categorical(logits, generator=generator)[0]
    generator.set_state(state)
    assert torch.equal(sample_categorical(logits, generator=generator)[0], first)
    generator.set_state(state)
    seed, offset = seed_from_generator(generator)
    assert torch.equal(sample_categorical(logits, seed=seed, offset=offset)[0], first)
    generator.set_state(state)
    noise = make_noise(generator=generator)
    assert (noise.seed, noise.offset) == (seed, offset)


@pytest.mark.parametrize("rows,vocab", [(1, 1), (7, 111), (64, 28), (64, 50257)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_sample_categorical_cuda_matches_cpu(rows, vocab, dtype):
    logits = (3 * torch.randn(rows, vocab)).to(dtype)
    per_row = torch.randint(0, vocab, (rows,))
    ids = torch.arange(rows) * 5 + 1
    cpu = sample_categorical(logits, 0.9, [0], per_row, seed=12, offset=3, row_ids=ids)
    gpu = sample_categorical(*on("cuda", logits), 0.9, [0], *on("cuda", per_row), seed=12, offset=3,
                             row_ids=ids.cuda())
    agree(gpu, cpu)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_special_logits_cuda_match_cpu(dtype, temperature):
    """Rows of GPT-2's vocabulary whose tiles the statistics kernel cannot take by plain
    subtraction (a +inf maximum, a tile of -inf only), beside rows it can: NaN, +inf ties in
    two tiles, huge ties, everything excluded, a row whose end tile is short; the same tokens,
    flags and statistics as the CPU path, at temperature 1 and below."""
    vocab = 50257
    g = torch.Generator().manual_seed(11)
    logits = 3 * torch.randn(6, vocab, generator=g)
    logits[0, 5] = float("nan")
    logits[0, 40000] = float("inf")
    logits[1, 300] = logits[1, 45000] = float("inf")  # uniform between the two
    logits[2, :] = float("-inf")  # nothing drawable: token 0, valid False
    logits[3, 1000] = logits[3, 1001] = 1e30  # huge ties keep their noise
    logits[4, :256] = float("-inf")  # a tile of -inf only, beside finite tiles
    logits[5, -1] = 30.0  # the short end tile holds the maximum
    logits = logits.to(dtype)
    kw = dict(seed=9, offset=4, return_logprob=True, confidence="entropy")
    cpu = sample_categorical(logits, temperature, **kw)
    gpu = sample_categorical(logits.cuda(), temperature, **kw)
    agree(gpu, cpu)
    assert cpu[1].tolist() == [True, True, False, True, True, True]
    assert cpu[0][0] == 40000 and cpu[0][1] in (300, 45000) and cpu[0][3] in (1000, 1001)


@pytest.mark.parametrize("vocab", [2 * 256 + 37, 50257])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_tile_edges_read_through_aligned_windows_match_cpu(vocab, dtype):
    """Rows starting at every offset from a 16-byte boundary (9 rows of an odd V), whose only
    drawable tokens are the first and last 8 columns of each tile: the tile statistics read
    them through aligned windows, with vector loads, each tile's last columns from the next
    window; the same tokens, flags and statistics as the CPU path."""
    g = torch.Generator().manual_seed(vocab)
    logits = torch.full((9, vocab), float("-inf"))
    edges = torch.tensor([c for t in range(0, vocab, 256) for c in [*range(t, t + 8), *range(t + 248, t + 256)]
                          if c < vocab])
    logits[:, edges] = 3 * torch.randn(9, edges.numel(), generator=g)
    logits = logits.to(dtype)
    for kw in (dict(seed=5, offset=1, return_logprob=True, confidence="entropy"),
               dict(seed=6, exclude_ids=[255, 256], confidence="prob")):
        cpu = sample_categorical(logits, **kw)
        agree(sample_categorical(logits.cuda(), **kw), cpu)
        assert bool(cpu[1].all())


@pytest.mark.parametrize("rows,length,k", [(64, 256, 1), (8, 1024, 4), (3, 7, 7)])
@pytest.mark.parametrize("mode", ["sigmoid", "softmax"])
def test_planner_ops_cuda_match_cpu(rows, length, k, mode):
    logits = 3 * torch.randn(rows, length)
    x = torch.randint(0, 27, (rows, length))
    agree(planner_select(logits.cuda(), k, mode, 0.5, seed=4, offset=9), planner_select(logits, k, mode, 0.5, seed=4,
                                                                                        offset=9))
    agree(planner_select_mask(logits.cuda(), x.cuda(), 27, k, mode, seed=4, offset=9),
          planner_select_mask(logits, x, 27, k, mode, seed=4, offset=9))
    positions = planner_select(logits, k, seed=1)[0]
    agree(planner_mask(logits.cuda(), x.cuda(), positions.cuda(), 27, seed=2),
          planner_mask(logits, x, positions, 27, seed=2))


@pytest.mark.parametrize("rows,width,vocab", [(8, 256, 50257), (64, 256, 28), (40, 768, 5000)])
def test_sample_from_hidden_cuda_matches_cpu(rows, width, vocab):
    hidden = torch.randn(rows, width)
    weight = 2 * torch.randn(vocab, width) / width**0.5
    bias = torch.randn(vocab)
    cpu = sample_from_hidden(hidden, weight, bias, 1.1, [1], seed=6, offset=1)
    gpu = sample_from_hidden(*on("cuda", hidden, weight, bias), 1.1, [1], seed=6, offset=1)
    agree(gpu, cpu)
    logits = (hidden @ weight.T + bias).cuda()
    agree(gpu, sample_categorical(logits, 1.1, [1], seed=6, offset=1))


def fused_step(planner_logits, x, hidden, weight, bias, mask_id):
    positions, _, stop, masked, _, _ = planner_select_mask(planner_logits, x, mask_id, 1, seed=1, offset=4)
    chosen = hidden.gather(1, positions[:, :, None].expand(-1, -1, hidden.shape[2])).squeeze(1)
    tokens, _, _, _ = sample_from_hidden(chosen, weight, bias, 0.8, [0], seed=1, offset=6)
    return x.scatter(1, positions, tokens[:, None]), masked, stop


def step_inputs(batch=8, length=1024, vocab=50257, width=256):
    return dict(planner_logits=3 * torch.randn(batch, length, device="cuda"),
                x=torch.randint(0, vocab, (batch, length), device="cuda"),
                hidden=torch.randn(batch, length, width, device="cuda"),
                weight=torch.randn(vocab, width, device="cuda") / width**0.5,
                bias=torch.randn(vocab, device="cuda"), mask_id=vocab)


def test_step_captures_in_a_cuda_graph():
    inputs = step_inputs()
    expected = fused_step(**inputs)  # also the warm-up: kernels compiled, id tensors cached
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fused_step(**inputs)
    graph.replay()
    torch.cuda.synchronize()
    agree(out, expected)


def test_step_compiles_fullgraph_on_cuda():
    inputs = step_inputs(64, 256, 28, 256)
    compiled = torch.compile(fused_step, fullgraph=True)
    agree(compiled(**inputs), fused_step(**inputs))


def test_graph_replays_draw_fresh_noise_from_tensor_offsets():
    """A step captured with tensor seed and offsets draws, on each replay, what eager calls
    at the offsets the tensors then hold draw."""
    inputs = step_inputs(8, 256, 1000, 64)
    seed, offset = torch.tensor(7, device="cuda"), torch.tensor(100, device="cuda")

    def step():
        positions, _, _, masked, _, _ = planner_select_mask(inputs["planner_logits"], inputs["x"], inputs["mask_id"],
                                                            1, seed=seed, offset=offset, mask_offset=offset + 1)
        chosen = inputs["hidden"].gather(1, positions[:, :, None].expand(-1, -1, 64)).squeeze(1)
        tokens, _, _, _ = sample_from_hidden(chosen, inputs["weight"], inputs["bias"], seed=seed, offset=offset + 2)
        weights = torch.softmax(inputs["planner_logits"], -1)
        picked = multinomial(weights, 2, seed=seed, offset=offset + 3, check_valid=False).tokens
        return positions, masked, tokens, picked

    step()  # warm-up: kernels compiled
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step()
    draws = []
    for start in (100, 104, 2**40):
        offset.fill_(start)
        graph.replay()
        torch.cuda.synchronize()
        draws.append([t.clone() for t in out])
        agree(draws[-1], step())
    assert not torch.equal(draws[0][2], draws[1][2])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_recomputed_winning_tiles_draw_what_the_cpu_draws(dtype):
    """sample_from_hidden, whose finish pass computes the winning tile's logits again: the
    C++ path's tokens and statistics, with a bias, exclusions, an allowed mask, per-row temperatures (a
    greedy row) and every confidence, over GPT-2's vocabulary."""
    g = torch.Generator().manual_seed(11)
    hidden, weight = torch.randn(40, 256, generator=g), torch.randn(50257, 256, generator=g) / 16
    bias = torch.randn(50257, generator=g)
    temperature = torch.rand(40, generator=g) + 0.5
    temperature[3] = 0.0
    allowed = torch.rand(40, 50257, generator=g) < 0.9
    hidden, weight, bias = hidden.to(dtype), weight.to(dtype), bias.to(dtype)
    for offset, confidence in enumerate(("prob", "margin", "entropy")):
        kw = dict(return_logprob=True, confidence=confidence, seed=7, offset=offset)
        cpu = sample_from_hidden(hidden, weight, bias, temperature, [5], allowed=allowed, **kw)
        gpu = sample_from_hidden(*on("cuda", hidden, weight, bias, temperature), [5], allowed=allowed.cuda(), **kw)
        agree(gpu, cpu, atol=1e-4 if dtype == torch.float32 else 1e-3)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_recomputed_winning_tiles_keep_margin_and_entropy_at_tiny_temperatures(dtype):
    """At temperature 1e-6 the drawn token is its row's maximum: log-probability 0, probability
    and margin 1, entropy 0. The finish pass takes a tile's second logit and entropy terms from
    the GEMM's logits; its recomputed tile's dot may round the last bit otherwise, and divided
    by the temperature that bit would move them."""
    g = torch.Generator().manual_seed(12)
    hidden, weight = torch.randn(16, 256, generator=g), torch.randn(50257, 256, generator=g) / 16
    hidden, weight = on("cuda", hidden.to(dtype), weight.to(dtype))
    for offset, (confidence, value) in enumerate((("prob", 1.0), ("margin", 1.0), ("entropy", 0.0))):
        out = sample_from_hidden(hidden, weight, None, 1e-6, return_logprob=True, confidence=confidence, seed=3,
                                 offset=offset)
        assert bool(out[1].all()) and out[2].tolist() == [0.0] * 16 and out[3].tolist() == [value] * 16


@pytest.mark.parametrize("rows,vocab", [(64, 50257), (7, 300), (3, 128256)])
def test_sampling_controls_cuda_match_cpu(rows, vocab):
    """The Triton kernels with per-row temperatures (greedy rows too), the truncation
    threshold search, masks and the log-probability / confidence outputs, against the C++
    path (tokens equal; statistics to 1e-4)."""
    g = torch.Generator().manual_seed(vocab)
    logits = (3 * torch.randn(rows, vocab, generator=g)).bfloat16()
    temperature = torch.rand(rows, generator=g) + 0.3
    temperature[0] = 0.0
    allowed = torch.rand(rows, vocab, generator=g) < 0.9
    controls = (dict(top_k=50), dict(top_p=0.9), dict(min_p=0.05), dict(top_k=40, top_p=0.8, min_p=0.02), {})
    for kw, confidence in zip(controls, ("prob", "margin", "entropy", "margin", "entropy")):  # few compilations
        kw = dict(kw, exclude_ids=[0], seed=4, offset=2, return_logprob=True, confidence=confidence)
        cpu = sample_categorical(logits, temperature, allowed=allowed, **kw)
        gpu = sample_categorical(*on("cuda", logits, temperature), allowed=allowed.cuda(), **kw)
        agree(gpu, cpu)


def test_sample_from_hidden_controls_cuda_match_cpu():
    g = torch.Generator().manual_seed(3)
    hidden, weight = torch.randn(64, 256, generator=g), torch.randn(50257, 256, generator=g) / 16
    temperature = torch.rand(64, generator=g) + 0.5
    temperature[:4] = 0.0
    for kw in (dict(return_logprob=True, confidence="margin"), dict(top_p=0.9, return_logprob=True)):
        cpu = sample_from_hidden(hidden, weight, None, temperature, seed=2, **kw)
        gpu = sample_from_hidden(*on("cuda", hidden, weight), None, temperature.cuda(), seed=2, **kw)
        agree(gpu, cpu)


def test_bernoulli_cuda_matches_cpu():
    from ddpd.ops import bernoulli

    p = torch.rand(64, 5000, generator=torch.Generator().manual_seed(1))
    rows = torch.arange(64) + 2**33
    assert torch.equal(bernoulli(p.cuda(), seed=3, offset=4, row_ids=rows.cuda()).cpu(),
                       bernoulli(p, seed=3, offset=4, row_ids=rows))


def test_opcheck_every_op_on_cuda():
    from ddpd.ops import compact_fixed

    cuda = torch.device("cuda")
    logits, planner = torch.randn(4, 700, device=cuda), torch.randn(4, 33, device=cuda)
    x = torch.randint(0, 9, (4, 33), device=cuda)
    hidden, weight = torch.randn(4, 16, device=cuda), torch.randn(700, 16, device=cuda)
    ops = torch.ops.ddpd
    torch.library.opcheck(ops.sample_categorical.default,
                          (logits, 0.8, torch.tensor([0.5, -1.0, 1.0, 2.0], device=cuda), None, None, None, 10, None,
                           0.9, None, -3.0, None, None, 1, 2, None, None, None, True, 2))
    torch.library.opcheck(ops.sample_from_hidden.default,
                          (hidden, weight, None, 0.9, None, None, None, None, None, 1, 2, None, None, None, True, 3))
    torch.library.opcheck(ops.head_logits.default, (hidden, weight, None))
    torch.library.opcheck(ops.planner_select.default, (planner, 2, True, 0.7, 0.01, None, 1, 2, None, None, None))
    torch.library.opcheck(ops.planner_mask.default, (planner, x, None, 9, None, 1, 2, None, None, None))
    torch.library.opcheck(ops.planner_select_mask.default,
                          (planner, x, 9, 2, False, 1.0, 0.01, None, None, 1, 2, 3, None, None, None, None))
    torch.library.opcheck(ops.bernoulli.default, (torch.rand(4, 33, device=cuda), None, 1, 2, None, None, None))
    weights = torch.rand(4, 700, device=cuda)
    torch.library.opcheck(ops.multinomial.default, (weights, 3, False, None, 1, 2, torch.arange(4, device=cuda), None,
                                                    None))
    active = torch.tensor([True, False, True, True], device=cuda)
    torch.library.opcheck(ops.compact_fixed.default, (active, 3, [x]))
    packed, index, _ = compact_fixed(active, 3, x)
    torch.library.opcheck(ops.scatter_back.default, (index, packed[0], torch.zeros_like(x)))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_rotary_cuda_is_the_reference_bit_for_bit(dtype):
    """The compiled kernel (no fused multiply-adds, torch's bfloat16 rounding) against torch's
    elementwise kernels on the same GPU, from the strided q of a qkv projection; and the
    networks take it when they sample."""
    from ddpd.models.attention import RotaryEmbedding, SelfAttention
    from ddpd.ops import rotary
    from ddpd.ops.reference import rotary as rotary_reference  # (a name ending in _triton: skipped on a GPU)

    qkv = (4 * torch.randn(3, 300, 3, 4, 64, device="cuda")).to(dtype)
    q = qkv.permute(2, 0, 3, 1, 4)[0]
    table = RotaryEmbedding(64, 512).cuda()
    assert torch.equal(rotary(q, table.cos, table.sin), rotary_reference(q, table.cos, table.sin))
    stacked = torch.stack([q, q.flip(0)])  # vmap's tensors run the reference
    assert torch.equal(torch.func.vmap(lambda t: rotary(t, table.cos, table.sin))(stacked),
                       torch.stack([rotary_reference(t, table.cos, table.sin) for t in stacked]))
    layer = SelfAttention(256, 4, 300, causal=False).cuda().to(dtype).eval()
    x = torch.randn(2, 300, 256, device="cuda").to(dtype)
    with torch.inference_mode():
        fused = layer(x)
        layer.rotary.forward = lambda t: rotary_reference(t, layer.rotary.cos, layer.rotary.sin)
        assert torch.equal(fused, layer(x))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_norm_cuda_agrees_with_the_reference(dtype):
    """The compiled kernel against torch's norm and elementwise kernels on the same GPU: 16-bit
    outputs within one unit of the last place (bit for bit for nearly every value), float32
    ones within the reordered sums' error; and a conditioned block takes it when it samples
    (and adds its gated residuals with one kernel each)."""
    from ddpd.models.backbone import Block
    from ddpd.models.config import TransformerConfig
    from ddpd.ops import norm
    from ddpd.ops.reference import norm as norm_reference  # (a name ending in _triton: skipped on a GPU)

    x = (3 * torch.randn(8, 300, 768, device="cuda") + 2).to(dtype)
    weight, bias = torch.randn(768, device="cuda"), torch.randn(768, device="cuda")
    shift, scale = (0.3 * torch.randn(8, 1, 1536, device="cuda")).to(dtype).chunk(2, dim=-1)
    for rms in (False, True):
        got = norm(x, weight, bias, rms=rms, shift=shift, scale=scale)
        want = norm_reference(x, weight, bias, rms=rms, shift=shift, scale=scale)
        tolerance = (64 if dtype == torch.float32 else 1) * torch.finfo(dtype).eps * want.float().abs().clamp_min(1)
        assert ((got.float() - want.float()).abs() <= tolerance).all()
        if dtype != torch.float32:  # one rounding of nearly the same float32 (whose last bits may all differ)
            assert (got != want).float().mean() < 0.05
    batched = torch.func.vmap(lambda t: norm(t, weight, bias))(x[:, :4])  # vmap's tensors run the reference
    torch.testing.assert_close(batched, torch.stack([norm_reference(t, weight, bias) for t in x[:, :4]]))
    config = TransformerConfig(vocab_size=30, out_dim=30, d_model=256, n_layers=1, n_heads=4, max_seq_len=64,
                               time_conditioned=True)
    block = Block(config).cuda().to(dtype).eval()
    torch.nn.init.normal_(block.modulation.weight, std=0.1)
    h, c = torch.randn(2, 64, 256, device="cuda").to(dtype), torch.randn(2, 256, device="cuda").to(dtype)
    with torch.inference_mode():
        block(h, c)  # compiles the kernel outside the trace
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            block(h, c)
            torch.cuda.synchronize()
    names = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    assert sum(name.startswith("norm_kernel") for name in names) == 2, names  # norm1 and norm2, one kernel each
    assert not any("layer_norm" in name for name in names)
    assert sum("addcmul" in name for name in names) == 2, names  # the gated residuals, one kernel each
