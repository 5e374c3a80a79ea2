"""The vector functions of the C++ CPU kernels (csrc/cpu/vector_math.cpp): log, exp and
the Gumbel, sigmoid and log-sigmoid built on them, computed in double and rounded once, and
the tile statistics' exp-sums, many lanes at a time with AVX-512 or AVX2. Every path this CPU
has gives the scalar path's bits; the elementwise functions are float64 torch's values rounded
to float32, composed as the torch references compose them (a rounding after each log and exp)."""
import math

import pytest
import torch

from ddpd.ops._dispatch import cpu_ops

INF = math.inf
BELOW_ONE = 1.0 - 2.0**-24  # the largest float32 below 1: uniforms are clamped to it


def inputs(fn: str) -> torch.Tensor:
    """A million float32 inputs over the function's domain, edges first."""
    g = torch.Generator().manual_seed(0)
    n = 1 << 20
    if fn == "log":  # every positive finite float32, by bit pattern, subnormals included
        x = torch.randint(1, 0x7F800000, (n,), generator=g, dtype=torch.int32).view(torch.float32)
        edges = [1.0, 2.0**-149, 2.0**-126, BELOW_ONE, 1.0 + 2.0**-23, 3.4028234663852886e38, INF, 0.5, 2.0]
    elif fn == "gumbel":  # uniforms in (0, 1]
        x = torch.rand(n, generator=g).clamp_min(2.0**-24)
        edges = [1.0, BELOW_ONE, 2.0**-24, 2.0**-149, 0.5, 1e-30]
    else:  # logits and exponents: the float32 range of exp and beyond, and infinities
        x = torch.empty(n).uniform_(-110.0, 95.0, generator=g)
        edges = [0.0, -0.0, 88.72283, 88.7229, -87.33655, -103.97, -1e30, 1e30, INF, -INF, 1e-30, -17.0, 17.0]
    return torch.cat([torch.tensor(edges, dtype=torch.float32), x])


def exact(fn: str, x: torch.Tensor) -> torch.Tensor:
    """fn as the kernels compose it: each log and exp exactly rounded to float32 (float64, then
    rounded), the rest float32 arithmetic."""
    def log(v):
        return v.double().log().float()

    def exp(v):
        return v.double().exp().float()

    if fn == "log":
        return log(x)
    if fn == "exp":
        return exp(x)
    if fn == "gumbel":
        return -log(-log(x.clamp(max=BELOW_ONE)))
    if fn == "sigmoid":
        return 1.0 / (1.0 + exp(-x))
    return torch.minimum(x, torch.zeros(())) - log(1.0 + exp(-x.abs()))


def vector_math(x: torch.Tensor, fn: str, isa: str, t: float = 1.0) -> torch.Tensor:
    try:
        return cpu_ops().vector_math_cpu(x, fn, isa, t)
    except ValueError as error:
        assert f"no path '{isa}'" in str(error)
        pytest.skip(f"this CPU has no {isa} path")


@pytest.mark.parametrize("fn", ["log", "exp", "gumbel", "sigmoid", "log_sigmoid"])
def test_each_function_is_the_exactly_rounded_composition(fn):
    """The scalar path against float64 torch: the same float32 for each of a million inputs
    (with these inputs fixed, a value could differ only where the exact result lies within a
    few 1e-13 of a rounding boundary; none does)."""
    x = inputs(fn)
    got, want = vector_math(x, fn, "scalar"), exact(fn, x)
    assert torch.equal(got, want), x[got != want][:5]


@pytest.mark.parametrize("isa", ["avx2", "avx512", "best"])
@pytest.mark.parametrize("fn", ["log", "exp", "gumbel", "sigmoid", "log_sigmoid"])
def test_every_vector_path_gives_the_scalar_paths_bits(fn, isa):
    """Each lane computes what the scalar path computes, whatever the vector width, for runs
    of every length around the widths (the tail of a run padded with ones)."""
    x = inputs(fn)
    scalar = vector_math(x, fn, "scalar")
    assert torch.equal(vector_math(x, fn, isa).view(torch.int32), scalar.view(torch.int32))
    for n in (1, 3, 4, 7, 8, 9, 15, 16, 17, 33):
        assert torch.equal(vector_math(x[:n], fn, isa).view(torch.int32), scalar[:n].view(torch.int32)), n


def test_edges_of_each_domain():
    ops = cpu_ops()
    t = torch.tensor
    assert ops.vector_math_cpu(t([1.0, INF, 2.0**-149]), "log", "best").tolist() == [0.0, INF, pytest.approx(-103.2789)]
    assert ops.vector_math_cpu(t([0.0, -INF, INF, -200.0, 100.0]), "exp", "best").tolist() == [1.0, 0.0, INF, 0.0, INF]
    assert ops.vector_math_cpu(t([-INF, INF, 0.0]), "sigmoid", "best").tolist() == [0.0, 1.0, 0.5]
    huge = float(t(-1e30))  # as float32
    assert ops.vector_math_cpu(t([-INF, INF, huge]), "log_sigmoid", "best").tolist() == [-INF, 0.0, huge]
    top = ops.vector_math_cpu(t([1.0, BELOW_ONE]), "gumbel", "best")  # u = 1 reads as the float below it
    assert top[0] == top[1] and math.isfinite(float(top[0]))
    with pytest.raises(ValueError, match="fn must be"):
        ops.vector_math_cpu(t([1.0]), "tanh", "best")
    with pytest.raises(ValueError, match="no path 'sse9'"):
        ops.vector_math_cpu(t([1.0]), "log", "sse9")


@pytest.mark.parametrize("t", [1.0, 0.7])
def test_tile_sums_are_the_same_float_sums_on_every_path(t):
    """The tile statistics' sums (the mass exp-sum and the entropy's sum exp(y) y) add the same
    values in the same order on every path, and are within float32 rounding of float64's."""
    g = torch.Generator().manual_seed(1)
    x = 4 * torch.randn(64, 256, generator=g)
    x[0, 5:] = -INF  # a tile mostly padding
    x[1, :] = x[1, 0]  # every value the maximum
    x[2, 7] = INF  # +inf ties at the maximum: the others weigh 0
    x[3, 200:] = -1e30  # a spread beyond float32's exp range
    scalar = vector_math(x, "tile_sums", "scalar", t)
    for isa in ("avx2", "avx512", "best"):
        try:
            got = cpu_ops().vector_math_cpu(x, "tile_sums", isa, t)
        except ValueError:
            continue  # a path this CPU lacks (the scalar one always runs)
        assert torch.equal(got.view(torch.int32), scalar.view(torch.int32)), isa
    y = (x.double() - x.double().amax(1, keepdim=True)) / t
    y = torch.where(x == x.amax(1, keepdim=True), 0.0, y)
    e = y.exp()
    want = torch.stack([e.sum(1), torch.where(e > 0, e * y, 0.0).sum(1)], 1)
    assert torch.allclose(scalar.double(), want, rtol=1e-5, atol=1e-6)
    assert scalar[1, 0] == 256 and scalar[2, 0] == 1


@pytest.mark.parametrize("fn", ["gumbel_race", "race"])
@pytest.mark.parametrize("t", [1.0, 0.7])
def test_the_gumbel_race_picks_the_first_largest_key_on_every_path(fn, t):
    """The draw inside a tile: the first column of the largest shift(x, m, t) + G (without G in
    the greedy race), as a loop over the columns picks it, on every path and at run lengths
    around the vector widths; every key -inf picks column 0."""
    g = torch.Generator().manual_seed(2)
    x = 3 * torch.randn(40, 256, generator=g)
    u = torch.rand(40, 256, generator=g).clamp_min(2.0**-24)
    x[0, :] = -INF  # nothing drawable
    x[1, ::2] = -INF
    x[2, :] = x[2, 0]  # every key equal in the greedy race: the first wins
    x[3, 17] = x[3, 200] = INF  # +inf ties
    u[4, :] = u[4, 0]  # equal noise: ties wherever the logits tie
    x[4, :] = 1.0
    x[5, :] = 1.0  # equal logits, distinct noise
    for n in (1, 3, 7, 8, 9, 16, 17, 33, 255, 256):
        rows = torch.stack([x[:, :n], u[:, :n]], 1).contiguous()
        m = rows[:, 0].amax(1, keepdim=True)
        key = (rows[:, 0] - m) / t
        key = torch.where(rows[:, 0] == m, 0.0, key)
        key = torch.where(rows[:, 0] == -INF, -INF, key)
        if fn == "gumbel_race":
            noisy = key + vector_math(rows[:, 1].contiguous(), "gumbel", "scalar").view_as(key)
            key = torch.where(key > -INF, noisy, key)
        top = key.amax(1, keepdim=True)
        first = torch.where(key == top, torch.arange(n), n).amin(1)
        first = torch.where(top.squeeze(1) == -INF, 0, first)
        want = torch.stack([first.float(), top.squeeze(1)], 1)
        for isa in ("scalar", "avx2", "avx512", "best"):
            try:
                got = cpu_ops().vector_math_cpu(rows, fn, isa, t)
            except ValueError:
                continue  # a path this CPU lacks
            assert torch.equal(got, want), (isa, n, (got != want).nonzero()[:3])
