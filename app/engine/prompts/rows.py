"""Rows of placeholder values from CSV or JSONL files, checked against a template.

Errors name the file, the row (1-based, as a spreadsheet shows it: the CSV header is row 1)
and the column, and say what to do.
"""
from __future__ import annotations

import csv
import io
import itertools
import json
from dataclasses import dataclass
from pathlib import Path

from ..errors import RowsError
from ..user_files import read_user_text

MAX_ROWS_BYTES = 256 * 1024 * 1024


@dataclass(frozen=True)
class Row:
    number: int  # as the user sees it in the file
    values: dict[str, str]


def read_rows(path: str | Path, placeholders: list[str] | None = None) -> list[Row]:
    p = Path(path)
    text = read_user_text(p, RowsError, "rows file", MAX_ROWS_BYTES)
    if p.suffix.lower() in (".jsonl", ".ndjson", ".json"):
        rows = parse_jsonl(text, p.name)
    else:
        rows = parse_csv(text, p.name)
    if not rows:
        raise RowsError(f"{p.name} has no rows; add at least one row of values")
    if placeholders is not None:  # a CSV's columns are its header's: an error is the header's
        check_rows(rows, placeholders, p.name, header=p.suffix.lower() not in
                   (".jsonl", ".ndjson", ".json"))
    return rows


def parse_csv(text: str, name: str = "rows") -> list[Row]:
    if not text.strip():
        raise RowsError(f"{name} is empty; it needs a header row naming the placeholders")
    try:
        dialect = csv.Sniffer().sniff(text[:4096], delimiters=",;\t")
    except csv.Error:
        dialect = csv.excel
    # values are often whole documents; the csv module's default limit is 128 KiB per field
    csv.field_size_limit(MAX_ROWS_BYTES)
    reader = csv.reader(io.StringIO(text), dialect)
    try:
        header = next(reader)
    except csv.Error as e:
        raise RowsError(f"{name} row 1: {e}") from None
    return _csv_rows(reader, _header(header, name), name)


def _header(cells: list[str], name: str) -> list[str]:
    header = [h.strip() for h in cells]
    for col, h in enumerate(header, 1):
        if not h:
            raise RowsError(f"{name} row 1, column {col}: empty column name; name every column")
    dupes = sorted({h for h in header if header.count(h) > 1})
    if dupes:
        raise RowsError(f"{name} row 1: column {dupes[0]!r} appears twice; rename one")
    return header


def _csv_rows(reader, header: list[str], name: str, first: list[str] | None = None,
              fill: bool = True) -> list[Row]:
    """The rows ``reader`` has left (``first`` before them): blank lines skipped, cells named
    by ``header`` (a file's, or the placeholders in order), every column filled unless not
    ``fill``."""
    columns = (f"the header names {len(header)} columns" if fill else
               f"the template has {len(header)} placeholders")
    rows = []
    try:
        # reader.line_num: the line the last row read ends on (the first's, before the rest)
        for cells in itertools.chain([first] if first is not None else [], reader):
            number = reader.line_num
            if not any(c.strip() for c in cells):
                continue
            if len(cells) > len(header):
                raise RowsError(f"{name} row {number}: {len(cells)} cells but {columns}; quote "
                                "values that contain the delimiter")
            missing = header[len(cells):]
            if missing and fill:
                raise RowsError(f"{name} row {number}: no value in column {missing[0]!r}")
            rows.append(Row(number, dict(zip(header, cells))))
    except csv.Error as e:
        raise RowsError(f"{name} row {reader.line_num}: {e}") from None
    return rows


def parse_pasted(text: str, placeholders: list[str], name: str = "pasted text,") -> list[Row]:
    """Rows pasted from a spreadsheet or typed: tab-separated cells, as spreadsheets copy them
    (comma-separated when there is no tab and more than one placeholder), quoted as CSV quotes
    them (a quoted cell may hold the separator, line breaks and doubled quotes). A first line
    that names placeholders is a header, read and checked as the CSV import reads one; without
    one, cells fill the placeholders in order, and those left out stay blank for the form."""
    if not placeholders:
        raise RowsError("the template has no placeholders to paste values into; add one first")
    text = text.lstrip("\r\n")
    if not text.strip():
        raise RowsError("there is nothing to paste; copy rows of cells first")
    sep = "\t" if "\t" in text or len(placeholders) < 2 else ","
    csv.field_size_limit(MAX_ROWS_BYTES)
    # strict: a quote left open is an error, not a cell swallowing every line after it
    reader = csv.reader(io.StringIO(text), delimiter=sep, strict=True)
    try:
        first = next(reader)
    except csv.Error as e:
        raise RowsError(f"{name} row 1: {e}") from None
    if all(c.strip() in placeholders for c in first):
        rows = _csv_rows(reader, _header(first, name), name)
        check_rows(rows, placeholders, name, header=True)  # a column missing is the header's
    else:
        rows = _csv_rows(reader, list(placeholders), name, first, fill=False)
    if not rows:
        raise RowsError("the pasted text holds a header and no row of values; copy rows too")
    return rows


def parse_jsonl(text: str, name: str = "rows") -> list[Row]:
    if text.lstrip().startswith("["):
        return _parse_json_array(text, name)
    rows = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise RowsError(f"{name} line {number}, column {e.colno}: invalid JSON ({e.msg})") from None
        except RecursionError:  # thousands of nested brackets
            raise RowsError(f"{name} line {number}: JSON nested too deeply") from None
        rows.append(_row(obj, number, name, "line"))
    return rows


def _parse_json_array(text: str, name: str) -> list[Row]:
    """A .json file holding one array of objects; rows are numbered from 1 in the array."""
    try:
        items = json.loads(text)
    except json.JSONDecodeError as e:
        raise RowsError(f"{name} line {e.lineno}, column {e.colno}: invalid JSON ({e.msg})") from None
    except RecursionError:
        raise RowsError(f"{name}: JSON nested too deeply") from None
    if not isinstance(items, list):
        raise RowsError(f"{name}: expected one object per line, or an array of objects")
    return [_row(obj, k, name, "item") for k, obj in enumerate(items, 1)]


def _row(obj, number: int, name: str, unit: str) -> Row:
    if not isinstance(obj, dict):
        raise RowsError(f"{name} {unit} {number}: expected an object of name: value pairs")
    values = {}
    for k, v in obj.items():
        if isinstance(v, (dict, list)) or v is None:
            raise RowsError(f"{name} {unit} {number}, key {k!r}: values must be text or numbers")
        values[str(k)] = v if isinstance(v, str) else json.dumps(v)
    return Row(number, values)


def check_rows(rows: list[Row], placeholders: list[str], name: str = "rows",
               header: bool = False) -> None:
    """Every placeholder must have a column; extra columns are an error too (likely a typo).
    ``header``: the columns are a CSV header's (row 1), which the error then names."""
    needed = set(placeholders)
    for row in rows:
        missing = [n for n in placeholders if n not in row.values]
        extra = sorted(k for k in row.values if k not in needed)
        where = "the header (row 1)" if header else f"row {row.number}"
        if missing:
            raise RowsError(f"{name} {where}: no column {missing[0]!r} for the placeholder "
                            f"<{missing[0]}>" + ("; add it to the header" if header else ""))
        if extra:
            raise RowsError(f"{name} {where}: column {extra[0]!r} is not a placeholder of "
                            "the template; remove it or add it to the template")
