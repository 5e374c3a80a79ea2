"""help() on a sampler lists every option: each parameter of its signature has an entry in its
docstring's Args section, and the entry of an options object names every field of it."""
import dataclasses
import inspect
import re

import pytest

from ddpd import sampling
from ddpd.sampling import DDPDOptions, Execution, Guidance, Prompt, Temperature, Truncation

SAMPLERS = [sampling.ddpd_sample, sampling.ddpd_sample_uniform, sampling.tau_leaping_mask,
            sampling.tau_leaping_uniform, sampling.tau_leaping_planned, sampling.maskgit_sample,
            sampling.mask_sample]
OPTIONS = (DDPDOptions, Execution, Guidance, Prompt, Temperature, Truncation)


def args_section(function) -> dict[str, str]:
    """name -> the text of its entry in the Google-style Args section of `function`'s docstring."""
    doc = inspect.getdoc(function)
    section = re.search(r"^Args:\n(.*?)(?=^\S|\Z)", doc, re.M | re.S)
    assert section, f"{function.__name__} has no Args section"
    entries, name = {}, None
    for line in section.group(1).splitlines():
        entry = re.match(r"^    (\w+): (.*)", line)
        if entry:
            name = entry.group(1)
            entries[name] = entry.group(2)
        elif name and line.startswith("        "):
            entries[name] += " " + line.strip()
    return entries


def options_of(parameter: inspect.Parameter) -> list[type]:
    """The options classes a parameter takes, read from its annotation."""
    annotation = str(parameter.annotation)
    return [kind for kind in OPTIONS if re.search(rf"\b{kind.__name__}\b", annotation)]


@pytest.mark.parametrize("sampler", SAMPLERS, ids=[s.__name__ for s in SAMPLERS])
def test_every_parameter_has_an_entry(sampler):
    entries = args_section(sampler)
    missing = [name for name in inspect.signature(sampler).parameters if name not in entries]
    assert not missing, f"{sampler.__name__}'s docstring misses {missing}"
    doc = inspect.getdoc(sampler)
    assert "\nReturns:\n" in doc and "\nRaises:\n" in doc


@pytest.mark.parametrize("sampler", SAMPLERS, ids=[s.__name__ for s in SAMPLERS])
def test_every_field_of_an_options_object_is_named(sampler):
    entries = args_section(sampler)
    for name, parameter in inspect.signature(sampler).parameters.items():
        for kind in options_of(parameter):
            missing = [f.name for f in dataclasses.fields(kind) if not re.search(rf"\b{f.name}\b", entries[name])]
            assert not missing, f"{sampler.__name__}: the entry of {name} misses {kind.__name__}'s {missing}"


def test_every_sampler_takes_the_options_objects_under_the_same_names_and_defaults():
    shared = ("temperature", "truncation", "execution", "prompt", "guidance", "schedule", "seed", "generator",
              "noise", "device")
    for sampler in SAMPLERS:
        parameters = inspect.signature(sampler).parameters
        assert not any(p.kind == p.VAR_KEYWORD for p in parameters.values()), sampler.__name__
        assert all(parameters[name].kind == parameters[name].KEYWORD_ONLY for name in ("steps", *shared))
        for name in shared:
            reference = inspect.signature(SAMPLERS[0]).parameters[name]
            assert (parameters[name].default, parameters[name].annotation) == \
                (reference.default, reference.annotation), (sampler.__name__, name)


def test_the_check_finds_a_missing_entry():
    """The checks have power: a docstring without an entry, or naming too few fields, fails."""
    def sampler(model, *, steps: int, execution: Execution = Execution()):
        """A sampler.

        Args:
            model: A model.
            execution: How (Execution): fused, dtype.
        """

    assert "steps" not in args_section(sampler)
    entry = args_section(sampler)["execution"]
    assert [f.name for f in dataclasses.fields(Execution) if f.name not in entry] == ["sync_every", "compaction",
                                                                                      "graphs"]


@pytest.mark.parametrize("sampler", SAMPLERS, ids=lambda s: s.__name__)
@pytest.mark.parametrize("keyword,where", [("fused", "execution=Execution(fused=...)"),
                                           ("top_p", "truncation=Truncation(top_p=...)"),
                                           ("x_init", "prompt=Prompt(x_init, frozen)"),
                                           ("frozen", "prompt=Prompt(x_init, frozen)"),
                                           ("labels", "guidance=Guidance(labels, ...)"),
                                           ("conditional_planner",
                                            "guidance=Guidance(labels, conditional_planner=...)"),
                                           ("sync_every", "execution=Execution(sync_every=...)"),
                                           ("min_p", "truncation=Truncation(min_p=...)"),
                                           ("guidance_scale", "guidance=Guidance(labels, scale=...)"),
                                           ("temperature_end", "temperature=Temperature(start, end)")])
def test_a_keyword_taken_flat_before_names_its_object(sampler, keyword, where):
    """Before any network is called: the networks here are None."""
    positional = [p.name for p in inspect.signature(sampler).parameters.values() if p.kind is p.POSITIONAL_OR_KEYWORD]
    networks = (None,) * (len(positional) - 3)  # before batch_size, length, vocab_size
    with pytest.raises(TypeError, match=re.escape(f"{keyword} (now {where})")):
        sampler(*networks, 2, 4, 5, steps=2, **{keyword: 1})


def test_an_unknown_keyword_is_named_with_the_keywords_a_sampler_takes():
    with pytest.raises(TypeError, match=r"got unexpected keyword argument\(s\): bogus; its keywords are .*'execution'"):
        sampling.ddpd_sample(None, None, 2, 4, 5, steps=2, bogus=1)
    with pytest.raises(TypeError) as raised:  # every keyword, in alphabetical order
        sampling.ddpd_sample(None, None, 2, 4, 5, steps=2, bogus=1)
    assert str(raised.value).endswith(f"its keywords are {sorted(inspect.signature(sampling.ddpd_sample).parameters)}")
    with pytest.raises(TypeError, match=r"selection \(now ddpd=DDPDOptions\(selection=\.\.\.\)\)"):
        sampling.ddpd_sample(None, None, 2, 4, 5, steps=2, selection="softmax")


@pytest.mark.parametrize("sampler", [s for s in SAMPLERS if "ddpd" not in inspect.signature(s).parameters],
                         ids=lambda s: s.__name__)
def test_a_ddpd_field_is_not_sent_to_a_sampler_without_ddpd_options(sampler):
    """eps= on mask_sample named ddpd=DDPDOptions(eps=...), which that sampler refuses in turn."""
    positional = [p.name for p in inspect.signature(sampler).parameters.values() if p.kind is p.POSITIONAL_OR_KEYWORD]
    networks = (None,) * (len(positional) - 3)
    with pytest.raises(TypeError) as raised:
        sampler(*networks, 2, 4, 5, steps=2, eps=0.1)
    assert "now ddpd=" not in str(raised.value)
    assert f"eps (ddpd=DDPDOptions(eps=...) of other samplers; {sampler.__name__} takes no ddpd=)" in str(raised.value)
