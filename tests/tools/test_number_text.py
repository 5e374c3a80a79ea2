"""Numbers as a user writes them (ddpd.number_text): what read_number refuses that int() and
float() read, and the reason refusal adds to a "must be a number" message."""
import pytest

from ddpd.number_text import REFUSED, read_number, refusal


@pytest.mark.parametrize("text", ["64\r", "\f64", "\x0b64", "64\u00a0", "\u200364", "\u300064"])
def test_read_number_refuses_every_kind_of_whitespace_python_would_strip(text):
    """int() and float() strip any Unicode whitespace, not only spaces, tabs and newlines."""
    assert int(text) == float(text) == 64
    for kind in (int, float):
        with pytest.raises(ValueError, match=f"{REFUSED}$"):
            read_number(kind, text)


def test_read_number_quotes_the_text_it_refuses():
    """The text is quoted as repr() writes it, so a stray space or tab shows in the message."""
    with pytest.raises(ValueError) as refused:
        read_number(int, "1\t0")
    assert str(refused.value) == r"'1\t0': a number has no underscores or spaces"
    assert refusal(refused.value) == ": a number has no underscores or spaces"


def test_refusal_adds_a_reason_only_where_the_message_ends_with_it():
    """An error of int() or float() itself, even one that quotes the reason's words, adds nothing."""
    with pytest.raises(ValueError) as not_a_number:
        read_number(float, "many")
    assert refusal(not_a_number.value) == ""
    assert refusal(ValueError(f"{REFUSED}, said the text")) == ""


@pytest.mark.parametrize("text", ["10_", "_10", "1__0", "1 0"])
def test_read_number_names_the_underscore_or_space_even_where_python_refuses_the_text_too(text):
    """int() refuses these on its own, with no word of the stray character."""
    with pytest.raises(ValueError):
        int(text)
    with pytest.raises(ValueError, match=f"^{text!r}: {REFUSED}$"):
        read_number(int, text)


@pytest.mark.parametrize("kind, text, expected", [(int, "64", 64), (int, "-3", -3), (float, "1e3", 1000.0),
                                                   (float, "-2.5", -2.5), (float, "inf", float("inf"))])
def test_read_number_reads_the_text_as_the_kind_asked_for(kind, text, expected):
    """An int stays an int (a step count, a seed) and a float keeps its exponent, sign or inf."""
    number = read_number(kind, text)
    assert type(number) is kind and number == expected


@pytest.mark.parametrize("text", ["1.5", "1e3", "2.0", "nan"])
def test_read_number_refuses_as_an_int_what_int_refuses(text):
    """No rounding or float detour: "1.5" steps is not one step, and the message adds no reason."""
    with pytest.raises(ValueError) as not_an_int:
        read_number(int, text)
    assert refusal(not_an_int.value) == ""
