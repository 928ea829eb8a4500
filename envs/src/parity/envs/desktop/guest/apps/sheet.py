"""Spreadsheet: a grid of cells A1..F12 saved as CSV. `=SUM(A1:A3)` cells are saved as their value.

Enter moves down, Tab moves right, Ctrl+S saves. Usage: python3 -m guest.apps.sheet [FILE.csv]
"""

from __future__ import annotations

import csv
import os
import re
import sys
import tkinter as tk

from .accessible import name, new_root, serve

COLS, ROWS = "ABCDEF", 12
_SUM = re.compile(r"^=SUM\(([A-F])(\d+):([A-F])(\d+)\)$", re.IGNORECASE)


def value(cells: dict[str, tk.Entry], text: str) -> str:
    """The saved value of a cell: its text, or the total of a `=SUM(range)` formula."""
    m = _SUM.match(text.strip())
    if not m:
        return text
    c0, r0, c1, r1 = m.group(1).upper(), int(m.group(2)), m.group(3).upper(), int(m.group(4))
    total = 0.0
    for c in COLS[COLS.index(c0) : COLS.index(c1) + 1]:
        for r in range(r0, r1 + 1):
            try:
                total += float(cells.get(f"{c}{r}").get() or 0)  # type: ignore[union-attr]
            except (ValueError, AttributeError):
                return "#VALUE!"
    return str(int(total)) if total.is_integer() else str(total)


def main() -> None:
    path = os.path.expanduser(sys.argv[1] if len(sys.argv) > 1 else "~/sheet.csv")
    root = new_root(f"Sheet - {os.path.basename(path)}")
    grid = tk.Frame(root)
    grid.pack(padx=4, pady=4)
    cells: dict[str, tk.Entry] = {}
    for j, c in enumerate(COLS):
        tk.Label(grid, text=c).grid(row=0, column=j + 1)
    for r in range(1, ROWS + 1):
        tk.Label(grid, text=str(r)).grid(row=r, column=0)
        for j, c in enumerate(COLS):
            cell = name(tk.Entry(grid, width=12), f"{c}{r}")
            cell.grid(row=r, column=j + 1)
            cells[f"{c}{r}"] = cell
    status = name(tk.Label(root, text="", anchor="w"), "Status")

    if os.path.isfile(path):
        with open(path, newline="", encoding="utf-8") as f:
            for r, row in enumerate(csv.reader(f), start=1):
                for j, text in enumerate(row[: len(COLS)]):
                    if r <= ROWS:
                        cells[f"{COLS[j]}{r}"].insert(0, text)

    def save(_event: object = None) -> str:
        table = [[value(cells, cells[f"{c}{r}"].get()) for c in COLS] for r in range(1, ROWS + 1)]
        while table and not any(table[-1]):
            table.pop()
        width = max((max((j + 1 for j, t in enumerate(row) if t), default=0) for row in table), default=0)
        with open(path, "w", newline="", encoding="utf-8") as f:
            csv.writer(f, lineterminator="\n").writerows(row[:width] for row in table)
        status.config(text="Saved")
        return "break"

    names_by_widget = {str(w): k for k, w in cells.items()}

    def down(event: tk.Event) -> str:
        key = names_by_widget.get(str(event.widget))
        if key and int(key[1:]) < ROWS:
            cells[f"{key[0]}{int(key[1:]) + 1}"].focus_set()
        return "break"

    for cell in cells.values():
        cell.bind("<Return>", down)
    tk.Button(root, text="Save", command=save).pack(side="left", padx=4, pady=4)
    status.pack(side="left", padx=8)
    root.bind_all("<Control-s>", save)
    cells["A1"].focus_set()
    serve(root)
    root.mainloop()


if __name__ == "__main__":
    main()
