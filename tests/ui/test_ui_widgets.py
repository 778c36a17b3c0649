"""The panels on their own over a session (no model needed)."""
from __future__ import annotations

from PySide6.QtCore import Qt

from app.engine import BenchResult, BenchRow, EngineConfig, Template
from app.engine.session import Session
from app.ui.fillings_panel import FillingsPanel
from app.ui.rows_model import RowsModel
from app.ui.states_library import StatesLibrary
from app.ui.template_editor import TemplateHighlighter


def fillings(qtbot, template: str) -> FillingsPanel:
    s = Session()
    s.set_template(template)
    p = FillingsPanel(s)
    qtbot.addWidget(p)
    return p


def test_paste_from_a_spreadsheet_skips_the_header(qtbot):
    p = fillings(qtbot, "<q> <r>")
    s = p.session
    assert p.paste("q\tr\nwhat\tthis\nwhy\tthat\r\n") == 2
    assert s.rows == [{"q": "what", "r": "this"}, {"q": "why", "r": "that"}]
    p.table.selectRow(0)
    assert s.selection == [0]
    p.duplicate_rows()
    assert s.rows[-1] == {"q": "what", "r": "this"} and len(s.rows) == 3
    p.table.selectRow(1)
    p.delete_rows()
    assert [r["q"] for r in s.rows] == ["what", "what"]
    # the form edits the current row, and shows the row the session selects
    p.table.selectRow(0)
    p.fields["r"].setPlainText("edited")
    assert s.rows[0] == {"q": "what", "r": "edited"}
    s.set_selection([1], 1)
    assert p.fields["r"].toPlainText() == "this"
    assert [i.row() for i in p.table.selectionModel().selectedRows()] == [1]


def test_typing_into_an_empty_table_starts_its_first_row(qtbot):
    p = fillings(qtbot, "<q> <r>")
    qtbot.keyClicks(p.fields["q"], "hi")
    assert p.session.rows == [{"q": "hi", "r": ""}] and p.count_label.text() == "1 rows"


def test_rows_model_shows_and_edits_the_session(qtbot):
    s = Session()
    s.set_template("<q> <r>")
    s.set_rows([{"q": "what\nnow", "r": "this"}])
    m = RowsModel(s)
    reset, changed = [], []
    m.modelReset.connect(lambda: reset.append(1))
    m.dataChanged.connect(lambda a, b: changed.append((a.row(), a.column())))
    assert (m.rowCount(), m.columnCount()) == (1, 2)
    assert m.headerData(1, Qt.Horizontal) == "<r>" and m.headerData(0, Qt.Vertical) == "1"
    assert m.data(m.index(0, 0)) == "what now" and m.data(m.index(0, 0), Qt.EditRole) == "what\nnow"
    assert m.setData(m.index(0, 1), "that") and s.value(0, "r") == "that"
    assert changed == [(0, 1)]
    s.set_value(0, "q", "who")
    assert changed[-1] == (0, 0) and m.data(m.index(0, 0)) == "who"
    s.add_rows([{"q": "x"}])
    s.set_template("<r> <q> <z>")
    assert len(reset) == 2 and (m.rowCount(), m.columnCount()) == (2, 3)
    assert m.data(m.index(1, 1)) == "x"


def test_import_rows_checks_columns_against_placeholders(qtbot, tmp_path, examples):
    p = fillings(qtbot, "<c1> <c2> <c3> <question>")
    errors = []
    p.error.connect(errors.append)
    assert p.import_file(str(examples / "rag-rows.csv")) >= 2
    assert p.session.rows[0]["question"] and p.model.rowCount() == len(p.session.rows)
    bad = tmp_path / "bad.csv"
    bad.write_text("c1,c2,nope,question\na,b,c,d\n")
    assert p.import_file(str(bad)) == 0
    assert "column 'nope' is not a placeholder" in errors[0] or "no column 'c3'" in errors[0]


def test_changing_placeholders_rebuilds_the_form(qtbot):
    p = fillings(qtbot, "<a> <b>")
    p.session.set_rows([{"a": "1", "b": "2"}])
    p.session.set_template("<b> <c>")
    assert list(p.fields) == ["b", "c"] and p.fields["b"].toPlainText() == "2"
    assert p.session.rows == [{"b": "2", "c": ""}]


def test_bench_view_headers_have_units_and_show_the_session(qtbot, tmp_path):
    from app.ui.bench_view import BenchView

    s = Session()
    v = BenchView(s)
    qtbot.addWidget(v)
    headers = [v.table.horizontalHeaderItem(c).text() for c in range(v.table.columnCount())]
    assert "cold (ms)" in headers and "max |Δlogit|" in headers and "prefix (tokens)" in headers
    assert not any("_" in h for h in headers)
    rows = [BenchRow(row=i, cold_ms=900.0, warm_ms=80.0, cold_ms_min=880.0, cold_ms_max=950.0,
                     warm_ms_min=70.0, warm_ms_max=90.0, speedup=11.25, tokens_equal=True)
            for i in range(1, 9)]
    s.set_bench(BenchResult(model={}, rows=rows, repeat=3))
    assert v.table.rowCount() == 8 and v.chart.bar_count == 16
    assert v.table.item(0, headers.index("speedup (×)")).text() == "×11.2"
    assert "prefix: median warm 80.0 ms, cold 900.0 ms, ×11.2" in v.summary.text()
    assert v.chart.series_names() == ["cold", "warm: prefix"]
    s.set_options(repeat=5)
    assert v.repeat.value() == 5
    v.repeat.setValue(4)
    assert s.options.repeat == 4


def test_bench_table_updates_its_cells_in_place(qtbot):
    """A benchmark shows its result after every row: the table keeps its items and changes
    only the cells that differ (texts, verdict colours, tooltips, fewer rows)."""
    from app.ui.bench_view import BenchView
    from app.ui.run_panel import VERDICT_COLORS

    s = Session()
    v = BenchView(s)
    qtbot.addWidget(v)
    col = {v.table.horizontalHeaderItem(c).text(): c for c in range(v.table.columnCount())}
    rows = [BenchRow(row=i, cold_ms=900.0, warm_ms=80.0, speedup=11.25, tokens_equal=True,
                     equivalence="bit-identical") for i in (1, 2, 3)]
    s.set_bench(BenchResult(model={}, rows=rows[:2], repeat=1))
    first = v.table.item(0, col["verdict"])
    s.set_bench(BenchResult(model={}, rows=rows, repeat=1))
    assert v.table.rowCount() == 3 and v.table.item(0, col["verdict"]) is first  # kept
    rows[1] = BenchRow(row=2, cold_ms=900.0, warm_ms=90.0, speedup=10.0, equivalence="diverged",
                       note="tokens differ at 3")
    s.set_bench(BenchResult(model={}, rows=rows, repeat=1))
    verdict = v.table.item(1, col["verdict"])
    assert verdict.text() == "diverged" and verdict.toolTip() == "tokens differ at 3"
    assert verdict.foreground().color().name() == VERDICT_COLORS["diverged"]
    assert v.table.item(1, col["same tokens"]).text() == "NO"
    assert v.table.item(1, col["cold (ms)"]).textAlignment() & Qt.AlignRight
    s.set_bench(BenchResult(model={}, rows=[BenchRow(row=7, error="no room")], repeat=1))
    assert v.table.rowCount() == 1 and v.table.item(0, col["error"]).text() == "no room"
    assert v.table.item(0, col["verdict"]).text() == "" and not v.table.item(0, col["verdict"]).toolTip()
    assert v.table.item(0, col["verdict"]).data(Qt.ForegroundRole) is None  # the colour is gone
    s.set_bench(None)
    assert v.table.rowCount() == 0 and v.accuracy.rowCount() == 0


def test_redrawn_charts_delete_the_axes_they_drop(qtbot):
    """QChart.removeAxis hands the axis back instead of deleting it: each redraw (one per
    benchmark row) leaked three axes until the charts deleted them."""
    import gc

    import shiboken6
    from PySide6.QtCharts import QAbstractAxis
    from PySide6.QtCore import QCoreApplication, QEvent

    from app.ui.charts import COLD, WARM, BarSeries, TtftChart

    def axes() -> set[int]:
        QCoreApplication.sendPostedEvents(None, QEvent.DeferredDelete)
        gc.collect()
        return {id(a) for a in gc.get_objects() if isinstance(a, QAbstractAxis) and shiboken6.isValid(a)}

    before = axes()  # other tests' charts
    chart = TtftChart()
    qtbot.addWidget(chart)
    series = [BarSeries("cold", COLD, [900.0, 800.0], [880.0, 790.0], [950.0, 820.0]),
              BarSeries("warm", WARM, [80.0, 70.0], [75.0, 65.0], [85.0, 90.0])]
    for _ in range(20):
        chart.set_series([("row 1", "1"), ("row 2", "2")], series)
    assert len(chart.chart().axes()) == 3 and len(axes() - before) == 3


def test_a_warm_bar_hundreds_of_times_shorter_shows_on_a_log_scale(qtbot):
    """At real sizes a warm run is x280 faster than its cold run: on a linear axis its bar is a
    hairline. Over 30x apart the value axis turns logarithmic, a decade under the warm bar."""
    import math

    from PySide6.QtCharts import QLogValueAxis, QValueAxis

    from app.ui.charts import TtftBar, TtftChart

    chart = TtftChart()
    qtbot.addWidget(chart)
    chart.resize(500, 300)
    chart.show()

    def value_axis():
        (y,) = [a for a in chart.chart().axes(Qt.Vertical) if a.isVisible()]
        return y

    chart.set_bars([TtftBar.single(1, 331_881.5, 1_184.9)])
    y = value_axis()
    assert isinstance(y, QLogValueAxis) and y.titleText() == "ms, log scale"
    lo, hi = math.log10(y.min()), math.log10(y.max())
    assert y.min() <= 1_184.9 / 10 and y.max() >= 331_881.5
    assert (math.log10(1_184.9) - lo) / (hi - lo) > 0.2  # the warm bar is a fifth of the plot
    chart.set_bars([TtftBar.single(1, 900.0, 80.0)])  # x11: linear, from 0
    y = value_axis()
    assert isinstance(y, QValueAxis) and y.min() == 0 and y.titleText() == "ms"


def test_chart_labels_fit_or_shorten_and_stay_unique(qtbot):
    from PySide6.QtGui import QFontMetrics

    from app.ui.charts import TtftBar, bar_labels

    bars = [TtftBar.single(r, 900.0, 80.0) for r in (1, 2, 1)]
    fm = QFontMetrics(qtbot_font())
    wide = bar_labels(bars, 3000, fm)
    assert wide[0] == "row 1 ×11.2" and len(set(wide)) == 3
    narrow = bar_labels(bars, 3 * (fm.horizontalAdvance("1") + 8), fm)
    assert narrow[0] == "1" and narrow[1] == "2" and narrow[2].strip("\u200b") == "1"
    assert len(set(narrow)) == 3


def chart_texts(view) -> list[str]:
    """The texts QtCharts draws (its axes' labels and the title), read from the chart's scene:
    what the user sees, after QtCharts' own layout."""
    import shiboken6
    from PySide6.QtWidgets import QGraphicsTextItem

    texts = []
    for item in view.scene().items():
        if item.type() != 8 or not item.isVisible():  # 8: QGraphicsTextItem's item type
            continue
        obj = item.toGraphicsObject()
        if not isinstance(obj, QGraphicsTextItem):
            obj = shiboken6.wrapInstance(shiboken6.getCppPointer(obj)[0], QGraphicsTextItem)
        texts.append(obj.toPlainText())
    return texts


def test_a_narrow_chart_draws_its_row_labels_whole_and_groups_thousands(qtbot):
    from app.ui.charts import TtftBar, TtftChart

    chart = TtftChart("Time to first token (ms), cold vs warm")
    qtbot.addWidget(chart)
    chart.set_bars([TtftBar.single(1, 55068.6, 1989.6)])
    chart.show()
    forms = {"row 1 ×27.7", "1 ×27.7", "1"}
    # the Run tab's chart beside the table with the panels open at 1366x768 is about this wide;
    # QtCharts cut "row 1 ×27.7" to "row 1 ×2..." there
    for width in range(256, 300, 6):
        chart.resize(width, 160)
        qtbot.wait(40)  # the labels are fitted once the resized chart is laid out
        texts = chart_texts(chart)
        assert not [t for t in texts if t.endswith("...")], (width, texts)
        assert len(forms & set(texts)) == 1, (width, texts)
    assert "80,000" in chart_texts(chart)  # as the tables write 55,068.6


def qtbot_font():
    from PySide6.QtGui import QFont

    return QFont()


def test_editor_prefix_label_says_what_is_shaded(qtbot):
    from app.ui.template_editor import TokenCounts, prefix_label, source_prefix_chars

    tpl = Template.parse("intro \\<x> text\nline two <c1> and <question>")
    assert source_prefix_chars(tpl) == len("intro \\<x> text\nline two ")
    assert prefix_label(tpl, TokenCounts(1761), True) == \
        "static prefix: 1,761 tokens (shaded) · placeholders <c1> <question>"
    assert "counting" in prefix_label(tpl, None, True)
    assert "no placeholders" in prefix_label(Template.parse("all static"), None, False)


def test_highlighter_marks_placeholders_and_special_tokens(qtbot):
    from PySide6.QtGui import QTextDocument

    doc = QTextDocument("<|im_start|>hi <name> \\<lit> a < b")
    h = TemplateHighlighter(doc)
    h.rehighlight()
    layout = doc.firstBlock().layout()
    formats = {(r.start, r.length) for r in layout.formats()}
    assert (0, len("<|im_start|>")) in formats
    assert (len("<|im_start|>hi "), len("<name>")) in formats
    assert not any(r.start == doc.toPlainText().index("<lit>") for r in layout.formats())


def test_states_library_lists_renames_and_deletes(qtbot, tmp_path, engine):
    import os

    from app.engine.states.llama_state_file import save_state, state_file_info
    from app.ui.states_library import LLAMA_MODEL

    state = engine.prime(Template.parse("hello world of the answer " * 5 + "<q>"))
    state.save(tmp_path / "one.kvstate")
    save_state(state, tmp_path / "slot.bin", "llama")
    os.utime(tmp_path / "slot.bin", (1, 1))  # listed after the newer .kvstate
    (tmp_path / "other.bin").write_bytes(b"not a state")  # a .bin that is no state: not listed
    lib = StatesLibrary(tmp_path, confirm=lambda text: True)
    qtbot.addWidget(lib)
    assert [p.name for p in lib.paths] == ["one.kvstate", "slot.bin"]
    assert lib.table.item(1, 1).text() == LLAMA_MODEL
    assert lib.table.item(1, 2).text() == str(state.n_tokens)
    (tmp_path / "slot.bin").unlink()
    lib.refresh()
    assert lib.table.item(0, 1).text() == state.model_name
    assert lib.table.item(0, 2).text() == str(state.n_tokens)
    assert state_file_info(tmp_path / "one.kvstate").n_tokens == state.n_tokens
    lib.select(tmp_path / "one.kvstate")
    assert lib.rename_selected("two") == tmp_path / "two.kvstate"
    assert lib.rename_selected("a/b") is None and "slash" in lib.message.text()
    lib.select(tmp_path / "two.kvstate")
    lib.delete_selected()
    assert lib.paths == [] and not (tmp_path / "two.kvstate").exists()


def test_model_panel_edits_the_sessions_engine_settings(qtbot, engine):
    from app.engine import EngineStatus
    from app.engine.session import Options, Session
    from app.ui.model_panel import ModelPanel

    s = Session(Options(engine=EngineConfig(model_path="/m.gguf", n_ctx=1024, n_threads=1,
                                            flash_attn="auto")))
    status = EngineStatus()
    p = ModelPanel(s, status)
    qtbot.addWidget(p)
    f = p.form
    # -ngl: unknown until a model's facts arrive (the build is asked on the worker thread);
    # then usable on a build with GPU offload, else disabled and saying why
    assert not f.ngl.isEnabled() and f.ngl.minimum() == -1
    status.update(info=engine.info, config=engine.config)  # the panel observes the status
    assert f.ngl.isEnabled() == engine.info.gpu_offload
    assert "other settings" in p.pending.text()  # the engine runs another file than /m.gguf
    if not f.ngl.isEnabled():
        assert "no GPU offload" in f.ngl.toolTip()
    got = []
    p.apply_requested.connect(got.append)
    f.n_ctx.setValue(2048)
    f.type_k.setCurrentText("q8_0")
    assert s.options.engine.n_ctx == 2048 and s.options.engine.type_k == "q8_0"
    p.apply.click()
    assert got == [False] and s.options.engine.model_path == "/m.gguf"
    assert s.options.engine.n_threads == 1 and s.options.engine.flash_attn == "auto"
    # the attention kernel: the engine's choice and its times shown, the setting applied
    assert p.fact_labels["attention"].text() == engine.kernels.describe()
    f.flash_attn.setCurrentIndex(f.flash_attn.findData("off"))
    assert s.options.engine.flash_attn == "off"
    p.remeasure.click()
    assert got[-1] is True and s.options.engine.flash_attn == "auto"
    assert not s.options.engine.remeasure_kernels  # asked for once, never kept


def test_signal_emits_and_void_calls_keep_the_singletons_reference_counts(qapp):
    """PySide6 6.12.0's emit() drops a reference to True each time, and each call of a C++
    method returning nothing one to None; the pinned PySide6 must do neither."""
    import gc
    import sys

    from PySide6.QtCore import QObject, Signal
    from PySide6.QtWidgets import QLabel

    class Pinger(QObject):
        ping = Signal()
        flag = Signal(bool)

    p, label = Pinger(), QLabel()
    got = []
    p.flag.connect(got.append)

    def counts():
        gc.collect()
        return sys.getrefcount(None), sys.getrefcount(True), sys.getrefcount(False)

    p.ping.emit()  # first calls may cache something
    p.flag.emit(False)
    label.setText("x")
    got.clear()
    before = counts()
    # 500 rounds: a bug of one reference a call shows as 500 or more, yet stays well below
    # True's own count (a few thousand on 3.11), so a buggy PySide6 fails here, not aborts
    for i in range(500):
        p.ping.emit()
        p.flag.emit(False)
        label.setText(str(i))
    got.clear()
    after = counts()
    drift = [a - b for a, b in zip(after, before)]
    assert all(abs(d) < 100 for d in drift), f"None, True, False drifted by {drift}"
