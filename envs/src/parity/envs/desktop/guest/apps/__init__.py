"""Small Tk applications for the desktop: text editor, file manager, spreadsheet, settings.

Each exports its widget tree as the desktop's accessibility source (see `accessible`).
"""
