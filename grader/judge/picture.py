"""Where a result is wrong, as a picture: a strip for 1-D outputs, a grid for 2-D ones, with
the block boundaries the kernel's BLOCK sizes imply.

A wrong tail, a wrong stride or a wrong row offset is seen at a glance, where the same fact in
numbers ("27721 of 29100 elements wrong") needs thinking. The judge stores a compact map in the
test's details (`wrong_map`, text: it travels in results.json and batch records); the report
draws it as inline SVG (no script, no network).
"""

from __future__ import annotations

import math
from html import escape
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

MAX_BINS_1D = 256
MAX_CELLS_2D = 64
ZOOM = 64  # elements in the 1-D close-up around the first wrong one
RIGHT, WRONG, NAN = "#c6f6d5", "#c53030", "#553c9a"


def wrong_map(bad: torch.Tensor, got: torch.Tensor, unwritten: torch.Tensor | None = None) -> dict:
    """The mismatch binned to at most 256 cells (1-D) or 64 x 64 (2-D; more dims are folded into
    rows). Each cell is one character: '.' all right, '1'..'9' the share wrong in ninths
    (rounded up: one wrong element shows), 'N' when every wrong element of the cell was never
    written (`unwritten`: where the poison survives; without it, every NaN counts)."""
    got = unwritten if unwritten is not None else got.isnan()  # below, only which elements were never written
    shape = list(bad.shape)
    if bad.dim() == 0 or bad.numel() == 0:
        return {}
    if bad.dim() == 1:
        cells = _bin(bad.reshape(1, -1), got.reshape(1, -1), 1, MAX_BINS_1D)
        m = {"shape": shape, "rows": 1, "cols": shape[0], "cells": cells}
        n = shape[0]
        if n > MAX_BINS_1D and bad.any():  # and one element per cell around the first wrong one, where a tail shows
            first = int(bad.nonzero()[0])
            start = max(0, min(first - ZOOM // 4, n - ZOOM))
            end = start + ZOOM
            m["zoom_start"] = start
            m["zoom"] = _bin(bad[start:end].reshape(1, -1), got[start:end].reshape(1, -1), 1, ZOOM)[0]
        return m
    rows = math.prod(shape[:-1])
    flat_bad, flat_got = bad.reshape(rows, shape[-1]), got.reshape(rows, shape[-1])
    return {"shape": shape, "rows": rows, "cols": shape[-1],
            "cells": _bin(flat_bad, flat_got, MAX_CELLS_2D, MAX_CELLS_2D)}


def _bin(bad: torch.Tensor, got: torch.Tensor, max_rows: int, max_cols: int) -> list[str]:
    rows, cols = bad.shape
    rstep, cstep = math.ceil(rows / min(rows, max_rows)), math.ceil(cols / min(cols, max_cols))
    nan_bad = bad & got  # got: where the result was never written
    lines = []
    for r in range(0, rows, rstep):
        line = []
        for c in range(0, cols, cstep):
            cell, cell_nan = bad[r:r + rstep, c:c + cstep], nan_bad[r:r + rstep, c:c + cstep]
            wrong = int(cell.sum())
            if not wrong:
                line.append(".")
            elif int(cell_nan.sum()) == wrong:
                line.append("N")
            else:
                line.append(str(max(1, math.ceil(9 * wrong / cell.numel()))))
        lines.append("".join(line))
    return lines


def block_sizes(params: dict, ndim: int) -> tuple[int | None, int | None]:
    """(rows, columns) of one program's block, read from the constexpr sizes of the kernel's
    launch (BLOCK_M/BLOCK_N, or one BLOCK_SIZE along a row or a vector). A guess from names:
    it only places the dashed lines of the picture."""
    sizes = {k.upper(): v for k, v in params.items() if isinstance(v, int) and not isinstance(v, bool)
             and 0 < v <= 1 << 24}
    row = next((sizes[k] for k in ("BLOCK_M", "BLOCK_ROWS", "BLOCK_R", "BLOCK_Q") if k in sizes), None)
    col = next((sizes[k] for k in ("BLOCK_N", "BLOCK_COLS", "BLOCK_C", "BLOCK_SIZE", "BLOCK", "BLOCK_D") if k in sizes),
               None)
    if col is None:
        blocks = [v for k, v in sizes.items() if k.startswith("BLOCK") and k != "BLOCK_K"]
        col = blocks[0] if len(blocks) == 1 else None
    return (row if ndim >= 2 else None), col


def svg(m: dict, blocks: dict | None = None, width: float = 640) -> str:
    """The map as inline SVG, with the kernel's block boundaries dashed."""
    if not m or not m.get("cells"):
        return ""
    cells, rows, cols = m["cells"], m["rows"], m["cols"]
    one_d = len(m["shape"]) == 1
    row_block, col_block = block_sizes(blocks or {}, len(m["shape"]))
    left, top = 44, 18
    ncols, nrows = len(cells[0]), len(cells)
    if one_d:
        cw, ch = width / ncols, 36.0
    else:  # cells of at most 16 px, the grid at most 640 x 400
        cw, ch = min(width / ncols, 16.0), min(400 / nrows, 16.0)
        width = round(cw * ncols, 2)
    height = nrows * ch
    parts = []
    for i, line in enumerate(cells):
        for j, c in enumerate(line):
            fill, opacity = _colour(c)
            parts.append(f'<rect x="{left + j * cw:.2f}" y="{top + i * ch:.2f}" width="{cw + 0.05:.2f}" '
                         f'height="{ch + 0.05:.2f}" fill="{fill}" fill-opacity="{opacity:.2f}"/>')
    parts += _boundaries(col_block, cols, left, top, width, height, vertical=True)
    if not one_d:
        parts += _boundaries(row_block, rows, left, top, width, height, vertical=False)
    parts.append(f'<rect x="{left}" y="{top}" width="{width}" height="{height:.2f}" fill="none" stroke="#4a5568"/>')
    axis = "index" if one_d else "column"
    parts.append(f'<text x="{left}" y="{top - 5}" font-size="11">{axis} 0</text>')
    parts.append(f'<text x="{left + width}" y="{top - 5}" font-size="11" text-anchor="end">{cols - 1}</text>')
    if not one_d:
        parts.append(f'<text x="{left - 4}" y="{top + 10}" font-size="11" text-anchor="end">row 0</text>')
        if height >= 28:  # room for both labels
            parts.append(f'<text x="{left - 4}" y="{top + height:.2f}" font-size="11" '
                         f'text-anchor="end">{rows - 1}</text>')
    if one_d and m.get("zoom"):  # the same strip, one element per cell, around the first wrong element
        start, zoom = m["zoom_start"], m["zoom"]
        ztop = top + height + 26
        zw = width / len(zoom)
        for j, c in enumerate(zoom):
            fill, opacity = _colour(c)
            parts.append(f'<rect x="{left + j * zw:.2f}" y="{ztop:.2f}" width="{zw + 0.05:.2f}" height="{ch:.2f}" '
                         f'fill="{fill}" fill-opacity="{opacity:.2f}"/>')
        if col_block:
            first_block = -(-start // col_block) * col_block
            for b in range(first_block, start + len(zoom), col_block):
                x = left + (b - start) * zw
                anchor = "end" if x > left + width - 40 else ("start" if x < left + 40 else "middle")
                parts.append(f'<line x1="{x:.2f}" x2="{x:.2f}" y1="{ztop - 3:.2f}" y2="{ztop + ch + 3:.2f}" '
                             f'stroke="#000" stroke-dasharray="5 3"/><text x="{x:.2f}" y="{ztop + ch + 14:.2f}" '
                             f'font-size="11" text-anchor="{anchor}">{b}</text>')
        parts.append(f'<text x="{left}" y="{ztop - 5:.2f}" font-size="11">zoom: elements {start} to '
                     f'{start + len(zoom) - 1}, one per cell</text>')
        parts.append(f'<rect x="{left}" y="{ztop:.2f}" width="{width}" height="{ch:.2f}" fill="none" '
                     f'stroke="#4a5568"/>')
        height += ch + 40
    legend = _legend(m, row_block, col_block, one_d)
    total_h = top + height + 34
    parts.append(f'<text x="{left}" y="{top + height + 16:.2f}" font-size="11">{escape(legend)}</text>')
    keys = ((RIGHT, "right"), (WRONG, "wrong"), (NAN, "NaN (never written)"))
    x = left
    for fill, word in keys:
        parts.append(f'<rect x="{x}" y="{top + height + 22:.2f}" width="10" height="10" fill="{fill}"/>'
                     f'<text x="{x + 14}" y="{top + height + 31:.2f}" font-size="11">{word}</text>')
        x += 24 + 7 * len(word)
    label = "where the result is wrong" + (f", {legend}" if legend else "")
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{max(left + width + 10, 600):.0f}" height="{total_h:.0f}" '
            f'role="img" aria-label="{escape(label)}" class="wrongmap">{"".join(parts)}</svg>')


def _colour(c: str) -> tuple[str, float]:
    """A cell's fill and opacity: right, NaN, or wrong (darker the more of it is wrong)."""
    if c == ".":
        return RIGHT, 1.0
    if c == "N":
        return NAN, 1.0
    return WRONG, 0.35 + 0.65 * int(c) / 9


def _boundaries(block: int | None, extent: int, left: float, top: float, width: float, height: float,
                vertical: bool) -> list[str]:
    """Dashed lines at the multiples of `block` (at most 64 of them; beyond that only the start
    of the last, partial block, the boundary a mask bug shows at)."""
    if not block or block >= extent:
        return []
    starts = list(range(block, extent, block))
    if len(starts) > 64:
        starts = [starts[-1]] if extent % block else []
    out = []
    for s in starts:
        last = s == starts[-1] and extent % block
        colour, dash = ("#000", "5 3") if last else ("#2d3748", "2 3")
        if vertical:
            x = left + width * s / extent
            out.append(f'<line x1="{x:.2f}" x2="{x:.2f}" y1="{top}" y2="{top + height:.2f}" stroke="{colour}" '
                       f'stroke-dasharray="{dash}"/>')
        else:
            y = top + height * s / extent
            out.append(f'<line x1="{left}" x2="{left + width}" y1="{y:.2f}" y2="{y:.2f}" stroke="{colour}" '
                       f'stroke-dasharray="{dash}"/>')
    return out


def _legend(m: dict, row_block: int | None, col_block: int | None, one_d: bool) -> str:
    shape = "x".join(map(str, m["shape"]))
    per_cell = math.ceil(m["cols"] / len(m["cells"][0]))
    words = [f"shape {shape}"]
    if len(m["shape"]) > 2:
        words.append(f"leading dims folded into {m['rows']} rows")
    if per_cell > 1:
        words.append(f"{per_cell} elements per cell along a row" if not one_d else f"{per_cell} elements per cell")
    if col_block and col_block < m["cols"]:
        words.append(f"dashed: blocks of {col_block}" + (" columns" if not one_d else "")
                     + (f" (last block starts at {m['cols'] // col_block * col_block})" if m["cols"] % col_block
                        else ""))
    if row_block and not one_d and row_block < m["rows"]:
        words.append(f"blocks of {row_block} rows")
    return "; ".join(words)
