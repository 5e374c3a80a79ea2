"""The samplers of ddpd-sample and ddpd-eval, in one table: name -> the models it needs -> how it is called.

| --sampler   | ddpd-eval name                | models                          | ddpd.sampling       |
|-------------|-------------------------------|---------------------------------|---------------------|
| ddpd        | ddpd-{A,AB,ABC}-mask          | planner + mask-denoiser         | ddpd_sample         |
| ddpd        | ddpd-{A,AB,ABC}-uniform       | planner + uniform-denoiser      | ddpd_sample         |
| ddpd        | ddpd-{A,AB,ABC}-uniform-model | uniform                         | ddpd_sample_uniform |
| tau-leaping | tau-planned-mask              | planner + mask-denoiser (P x D) | tau_leaping_planned |
| tau-leaping | tau-planned-uniform           | planner + uniform-denoiser      | tau_leaping_planned |
| tau-leaping | dfm-eta{eta}                  | mask-denoiser (DFM)             | tau_leaping_mask    |
| tau-leaping | dfm-uni                       | uniform (DFM-Uni)               | tau_leaping_uniform |
| maskgit     | maskgit                       | mask-denoiser                   | mask_sample         |

Both tools call a row through `Sampler.call` with one `Settings` object, so each sampler
is wired to ddpd.sampling once; torch is imported only when a Settings is made."""
from __future__ import annotations

import argparse
import dataclasses
import importlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Optional

from ddpd.cli.common import UsageError, float_type, int_type

if TYPE_CHECKING:
    import torch
    from torch import Tensor

    from ddpd.sampling import DDPDOptions, Execution, SampleResult, Truncation

# DDPD's options of the appendix 'Implementation details' as ddpd-eval names them
OPTIONS = {"A": dict(stop="eps", selection="sigmoid"), "AB": dict(stop="budget", selection="sigmoid"),
           "ABC": dict(stop="budget", selection="softmax")}
ONE_PASS = "-one-pass"  # the suffix of the single uniform model's samplers that plan and draw in one pass


def _sampling():
    return importlib.import_module("ddpd.sampling")


MASKGIT_CHOICE_TEMPERATURE = 4.5  # ddpd.sampling.policies.MaskGIT's default, without importing torch
FLOAT32_MAX = 3.4028234663852886e38  # torch.finfo(torch.float32).max: Guidance's largest scale


def _maskgit(choice_temperature: float):
    """MaskGIT's policy (ddpd.sampling.policies), imported when a sampler is called."""
    return importlib.import_module("ddpd.sampling.policies").MaskGIT(choice_temperature)


def _default(name: str) -> Callable[[], object]:
    """A field's default, ddpd.sampling's `name`(), made (and torch imported) when needed."""
    return lambda: getattr(_sampling(), name)()


@dataclass(frozen=True)
class Settings:
    """Everything a sampler call takes besides its models and its rows' noise.

    x_init / frozen: Long[P, D] / Bool[P, D] prompts, labels: Long[L] class labels;
    sample i (counted over the whole run) takes prompt i mod P and label i mod L, so a
    batch's rows are the same whatever the batching or the process that samples them.
    conditional_planner: the labels go to the planner too (a class-conditional planner).
    """

    length: int
    vocab_size: int
    steps: int
    temperature: float = 1.0
    temperature_end: Optional[float] = None
    schedule: str = "linear"
    device: Optional[torch.device] = None
    execution: Execution = field(default_factory=_default("Execution"))
    truncation: Truncation = field(default_factory=_default("Truncation"))
    ddpd: DDPDOptions = field(default_factory=_default("DDPDOptions"))
    eta: float = 0.0
    choice_temperature: float = MASKGIT_CHOICE_TEMPERATURE
    policy: Optional[object] = None  # a mask-loop policy (ddpd.sampling.policies); None: MaskGIT's
    x_init: Optional[Tensor] = None
    frozen: Optional[Tensor] = None
    labels: Optional[Tensor] = None
    guidance_scale: float = 1.0
    conditional_planner: bool = False

    def rows(self, first: int, n: int, planner: bool) -> dict:
        """The per-row keywords (prompt=, guidance=) of samples first .. first + n - 1; prompts and
        labels repeat cyclically over the samples.

        Args:
            first: the first sample.
            n: the number of samples.
            planner: whether the sampler runs a planner (Guidance.conditional_planner applies).

        Returns:
            A dict of the keywords, empty without prompts or labels.
        """
        import torch

        sampling, kwargs = _sampling(), {}
        if self.x_init is not None:
            index = torch.arange(first, first + n) % self.x_init.shape[0]
            kwargs["prompt"] = sampling.Prompt(self.x_init[index], self.frozen[index])
        if self.labels is not None:
            labels = self.labels[torch.arange(first, first + n) % self.labels.shape[0]]
            kwargs["guidance"] = sampling.Guidance(labels, self.guidance_scale,
                                                   conditional_planner=planner and self.conditional_planner)
        return kwargs


@dataclass(frozen=True)
class Sampler:
    """One row of the table: `family` is ddpd-sample's --sampler, `name` ddpd-eval's (with
    {option} / {eta} for its variants); it needs a planner (or not) and one model of kind
    `model`; `options(settings)` gives the keywords only this sampler takes."""

    family: str
    name: str
    planner: bool
    model: str
    function: str
    options: Callable[[Settings], dict]

    @property
    def needs(self) -> str:
        model = "uniform model" if self.model == "uniform" else self.model
        return f"a planner with a {model}" if self.planner else f"one {model}"

    def call(self, models: dict[str, Callable], settings: Settings, n: int, noise, first: int) -> SampleResult:
        """Samples first .. first + n - 1 from `models`.

        Args:
            models: the networks by kind (planner, mask-denoiser, ...).
            settings: the run's Settings.
            n: the number of samples.
            noise: the noise source (ddpd.sampling.noise).
            first: the first sample's index.

        Returns:
            The sampler's SampleResult.
        """
        networks = (models["planner"], models[self.model]) if self.planner else (models[self.model],)
        s = settings
        sampling = _sampling()
        return getattr(sampling, self.function)(
            *networks, n, s.length, s.vocab_size, steps=s.steps,
            temperature=sampling.Temperature(s.temperature, s.temperature_end), schedule=s.schedule,
            device=s.device, noise=noise, execution=s.execution, truncation=s.truncation, **self.options(s),
            **s.rows(first, n, self.planner))


def _ddpd(denoiser_type: Optional[str]) -> Callable[[Settings], dict]:
    def options(s: Settings) -> dict:
        return {"ddpd": s.ddpd, **({"denoiser_type": denoiser_type} if denoiser_type else {})}
    return options


TABLE: tuple[Sampler, ...] = (
    Sampler("ddpd", "ddpd-{option}-mask", True, "mask-denoiser", "ddpd_sample", _ddpd("mask")),
    Sampler("ddpd", "ddpd-{option}-uniform", True, "uniform-denoiser", "ddpd_sample", _ddpd("uniform")),
    Sampler("ddpd", "ddpd-{option}-uniform-model", False, "uniform", "ddpd_sample_uniform", _ddpd(None)),
    Sampler("tau-leaping", "tau-planned-mask", True, "mask-denoiser", "tau_leaping_planned",
            lambda s: {"denoiser_type": "mask"}),
    Sampler("tau-leaping", "tau-planned-uniform", True, "uniform-denoiser", "tau_leaping_planned",
            lambda s: {"denoiser_type": "uniform"}),
    Sampler("tau-leaping", "dfm-eta{eta}", False, "mask-denoiser", "tau_leaping_mask", lambda s: {"eta": s.eta}),
    Sampler("tau-leaping", "dfm-uni", False, "uniform", "tau_leaping_uniform", lambda s: {}),
    Sampler("maskgit", "maskgit", False, "mask-denoiser", "mask_sample",
            lambda s: {"policy": s.policy or _maskgit(s.choice_temperature)}),
)
FAMILIES = tuple(dict.fromkeys(row.family for row in TABLE))


def find(family: str, planner: bool, model: Optional[str]) -> Optional[Sampler]:
    """The row of `family` that uses exactly a planner (or none) and one model of kind `model`.

    Args:
        family: ddpd-sample's --sampler.
        planner: whether a planner is given.
        model: the kind of the other model, or None.

    Returns:
        The Sampler, or None when no row fits.
    """
    return next((row for row in TABLE if (row.family, row.planner, row.model) == (family, planner, model)), None)


def needs(family: Optional[str] = None) -> str:
    """What `family` needs, in words: 'a planner with a mask-denoiser, ... or one uniform model'.

    Args:
        family: ddpd-sample's --sampler; None: any sampler of the table.

    Returns:
        The text.
    """
    options = [row.needs for row in TABLE if family is None or row.family == family]
    options = list(dict.fromkeys(options))
    return options[0] if len(options) == 1 else ", ".join(options[:-1]) + " or " + options[-1]


@dataclass(frozen=True)
class Variant:
    """A named sampler of ddpd-eval: a row with its variant's settings applied."""

    name: str
    sampler: Sampler
    change: dict

    def call(self, models, settings: Settings, n: int, noise, first: int) -> SampleResult:
        """Samples first .. first + n - 1 with the variant's settings applied.

        Args:
            models: the networks by kind (planner, mask-denoiser, ...).
            settings: the run's Settings, before the variant's change.
            n: the number of samples.
            noise: the noise source (ddpd.sampling.noise).
            first: the first sample's index.

        Returns:
            The sampler's SampleResult.
        """
        changed = dict(self.change)
        if "ddpd" in changed:
            changed["ddpd"] = dataclasses.replace(settings.ddpd, **changed["ddpd"])
        return self.sampler.call(models, dataclasses.replace(settings, **changed), n, noise, first)


def variants(kinds, etas: list[float]) -> dict[str, Variant]:
    """Every named sampler the models of `kinds` allow, in table order.

    Args:
        kinds: the kinds of the models given (planner, mask-denoiser, ...).
        etas: the eta values of the dfm-eta{eta} variants.

    Returns:
        The Variants by name.
    """
    from ddpd.validation import float_text  # imports torch: not before the command line is checked

    named: dict[str, Variant] = {}
    for row in TABLE:
        if row.model not in kinds or (row.planner and "planner" not in kinds):
            continue
        if "{option}" in row.name:
            for option, change in OPTIONS.items():
                named[row.name.format(option=option)] = Variant(row.name.format(option=option), row, {"ddpd": change})
            if row.function == "ddpd_sample_uniform":  # and one pass a step (DDPDOptions.one_pass)
                for option, change in OPTIONS.items():
                    name = row.name.format(option=option) + ONE_PASS
                    named[name] = Variant(name, row, {"ddpd": {**change, "one_pass": True}})
        elif "{eta}" in row.name:
            for eta in etas:
                name = row.name.format(eta=float_text(float(eta)))
                named[name] = Variant(name, row, {"eta": eta})
        else:
            named[row.name] = Variant(row.name, row, {})
    return named


# ---------------------------------------------------------------- truncation flags of both tools

TRUNCATION_FLAGS = {"top_k": "--top-k", "top_p": "--top-p", "min_p": "--min-p"}


def add_truncation_arguments(parser: argparse.ArgumentParser) -> None:
    """Add --top-k, --top-p, --min-p: ddpd.sampling.Truncation of every token draw.

    Args:
        parser: the tool's parser.
    """
    parser.add_argument("--top-k", dest="top_k", type=int_type, metavar="K",
                        help="draw each token among the K most probable only")
    parser.add_argument("--top-p", dest="top_p", type=float_type, metavar="P",
                        help="draw each token from the smallest set of most probable tokens whose probability "
                             "reaches P, in (0, 1]")
    parser.add_argument("--min-p", dest="min_p", type=float_type, metavar="P",
                        help="draw each token among those with at least P (in [0, 1]) times the top probability")


def truncation_from(args: argparse.Namespace) -> Truncation:
    """The Truncation of the parsed flags.

    Args:
        args: the parsed command line.

    Returns:
        The Truncation.

    Raises:
        UsageError: a bad value, naming its flag.
    """
    try:
        return _sampling().Truncation(args.top_k, args.top_p, args.min_p)
    except (TypeError, ValueError) as err:
        message = str(err)
        for field_name, flag in TRUNCATION_FLAGS.items():
            message = message.replace(field_name, flag)
        raise UsageError(message) from None


def truncation_label(truncation: Truncation) -> str:
    """' top-p=0.9'-style suffix naming the cuts in ddpd-eval's sampler names.

    Args:
        truncation: the Truncation.

    Returns:
        The suffix ('' for none).
    """
    from ddpd.validation import float_text  # imports torch: not before the command line is checked

    # float_text, not :g: two cuts never share a name (:g writes top-k 1000000 as 1e+06)
    cuts = truncation.controls().items()
    return "".join(f" {TRUNCATION_FLAGS[name][2:]}={float_text(value)}" for name, value in cuts)
