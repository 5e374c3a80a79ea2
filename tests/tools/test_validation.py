"""The argument checks of ddpd.validation, called directly: the values they return, the
bounds and wording of their messages, and which tensors they let a check read."""
import threading
import warnings

import numpy as np
import pytest
import torch

from ddpd.validation import (
    MissingExtra,
    caller_level,
    check_bool,
    check_callable,
    check_choice,
    check_device,
    check_float,
    check_int,
    check_same_device,
    check_shape,
    check_tensor,
    float_text,
    readable,
    require_extra,
    value_range,
    values_checkable,
)
from oracles.devices import fake_tensors, moved


def test_an_integer_scalar_comes_back_as_a_python_int():
    value = check_int("n", np.int64(3), 0)
    assert value == 3 and type(value) is int


@pytest.mark.parametrize("value, minimum, maximum, message", [
    (-1, 0, None, "n must be >= 0, got -1"),
    (5, 0, 4, r"n must be in \[0, 4\], got 5"),
    (-1, 0, 4, r"n must be in \[0, 4\], got -1"),
])
def test_an_int_out_of_range_names_its_bounds(value, minimum, maximum, message):
    with pytest.raises(ValueError, match=f"^{message}$"):
        check_int("n", value, minimum, maximum)


def test_an_int_on_its_bounds_is_accepted():
    assert check_int("n", 0, 0, 4) == 0 and check_int("n", 4, 0, 4) == 4 and check_int("n", 7, 7) == 7


def test_a_bool_is_not_an_int():
    with pytest.raises(TypeError, match=r"^n must be an int, got bool True$"):
        check_int("n", True, 0)


@pytest.mark.parametrize("kwargs, value, message", [
    ({"open_min": True}, 0.0, r"x must be in \(0, 1\], got 0.0"),
    ({"open_max": True}, 1.0, r"x must be in \[0, 1\), got 1.0"),
    ({}, -0.5, r"x must be in \[0, 1\], got -0.5"),
    ({}, 1.5, r"x must be in \[0, 1\], got 1.5"),
    ({}, float("nan"), r"x must be in \[0, 1\], got nan"),
])
def test_a_float_out_of_its_interval_names_the_interval(kwargs, value, message):
    with pytest.raises(ValueError, match=f"^{message}$"):
        check_float("x", value, 0, 1, **kwargs)


def test_a_float_on_a_closed_bound_is_accepted_and_comes_back_as_a_float():
    assert check_float("x", 0, 0, 1) == 0.0 and type(check_float("x", 1, 0, 1)) is float
    assert check_float("x", np.float32(0.5), 0, 1, open_min=True, open_max=True) == 0.5


def test_a_bool_is_not_a_number():
    with pytest.raises(TypeError, match=r"^x must be a number, got bool False$"):
        check_float("x", False, 0, 1)
    with pytest.raises(TypeError, match=r"^x must be a number, got str '0.5'$"):
        check_float("x", "0.5", 0, 1)


def test_an_int_beyond_float_range_is_refused_with_its_size():
    with pytest.raises(ValueError, match=r"^x must be in \[0, inf\], got an int of 1025 bits$"):
        check_float("x", 2 ** 1024, 0)


def test_a_choice_that_is_not_a_str_is_a_type_error_listing_the_choices():
    with pytest.raises(TypeError, match=r"^mode must be a str, one of \('a', 'b'\), got int 1$"):
        check_choice("mode", 1, ["a", "b"])
    with pytest.raises(ValueError, match=r"^mode must be one of \('a', 'b'\), got 'c'$"):
        check_choice("mode", "c", ["a", "b"])
    with pytest.raises(ValueError, match=r"^mode must be one of \('a', 'b'\), got ''$"):
        check_choice("mode", "", ["a", "b"])


@pytest.mark.parametrize("value, text", [(0.5, "0.5"), (1e6, "1e+06"), (1000001.0, "1000001.0"), (3, "3"),
                                         (0.1 + 0.2, "0.30000000000000004"),
                                         (10 ** 20, "100000000000000000000")])
def test_float_text_is_short_only_where_it_reads_back_exactly(value, text):
    assert float_text(value) == text


def test_a_numpy_float64_is_written_as_a_float():
    assert float_text(np.float64(1e6)) == "1e+06" and float_text(np.float64(0.1 + 0.2)) == "0.30000000000000004"


def test_a_bool_check_refuses_an_int_naming_its_type():
    assert check_bool("rms", False) is False
    with pytest.raises(TypeError, match=r"^rms must be a bool, got int 1$"):
        check_bool("rms", 1)


def test_a_callable_check_refuses_a_value_naming_its_type_only():
    assert check_callable("fn", len) is len
    with pytest.raises(TypeError, match=r"^fn must be callable, got str$"):
        check_callable("fn", "len")


def test_a_shape_check_compares_every_dim_not_the_size():
    check_shape("x", torch.zeros(2, 3), [2, 3])
    with pytest.raises(ValueError, match=r"^x must have shape \(3, 2\), got \(2, 3\)$"):
        check_shape("x", torch.zeros(2, 3), [3, 2])


def test_a_tensor_of_another_dtype_is_checked_before_its_dims():
    with pytest.raises(TypeError, match=r"^x must have dtype in \(torch.int64, torch.int32\), got torch.float32$"):
        check_tensor("x", torch.zeros(2, 2), (torch.int64, torch.int32), dim=1)
    with pytest.raises(ValueError, match=r"^x must be 1-D, got shape \(2, 2\)$"):
        check_tensor("x", torch.zeros(2, 2), (torch.float32,), dim=1)
    with pytest.raises(ValueError, match=r"^x must be 2-D, got shape \(2,\)$"):
        check_tensor("x", torch.zeros(2), (torch.float32,), dim=2)
    assert check_tensor("x", torch.zeros(2, 2), (torch.float32,)).shape == (2, 2)


def test_a_zero_dim_check_refuses_a_vector_and_takes_a_scalar():
    with pytest.raises(ValueError, match=r"^x must be 0-D, got shape \(2,\)$"):
        check_tensor("x", torch.zeros(2), (torch.float32,), dim=0)
    assert check_tensor("x", torch.tensor(1.0), (torch.float32,), dim=0).dim() == 0


def test_a_meta_tensor_is_refused_for_its_device_and_a_sparse_one_for_its_layout():
    with pytest.raises(ValueError, match=r"^x must be on a cpu or cuda device, got meta$"):
        check_tensor("x", torch.zeros(2, device="meta"), (torch.float32,))
    with pytest.raises(TypeError, match=r"^x must be a dense tensor, got layout torch.sparse_coo$"):
        check_tensor("x", torch.zeros(2).to_sparse(), (torch.float32,))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # torch: sparse CSR support is in beta
        csr = torch.zeros(2, 2).to_sparse_csr()
    with pytest.raises(TypeError, match=r"^x must be a dense tensor, got layout torch.sparse_csr$"):
        check_tensor("x", csr, (torch.float32,))


def test_tensors_on_two_devices_are_refused_naming_both():
    check_same_device("x", torch.zeros(1), torch.zeros(2), "y")
    with pytest.raises(ValueError, match=r"^x must be on the device of y \(cpu\), got meta$"):
        check_same_device("x", torch.zeros(1, device="meta"), torch.zeros(2), "y")


def test_tensors_on_two_gpus_of_one_machine_are_refused_naming_both():
    with fake_tensors("cuda:0"):
        first = torch.zeros(2)
        with pytest.raises(ValueError, match=r"^x must be on the device of y \(cuda:0\), got cuda:1$"):
            check_same_device("x", moved(first, "cuda:1"), first, "y")


def test_a_missing_module_names_the_extra_that_installs_it():
    with pytest.raises(MissingExtra, match=r'^plotting needs the no_such_module_xyz package, which is not '
                                           r'installed: pip install "ddpd\[plots\]"$'):
        require_extra("no_such_module_xyz", "plots", "plotting")
    assert require_extra("json", "plots", "plotting").__name__ == "json"


def test_a_module_that_fails_to_import_names_the_extra_without_the_import_error(tmp_path, monkeypatch):
    """An ImportError that is not ModuleNotFoundError (an installed module missing a name it
    imports) counts as missing too; the message stands alone, its cause not chained."""
    (tmp_path / "half_installed_xyz.py").write_text("from json import no_such_name\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(MissingExtra, match=r"^plotting needs the half_installed_xyz package") as raised:
        require_extra("half_installed_xyz", "plots", "plotting")
    assert raised.value.__cause__ is None and raised.value.__suppress_context__


def test_a_cpu_device_ignores_the_local_rank_and_a_meta_device_is_refused():
    assert check_device("device", "cpu", local_rank=1) == torch.device("cpu")
    assert check_device("device", torch.device("cpu")) == torch.device("cpu")
    with pytest.raises(ValueError, match=r"^device must be auto, cpu, cuda or cuda:N, got 'meta'$"):
        check_device("device", "meta")
    with pytest.raises(ValueError, match=r"^device must be auto, cpu, cuda or cuda:N, got 'mps'$"):
        check_device("device", "mps")
    with pytest.raises(ValueError, match=r"^device must be auto, cpu, cuda or cuda:N, got 'gpu'$"):
        check_device("device", "gpu")
    with pytest.raises(TypeError, match=r"^device must be auto, cpu, cuda or cuda:N, got int 0$"):
        check_device("device", 0)


def test_auto_is_cuda_where_there_is_cuda_and_cpu_elsewhere():
    assert check_device("device", "auto").type == ("cuda" if torch.cuda.is_available() else "cpu")


def test_auto_and_cuda_take_the_local_rank_where_cuda_is_available(monkeypatch):
    # torch.device("cuda", n) needs no GPU: only the check of availability is replaced
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert check_device("device", "auto") == torch.device("cuda")
    assert check_device("device", "auto", local_rank=1) == torch.device("cuda", 1)
    assert check_device("device", "cuda:0", local_rank=2) == torch.device("cuda", 2)
    assert check_device("device", "cuda", local_rank=0) == torch.device("cuda", 0)


def test_cuda_asked_for_where_there_is_none_is_refused_naming_it(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert check_device("device", "auto") == torch.device("cpu")
    with pytest.raises(ValueError, match=r"^device cuda:1: CUDA is not available on this machine$"):
        check_device("device", torch.device("cuda", 1))
    with pytest.raises(ValueError, match=r"^device cuda: CUDA is not available on this machine$"):
        check_device("device", "cuda", local_rank=0)


def test_values_are_read_from_non_empty_cpu_tensors_only():
    assert values_checkable(torch.zeros(1))
    assert not values_checkable(torch.zeros(0))
    assert not values_checkable(torch.zeros(1, device="meta"))


def test_values_are_not_read_under_jit_tracing_or_functional_tensors():
    from torch._subclasses.functional_tensor import FunctionalTensorMode

    seen = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # torch.jit.trace: still in use, deprecated
        torch.jit.trace(lambda t: seen.append(readable(t)) or t + 1, torch.ones(2), check_trace=False)
    with FunctionalTensorMode():
        seen.append(readable())
    assert seen == [False, False] and readable(torch.ones(2))


def test_values_are_not_read_under_fake_tensors_even_of_a_tensor_made_outside():
    from torch._subclasses.fake_tensor import FakeTensorMode

    real = torch.ones(2)
    with FakeTensorMode():
        seen = [readable(), readable(real), values_checkable(real)]
    assert seen == [False, False, False] and readable(real)


def test_a_parameters_values_are_read_as_a_plain_tensors():
    weight = torch.nn.Parameter(torch.tensor([0.5, -1.5]))
    assert readable(weight) and values_checkable(weight)
    assert value_range(weight) == (-1.5, 0.5)


def test_value_range_gives_python_numbers_of_the_tensors_kind():
    low, high = value_range(torch.tensor([3, -2, 5]))
    assert (low, high) == (-2, 5) and type(low) is int
    low, high = value_range(torch.tensor([0.5, float("nan")]))
    assert low != low and high != high


def test_a_warning_points_at_the_first_frame_outside_ddpd():
    assert caller_level() == 1
    inside = {"__name__": "ddpd.sampling.fake", "caller_level": caller_level}
    exec("def warn():\n    return caller_level()\ndef outer():\n    return warn()\n", inside)
    assert inside["warn"]() == 2 and inside["outer"]() == 3
    beside = {"__name__": "ddpd_plugins.fake", "caller_level": caller_level}  # another package, not ddpd
    exec("def warn():\n    return caller_level()\n", beside)
    assert beside["warn"]() == 1
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        exec("import warnings\ndef warn():\n    warnings.warn('w', stacklevel=caller_level())\n", inside)
        inside["warn"]()
    assert caught[0].filename == __file__


def test_caller_level_is_usable_from_a_thread():
    seen = []
    thread = threading.Thread(target=lambda: seen.append(caller_level()))
    thread.start()
    thread.join()
    assert seen == [1]
