"""The planner as a detector of wrong tokens (ddpd.eval.detection, docs/parallel/planner_errors.py and
planner_on_draws.py)."""
import csv
import dataclasses
import fractions
import itertools
import math
import runpy
import sys
from pathlib import Path

import pytest
import torch

from ddpd.checkpoint import CheckpointError, load_bundle
from ddpd.eval.detection import auc, detection_rows, detection_table, error_detection, parallel_draws
from ddpd.pretrained import default_bundle
from ddpd.process import LinearSchedule

ROOT = Path(__file__).resolve().parents[2]
V, D = 5, 12


def pairwise_auc(score, positive):
    pos, neg = score[positive].tolist(), score[~positive].tolist()
    wins = sum(1.0 if p > n else 0.5 if p == n else 0.0 for p, n in itertools.product(pos, neg))
    return wins / (len(pos) * len(neg))


def test_auc_is_the_chance_a_positive_scores_above_a_negative():
    g = torch.Generator().manual_seed(0)
    score = torch.randint(0, 4, (200,), generator=g).float()  # many ties
    positive = torch.rand(200, generator=g) < score / 6
    assert auc(score, positive) == pytest.approx(pairwise_auc(score, positive), abs=1e-12)
    assert auc(score, score > 1) == 1.0 and auc(-score, score > 1) == 0.0
    assert auc(torch.zeros(10), torch.arange(10) < 3) == 0.5
    assert math.isnan(auc(score, torch.zeros(200, dtype=torch.bool)))


def test_a_planner_that_knows_the_text_detects_every_wrong_token_and_a_negated_one_none():
    g = torch.Generator().manual_seed(1)
    x1 = torch.randint(0, V, (16, D), generator=g)

    def knowing(x):
        return torch.where(x != x1, 10.0, -10.0)

    def denoiser(x, t):  # unsure: every draw a coin among the five tokens
        return torch.zeros(*x.shape, V)

    seen = error_detection(knowing, denoiser, x1, 0.5, V, LinearSchedule(), V, torch.Generator().manual_seed(2))
    assert seen.uniform == 1.0 and seen.parallel == 1.0 and seen.combined == 1.0
    assert 0.6 < seen.parallel_wrong < 1.0 and abs(seen.drawn - 0.5 * x1.numel()) < 30
    assert seen.confidence == 0.5  # the denoiser is as sure of every draw
    blind = error_detection(lambda x: -knowing(x), denoiser, x1, 0.5, V, LinearSchedule(), V,
                            torch.Generator().manual_seed(2))
    assert blind.uniform == 0.0 and blind.parallel == 0.0 and blind.combined == 0.0
    with pytest.raises(ValueError, match="fraction must be in"):
        error_detection(knowing, denoiser, x1, 1.0, V, LinearSchedule(), V)


def test_an_uninformed_planner_leaves_the_combined_detector_to_the_confidence():
    g = torch.Generator().manual_seed(3)
    x1 = torch.randint(0, V, (16, D), generator=g)
    bias = torch.randn(16, D, V, generator=g)

    def denoiser(x, t):  # leans to the text, unevenly: its confidence is a detector
        return bias + 2.0 * torch.nn.functional.one_hot(x1, V)

    found = error_detection(lambda x: torch.zeros(x.shape), denoiser, x1, 0.5, V, LinearSchedule(), V,
                            torch.Generator().manual_seed(4))
    assert found.parallel == 0.5 and 0.6 < found.confidence < 1.0
    assert found.combined == found.confidence and found.confident_combined == found.confident_confidence


def test_detection_rows_score_each_fraction_from_one_seeded_generator():
    g = torch.Generator().manual_seed(9)
    x1 = torch.randint(0, V, (16, D), generator=g)
    bias = torch.randn(16, D, V, generator=g)

    def denoiser(x, t):
        return bias + 2.0 * torch.nn.functional.one_hot(x1, V)

    def planner(x):
        return (x != x1).float() + bias[..., 0]

    rows = detection_rows(planner, denoiser, x1, [0.2, 0.6], V, LinearSchedule(), V, seed=10)
    generator = torch.Generator().manual_seed(10)
    want = [dataclasses.asdict(error_detection(planner, denoiser, x1, fraction, V, LinearSchedule(), V, generator))
            for fraction in (0.2, 0.6)]
    assert rows == want
    assert rows == detection_rows(planner, denoiser, x1, [0.2, 0.6], V, LinearSchedule(), V, seed=10)
    table = detection_table(rows).splitlines()
    assert table[0].startswith("| fraction | uniform | drawn |") and len(table) == 4
    assert f"| {rows[1]['drawn']} |" in table[3] and f"| {rows[1]['parallel']:.3f} |" in table[3]


def test_a_table_of_no_rows_is_refused_saying_so():
    """detection_table([]) raised a bare IndexError from rows[0]."""
    with pytest.raises(ValueError, match=r"rows must hold at least one detection row .*, got none"):
        detection_table([])


def test_the_script_writes_a_row_a_fraction(tmp_path, monkeypatch, capsys):
    corpus = tmp_path / "text.txt"
    corpus.write_text(" ".join(["the quick brown fox jumps over the lazy dog"] * 1200))
    out = tmp_path / "errors.csv"
    monkeypatch.setattr(sys, "argv", ["planner_errors.py", "--data", str(corpus), "--sequences", "2", "--fractions",
                                      "0.2", "0.6", "--out", str(out)])
    runpy.run_path(str(ROOT / "docs" / "parallel" / "planner_errors.py"), run_name="__main__")
    with open(out, newline="") as f:
        rows = list(csv.DictReader(f))
    assert [row["fraction"] for row in rows] == ["0.2", "0.6"]
    assert all(0.0 <= float(row["uniform"]) <= 1.0 for row in rows)
    assert "| fraction | uniform |" in capsys.readouterr().out


def test_the_script_scores_the_sequences_asked_for_at_the_seed_given(tmp_path, monkeypatch, capsys):
    """--sequences 2 of the bundled networks' 256 tokens: about half of 512 positions drawn at 0.5
    (the test split holds 10 such sequences); --seed changes the corruption."""
    corpus = tmp_path / "text.txt"
    corpus.write_text(" ".join(["the quick brown fox jumps over the lazy dog"] * 1200))
    rows = {}
    for seed in ("0", "1"):
        out = tmp_path / f"errors-{seed}.csv"
        monkeypatch.setattr(sys, "argv", ["planner_errors.py", "--data", str(corpus), "--sequences", "2",
                                          "--fractions", "0.5", "--seed", seed, "--out", str(out)])
        runpy.run_path(str(ROOT / "docs" / "parallel" / "planner_errors.py"), run_name="__main__")
        with open(out, newline="") as f:
            (rows[seed],) = csv.DictReader(f)
    assert all(abs(int(row["drawn"]) - 256) < 60 for row in rows.values())  # s.d. 11
    assert rows["0"] != rows["1"]


@pytest.mark.parametrize("script", ["planner_errors.py", "planner_on_draws.py"])
@pytest.mark.parametrize("fraction", ["1.5", "0", "-0.1", "nan", "abc", "1"])
def test_the_scripts_refuse_a_fraction_outside_0_1_in_one_line(tmp_path, capsys, script, fraction):
    """A fraction outside (0, 1) reached error_detection, after the bundle and the corpus were
    read, and ended in a traceback; a word that is no number printed argparse's usage too."""
    corpus = tmp_path / "text.txt"
    corpus.write_text(" ".join(["the quick brown fox jumps over the lazy dog"] * 1200))
    main = runpy.run_path(str(ROOT / "docs" / "parallel" / script))["main"]
    with pytest.raises(SystemExit) as stopped:
        main(["--data", str(corpus), "--sequences", "2", "--fractions", "0.5", fraction, "--out",
              str(tmp_path / "out.csv")])
    err = capsys.readouterr().err
    assert stopped.value.code == 2 and err.count("\n") == 1, err
    assert err.endswith(f"error: argument --fractions: must be a number in (0, 1), got {fraction!r}\n"), err
    assert not (tmp_path / "out.csv").exists()


@pytest.mark.parametrize("script, flag", [("planner_errors.py", "--sequences"), ("planner_on_draws.py", "--sequences"),
                                          ("planner_on_draws.py", "--steps"), ("planner_on_draws.py", "--batch-size"),
                                          ("planner_on_draws.py", "--threads")])
@pytest.mark.parametrize("count", ["0", "-2", "1.5", "abc"])
def test_the_scripts_refuse_a_count_below_1_in_one_line(tmp_path, capsys, script, flag, count):
    """A count below 1 failed deep in the run (torch.set_num_threads, an empty batch)."""
    main = runpy.run_path(str(ROOT / "docs" / "parallel" / script))["main"]
    with pytest.raises(SystemExit) as stopped:
        main(["--data", str(tmp_path / "text.txt"), flag, count, "--out", str(tmp_path / "out.csv")])
    err = capsys.readouterr().err
    assert stopped.value.code == 2 and err.count("\n") == 1, err
    assert err.endswith(f"error: argument {flag}: must be an int >= 1, got {count!r}\n"), err


def test_parallel_draws_mask_the_chosen_positions_and_draw_each_from_its_law():
    g = torch.Generator().manual_seed(5)
    x = torch.randint(0, V, (64, D), generator=g)
    chosen = torch.rand(64, D, generator=g) < 0.5
    seen = {}

    def denoiser(x_in, t):  # certain of x + 1 at the first half of the positions, a fair coin of 0 and 1 after
        seen["x"], seen["t"] = x_in, t
        sure = torch.nn.functional.one_hot((x + 1) % V, V).float() * 50.0
        coin = torch.tensor([0.0, 0.0] + [-50.0] * (V - 2)).expand(*x.shape, V)
        return torch.where(torch.arange(D)[:, None] < D // 2, sure, coin)

    tokens, log_q = parallel_draws(denoiser, x, chosen, V, LinearSchedule(), V, torch.Generator().manual_seed(6))
    assert torch.equal(seen["x"], torch.where(chosen, V, x))  # every chosen position masked, the rest kept
    assert torch.allclose(seen["t"], 1.0 - chosen.float().mean(-1))  # the linear schedule's time of that share
    assert torch.equal(tokens[:, : D // 2], (x[:, : D // 2] + 1) % V)
    coins = tokens[:, D // 2:]
    assert coins.max() <= 1 and 0.4 < coins.float().mean() < 0.6
    assert torch.allclose(log_q.exp().sum(-1), torch.ones(64, D))


def test_the_draws_corruption_labels_noise_and_the_wrong_draws_only():
    corruption = runpy.run_path(str(ROOT / "docs" / "parallel" / "planner_on_draws.py"))["draws_corruption"]
    g = torch.Generator().manual_seed(7)
    x1 = torch.randint(0, V, (256, D), generator=g)

    seen = {}

    def denoiser(x, t):  # right at even positions, wrong at odd ones
        seen["x"] = x
        right = torch.nn.functional.one_hot(x1, V).float() * 50.0
        return torch.where(torch.arange(D)[:, None] % 2 == 0, right, right.roll(1, -1))

    config = {"schedule": "linear", "vocab_size": V, "mask_id": V}
    x, wrong = corruption(denoiser, x1, config, torch.Generator().manual_seed(8))
    changed = x != x1
    odd = (torch.arange(D) % 2 == 1).expand_as(x1)
    assert torch.all(wrong[changed])  # a token off the text is labelled, uniform noise or a wrong draw
    drawn_wrong = changed & ~wrong
    assert not drawn_wrong.any()
    # labelled but unchanged: uniform noise that landed on the text; draws there would be right
    assert (wrong & ~changed).float().mean() < 0.25
    # uniform noise changes about 40% of the positions; the wrong draws about 19% more of the odd ones
    assert changed[odd].float().mean() - changed[~odd].float().mean() > 0.1
    assert torch.all(seen["x"][changed] == V)  # the draws never saw the text under the noise
    # right draws are not labelled, so labelled-but-unchanged is as rare at even positions as at odd
    assert abs((wrong & ~changed)[~odd].float().mean() - (wrong & ~changed)[odd].float().mean()) < 0.05
    assert 0.35 < changed[~odd].float().mean() < 0.47  # the noise is kept: draws go to clean positions only


def test_the_fine_tuning_script_scores_the_planner_before_and_after(tmp_path, monkeypatch, capsys):
    corpus = tmp_path / "text.txt"
    corpus.write_text(" ".join(["the quick brown fox jumps over the lazy dog"] * 1200))
    out = tmp_path / "draws.csv"
    monkeypatch.setattr(sys, "argv", ["planner_on_draws.py", "--data", str(corpus), "--steps", "2", "--batch-size",
                                      "2", "--sequences", "2", "--fractions", "0.5", "--threads", "1", "--out",
                                      str(out), "--bundle-out", str(tmp_path / "bundle")])
    runpy.run_path(str(ROOT / "docs" / "parallel" / "planner_on_draws.py"), run_name="__main__")
    with open(out, newline="") as f:
        rows = list(csv.DictReader(f))
    assert [(row["steps"], row["fraction"]) for row in rows] == [("0", "0.5"), ("2", "0.5")]
    assert rows[0]["confidence"] == rows[1]["confidence"]  # the same corruption and draws both times
    assert (tmp_path / "bundle" / "planner" / "model.safetensors").is_file()
    assert "| steps | fraction |" in capsys.readouterr().out
    # the bundle written loads back: the planner trained, the denoiser as it was
    tuned, kept, _ = load_bundle(str(tmp_path / "bundle"))
    planner, denoiser, _ = load_bundle(default_bundle())
    assert not all(torch.equal(a, b) for a, b in zip(tuned.state_dict().values(), planner.state_dict().values()))
    assert all(torch.equal(a, b) for a, b in zip(kept.state_dict().values(), denoiser.state_dict().values()))


@pytest.mark.parametrize("score, positive, error, match", [
    (torch.tensor([0.3, 0.1, 0.2]), torch.tensor([1, 0, 0]), TypeError, "positive must have dtype"),
    (torch.tensor([0.3, 0.1, 0.2]), torch.tensor([True, False]), ValueError, "positive must have shape"),
    (torch.tensor([0.3, float("nan"), 0.2]), torch.tensor([True, False, False]), ValueError, "score must not hold NaN"),
])
def test_auc_refuses_labels_that_are_not_bool_or_not_the_scores_shape_and_nan_scores(score, positive, error, match):
    """Integer labels were read as indices (an area of -0.67), and a NaN score ranked highest."""
    with pytest.raises(error, match=match):
        auc(score, positive)


def test_the_confident_half_is_the_draws_the_denoiser_is_surest_of():
    g = torch.Generator().manual_seed(11)
    x1 = torch.randint(0, V, (16, D), generator=g)

    def denoiser(x, t):  # certain of the text at three positions in four, a fair die at the fourth
        sure = torch.nn.functional.one_hot(x1, V).float() * 50.0
        return torch.where((torch.arange(D) % 4 == 0)[:, None], torch.zeros_like(sure), sure)

    found = error_detection(lambda x: torch.zeros(x.shape), denoiser, x1, 0.5, V, LinearSchedule(), V,
                            torch.Generator().manual_seed(12))
    assert found.parallel_wrong > 0  # the die's draws miss the text at times
    assert found.confident_wrong == 0  # the sure draws never do: no detector has a wrong draw to find there
    assert all(math.isnan(a) for a in (found.confident_planner, found.confident_confidence,
                                       found.confident_combined))


def test_the_fraction_is_the_share_of_positions_corrupted():
    x1 = torch.randint(0, V, (64, D), generator=torch.Generator().manual_seed(13))
    found = error_detection(lambda x: torch.zeros(x.shape), lambda x, t: torch.zeros(*x.shape, V), x1, 0.1, V,
                            LinearSchedule(), V, torch.Generator().manual_seed(14))
    assert abs(found.drawn - 0.1 * x1.numel()) < 40  # 77 expected, s.d. 8; the other 90% is 691


def test_a_denoiser_sure_of_its_draws_leaves_every_ranking_to_the_planner():
    """Certain of a wrong token at even positions and of the text at odd ones: every draw has
    probability 1, so the confidence cannot rank them and its log-odds are all equal (clamped,
    not -inf); the planner that knows the text ranks them alone, in the confident half too."""
    x1 = torch.randint(0, V, (16, D), generator=torch.Generator().manual_seed(15))
    even = (torch.arange(D) % 2 == 0)[:, None]

    def sure(x, t):
        target = torch.where(even.T, (x1 + 1) % V, x1)
        return torch.nn.functional.one_hot(target, V).float() * 200.0

    def knowing(x):
        return torch.where(x != x1, 10.0, -10.0)

    found = error_detection(knowing, sure, x1, 0.5, V, LinearSchedule(), V, torch.Generator().manual_seed(16))
    assert 0.3 < found.parallel_wrong < 0.7
    assert found.confident_wrong == round(found.parallel_wrong * found.drawn)  # every draw as confident
    assert (found.confidence, found.confident_confidence) == (0.5, 0.5)
    assert (found.parallel, found.combined, found.confident_planner, found.confident_combined) == (1.0,) * 4


def test_the_confident_half_holds_half_the_draws():
    """Every draw wrong, each at its own confidence: the confident half's wrong draws are half
    the draws."""
    x1 = torch.randint(0, V, (16, D), generator=torch.Generator().manual_seed(17))
    lean = 1.0 + torch.rand(16, D, generator=torch.Generator().manual_seed(18))

    def wrong(x, t):  # two wrong tokens, the first favoured by `lean`; the text never drawn
        logits = torch.full((16, D, V), -100.0)
        logits.scatter_(-1, ((x1 + 1) % V)[..., None], lean[..., None])
        return logits.scatter(-1, ((x1 + 2) % V)[..., None], 0.0)

    found = error_detection(lambda x: torch.zeros(x.shape), wrong, x1, 0.5, V, LinearSchedule(), V,
                            torch.Generator().manual_seed(19))
    assert found.parallel_wrong == 1.0 and found.drawn % 2 == 0
    assert found.confident_wrong == found.drawn // 2


@pytest.mark.parametrize("fraction", [0.0, 1.0, -0.1, 1.5])
def test_error_detection_refuses_a_fraction_outside_0_1(fraction):
    x1 = torch.zeros(2, D, dtype=torch.long)
    with pytest.raises(ValueError, match="fraction must be in"):
        error_detection(lambda x: torch.zeros(x.shape), lambda x, t: torch.zeros(*x.shape, V), x1, fraction, V,
                        LinearSchedule(), V)


def test_error_detection_and_parallel_draws_refuse_a_mask_id_among_the_tokens():
    """A mask id below V masked the chosen positions with a real token, and the denoiser drew
    from text it could not tell from a mask."""
    x1 = torch.zeros(2, D, dtype=torch.long)
    chosen = torch.ones(2, D, dtype=torch.bool)
    with pytest.raises(ValueError, match=f"mask_id must be >= {V}, got {V - 1}"):
        error_detection(lambda x: torch.zeros(x.shape), lambda x, t: torch.zeros(*x.shape, V), x1, 0.5, V - 1,
                        LinearSchedule(), V)
    with pytest.raises(ValueError, match=f"mask_id must be >= {V}, got {V - 1}"):
        parallel_draws(lambda x, t: torch.zeros(*x.shape, V), x1, chosen, V - 1, LinearSchedule(), V)


def _planner(x):
    return torch.zeros(x.shape)


def _denoiser(x, t):
    return torch.zeros(*x.shape, V)


X1, CHOSEN = torch.zeros(2, D, dtype=torch.long), torch.ones(2, D, dtype=torch.bool)


@pytest.mark.parametrize("call, error, match", [
    (lambda: parallel_draws(_denoiser, X1, CHOSEN, V, None, V), TypeError, "schedule must be a schedule's name"),
    (lambda: parallel_draws(_denoiser, X1, CHOSEN, V, "squared", V), ValueError, "schedule must be one of"),
    (lambda: parallel_draws(_denoiser, X1, CHOSEN.float(), V, "linear", V), TypeError, "chosen must have dtype"),
    (lambda: parallel_draws(_denoiser, X1, CHOSEN[:1], V, "linear", V), ValueError,
     r"chosen must have shape \(2, 12\), got \(1, 12\)"),
    (lambda: parallel_draws(_denoiser, X1.tolist(), CHOSEN, V, "linear", V), TypeError, "x must be a torch.Tensor"),
    (lambda: parallel_draws(_denoiser, X1, CHOSEN, V, "linear", "5"), TypeError, "vocab_size must be an int"),
    (lambda: error_detection(_planner, _denoiser, X1, 0.5, V, None, V), TypeError, "schedule must be a schedule's"),
    (lambda: error_detection(_planner, _denoiser, X1 + V, 0.5, V, "linear", V), ValueError,
     r"x1 must hold ids in \[0, 5\), got range \[5, 5\]"),
    (lambda: detection_rows(_planner, _denoiser, X1.tolist(), [0.5], V, "linear", V, 0), TypeError,
     "x1 must be a torch.Tensor"),
    (lambda: detection_rows(_planner, _denoiser, X1, [0.5], V, "linear", V, None), TypeError, "seed must be an int"),
    (lambda: detection_rows(_planner, _denoiser, X1, [0.5], V, "linear", V, -1), ValueError, "seed must be in"),
])
def test_detection_names_a_bad_argument(call, error, match):
    """A schedule that is no Schedule met an AttributeError on .inverse (after the planner had run), a
    chosen of another shape or dtype torch.where's RuntimeError, a list x1 an AttributeError on
    .device and a seed of None torch's 'manual_seed expected a long'."""
    with pytest.raises(error, match=match):
        call()


def test_detection_takes_a_schedule_by_name():
    """A checkpoint's config names its schedule ("linear"): the name draws what the Schedule does."""
    g = lambda: torch.Generator().manual_seed(3)  # noqa: E731
    x = torch.randint(0, V, (2, D), generator=g())
    chosen = torch.rand(2, D, generator=g()) < 0.5
    by_name = parallel_draws(_denoiser, x, chosen, V, "linear", V, g())
    by_object = parallel_draws(_denoiser, x, chosen, V, LinearSchedule(), V, g())
    assert all(torch.equal(a, b) for a, b in zip(by_name, by_object))
    named = detection_rows(_planner, lambda x, t: torch.randn(*x.shape, V, generator=g()), x, [0.5], V, "linear", V, 0)
    assert named[0]["fraction"] == 0.5


def test_the_planner_scores_uniform_noise_everywhere_and_the_draws_at_the_drawn_positions():
    """Uniform noise over all V tokens (the text's own too) and the draws replace x1 at the drawn
    positions only; the uniform area scores every position, the parallel one the drawn ones."""
    x1 = torch.randint(0, V, (64, D), generator=torch.Generator().manual_seed(20))
    score = torch.randn(64, D, generator=torch.Generator().manual_seed(21))
    seen = []

    def planner(x):  # a fixed score a position, blind to the tokens
        seen.append(x)
        return score

    def denoiser(x, t):  # a fair die: most draws differ from the text
        seen.append(x)
        return torch.zeros(*x.shape, V)

    found = error_detection(planner, denoiser, x1, 0.5, V, LinearSchedule(), V, torch.Generator().manual_seed(22))
    uniform, masked, parallel = seen
    chosen = masked == V
    assert torch.equal(uniform[~chosen], x1[~chosen]) and torch.equal(parallel[~chosen], x1[~chosen])
    assert torch.equal(uniform[chosen].unique(), torch.arange(V))
    assert 0.1 < (uniform == x1)[chosen].float().mean() < 0.3  # 1 / V: 77 of 384 expected, s.d. 8
    assert found.uniform == auc(score, uniform != x1)
    assert found.parallel == auc(score[chosen], (parallel != x1)[chosen])


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_auc_takes_half_precision_scores(dtype):
    """A network run in half precision gives its scores as they are: the same area as in float32."""
    score = torch.arange(12.0).remainder(5)  # small integers: exact in every dtype, with ties
    positive = torch.arange(12) % 3 == 0
    assert auc(score.to(dtype), positive) == auc(score, positive)


def test_detection_rows_run_the_models_without_gradients():
    """The rows are scores, not a loss: no autograd graph is kept through the planner or the denoiser."""
    x1 = torch.randint(0, V, (2, D), generator=torch.Generator().manual_seed(23))
    grad = []

    def planner(x):
        grad.append(torch.is_grad_enabled())
        return torch.zeros(x.shape)

    def denoiser(x, t):
        grad.append(torch.is_grad_enabled())
        return torch.zeros(*x.shape, V)

    detection_rows(planner, denoiser, x1, [0.5], V, "linear", V, seed=0)
    assert grad == [False] * 3


def test_error_detection_refuses_an_unknown_schedule_before_the_planner_runs():
    """A bad schedule is named before the planner spends a pass on the corrupted text."""
    def planner(x):
        raise AssertionError("the planner ran")

    with pytest.raises(ValueError, match="schedule must be one of"):
        error_detection(planner, _denoiser, X1, 0.5, V, "squared", V)


def test_parallel_draws_draw_each_token_as_often_as_its_probability():
    """One token at probability 1/2 and four at 1/8: a draw of the law, not of a law with the
    same most likely token (Gumbel noise subtracted gives the first about 62% of the time)."""
    x = torch.zeros(128, D, dtype=torch.long)
    law = torch.tensor([0.5] + [0.125] * (V - 1)).log()
    tokens, _ = parallel_draws(lambda x_in, t: law.expand(*x_in.shape, V), x, torch.ones(128, D, dtype=torch.bool),
                               V, LinearSchedule(), V, torch.Generator().manual_seed(24))
    assert 0.45 < (tokens == 0).float().mean() < 0.55  # 768 of 1536 expected, s.d. 20


def test_detection_rows_take_every_seed_a_generator_takes():
    """torch seeds a generator from any int in [0, 2**64): the largest is taken, the next refused."""
    rows = detection_rows(_planner, _denoiser, X1, [0.5], V, "linear", V, 2**64 - 1)
    assert rows[0]["drawn"] <= X1.numel()
    with pytest.raises(ValueError, match="seed must be in"):
        detection_rows(_planner, _denoiser, X1, [0.5], V, "linear", V, 2**64)


def test_parallel_draws_refuse_an_empty_vocabulary():
    with pytest.raises(ValueError, match="vocab_size must be >= 1, got 0"):
        parallel_draws(_denoiser, X1, CHOSEN, V, "linear", 0)


class _Clean(LinearSchedule):  # alpha_t = 1 at every t: corrupt adds no uniform noise, the draws alone remain
    def alpha(self, t):
        return torch.ones_like(torch.as_tensor(t, dtype=torch.float32))


def test_the_draws_corruption_draws_three_rows_in_four_each_at_a_uniform_share():
    """Without uniform noise the masked positions are the drawn ones: about 3/4 of the rows hold
    some (a row draws at a share f ~ U(0, 1)), and those rows draw about half their positions."""
    corruption = runpy.run_path(str(ROOT / "docs" / "parallel" / "planner_on_draws.py"))["draws_corruption"]
    x1 = torch.randint(0, V, (400, 64), generator=torch.Generator().manual_seed(25))
    seen = {}

    def denoiser(x, t):
        seen["x"] = x
        return torch.zeros(*x.shape, V)

    config = {"schedule": _Clean(), "vocab_size": V, "mask_id": V}
    x, wrong = corruption(denoiser, x1, config, torch.Generator().manual_seed(26))
    drawn = seen["x"] == V
    rows = drawn.any(-1)
    assert 0.66 < rows.float().mean() < 0.82  # 0.75 * 64 / 65 expected, s.d. 0.02
    shares = drawn[rows].float().mean(-1)
    assert 0.42 < shares.mean() < 0.58 and shares.std() > 0.2  # U(0, 1): s.d. 0.29; one share for all: 0.06
    assert torch.equal(wrong, drawn & (x != x1))


@pytest.mark.parametrize("script", ["planner_errors.py", "planner_on_draws.py"])
def test_the_scripts_load_the_bundle_asked_for(tmp_path, script):
    """--bundle replaces the bundled pair: a directory that holds none is named, not passed over."""
    main = runpy.run_path(str(ROOT / "docs" / "parallel" / script))["main"]
    with pytest.raises(CheckpointError, match="bundle directory not found"):
        main(["--data", str(tmp_path / "text.txt"), "--bundle", str(tmp_path / "none"), "--out",
              str(tmp_path / "out.csv")])


def test_auc_takes_double_precision_scores():
    """A detector scored in float64 (a log-odds computed in double) is as welcome as float32."""
    score = torch.arange(12.0).remainder(5)
    positive = torch.arange(12) % 3 == 0
    assert auc(score.double(), positive) == auc(score, positive) == pytest.approx(pairwise_auc(score, positive))


def test_the_share_of_wrong_draws_is_their_count_over_the_draws_in_double():
    """parallel_wrong is the exact ratio of the wrong draws to the draws, not its float32 rounding."""
    x1 = torch.randint(0, V, (16, D), generator=torch.Generator().manual_seed(27))
    found = error_detection(_planner, _denoiser, x1, 0.5, V, LinearSchedule(), V, torch.Generator().manual_seed(29))
    wrong = round(found.parallel_wrong * found.drawn)
    assert 0 < wrong < found.drawn
    assert found.parallel_wrong == wrong / found.drawn
    assert found.parallel_wrong != float(torch.tensor(wrong / found.drawn, dtype=torch.float32))  # float32 would differ


def test_a_detection_table_gives_areas_to_three_decimals_and_counts_whole():
    """Areas of 1, below 0.1 and NaN keep three decimals (not three significant digits), counts
    stay integers, and a column added to the rows follows the first row's keys."""
    rows = [{"fraction": 0.05, "uniform": 1.0, "drawn": 7, "confident_planner": float("nan"), "steps": 2},
            {"fraction": 0.5, "uniform": 0.01234, "drawn": 120, "confident_planner": 0.5, "steps": 10}]
    lines = detection_table(rows).splitlines()
    assert lines[0] == "| fraction | uniform | drawn | confident_planner | steps |"
    assert lines[2] == "| 0.050 | 1.000 | 7 | nan | 2 |"
    assert lines[3] == "| 0.500 | 0.012 | 120 | 0.500 | 10 |"


def test_the_combined_detector_sums_the_planner_logit_and_the_draws_log_odds_of_doubt():
    """Blind planner scores and an uneven denoiser: every area is the one recomputed from what the
    models saw, with the combined score the planner's logit plus log((1 - c) / c) for the draw's
    probability c, and the confident half the draws of the lower half of that log-odds."""
    g = torch.Generator().manual_seed(30)
    x1 = torch.randint(0, V, (32, D), generator=g)
    score = torch.randn(32, D, generator=g)
    bias = 2.0 * torch.randn(32, D, V, generator=g)
    seen = []

    def planner(x):
        seen.append(x)
        return score

    def denoiser(x, t):
        seen.append(x)
        return bias + 1.5 * torch.nn.functional.one_hot(x1, V)

    found = error_detection(planner, denoiser, x1, 0.5, V, LinearSchedule(), V, torch.Generator().manual_seed(31))
    _, masked, parallel = seen
    chosen = masked == V
    c = torch.softmax((bias + 1.5 * torch.nn.functional.one_hot(x1, V)).double(), -1)
    c = c.gather(-1, parallel[..., None]).squeeze(-1)[chosen]
    doubt, planned, wrong = torch.log((1.0 - c) / c), score[chosen].double(), (parallel != x1)[chosen]
    combined = planned + doubt
    confident = doubt <= doubt.median()
    assert 0.55 < found.confidence < 0.95 and 0.55 < found.combined  # both detectors inform the sum
    assert found.confidence == pytest.approx(pairwise_auc(doubt, wrong), abs=1e-9)
    assert found.combined == pytest.approx(pairwise_auc(combined, wrong), abs=1e-9)
    assert confident.sum() == (wrong.numel() + 1) // 2
    assert found.confident_wrong == int(wrong[confident].sum())
    assert found.confident_combined == pytest.approx(pairwise_auc(combined[confident], wrong[confident]), abs=1e-9)


@pytest.mark.parametrize("score", [torch.tensor([3, 1, 2]), torch.tensor([True, False, False]), [0.3, 0.1, 0.2]])
def test_auc_refuses_scores_that_are_not_a_floating_tensor(score):
    """Integer or bool scores (token ids, labels passed in the wrong place) gave an area as if
    they were scores; a list met an AttributeError."""
    with pytest.raises(TypeError, match="score must"):
        auc(score, torch.tensor([True, False, False]))


def test_error_detection_reports_any_real_fraction_as_a_float():
    """A fraction given as a Fraction (or numpy's scalar) is kept as the float it was checked as,
    so its row prints in the table like any other."""
    x1 = torch.randint(0, V, (4, D), generator=torch.Generator().manual_seed(32))
    found = error_detection(_planner, _denoiser, x1, fractions.Fraction(1, 4), V, LinearSchedule(), V,
                            torch.Generator().manual_seed(33))
    assert type(found.fraction) is float and found.fraction == 0.25
    assert detection_table([dataclasses.asdict(found)]).splitlines()[2].startswith("| 0.250 | ")


@pytest.mark.parametrize("at", [0, 2])
def test_auc_refuses_a_nan_score_at_a_positive_or_a_negative_entry(at):
    score = torch.tensor([0.3, 0.1, 0.2])
    score[at] = float("nan")
    with pytest.raises(ValueError, match="score must not hold NaN"):
        auc(score, torch.tensor([True, False, False]))


def test_auc_ranks_infinite_scores_at_the_ends():
    """A logit of +inf or -inf is a score like any other: only NaN cannot be ranked."""
    score = torch.tensor([float("inf"), 0.5, -float("inf"), 0.2, 0.9])
    positive = torch.tensor([True, False, False, True, False])
    assert auc(score, positive) == pytest.approx(pairwise_auc(score, positive)) == pytest.approx(4 / 6)
    assert auc(score, score > 0.7) == 1.0


def test_a_detection_table_takes_its_columns_in_the_first_rows_order():
    """Rows of equal keys in another order (one read back from a CSV, one computed) print under
    the first row's columns, each value in its own column."""
    rows = [{"fraction": 0.5, "drawn": 10, "uniform": 0.75}, {"uniform": 0.25, "fraction": 0.2, "drawn": 4}]
    lines = detection_table(rows).splitlines()
    assert lines[0] == "| fraction | drawn | uniform |"
    assert lines[2:] == ["| 0.500 | 10 | 0.750 |", "| 0.200 | 4 | 0.250 |"]


def test_the_draws_mask_with_the_mask_id_given_above_the_vocabulary():
    """A mask id past V (a vocabulary with reserved ids between) is the token the denoiser sees
    at the drawn positions, in error_detection as in parallel_draws."""
    x1 = torch.randint(0, V, (4, D), generator=torch.Generator().manual_seed(34))
    seen = []

    def denoiser(x, t):
        seen.append(x)
        return torch.zeros(*x.shape, V)

    chosen = torch.arange(D).expand(4, D) % 3 == 0
    parallel_draws(denoiser, x1, chosen, V + 2, LinearSchedule(), V)
    assert torch.equal(seen[0], torch.where(chosen, V + 2, x1))
    found = error_detection(_planner, denoiser, x1, 0.5, V + 2, LinearSchedule(), V, torch.Generator().manual_seed(35))
    masked = seen[1] != x1
    assert masked.sum() == found.drawn > 0 and torch.all(seen[1][masked] == V + 2)


def test_error_detection_takes_a_one_token_vocabulary_and_refuses_an_empty_one():
    """With one token nothing can be wrong: every area has no positive to find (NaN), none of the
    draws is wrong; a vocabulary of none is named."""
    x1 = torch.zeros(4, D, dtype=torch.long)
    found = error_detection(_planner, lambda x, t: torch.zeros(*x.shape, 1), x1, 0.5, 1, LinearSchedule(), 1,
                            torch.Generator().manual_seed(36))
    assert found.drawn > 0 and found.parallel_wrong == 0.0 and found.confident_wrong == 0
    assert all(math.isnan(a) for a in (found.uniform, found.parallel, found.confidence, found.combined))
    with pytest.raises(ValueError, match="vocab_size must be >= 1, got 0"):
        error_detection(_planner, _denoiser, x1, 0.5, V, LinearSchedule(), 0)


def test_detection_rows_hold_plain_ints_and_floats():
    """Counts are ints and areas and shares floats, not 0-d tensors: the table and the CSV writer
    format them as numbers."""
    x1 = torch.randint(0, V, (8, D), generator=torch.Generator().manual_seed(37))
    g = torch.Generator().manual_seed(38)
    (row,) = detection_rows(_planner, lambda x, t: torch.randn(*x.shape, V, generator=g), x1, [0.5], V, "linear", V,
                            seed=39)
    assert {name for name, value in row.items() if type(value) is int} == {"drawn", "confident_wrong"}
    assert all(type(value) is float for name, value in row.items() if name not in ("drawn", "confident_wrong"))
    assert "tensor" not in detection_table([row])


def test_the_confident_half_is_cut_at_the_median_even_among_near_ties():
    """Every draw wrong at confidences a hair apart: the cut is the median itself, so the
    confident half still holds half the draws."""
    x1 = torch.randint(0, V, (16, D), generator=torch.Generator().manual_seed(40))
    lean = 1.0 + 1e-4 * torch.rand(16, D, generator=torch.Generator().manual_seed(41))

    def wrong(x, t):  # as in test_the_confident_half_holds_half_the_draws, the leans closer
        logits = torch.full((16, D, V), -100.0)
        logits.scatter_(-1, ((x1 + 1) % V)[..., None], lean[..., None])
        return logits.scatter(-1, ((x1 + 2) % V)[..., None], 0.0)

    found = error_detection(_planner, wrong, x1, 0.5, V, LinearSchedule(), V, torch.Generator().manual_seed(42))
    assert found.parallel_wrong == 1.0
    assert found.confident_wrong == (found.drawn + 1) // 2


def _planner_gap():
    return runpy.run_path(str(ROOT / "docs" / "text8" / "planner_gap.py"))


def test_the_uniform_models_implied_planner_is_eq_corruption_prob():
    """The gap script reads the bundled uniform model as a planner: its sigmoid is
    planner_prob_from_uniform of the model's probabilities at alpha_t."""
    from ddpd.checkpoint import load_model
    from ddpd.pretrained import UNIFORM
    from ddpd.process import get_schedule, planner_prob_from_uniform

    uniform, _ = load_model(f"{default_bundle(model=UNIFORM)}/{UNIFORM}")
    planner = _planner_gap()["implied_planner"](uniform.eval(), "cosine")
    x = torch.randint(0, 27, (2, 256), generator=torch.Generator().manual_seed(0))
    t = torch.tensor([0.2, 0.7])
    with torch.no_grad():
        alpha = get_schedule("cosine").alpha(t)  # not t: the schedule the script is given is read
        expected = planner_prob_from_uniform(torch.softmax(uniform(x, t).float(), -1), x, alpha)
        assert torch.allclose(torch.sigmoid(planner(x, t)), expected, atol=1e-5)


def test_the_gap_script_writes_both_tables(tmp_path, monkeypatch, capsys):
    corpus = tmp_path / "text.txt"
    corpus.write_text(" ".join(["the quick brown fox jumps over the lazy dog"] * 1200))
    out = tmp_path / "gap.md"
    monkeypatch.setattr(sys, "argv", ["planner_gap.py", "--data", str(corpus), "--sequences", "2", "--out", str(out)])
    runpy.run_path(str(ROOT / "docs" / "text8" / "planner_gap.py"), run_name="__main__")
    text = out.read_text()
    rows = {line.split(" | ")[0][2:]: line.split(" | ")[1:] for line in text.splitlines() if line.startswith("| ")}
    assert rows["planner"][0] == rows["true"][0]  # one planner, one seed: the same planning term
    assert [t for t in rows if t[:2] == "0."] == ["0.1", "0.3", "0.5", "0.7", "0.9"]
    assert text in capsys.readouterr().out
