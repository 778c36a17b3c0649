"""Pasted rows (app/engine/prompts/rows.py parse_pasted): the rows panel's Paste, parsed as the
CSV import (the CLI's --rows) parses a file."""
import pytest

from app.engine import RowsError, read_rows
from app.engine.prompts.rows import parse_pasted
from app.engine.session import Session
from app.ui.fillings_panel import FillingsPanel

NAMES = ["q", "r"]


def values(rows):
    return [r.values for r in rows]


def test_tabs_quotes_and_a_header_in_any_order():
    text = 'r\tq\n"two\nlines"\t"say ""hi"""\n\nthird\t"a\ttab"\n'
    assert values(parse_pasted(text, NAMES)) == [{"r": "two\nlines", "q": 'say "hi"'},
                                                 {"r": "third", "q": "a\ttab"}]
    # no header: the placeholders in order; cells left out stay blank for the form
    assert values(parse_pasted("what\tthis\nwhy\n", NAMES)) == [{"q": "what", "r": "this"},
                                                                {"q": "why"}]
    # no tab: comma-separated, quoted as CSV quotes
    assert values(parse_pasted('q,r\n"a, b",c\n', NAMES)) == [{"q": "a, b", "r": "c"}]
    # one placeholder and no tab: a line is one value, commas and all
    assert values(parse_pasted("hello, world\nbye\n", ["q"])) == [{"q": "hello, world"},
                                                                  {"q": "bye"}]


@pytest.mark.parametrize("text, says", [
    ("a\tb\tc\n", "row 1: 3 cells but the template has 2 placeholders; quote values"),
    ('q\tr\n"open\tquote\n', "pasted text, row 2: unexpected end of data"),
    # a header without a placeholder's column: the header's fault (row 1), not row 2's
    ("q\n1\n", r"pasted text, the header \(row 1\): no column 'r' for the placeholder <r>; add"),
    ("q\tr\n", "holds a header and no row of values"),
    ("\n \n", "there is nothing to paste"),
])
def test_a_bad_paste_says_why_in_one_line(text, says):
    with pytest.raises(RowsError, match=says) as e:
        parse_pasted(text, NAMES)
    assert "\n" not in str(e.value)


def test_pasted_with_a_header_reads_as_the_csv_import_reads_the_file(tmp_path):
    text = 'q,r\n"a, ""b""",c\nd,"e\nf"\n'
    (tmp_path / "rows.csv").write_text(text, encoding="utf-8")
    assert values(parse_pasted(text, NAMES)) == values(read_rows(tmp_path / "rows.csv", NAMES))


def test_the_panel_pastes_through_the_parser_and_a_bad_paste_loses_nothing(qtbot):
    s = Session()
    s.set_template("<q> <r>")
    p = FillingsPanel(s)
    qtbot.addWidget(p)
    assert p.paste('q\tr\n"x\ty"\tz\n') == 1
    assert s.rows == [{"q": "x\ty", "r": "z"}]
    with qtbot.waitSignal(p.error) as said:
        assert p.paste("1\t2\t3\n") == 0
    assert said.args == ["pasted text, row 1: 3 cells but the template has 2 placeholders; "
                         "quote values that contain the delimiter"]
    assert s.rows == [{"q": "x\ty", "r": "z"}]  # what the user had stays
    p.edits.stack.undo()  # and the good paste can still be undone
    assert s.rows == []
