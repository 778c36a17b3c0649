import pytest
from hypothesis import given, settings, strategies as st

from app.engine.errors import MissingValuesError, TemplateSyntaxError
from app.engine.prompts.template import Literal, Placeholder, Template


def test_placeholders_and_literal_brackets():
    t = Template.parse("<|im_start|>system\nA </s> a < b <3 <name> and <x-1>, <name>.")
    assert t.placeholders == ["name", "x-1"]
    assert t.static_prefix == "<|im_start|>system\nA </s> a < b <3 "


def test_escape_makes_literal_placeholder_text():
    t = Template.parse(r"say \<name> then <v>")
    assert t.placeholders == ["v"]
    assert t.static_prefix == "say <name> then "


def test_repeated_placeholder_gets_same_value():
    t = Template.parse("<a>-<b>-<a>")
    assert t.fill({"a": "1", "b": "2"}).text == "1-2-1"


def test_values_are_marked_plain_and_template_text_special():
    spans = Template.parse("X<v>Y").fill({"v": "<|im_end|>"}).spans
    assert [(s.text, s.from_template) for s in spans] == [("X", True), ("<|im_end|>", False), ("Y", True)]


def test_unclosed_placeholder_names_line_and_column():
    with pytest.raises(TemplateSyntaxError) as e:
        Template.parse("first line\n  and <question\nmore")
    assert (e.value.line, e.value.column) == (2, 7)
    assert "line 2, column 7" in str(e.value)


def test_missing_and_unknown_values_in_one_error():
    t = Template.parse("<a> <b> <c>")
    with pytest.raises(MissingValuesError) as e:
        t.fill({"a": "x", "zz": "y", "yy": "z"})
    assert e.value.missing == ["b", "c"] and e.value.unknown == ["yy", "zz"]
    assert "<b>" in str(e.value) and "zz" in str(e.value)


def test_no_placeholder_means_all_prefix():
    t = Template.parse("just text")
    assert t.placeholders == [] and t.static_prefix == "just text"
    assert t.fill({}).text == "just text"


def test_render_round_trips_tricky_literals():
    for src in [r"a\<b> c", "x\\\\<y> <z>", r"trail \<q", "<a><b>", "\\", r"\\<v>"]:
        t = Template.parse(src)
        assert Template.parse(t.render()).parts == t.parts, src


_text = st.text(alphabet=st.sampled_from(list("ab<>\\|/ \n_-3xy")), max_size=40)


@settings(max_examples=1500, deadline=None)
@given(_text)
def test_parse_never_crashes_and_round_trips(src):
    try:
        t = Template.parse(src)
    except TemplateSyntaxError as e:
        assert e.line >= 1 and e.column >= 1
        return
    again = Template.parse(t.render())
    assert again.parts == t.parts
    values = {n: f"[{n}]" for n in t.placeholders}
    assert again.fill(values).text == t.fill(values).text


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(
    st.builds(Literal, st.text(alphabet=st.sampled_from(list("a<>\\ \nb")), min_size=1, max_size=8)),
    st.builds(Placeholder, st.from_regex(r"[A-Za-z_][A-Za-z0-9_-]{0,5}", fullmatch=True))),
    max_size=6))
def test_render_then_parse_keeps_the_text(parts):
    # adjacent literals merge when parsed; compare filled text instead of parts
    from app.engine.prompts.template import render_parts
    t = Template.parse(render_parts(parts))
    values = {p.name: "V" for p in parts if isinstance(p, Placeholder)}
    expect = "".join(p.text if isinstance(p, Literal) else "V" for p in parts)
    if any(isinstance(p, Literal) and p.text.endswith("\\") and i + 1 < len(parts)
           and isinstance(parts[i + 1], Placeholder) for i, p in enumerate(parts)):
        return  # a literal backslash right before a placeholder cannot be written (documented)
    assert t.fill(values).text == expect


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet="<>\\ab_-1 |/\n", max_size=40))
def test_placeholder_pattern_finds_what_the_parser_reads(source):
    from app.engine.prompts.template import PLACEHOLDER_RE

    try:
        parsed = [p.name for p in Template.parse(source).parts if isinstance(p, Placeholder)]
    except TemplateSyntaxError:
        return  # an unclosed <name: the editor highlights the closed ones only
    assert [m.group(1) for m in PLACEHOLDER_RE.finditer(source)] == parsed
