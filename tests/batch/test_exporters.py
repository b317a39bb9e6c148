"""Gradebook exports: Canvas's gradebook import CSV."""

from __future__ import annotations

import csv
import io
from types import SimpleNamespace

from tests.conftest import COURSE
from grader.batch.classview import Cell, Row
from grader.batch.exporters import EXPORTS, canvas_csv


def test_canvas_csv_header_points_row_and_a_student():
    alice = Row("alice@uni.edu", "alice", "fetched", name="Alice Liddell",
                cells={"vector_add": Cell("vector_add", "graded", 4.5, 10.0), "softmax": Cell("softmax", "infra_error")})
    view = SimpleNamespace(assignments=["vector_add", "softmax"], rows=[alice], catalogue=COURSE)
    rows = list(csv.reader(io.StringIO(canvas_csv(view))))
    # Canvas's import columns: Student, ID, SIS User ID, SIS Login ID, Section, then one per assignment
    assert rows[0] == ["Student", "ID", "SIS User ID", "SIS Login ID", "Section", "vector_add", "softmax"]
    # the full points of each assignment (GPU-only points included): vector_add 6 + 4, softmax 12 + 8
    assert rows[1] == ["Points Possible", "", "", "", "", "10", "20"]
    # no grade is an empty cell (Canvas leaves it alone), never a zero
    assert rows[2] == ["Alice Liddell", "", "", "alice@uni.edu", "", "4.5", ""]
    assert len(rows) == 3
    assert EXPORTS["canvas.csv"] is canvas_csv  # written beside grades.csv by grader grade
