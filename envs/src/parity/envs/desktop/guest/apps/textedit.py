"""Text editor: a path entry, Open and Save buttons, and the document. Ctrl+S saves.

Usage: python3 -m guest.apps.textedit [FILE]
"""

from __future__ import annotations

import os
import sys
import tkinter as tk

from .accessible import name, new_root, serve


def main() -> None:
    path = os.path.expanduser(sys.argv[1] if len(sys.argv) > 1 else "~/untitled.txt")
    root = new_root("")
    bar = tk.Frame(root)
    bar.pack(fill="x")
    entry = name(tk.Entry(bar, width=50), "File name")
    entry.pack(side="left", padx=4, pady=4)
    status = name(tk.Label(bar, text=""), "Status")
    doc = name(tk.Text(root, undo=True, wrap="word"), "Document")

    def load() -> None:
        nonlocal path
        path = os.path.expanduser(entry.get())
        doc.delete("1.0", "end")
        if os.path.isfile(path):
            with open(path, encoding="utf-8", errors="replace") as f:
                doc.insert("1.0", f.read())
        doc.edit_modified(False)
        root.title(f"Text Editor - {os.path.basename(path)}")
        status.config(text="")

    def save(_event: object = None) -> str:
        nonlocal path
        path = os.path.expanduser(entry.get())
        with open(path, "w", encoding="utf-8") as f:
            f.write(doc.get("1.0", "end-1c"))
        doc.edit_modified(False)
        root.title(f"Text Editor - {os.path.basename(path)}")
        status.config(text="Saved")
        return "break"

    tk.Button(bar, text="Open", command=load).pack(side="left")
    tk.Button(bar, text="Save", command=save).pack(side="left")
    status.pack(side="left", padx=8)
    doc.pack(fill="both", expand=True)
    entry.insert(0, path)
    root.bind_all("<Control-s>", save)
    doc.bind("<Control-a>", lambda _e: (doc.tag_add("sel", "1.0", "end-1c"), "break")[1])
    doc.bind("<<Modified>>", lambda _e: status.config(text="Modified" if doc.edit_modified() else status.cget("text")))
    load()
    doc.focus_set()
    serve(root)
    root.mainloop()


if __name__ == "__main__":
    main()
