"""Settings dialog: check boxes, a text-size choice, a font-size spin box and a user name.

Apply writes ~/.config/parity/settings.json; Cancel restores the saved values.
Usage: python3 -m guest.apps.settings
"""

from __future__ import annotations

import json
import os
import tkinter as tk

from .accessible import name, new_root, serve

PATH = os.path.expanduser("~/.config/parity/settings.json")
DEFAULTS = {"dark_mode": False, "notifications": True, "text_size": "Medium", "font_size": 11, "username": "user"}


def main() -> None:
    root = new_root("Settings")
    dark, notify = tk.BooleanVar(root), tk.BooleanVar(root)
    size, font = tk.StringVar(root), tk.StringVar(root)
    status = name(tk.Label(root, text="", anchor="w"), "Status")
    tk.Checkbutton(root, text="Dark mode", variable=dark).pack(anchor="w", padx=8, pady=2)
    tk.Checkbutton(root, text="Notifications", variable=notify).pack(anchor="w", padx=8, pady=2)
    tk.Label(root, text="Text size").pack(anchor="w", padx=8)
    for choice in ("Small", "Medium", "Large"):
        tk.Radiobutton(root, text=choice, value=choice, variable=size).pack(anchor="w", padx=24)
    row = tk.Frame(root)
    row.pack(anchor="w", padx=8, pady=2)
    tk.Label(row, text="Font size").pack(side="left")
    name(tk.Spinbox(row, from_=8, to=32, textvariable=font, width=5), "Font size").pack(side="left", padx=4)
    row2 = tk.Frame(root)
    row2.pack(anchor="w", padx=8, pady=2)
    tk.Label(row2, text="User name").pack(side="left")
    user = name(tk.Entry(row2, width=24), "User name")
    user.pack(side="left", padx=4)

    def load() -> None:
        saved = dict(DEFAULTS)
        if os.path.isfile(PATH):
            with open(PATH, encoding="utf-8") as f:
                saved.update(json.load(f))
        dark.set(saved["dark_mode"])
        notify.set(saved["notifications"])
        size.set(saved["text_size"])
        font.set(str(saved["font_size"]))
        user.delete(0, "end")
        user.insert(0, saved["username"])
        status.config(text="")

    def apply() -> None:
        try:
            font_size = int(font.get())
        except ValueError:
            status.config(text="Error: font size must be a whole number")
            return
        os.makedirs(os.path.dirname(PATH), exist_ok=True)
        with open(PATH, "w", encoding="utf-8") as f:
            json.dump({"dark_mode": dark.get(), "notifications": notify.get(), "text_size": size.get(),
                       "font_size": font_size, "username": user.get()}, f, sort_keys=True)
        status.config(text="Applied")

    buttons = tk.Frame(root)
    buttons.pack(anchor="w", padx=8, pady=6)
    tk.Button(buttons, text="Apply", command=apply).pack(side="left")
    tk.Button(buttons, text="Cancel", command=load).pack(side="left", padx=4)
    status.pack(fill="x", padx=8)
    load()
    serve(root)
    root.mainloop()


if __name__ == "__main__":
    main()
