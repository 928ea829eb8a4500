"""The accessibility source of the Tk apps: their widget tree, served over a unix socket.

AT-SPI needs a D-Bus session and an accessibility bus; instead each app listens on
`$PARITY_A11Y_DIR/<pid>.sock` and answers any connection with one JSON document: the viewable
widgets as rows {tag, name, text, class, description, x, y, w, h}. Apps name their
widgets with `name(widget, "...")`; buttons and labels default to their visible text.
"""

from __future__ import annotations

import json
import os
import socket
import tkinter as tk

_ROLES = {
    "Button": "push-button", "Label": "label", "Entry": "entry", "Text": "text",
    "Listbox": "list", "Checkbutton": "check-box", "Radiobutton": "radio-button",
    "Spinbox": "spin-button", "Scale": "slider", "Tk": "frame", "Toplevel": "frame",
}
_NAMES: dict[str, str] = {}


def name(widget: tk.Misc, label: str) -> tk.Misc:
    """Give `widget` an accessible name (what a screen reader would announce); returns it."""
    _NAMES[str(widget)] = label
    return widget


def _text(widget: tk.Misc) -> str:
    cls = widget.winfo_class()
    if cls in ("Entry", "Spinbox"):
        return widget.get()  # type: ignore[attr-defined]
    if cls == "Text":
        return widget.get("1.0", "end-1c")  # type: ignore[attr-defined]
    if cls == "Checkbutton":
        var = widget.cget("variable")
        return "checked" if str(widget.getvar(var)) in ("1", "True") else "unchecked"
    if cls == "Radiobutton":
        var, value = widget.cget("variable"), widget.cget("value")
        return "selected" if str(widget.getvar(var)) == str(value) else ""
    if cls == "Label" and str(widget) in _NAMES:
        return str(widget.cget("text"))
    if cls == "Scale":
        return str(widget.get())  # type: ignore[attr-defined]
    return ""


def _rows(root: tk.Tk) -> list[dict]:
    rows: list[dict] = []
    focus = root.focus_get()
    stack: list[tk.Misc] = [root]
    while stack:
        w = stack.pop(0)
        if not w.winfo_viewable():
            continue
        cls = w.winfo_class()
        label = _NAMES.get(str(w), "")
        if not label and cls in ("Button", "Label", "Checkbutton", "Radiobutton"):
            label = str(w.cget("text"))
        if cls in ("Tk", "Toplevel"):
            label = w.winfo_toplevel().title()  # type: ignore[attr-defined]
        if label or cls in _ROLES:
            rows.append({
                "tag": _ROLES.get(cls, cls.lower()), "name": label, "text": _text(w), "class": cls,
                "description": "focused" if w is focus else "",
                "x": w.winfo_rootx(), "y": w.winfo_rooty(), "w": w.winfo_width(), "h": w.winfo_height(),
            })
        if cls == "Listbox":
            rows.extend(_list_items(w))  # type: ignore[arg-type]
        stack.extend(w.winfo_children())
    return rows


def _list_items(lb: tk.Listbox) -> list[dict]:
    items = []
    selected = set(lb.curselection())
    for i in range(lb.size()):
        box = lb.bbox(i)
        if box is None:
            continue
        bx, by, bw, bh = box
        items.append({
            "tag": "list-item", "name": str(lb.get(i)), "text": "", "class": "ListboxItem",
            "description": "selected" if i in selected else "",
            "x": lb.winfo_rootx() + bx, "y": lb.winfo_rooty() + by, "w": max(bw, lb.winfo_width() - 2 * bx), "h": bh,
        })
    return items


def new_root(title: str) -> tk.Tk:
    """The app's main window, with options that keep the screen deterministic."""
    root = tk.Tk(className="Parity")
    root.title(title)
    root.option_add("*insertOffTime", 0)  # a blinking cursor would keep the screen from settling
    return root


def serve(root: tk.Tk) -> None:
    """Answer tree requests on the app's socket from Tk's event loop (no threads: Tk is not thread-safe)."""
    directory = os.environ.get("PARITY_A11Y_DIR")
    if not directory:
        return
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(os.path.join(directory, f"{os.getpid()}.sock"))
    server.listen(4)

    def answer(_fd: object, _mask: int) -> None:
        conn, _ = server.accept()
        try:
            conn.settimeout(2.0)
            root.update_idletasks()
            doc = {"pid": os.getpid(), "title": root.title(), "rows": _rows(root)}
            conn.sendall(json.dumps(doc).encode())
        except OSError:
            pass
        finally:
            conn.close()

    root.createfilehandler(server, tk.READABLE, answer)  # type: ignore[attr-defined]
