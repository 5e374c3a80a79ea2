"""ddpd.ops.rotary: the Triton kernel (interpreter) returns the torch reference's values
bit for bit in every dtype, from strided views (q and k of a qkv projection) and at
lengths that fill no block; the networks' RotaryEmbedding is that reference; bad
arguments, gradients, opcheck and torch.compile."""
import pytest
import torch

from ddpd.models.attention import RotaryEmbedding, SelfAttention
from ddpd.ops import rotary
from ddpd.ops.reference import rotary as rotary_reference
from ddpd.ops.rotary import rotary_launch, rotary_triton
from oracles.devices import MISMATCHES, fake_tensors, moved


def qkv_views(batch, heads, length, head_dim, dtype, seed=0):
    """q and k as SelfAttention slices them out of its projection (strided views)."""
    g = torch.Generator().manual_seed(seed)
    qkv = (torch.randn(batch, length, 3, heads, head_dim, generator=g) * 4).to(dtype)
    q, k, _ = qkv.permute(2, 0, 3, 1, 4)
    return q, k


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape", [(2, 3, 37, 16), (1, 1, 1, 2), (3, 2, 300, 64), (1, 2, 5, 6)])
def test_kernel_returns_the_reference_bit_for_bit(dtype, shape):
    batch, heads, length, head_dim = shape
    table = RotaryEmbedding(head_dim, length + 7)  # tables longer than the sequence
    for x in qkv_views(*shape, dtype):
        want = rotary_reference(x, table.cos, table.sin)
        got = rotary_triton(x, table.cos, table.sin)
        assert got.dtype == dtype and got.shape == x.shape and got.is_contiguous()
        assert torch.equal(got, want)
    contiguous = qkv_views(*shape, dtype, seed=1)[0].contiguous()
    assert torch.equal(rotary_triton(contiguous, table.cos, table.sin),
                       rotary_reference(contiguous, table.cos, table.sin))


BITS = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float16: torch.int16}


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")  # the interpreter's numpy, on purpose
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_special_values_and_rounding_ties_bit_for_bit(dtype):
    """inf, NaN, values that overflow the dtype after the rotation, and results halfway
    between two bfloat16 / float16 values: the bits of the reference's output (NaN where it
    has NaN, whose payload carries no meaning)."""
    q = qkv_views(1, 2, 64, 8, dtype)[0].contiguous()
    q[0, 0, 1, 0], q[0, 0, 2, 5], q[0, 1, 3, 2] = float("inf"), float("nan"), float("-inf")
    q[0, 1, 4:8] = torch.finfo(dtype).max  # x1 * cos + ... overflows the dtype
    q[0, 1, 10, :] = torch.tensor([1 + 2**-8, 1 + 3 * 2**-8, 1 + 2**-11, 1 + 3 * 2**-11, 0, 0, 0, 0]).to(dtype)
    tiny = torch.finfo(dtype).tiny
    q[0, 1, 11, :] = torch.tensor([tiny / 4, tiny * 0.75, tiny / 64, -tiny / 2, 0, 0, 0, 0]).to(dtype)  # subnormal
    table = RotaryEmbedding(8, 64)
    table.cos[10:12], table.sin[10:12] = 1.0, 0.0  # positions 10, 11 unrotated: only the roundings act
    want, got = rotary_reference(q, table.cos, table.sin), rotary_triton(q, table.cos, table.sin)
    nan = torch.isnan(want)
    assert nan.sum() == 2 and torch.equal(torch.isnan(got), nan) and torch.isinf(want).sum() >= 4
    assert torch.equal(got.view(BITS[dtype])[~nan], want.view(BITS[dtype])[~nan])


def test_a_nan_of_any_payload_stays_nan_in_bfloat16():
    """A float32 NaN whose mantissa is all ones (here from the table) rounds to a bfloat16 NaN:
    rounding its bits to nearest even would carry into the sign and give -0."""
    q = qkv_views(1, 1, 4, 8, torch.bfloat16)[0].contiguous()
    table = RotaryEmbedding(8, 4)
    table.cos[2, 1] = torch.tensor(0x7FFFFFFF, dtype=torch.int32).view(torch.float32)
    want, got = rotary_reference(q, table.cos, table.sin), rotary_triton(q, table.cos, table.sin)
    nan = torch.isnan(want)
    assert nan[0, 0, 2].tolist() == [False, True, False, False, False, True, False, False]
    assert torch.equal(torch.isnan(got), nan)
    assert torch.equal(got.view(torch.int16)[~nan], want.view(torch.int16)[~nan])


def test_the_rotation_is_rotary_embedding():
    """The reference is the rotation the networks compute: pairs (i, i + d/2) turned by
    pos * base^(-2i/d), lengths kept (a rotation), position 0 unchanged."""
    x = qkv_views(2, 2, 9, 8, torch.float64)[0].float()
    out = RotaryEmbedding(8, 16)(x)
    assert torch.equal(out, rotary_reference(x, *RotaryEmbedding(8, 16).buffers()))
    pairs = lambda t: torch.stack(t.chunk(2, dim=-1), -1)  # noqa: E731
    assert torch.allclose(pairs(out).norm(dim=-1), pairs(x).norm(dim=-1), atol=1e-5)
    assert torch.equal(out[:, :, 0], x[:, :, 0])
    angle = torch.atan2(pairs(out)[0, 0, 3, 1, 1], pairs(out)[0, 0, 3, 1, 0]) - \
        torch.atan2(pairs(x)[0, 0, 3, 1, 1], pairs(x)[0, 0, 3, 1, 0])
    assert torch.isclose(torch.remainder(angle, 2 * torch.pi), torch.tensor(3 * 10000 ** (-2 / 8)), atol=1e-5)


def test_attention_on_cpu_keeps_its_values():
    """SelfAttention's output is unchanged by routing its rotation through ddpd.ops (the
    CPU runs the reference): the pinned sampling tests depend on it."""
    torch.manual_seed(0)
    layer = SelfAttention(32, 4, 16, causal=False).eval()
    x = torch.randn(2, 16, 32)
    q, k, v = layer.qkv(x).view(2, 16, 3, 4, 8).permute(2, 0, 3, 1, 4)
    x1, x2 = q.chunk(2, dim=-1)
    cos, sin = layer.rotary.cos, layer.rotary.sin
    by_hand = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
    assert torch.equal(layer.rotary(q), by_hand)


def test_launch_blocks_cover_every_pair():
    assert rotary_launch(1, 1, 1, 1) == ((1,), 1, 1)
    assert rotary_launch(2, 3, 1024, 32) == ((48,), 128, 32)  # 4096 pairs a program
    assert rotary_launch(1, 1, 5, 3) == ((1,), 8, 4)
    grid, block_l, block_half = rotary_launch(1, 1, 100_000, 4096)  # one grid axis: no 65535 cap
    assert block_half == 4096 and block_l == 1 and grid == (100_000,)


def test_lengths_that_fill_their_blocks_exactly_rotate_every_head():
    """A length that is a whole number of position blocks (64 = 2 x 32 at d = 256), over
    several heads: each program finds its head and block with no block left over, so every
    head's rows are rotated by their own positions."""
    x = qkv_views(2, 2, 64, 256, torch.float32)[0]
    assert rotary_launch(2, 2, 64, 128) == ((8,), 32, 128)
    table = RotaryEmbedding(256, 64)
    assert torch.equal(rotary_triton(x, table.cos, table.sin), rotary_reference(x, table.cos, table.sin))


@pytest.mark.parametrize("x,table,error,match", [
    (torch.zeros(2, 3, 4), torch.zeros(4, 2), ValueError, "x must be 4-D"),
    (torch.zeros(1, 1, 4, 5), torch.zeros(4, 2), ValueError, "must be even"),
    (torch.zeros(1, 1, 4, 6, dtype=torch.int64), torch.zeros(4, 3), TypeError, "x must have dtype"),
    (torch.zeros(1, 1, 4, 6), torch.zeros(3, 3), ValueError, r"cos must have shape \[L' >= 4, 3\]"),
    (torch.zeros(1, 1, 4, 6), torch.zeros(4, 2), ValueError, "cos must have shape"),
    (torch.zeros(1, 1, 4, 6), torch.zeros(4, 3, dtype=torch.float64), TypeError, "cos must have dtype"),
    (torch.zeros(1, 1, 4, 6), torch.zeros(4, 3, dtype=torch.bfloat16), TypeError, "cos must have dtype"),
    (torch.zeros(1, 1, 4, 6), torch.zeros(4, 3, 1), ValueError, "cos must be 2-D"),
    (torch.zeros(1, 1, 4, 1), torch.zeros(4, 1), ValueError, "must be even, got 1"),
])
def test_bad_arguments_raise_clear_errors(x, table, error, match):
    with pytest.raises(error, match=match):
        rotary(x, table, table)


@pytest.mark.parametrize("like, other", MISMATCHES)
@pytest.mark.parametrize("name", ["cos", "sin"])
def test_tables_on_another_device_than_x_are_refused(name, like, other):
    """cos or sin on another device than x: the op's own ValueError, naming the argument and
    both devices (fake tensors stand in for a GPU)."""
    with fake_tensors(like):
        tables = dict(cos=torch.ones(4, 3), sin=torch.zeros(4, 3))
        tables[name] = moved(tables[name], other)
        with pytest.raises(ValueError, match=rf"^{name} must be on the device of x \({like}\), got {other}$"):
            rotary(torch.randn(1, 1, 4, 6), **tables)


def test_gradients_flow_through_the_reference():
    q = qkv_views(1, 2, 7, 8, torch.float32)[0].clone().requires_grad_(True)
    table = RotaryEmbedding(8, 7)
    rotary(q, table.cos, table.sin).square().sum().backward()
    expected = torch.autograd.grad(rotary_reference(q, table.cos, table.sin).square().sum(), q)[0]
    assert torch.equal(q.grad, expected)


def test_opcheck_and_compile():
    x = qkv_views(2, 2, 6, 8, torch.float32)[0]
    table = RotaryEmbedding(8, 6)
    torch.library.opcheck(torch.ops.ddpd.rotary.default, (x.contiguous(), table.cos, table.sin))
    compiled = torch.compile(rotary, fullgraph=True, backend="eager")
    assert torch.equal(compiled(x, table.cos, table.sin), rotary_reference(x, table.cos, table.sin))


def test_a_head_dimension_of_two_comes_back_contiguous():
    """With d = 2 the halves torch.cat joins have one channel, and from a qkv view it laid
    them out channels-last: the op's result, and the fake kernel torch.compile trusts, must
    be contiguous (a last-dimension stride of 1 is also what attention's fused kernels need)."""
    q = qkv_views(2, 4, 6, 2, torch.float32)[0]
    table = RotaryEmbedding(2, 6)
    assert rotary(q, table.cos, table.sin).is_contiguous()
    assert rotary_reference(q, table.cos, table.sin).is_contiguous()
    torch.library.opcheck(torch.ops.ddpd.rotary.default, (q, table.cos, table.sin))


def test_heads_with_strided_channels_are_read_by_their_strides():
    """x whose channels are not adjacent in memory (a transposed view, every other channel of a
    wider head): the kernel rotates the values the reference rotates, not the memory next to
    the first channel."""
    table = RotaryEmbedding(8, 5)
    for x in (torch.randn(1, 2, 8, 5).transpose(-1, -2), torch.randn(1, 2, 5, 16)[..., ::2]):
        assert x.stride(-1) != 1
        assert torch.equal(rotary_triton(x, table.cos, table.sin), rotary_reference(x, table.cos, table.sin))


def test_an_empty_batch_comes_back_empty():
    table = RotaryEmbedding(8, 4)
    for shape in ((0, 2, 4, 8), (1, 2, 0, 8)):
        out = rotary_triton(torch.zeros(shape), table.cos, table.sin)
        assert out.shape == shape and out.dtype == torch.float32


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_a_traced_call_on_a_gpu_returns_a_tensor_like_x(dtype):
    """Under fake tensors (a trace, on cuda:0 where the machine has none) the call goes
    through the registered op, whose fake kernel gives x's shape, dtype and device, contiguous
    as the kernel's output is."""
    with fake_tensors("cuda:0"):
        x = torch.empty(2, 5, 3, 8, dtype=dtype).transpose(1, 2)  # q of a qkv view
        out = rotary(x, torch.ones(7, 4), torch.zeros(7, 4))
        assert (out.shape, out.dtype, str(out.device)) == ((2, 3, 5, 8), dtype, "cuda:0") and out.is_contiguous()


def test_gradients_flow_through_a_compiled_call():
    """A call torch.compile traces that needs a gradient runs the differentiable reference,
    not the custom op (which has no backward)."""
    q = qkv_views(1, 2, 7, 8, torch.float32)[0].clone().requires_grad_(True)
    table = RotaryEmbedding(8, 7)
    compiled = torch.compile(rotary, fullgraph=True, backend="eager")
    compiled(q, table.cos, table.sin).square().sum().backward()
    expected = torch.autograd.grad(rotary_reference(q, table.cos, table.sin).square().sum(), q)[0]
    assert torch.equal(q.grad, expected)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_rotations_that_cancel_give_the_reference_signed_zeros(dtype):
    """Zero channels, and pairs whose two products cancel (x1 = x2 where cos = sin): each
    half's difference or sum is the reference's zero, its sign bit included."""
    x = torch.zeros(1, 2, 4, 8, dtype=dtype)
    x[0, 1, :, :4] = x[0, 1, :, 4:] = torch.tensor([1.5, -2.0, 3.0, -0.0]).to(dtype)
    x[0, 1, 3] = -x[0, 1, 3]
    table = RotaryEmbedding(8, 4)
    table.cos[:], table.sin[:] = 0.5, 0.5
    for cos, sin in ((table.cos, table.sin), (table.cos, -table.sin)):
        want, got = rotary_reference(x, cos, sin), rotary_triton(x, cos, sin)
        assert (want == 0).any()
        assert torch.equal(got.view(BITS[dtype]), want.view(BITS[dtype]))


def test_bfloat16_subnormals_in_either_half_are_widened_from_their_bits():
    """Subnormal bfloat16 values in the second half of the channels as in the first (the
    interpreter's own conversion would change them): unrotated and quarter-turned, both
    halves give the reference's bits."""
    tiny = torch.finfo(torch.bfloat16).tiny
    sub = torch.tensor([tiny / 4, tiny * 0.75, tiny / 64, -tiny / 2])
    x = torch.stack([torch.cat([sub, -sub]), torch.cat([sub.flip(0), sub])]).to(torch.bfloat16)[None, None]
    table = RotaryEmbedding(8, 2)
    for cos, sin in ((1.0, 0.0), (0.0, 1.0)):
        table.cos[:], table.sin[:] = cos, sin
        want, got = rotary_reference(x, table.cos, table.sin), rotary_triton(x, table.cos, table.sin)
        assert (want != 0).all()
        assert torch.equal(got.view(torch.int16), want.view(torch.int16))


def test_tables_given_as_strided_views_are_read_by_value():
    """cos and sin whose pairs are not adjacent in memory (transposed copies, as a table kept
    [d/2, L'] and viewed back): the kernel rotates by their values, not the packed memory."""
    q, _ = qkv_views(2, 2, 7, 8, torch.float32, seed=3)
    table = RotaryEmbedding(8, 10)
    cos, sin = table.cos.t().contiguous().t(), table.sin.t().contiguous().t()
    assert not cos.is_contiguous() and not sin.is_contiguous()
    assert torch.equal(rotary_triton(q, cos, sin), rotary_reference(q, table.cos, table.sin))
