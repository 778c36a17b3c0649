"""Rows files (CSV, JSONL, JSON) that are empty, badly encoded or do not fit the template:
a RowsError naming the file, the row and the column; and never any other exception."""
from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from app.engine.errors import RowsError, TemplateError, TemplateSyntaxError
from app.engine.prompts.rows import check_rows, parse_csv, parse_jsonl, read_rows
from app.engine.prompts.template import Template


def rows_error(tmp_path, name: str, raw: bytes, placeholders=("c", "q")) -> str:
    p = tmp_path / name
    p.write_bytes(raw)
    with pytest.raises(RowsError) as e:
        read_rows(p, list(placeholders))
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith((name, "no rows", "cannot", str(tmp_path)))
    return msg


@pytest.mark.parametrize("name, raw, expect", [
    ("empty.csv", b"", "empty.csv is empty"),
    ("blank.csv", b"\n\n  \n", "is empty"),
    ("header-only.csv", b"c,q\n", "has no rows"),
    ("empty.jsonl", b"", "has no rows"),
    ("missing-col.csv", b"c\nthe world\n", "the header (row 1): no column 'q' for the placeholder <q>"),
    ("extra-col.csv", b"c,q,zz\na,b,c\n", "the header (row 1): column 'zz' is not a placeholder"),
    ("short-row.csv", b"c,q\na,b\nonly\n", "row 3: no value in column 'q'"),
    ("long-row.csv", b"c,q\na,b,c\n", "row 2: 3 cells but the header names 2 columns"),
    ("dupe.csv", b"c,c,q\n1,2,3\n", "row 1: column 'c' appears twice"),
    ("noname.csv", b"c,,q\n1,2,3\n", "row 1, column 2: empty column name"),
    ("latin1.csv", "c,q\na,b\ncaf\xe9,x\n".encode("latin-1"), "line 3: not UTF-8"),
    ("utf16.csv", "c,q\na,b\n".encode("utf-16"), "line 1: not UTF-8"),
    ("missing-key.jsonl", b'{"c": "a", "q": "b"}\n{"c": "a"}\n', "row 2: no column 'q'"),
    ("extra-key.jsonl", b'{"c": "a", "q": "b", "zz": 1}\n', "row 1: column 'zz'"),
    ("bad.jsonl", b'{"c": "a", "q": "b"}\n\n{"c": "a", "q": }\n', "line 3, column 17: invalid JSON"),
    ("list.jsonl", b'{"c": "a", "q": "b"}\n"just text"\n', "line 2: expected an object"),
    ("nested.jsonl", b'{"c": {"x": 1}, "q": "b"}\n', "line 1, key 'c': values must be text"),
    ("null.jsonl", b'{"c": null, "q": "b"}\n', "key 'c'"),
    ("deep.jsonl", b'{"c": ' + b"[" * 100_000 + b"\n", "nested too deeply"),
    ("array.json", b'[{"c": "a", "q": "b"}, {"c": "a"}]', "row 2: no column 'q'"),
    ("array-bad.json", b'[{"c": "a", "q": "b"},\n 3]', "item 2: expected an object"),
])
def test_bad_rows_files_name_row_and_column(tmp_path, name, raw, expect):
    assert expect in rows_error(tmp_path, name, raw)


def test_missing_file_and_folder(tmp_path):
    with pytest.raises(RowsError, match="no rows file"):
        read_rows(tmp_path / "none.csv")
    with pytest.raises(RowsError, match="is a folder"):
        read_rows(tmp_path)


def test_good_files_of_every_kind(tmp_path):
    (tmp_path / "a.csv").write_text('\ufeffc;q\n"x; y";z\n\n"multi\nline";w\n', encoding="utf-8")
    rows = read_rows(tmp_path / "a.csv", ["c", "q"])
    assert [r.values for r in rows] == [{"c": "x; y", "q": "z"}, {"c": "multi\nline", "q": "w"}]
    (tmp_path / "a.jsonl").write_text('{"c": "x", "q": 3}\n\n{"c": "<|im_end|>", "q": true}\n')
    rows = read_rows(tmp_path / "a.jsonl", ["c", "q"])
    assert [(r.number, r.values) for r in rows] == [(1, {"c": "x", "q": "3"}),
                                                   (3, {"c": "<|im_end|>", "q": "true"})]
    (tmp_path / "a.json").write_text('[\n {"c": "x", "q": "y"}\n]')
    assert read_rows(tmp_path / "a.json", ["c", "q"])[0].values == {"c": "x", "q": "y"}


def test_a_long_value_is_not_a_csv_error(tmp_path):
    # a retrieved document easily exceeds the csv module's default 128 KiB field limit
    doc = "word " * 60_000
    (tmp_path / "big.csv").write_text(f'c,q\n"{doc}",why?\n')
    assert read_rows(tmp_path / "big.csv", ["c", "q"])[0].values["c"] == doc


_rows_text = st.lists(st.sampled_from(list('cq,;\t"\n\r \\{}[]:1é\x00') + ['"c"', '"q"', "c,q\n"]),
                     max_size=40).map("".join)


@settings(max_examples=400, deadline=None)
@given(_rows_text)
def test_any_text_gives_rows_or_a_one_line_rows_error(text):
    for parse in (parse_csv, parse_jsonl):
        try:
            rows = parse(text, "r")
            check_rows(rows, ["c", "q"], "r")
        except RowsError as e:
            assert "\n" not in str(e) and str(e).startswith("r")
            continue
        for row in rows:
            assert set(row.values) == {"c", "q"} and row.number >= 1


# ---- the template parser, on any text -----------------------------------------------------


@settings(max_examples=400, deadline=None)
@given(st.text(max_size=60) | st.text(alphabet=st.sampled_from(list("<>\\\r\nab_-|/ é")), max_size=60))
def test_template_parser_on_any_text(src):
    try:
        t = Template.parse(src)
    except TemplateSyntaxError as e:
        # the position points at the '<' that opens the unclosed placeholder
        lines = src.split("\n")
        assert lines[e.line - 1][e.column - 1] == "<"
        assert "\n" not in str(e)
        return
    again = Template.parse(t.render())
    assert again.parts == t.parts
    values = {n: f"<{n}>" for n in t.placeholders}  # values that look like placeholders stay text
    assert again.fill(values).text == t.fill(values).text
    assert t.fill(values).text.startswith(t.static_prefix)
    with pytest.raises(TemplateError) if t.placeholders else _no_error():
        t.fill({})


class _no_error:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False
