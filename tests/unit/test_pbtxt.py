"""The protobuf text-format parser: syntax, values, line numbers and error messages."""

from __future__ import annotations

import math

import pytest

from zinfer.client.errors import ConfigError
from zinfer.modelconfig.pbtxt import Field, Ident, Item, ListValue, Message, describe, parse

SRC = "models/add/config.pbtxt"


def one(text: str) -> Field:
    message = parse(text, SRC)
    assert len(message.fields) == 1
    return message.fields[0]


def test_scalars_and_lines() -> None:
    text = 'name: "add"\nmax_batch_size: 8\n\nkind: KIND_GPU\nenable: true\noff: False\nratio: 0.5\n'
    fields = parse(text, SRC).fields
    assert [(f.name, f.value, f.line) for f in fields] == [
        ("name", "add", 1),
        ("max_batch_size", 8, 2),
        ("kind", Ident("KIND_GPU"), 4),
        ("enable", True, 5),
        ("off", False, 6),
        ("ratio", 0.5, 7),
    ]


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("-1", -1),
        ("0", 0),
        ("0x1F", 31),
        ("-0x10", -16),
        ("017", 15),
        ("1.5", 1.5),
        ("-2.5e3", -2500.0),
        (".25", 0.25),
        ("1e2", 100.0),
        ("2.0f", 2.0),
        ("3F", 3.0),
        ("18446744073709551615", 2**64 - 1),
    ],
)
def test_numbers(text: str, value: float) -> None:
    got = one(f"x: {text}").value
    assert got == value
    assert type(got) is type(value)


def test_negative_infinity_and_words() -> None:
    assert one("x: -inf").value == -math.inf
    assert one("x: inf").value == Ident("inf")
    assert math.isnan(float(str(one("x: -nan").value)))


@pytest.mark.parametrize(
    ("text", "value"),
    [
        (r'"a\"b"', 'a"b'),
        (r"'it\'s'", "it's"),
        ("'say \"hi\"'", 'say "hi"'),
        (r'"tab\there\nnl"', "tab\there\nnl"),
        (r'"\\"', "\\"),
        (r'"\101\x42"', "AB"),
        (r'"\u00e9\U0001F600"', "\u00e9\U0001f600"),
        (r'"\303\251"', "\u00e9"),
        ('"a" "b" \'c\'', "abc"),
        ('""', ""),
    ],
)
def test_strings(text: str, value: str) -> None:
    assert one(f"s: {text}").value == value


def test_nested_messages_all_spellings() -> None:
    text = "a { x: 1 }\nb: { y: 2 }\nc < z: 3 >\nd {}\n"
    fields = parse(text, SRC).fields
    assert [f.name for f in fields] == ["a", "b", "c", "d"]
    for f in fields:
        assert isinstance(f.value, Message)
    assert fields[0].value == Message((Field("x", 1, 1),), 1)
    assert fields[3].value == Message((), 4)


def test_lists_of_scalars_and_messages() -> None:
    text = "dims: [ 1, -1,\n 3 ]\ninput [\n  { name: 'a' },\n  { name: 'b' }\n]\nempty: []\n"
    dims, inputs, empty = parse(text, SRC).fields
    assert dims.value == ListValue((Item(1, 1), Item(-1, 1), Item(3, 2)))
    assert isinstance(inputs.value, ListValue)
    assert [item.line for item in inputs.value.items] == [4, 5]
    first = inputs.value.items[0].value
    assert isinstance(first, Message)
    assert first.fields == (Field("name", "a", 4),)
    assert empty.value == ListValue(())


def test_list_with_colon_of_messages() -> None:
    field = one("input: [ { name: 'a' } ]")
    assert isinstance(field.value, ListValue)


def test_repeated_fields_keep_order() -> None:
    names = [f.name for f in parse("a: 1 b: 2 a: 3", SRC).fields]
    assert names == ["a", "b", "a"]


def test_separators_and_comments() -> None:
    text = "# header\na: 1, b: 2; # trailing\nc { d: 4; e: 5, }  # done\n"
    fields = parse(text, SRC).fields
    assert [f.name for f in fields] == ["a", "b", "c"]
    c = fields[2].value
    assert isinstance(c, Message)
    assert [f.name for f in c.fields] == ["d", "e"]


def test_map_entry_shape() -> None:
    field = one('parameters { key: "x" value: { string_value: "y" } }')
    assert isinstance(field.value, Message)
    key, value = field.value.fields
    assert key == Field("key", "x", 1)
    assert isinstance(value.value, Message)
    assert value.value.fields == (Field("string_value", "y", 1),)


def test_empty_and_comment_only() -> None:
    assert parse("", SRC).fields == ()
    assert parse("# nothing\n\n", SRC).fields == ()


@pytest.mark.parametrize(
    ("text", "line", "fragment"),
    [
        ('name: "abc', 1, "unterminated string"),
        ("a: 1\nname: 'abc\n", 2, "unterminated string"),
        ('s: "\\q"', 1, "unknown escape sequence \\q"),
        ('s: "\\777"', 1, "octal escape"),
        ('s: "\\xff"', 1, "not valid UTF-8"),
        ("a: 09", 1, "not a valid octal integer"),
        ("a: 1\nb: @", 2, "unexpected character '@'"),
        ("a: 1.2.3", 1, "unexpected character"),
        ("a {\n b: 1\n", 3, "expected '}' before the end of the file"),
        ("a { b: 1 ]", 1, "expected a field name, got ']'"),
        ("}", 1, "expected a field name, got '}'"),
        ("a 1", 1, "field 'a': expected ':' or '{' after the field name, got '1'"),
        ("a:", 1, "field 'a': expected a value, got end of file"),
        ("a: }", 1, "field 'a': expected a value, got '}'"),
        ("dims: [ 1 2 ]", 1, "field 'dims': expected ',' or ']' in the list, got '2'"),
        ("dims: [ 1, ]", 1, "field 'dims': a list may not end with ','"),
        ("dims: [ 1,\n", 2, "field 'dims': expected a value, got end of file"),
        ('"x": 1', 1, "expected a field name"),
    ],
)
def test_syntax_errors(text: str, line: int, fragment: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse(text, SRC)
    message = str(info.value)
    assert message.startswith(f"{SRC}:{line}: "), message
    assert fragment in message, message


def test_describe() -> None:
    assert describe(Ident("x")) == "'x'"
    assert describe('a"b') == 'the string "a\\"b"'
    assert describe(True) == "true"
    assert describe(3) == "3"
    assert describe(Message((), 1)) == "a message block"
    assert describe(ListValue(())) == "a list"


def test_triton_example_parses() -> None:
    text = """
    name: "simple"
    platform: "tensorflow_graphdef"
    max_batch_size: 8
    input [
      {
        name: "INPUT0"
        data_type: TYPE_INT32
        dims: [ 16 ]
      },
      {
        name: "INPUT1"
        data_type: TYPE_INT32
        dims: [ 16 ]
      }
    ]
    output [
      {
        name: "OUTPUT0"
        data_type: TYPE_INT32
        dims: [ 16 ]
      }
    ]
    instance_group [ { kind: KIND_GPU, count: 2 } ]
    """
    fields = parse(text, SRC).fields
    assert [f.name for f in fields] == [
        "name",
        "platform",
        "max_batch_size",
        "input",
        "output",
        "instance_group",
    ]
    assert fields[3].line == 5
