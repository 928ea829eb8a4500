"""File manager: one folder's entries, a name field, and New Folder / New File / Rename / Delete.

Double-click a folder to enter it, ".." to go up. Usage: python3 -m guest.apps.files [DIR]
"""

from __future__ import annotations

import os
import shutil
import sys
import tkinter as tk

from .accessible import name, new_root, serve


def main() -> None:
    folder = os.path.expanduser(sys.argv[1] if len(sys.argv) > 1 else "~")
    root = new_root("")
    where = name(tk.Label(root, text="", anchor="w"), "Location")
    where.pack(fill="x", padx=4, pady=2)
    listing = name(tk.Listbox(root, height=16, exportselection=False), "Files")
    listing.pack(fill="both", expand=True, padx=4)
    bar = tk.Frame(root)
    bar.pack(fill="x")
    tk.Label(bar, text="Name:").pack(side="left", padx=4)
    field = name(tk.Entry(bar, width=30), "Name")
    field.pack(side="left", pady=4)
    message = name(tk.Label(root, text="", anchor="w"), "Message")

    def refresh() -> None:
        listing.delete(0, "end")
        listing.insert("end", "..")
        for entry in sorted(os.listdir(folder)):
            full = os.path.join(folder, entry)
            listing.insert("end", entry + ("/" if os.path.isdir(full) else ""))
        where.config(text=folder)
        root.title(f"Files - {folder}")

    def selected() -> str | None:
        sel = listing.curselection()
        item = listing.get(sel[0]) if sel else None
        return None if item in (None, "..") else os.path.join(folder, item.rstrip("/"))

    def act(fn) -> None:  # run one file operation, report its error instead of raising
        try:
            fn()
            message.config(text="")
        except (OSError, ValueError) as e:
            message.config(text=f"Error: {e}")
        refresh()

    def need_name() -> str:
        text = field.get().strip()
        if not text or "/" in text:
            raise ValueError("enter a name without '/'")
        return os.path.join(folder, text)

    def rename() -> None:
        src = selected()
        if src is None:
            raise ValueError("select an item first")
        os.rename(src, need_name())

    def delete() -> None:
        src = selected()
        if src is None:
            raise ValueError("select an item first")
        shutil.rmtree(src) if os.path.isdir(src) else os.remove(src)

    def enter(_event: object = None) -> None:
        nonlocal folder
        sel = listing.curselection()
        if not sel:
            return
        target = os.path.normpath(os.path.join(folder, listing.get(sel[0]).rstrip("/")))
        if os.path.isdir(target):
            folder = target
            refresh()

    for label, fn in (("New Folder", lambda: os.mkdir(need_name())),
                      ("New File", lambda: open(need_name(), "x").close()),
                      ("Rename", rename), ("Delete", delete)):
        tk.Button(bar, text=label, command=lambda fn=fn: act(fn)).pack(side="left", padx=2)
    message.pack(fill="x", padx=4)
    listing.bind("<Double-Button-1>", enter)
    refresh()
    serve(root)
    root.mainloop()


if __name__ == "__main__":
    main()
