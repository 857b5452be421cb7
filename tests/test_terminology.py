"""The text side of lexical constraints (nmt/terminology.py): `--json-input` lines and
`--terminology` files, their matching rule, and their one-line errors naming FILE:LINE."""

from __future__ import annotations

import pytest

from nmt.errors import NmtError
from nmt.terminology import (
    Request,
    load_terminology,
    parse_json_line,
    terminology_from_pairs,
    with_terms,
)


def test_a_json_line_gives_its_text_and_every_optional_key():
    r = parse_json_line(
        '{"text": "A dog.", "constraints": ["Hund", "Park"], "avoid": ["Katze"], '
        '"prefix": "Ein", "ordered": true}',
        "in:1",
    )
    assert r == Request("A dog.", ("Hund", "Park"), ("Katze",), "Ein", True)
    assert parse_json_line('{"text": ""}', "in:2") == Request("")
    assert not parse_json_line('{"text": "x", "prefix": null, "constraints": []}', "in:3").asks()


@pytest.mark.parametrize(
    "line, message",
    [
        ("{bad", "in:7: not a JSON object (Expecting property name"),
        ('"text"', "in:7: not a JSON object (a JSON str)"),
        ("{}", 'in:7: no "text"'),
        ('{"text": 3}', 'in:7: "text" must be a string'),
        ('{"text": "a", "constraint": ["b"]}', "in:7: unknown key 'constraint'"),
        ('{"text": "a", "constraints": "b"}', 'in:7: "constraints" must be a list of strings'),
        ('{"text": "a", "avoid": ["b", " "]}', 'in:7: "avoid"[1] is empty'),
        ('{"text": "a", "prefix": ["b"]}', 'in:7: "prefix" must be a string'),
        ('{"text": "a", "ordered": "yes"}', 'in:7: "ordered" must be true or false'),
        (
            "[" * 100_000 + "]" * 100_000,
            "in:7: not a request (JSON nested too deeply)",
        ),  # a RecursionError before
        (
            '{"text": "a", "avoid": ' + "[" * 100_000 + "]" * 100_000 + "}",
            "in:7: not a request (JSON nested too",
        ),
    ],
)
def test_a_bad_json_line_is_one_error_naming_the_line(line, message):
    with pytest.raises(NmtError) as e:
        parse_json_line(line, "in:7")
    assert str(e.value).startswith(message) and "\n" not in str(e.value)


@pytest.mark.parametrize(
    "fields, message",
    [
        (
            {"constraints": ["b", " "]},
            "api: text 0: constraints[1] must be a non-empty string, got ' '",
        ),
        ({"avoid": "b"}, "api: text 0: avoid must be a list of strings"),
        ({"prefix": 3}, "api: text 0: prefix must be a string, got int"),
        ({"ordered": 1}, "api: text 0: ordered must be True or False"),
    ],
)
def test_a_request_is_checked_as_it_is_made(fields, message):
    """Issue 34: one check of a request, whoever makes it (a JSON line above, the API's arguments,
    a program): a Request that exists is a good one."""
    with pytest.raises(NmtError) as e:
        Request("a", where="api: text 0", **fields)
    assert str(e.value) == message
    assert Request("a", ["b"], None, None) == Request(
        "a", ("b",)
    )  # lists kept as tuples, None as nothing


def test_terms_match_whole_words_in_any_case_longest_first():
    t = terminology_from_pairs(
        [
            ("blue shirt", "blaues Hemd"),
            ("shirt", "Hemd"),
            ("dog", "Hund"),
            ("hot dog", "Hotdog"),
            ("C++", "C++"),
        ]
    )
    assert t.match("A man in a Blue  shirt eats a HOT dog; his dog barks.") == [
        "blaues Hemd",
        "Hotdog",
        "Hund",
    ]
    assert t.match("dogs and shirts, a bulldog, dog_house") == []  # whole words only
    assert t.match("shirt, then a blue shirt") == ["Hemd", "blaues Hemd"]  # first occurrence order
    assert t.match("I write C++ daily") == ["C++"]
    assert terminology_from_pairs([]).match("anything") == []


TERMS = ["Straße", "İstanbul", "Ärger", "ﬁle", "ΣΟΦΊΑ", "ǅemal", "Jürgen Groß", "dog", "ıslak"]


@pytest.mark.parametrize("term", TERMS)
def test_a_term_matches_its_own_text_and_its_case_variants(term):
    """Issue 33 (10): the pattern was the case-folded term over the text as it is ("straße" for
    "Straße"): 'Straße' never matched 'Straße', 'İstanbul' never itself. A term matches its own
    text, and any text equal to it once both are case-folded (its upper, lower and title case
    where they fold alike), as whole words only."""
    t = terminology_from_pairs([(term, "TARGET"), ("other", "X")])
    for variant in {term, term.upper(), term.lower(), term.title(), term.casefold()}:
        expected = ["TARGET"] if variant.casefold() == term.casefold() else []
        assert t.match(f"Vor {variant}, nach") == expected, variant
        assert t.match(f"{variant}") == expected, variant
        assert t.match(f"x{variant} und {variant}x") == [], variant  # inside longer words
    assert t.match(f"Vor {term}") == ["TARGET"]


def test_a_match_does_not_end_inside_a_folded_letter():
    """'İ' folds to 'i' and a combining dot, 'ǰ' to 'j' and a combining caron (neither a word
    character): the terms 'i' and 'j' are not in 'İ' and 'ǰ'; 'ß' folds to 'ss' and matches both."""
    t = terminology_from_pairs([("i", "A"), ("j", "B"), ("groß", "C")])
    assert t.match("İ ǰ") == []
    assert t.match("I, J, GROSS") == ["A", "B", "C"]


def test_terms_become_constraints_once(tmp_path):
    path = tmp_path / "terms.tsv"
    path.write_text("dog\tHund\n\nDog\tHündchen\npark\tPark\n")
    t = load_terminology(path)
    r = with_terms(Request("The dog runs in the park.", constraints=("Park",)), t)
    assert r.constraints == ("Park", "Hund") and r.terms == (
        "Hund",
    )  # the first pair of a term wins
    assert with_terms(Request("Nothing here."), t) == Request("Nothing here.")


@pytest.mark.parametrize(
    "content, message",
    [
        ("dog\tHund\ncat\n", "terms.tsv:2: expected 'source term<TAB>target term', found 1 column"),
        ("dog\tHund\tx\n", "terms.tsv:1: expected 'source term<TAB>target term', found 3 columns"),
        ("dog\t \n", "terms.tsv:1: the target term is empty"),
        ("\tHund\n", "terms.tsv:1: the source term is empty"),
    ],
)
def test_a_bad_terminology_file_is_one_error_naming_the_line(tmp_path, content, message):
    path = tmp_path / "terms.tsv"
    path.write_text(content)
    with pytest.raises(NmtError) as e:
        load_terminology(path)
    assert message in str(e.value) and str(e.value).startswith(str(path))
