"""Task files, metrics and the linearised accessibility tree (no desktop needed)."""

from __future__ import annotations

import base64
import json
import os
import sqlite3
from collections import Counter
from pathlib import Path
from xml.etree import ElementTree

import docx
import openpyxl
import pytest
from docx.enum.text import WD_PARAGRAPH_ALIGNMENT
from odf.opendocument import OpenDocumentText
from odf.text import P

from parity.envs.desktop.a11y import approx_tokens, linearize
from parity.envs.desktop.env import DesktopEnv
from parity.envs.desktop.guest import browser, programs
from parity.envs.desktop.guest.office import with_profile, write_profile
from parity.envs.desktop.metrics import (
    METRICS,
    check_include_exclude,
    check_json,
    check_json_settings,
    compare_csv,
    compare_docx_files,
    compare_table,
    compare_text_file,
    contains_page_break,
    exact_match,
    is_expected_active_tab,
    is_first_line_centered,
    is_in_list,
    literal_match,
    normalized_match,
)
from parity.envs.desktop.sample import CI_SAMPLE, features, uncovered
from parity.envs.desktop.tasks import SETUP_TYPES, TaskError, guest_steps, load_task, load_tasks


def test_shipped_tasks_cover_every_app_with_oracle_and_wrong_solutions() -> None:
    tasks = load_tasks()
    assert len(tasks) == 91
    apps = Counter(app for t in tasks for app in t.related_apps)
    assert apps == {"libreoffice_calc": 9, "libreoffice_writer": 8, "libreoffice_impress": 9, "pcmanfm": 5,  # real
                    "terminal": 7, "firefox": 5, "mousepad": 7, "gimp": 11, "vlc": 14, "thunderbird": 6, "chromium": 5,
                    "textedit": 4, "files": 3, "settings": 3, "sheet": 2}  # the repo's Tk apps
    for t in tasks:
        assert t.solutions["oracle"] and t.solutions["wrong"], t.id
        assert t.solutions["oracle"] != t.solutions["wrong"], t.id
        assert {s["type"] for s in t.config} <= SETUP_TYPES


def test_the_ci_sample_uses_every_app_getter_and_metric_of_the_shipped_tasks() -> None:
    tasks = load_tasks()
    assert set(CI_SAMPLE) <= {t.id for t in tasks} and len(set(CI_SAMPLE)) == len(CI_SAMPLE) == 27
    assert uncovered(tasks) == {}, "add a task that uses each of these to sample.CI_SAMPLE"
    without = tuple(t for t in CI_SAMPLE if t != "chromium-bookmark-page")
    bookmarking = ["chromium-bookmark-hours", "chromium-bookmark-page"]
    assert uncovered(tasks, without) == {("getter", "bookmarks"): bookmarking, ("metric", "is_expected_bookmarks"): bookmarking}
    assert features(next(t for t in tasks if t.id == "browser-open-address")) == {
        ("app", "firefox"), ("getter", "active_url_from_accessTree"), ("getter", "browser_history"),
        ("getter", "rule"), ("metric", "is_expected_active_tab"), ("metric", "check_include_exclude")}


def _write(tmp_path: Path, doc: object) -> Path:
    path = tmp_path / "t.json"
    path.write_text(json.dumps(doc))
    return path


GOOD = {"id": "x", "instruction": "do it", "config": [{"type": "launch", "parameters": {"command": ["files"]}}],
        "evaluator": {"func": "exact_match", "result": {"type": "vm_file", "path": "~/a"},
                      "expected": {"type": "rule", "rules": {"expected": "a"}}}}
URL = "https://example.invalid/data/budget.xlsx"


@pytest.mark.parametrize(("change", "message"), [
    ({"id": 3}, "field 'id' must be a str"),
    ({"config": [{"type": "format_disk"}]}, "config[0].type must be one of"),
    ({"config": [{"type": "download", "parameters": {"files": [{"url": URL, "path": "/home/user/b.xlsx"}]}}]},
     "config[0] (download): file 'https://example.invalid/data/budget.xlsx' is not shipped with the task"),
    ({"evaluator": {**GOOD["evaluator"], "func": "vibes"}}, "evaluator.func 'vibes' is not a known metric"),
    ({"evaluator": {**GOOD["evaluator"], "func": ["exact_match", "compare_holograms"]}},
     "evaluator.func 'compare_holograms' is not a known metric"),
    ({"evaluator": {**GOOD["evaluator"], "result": {"type": "nope"}}}, "evaluator.result has unknown getter"),
    ({"evaluator": {**GOOD["evaluator"], "expected": {"type": "cloud_file", "path": URL, "dest": "b.xlsx"}}},
     "evaluator.expected (cloud_file): file 'https://example.invalid/data/budget.xlsx' is not shipped"),
    ({"evaluator": {**GOOD["evaluator"], "conj": "xor"}}, "evaluator.conj must be 'and' or 'or'"),
])
def test_bad_task_files_name_the_field(tmp_path: Path, change: dict, message: str) -> None:
    path = _write(tmp_path, {**GOOD, **change})
    with pytest.raises(TaskError) as err:
        load_task(path)
    assert str(path) in str(err.value) and message in str(err.value)


def test_a_task_folder_in_osworld_format_is_read_as_it_is(tmp_path: Path) -> None:
    (tmp_path / "files").mkdir()
    (tmp_path / "files" / "b.xlsx").write_bytes(b"PK-bytes")  # named as the task names it
    (tmp_path / "files" / "gold.xlsx").write_bytes(b"PK-gold")
    drive = "https://drive.usercontent.google.com/download?id=1xyz&export=download"
    doc = {**GOOD, "snapshot": "libreoffice_calc", "source": "osworld", "trajectory": "trajectories/",
           "evaluator": {"func": "compare_table", "result": {"type": "vm_file", "path": "/home/user/b.xlsx", "dest": "b.xlsx"},
                         "expected": {"type": "cloud_file", "path": drive, "dest": "gold.xlsx"},
                         "options": {"rules": [{"type": "sheet_data", "sheet_idx0": 0, "sheet_idx1": "EI0"}]}},
           "config": [{"type": "download", "parameters": {"files": [{"url": drive, "path": "/home/user/b.xlsx"}]}},
                      {"type": "command", "parameters": {"command": ["ls"]}},
                      {"type": "open", "parameters": {"path": "/home/user/b.xlsx"}}]}
    _write(tmp_path, doc)
    env = DesktopEnv(task_dir=tmp_path)  # starts nothing
    (task,) = env.tasks
    assert guest_steps(task) == [
        {"type": "write_file", "parameters": {"path": "/home/user/b.xlsx",
                                              "content_base64": base64.b64encode(b"PK-bytes").decode()}},
        {"type": "command", "parameters": {"command": ["ls"]}},
        {"type": "open", "parameters": {"path": "/home/user/b.xlsx"}}]
    (tmp_path / "bad.json").write_text(json.dumps({**GOOD, "id": "y", "evaluator": {**GOOD["evaluator"], "func": "nope"}}))
    with pytest.raises(TaskError, match=r"bad\.json: evaluator.func 'nope' is not a known metric"):
        DesktopEnv(task_dir=tmp_path)


def test_malformed_task_json_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "broken.json"
    path.write_text("{")
    with pytest.raises(TaskError, match=r"broken\.json"):
        load_task(path)


def test_duplicate_ids_are_refused(tmp_path: Path) -> None:
    for name in ("a.json", "b.json"):
        (tmp_path / name).write_text(json.dumps(GOOD))
    with pytest.raises(TaskError, match="duplicate task id 'x'"):
        load_tasks(tmp_path)


def test_value_metrics_take_osworld_rules() -> None:
    assert exact_match("a", {"expected": "a"}) == 1.0 and exact_match(None, {"expected": "a"}) == 0.0
    assert is_in_list(["a", "b"], {"expected": "b"}) == 1.0 and is_in_list(None, {"expected": "b"}) == 0.0
    assert check_include_exclude("buy milk\ncall mom", {"include": ["call mom"], "exclude": ["eggs"]}) == 1.0
    assert check_include_exclude(["a", "c"], {"include": ["a"], "exclude": ["c"]}) == 0.0
    assert check_include_exclude(None, {"include": []}) == 0.0
    assert literal_match("Abc", "abc") == 0.0 and literal_match("Abc", "abc", ignore_case=True) == 1.0
    assert literal_match([1, "x"], ["1", "x"], type="list") == 1.0 and literal_match([1], [1, 2], type="list") == 0.0
    assert normalized_match("  Hello  World\n", {"expected": "hello world"}) == 1.0
    assert normalized_match("421", {"expected": "42"}) == 0.0 and normalized_match(None, {"expected": "42"}) == 0.0
    assert {"compare_table", "compare_docx_files", "compare_csv", "compare_text_file"} <= set(METRICS)


def test_file_metrics(tmp_path: Path) -> None:
    a, b, c = (tmp_path / n for n in ("a.txt", "b.txt", "c.json"))
    a.write_text("Hello  World\n")
    b.write_text("hello world")
    assert compare_text_file(str(a), str(b)) == 0.0
    assert compare_text_file(str(a), str(b), ignore_blanks=True, ignore_case=True) == 1.0
    assert compare_text_file(str(a), None) == 0.0 and compare_text_file(str(a), str(tmp_path / "gone")) == 0.0
    a.write_text("x,1\ny,2\n")
    b.write_text("x,1\ny,2 \n")
    assert compare_csv(str(a), str(b)) == 0.0 and compare_csv(str(a), str(b), strict=False) == 1.0
    assert compare_csv(str(a), [str(tmp_path / "gone"), str(a)]) == 1.0 and compare_csv(None, str(a)) == 0.0
    c.write_text('{"dark_mode": true, "font_size": 14}')
    assert check_json_settings(str(c), {"expected": {"dark_mode": True}}) == 1.0
    assert check_json_settings(str(c), {"expected": {"dark_mode": False}}) == 0.0
    a.write_text("{")
    assert check_json_settings(str(a), {"expected": {}}) == 0.0


def test_check_json_takes_key_paths_and_value_rules(tmp_path: Path) -> None:
    order = tmp_path / "order.json"
    order.write_text('{"name": "Ada Lovelace", "quantity": 3, "items": [{"sku": "mug-blue"}]}')
    expect = [{"key": ["name"], "method": "eq", "ref": "Ada Lovelace"}, {"key": ["quantity"], "method": "ge", "ref": 2},
              {"key": ["items", 0, "sku"], "method": "re", "ref": "^mug-"}]
    assert check_json(str(order), {"expect": expect}) == 1.0
    assert check_json(str(order), {"expect": [{"key": ["quantity"], "method": "eq", "ref": 4}]}) == 0.0
    assert check_json(str(order), {"expect": [{"key": ["gift_wrap"], "method": "eq", "ref": True}]}) == 0.0
    assert check_json(str(order), {"expect": [{"key": ["items", 5], "method": "eq", "ref": 1}]}) == 0.0
    assert check_json(str(order), {"expect": expect, "unexpect": [{"key": ["name"], "method": "re", "ref": "Ada"}]}) == 0.0
    assert check_json(str(order), {"unexpect": [{"key": ["coupon"], "method": "eq", "ref": "X"}]}) == 1.0
    assert check_json(None, {"expect": []}) == 0.0 and check_json(str(tmp_path / "gone"), {"expect": []}) == 0.0


def test_is_expected_active_tab_compares_urls() -> None:
    rule = {"type": "url", "url": "file:///home/user/site/hours.html"}
    assert is_expected_active_tab("file:///home/user/site/hours.html", rule) == 1.0
    assert is_expected_active_tab({"url": "FILE:///home/user/site/hours.html/", "title": "x"}, rule) == 1.0
    assert is_expected_active_tab("file:///home/user/site/hours.html?x=1", rule) == 0.0
    assert is_expected_active_tab("file:///home/user/site/contact.html", rule) == 0.0
    assert is_expected_active_tab(None, rule) == 0.0
    with pytest.raises(ValueError, match="unknown rule type 'title'"):
        is_expected_active_tab("x", {"type": "title", "title": "x"})


def test_browser_profile_reaches_no_network_and_starts_the_same(tmp_path: Path) -> None:
    profile = str(tmp_path / "profile")
    assert browser.with_profile(["firefox", "file:///home/user/a.html"], profile) == [
        "firefox-esr", "--no-remote", "--new-instance", "--profile", profile, "file:///home/user/a.html"]
    assert browser.with_profile(["xterm"], profile) == ["xterm"]
    (tmp_path / "profile").mkdir()
    (tmp_path / "profile" / "places.sqlite").write_text("from the last episode")
    browser.write_profile(profile, "/home/user")
    assert os.listdir(profile) == ["user.js"]
    prefs = {json.loads(k): json.loads(v) for k, v in (line[len("user_pref("):-len(");")].split(", ", 1) for line in
                                                        (tmp_path / "profile" / "user.js").read_text().splitlines())}
    assert {k: v for k, v in prefs.items() if k.startswith("network.proxy.")} == {
        "network.proxy.type": 1, "network.proxy.http": "127.0.0.1", "network.proxy.http_port": 9,
        "network.proxy.ssl": "127.0.0.1", "network.proxy.ssl_port": 9, "network.proxy.socks": "127.0.0.1",
        "network.proxy.socks_port": 9, "network.proxy.no_proxies_on": "", "network.proxy.allow_hijacking_localhost": True}
    assert prefs["network.dns.disabled"] is True and prefs["browser.download.dir"] == "/home/user/Downloads"


def test_chromium_thunderbird_gimp_and_vlc_start_without_dialogs_or_network(tmp_path: Path) -> None:
    home = str(tmp_path)
    chromium = programs.command(["chromium", "--remote-debugging-port=1337", "file:///home/user/a.html"], home)
    assert chromium[0] == "/usr/lib/chromium/chromium" and chromium[-2:] == ["--remote-debugging-port=1337",
                                                                             "file:///home/user/a.html"]
    assert {"--no-sandbox", "--test-type", "--no-first-run", "--proxy-server=127.0.0.1:9",
            "--proxy-bypass-list=<-loopback>"} <= set(chromium)
    profile = f"{home}/.thunderbird/parity.default"
    assert programs.command(["thunderbird"], home) == ["thunderbird", "--no-remote", "--profile", profile]
    prefs = (tmp_path / ".thunderbird" / "parity.default" / "user.js").read_text()
    assert 'user_pref("mail.server.server1.type", "none");' in prefs  # Local Folders: no account wizard
    assert 'user_pref("network.dns.disabled", true);' in prefs
    (tmp_path / ".config" / "vlc").mkdir(parents=True)
    (tmp_path / ".config" / "vlc" / "vlcrc").write_text("[qt]\nqt-minimal-view=1\n")  # a task's own settings stay
    assert programs.command(["vlc", "a.mp4"], home) == ["vlc", "a.mp4"]
    assert (tmp_path / ".config" / "vlc" / "vlcrc").read_text() == "[qt]\nqt-minimal-view=1\n"
    assert programs.command(["gimp", "a.png"], home) == ["gimp", "--no-splash", "a.png"]
    assert programs.command(["xterm"], home) == ["xterm"]


def test_browser_places_are_read_from_a_copy_with_its_log(tmp_path: Path) -> None:
    assert browser.places(str(tmp_path), "bookmarks") == []  # before the browser made its database
    conn = sqlite3.connect(tmp_path / "places.sqlite")
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA wal_autocheckpoint=0")  # the rows stay in places.sqlite-wal, as while Firefox runs
    conn.executescript("""
        CREATE TABLE moz_places (id INTEGER PRIMARY KEY, url TEXT, title TEXT);
        CREATE TABLE moz_bookmarks (id INTEGER PRIMARY KEY, type INTEGER, fk INTEGER, title TEXT);
        CREATE TABLE moz_historyvisits (id INTEGER PRIMARY KEY, place_id INTEGER);
        INSERT INTO moz_places VALUES (1, 'file:///home/user/a.html', 'A'), (2, 'file:///home/user/b.html', NULL);
        INSERT INTO moz_bookmarks VALUES (1, 2, NULL, 'toolbar'), (2, 1, 2, 'Weekly recipes');
        INSERT INTO moz_historyvisits VALUES (1, 1);
    """)
    conn.commit()
    assert (tmp_path / "places.sqlite-wal").stat().st_size > 0
    assert browser.places(str(tmp_path), "bookmarks") == [{"url": "file:///home/user/b.html", "title": "Weekly recipes"}]
    assert browser.places(str(tmp_path), "history") == [{"url": "file:///home/user/a.html", "title": "A"}]
    conn.close()


def _xlsx(path: Path, rows: list[list], title: str = "Sheet1") -> str:
    wb = openpyxl.Workbook()
    wb.active.title = title
    for row in rows:
        wb.active.append(row)
    wb.save(path)
    return str(path)


def test_compare_table_reads_xlsx_with_osworld_rules(tmp_path: Path) -> None:
    got = _xlsx(tmp_path / "r.xlsx", [["item", "cost"], ["rent", 900.00001], ["total", 1200]])
    gold = _xlsx(tmp_path / "e.xlsx", [["item", "cost"], ["rent", 900], ["total", 1200]])
    off = _xlsx(tmp_path / "o.xlsx", [["item", "cost"], ["rent", 900], ["total", 1201]], title="Other")
    data = {"rules": [{"type": "sheet_data", "sheet_idx0": 0, "sheet_idx1": "EI0"}]}
    assert compare_table(got, gold, **data) == 1.0 and compare_table(got, off, **data) == 0.0
    assert compare_table(got, gold, rules=[{"type": "sheet_data", "sheet_idx0": "RNSheet1", "sheet_idx1": "ENSheet1",
                                            "precision": 6}]) == 0.0  # 900.00001 differs at 6 digits
    assert compare_table(got, gold, rules=[{"type": "sheet_name"}]) == 1.0
    assert compare_table(got, off, rules=[{"type": "sheet_name"}]) == 0.0
    cell = {"type": "check_cell", "sheet_idx": 0, "coordinate": "B3"}
    assert compare_table(got, rules=[{**cell, "props": {"value": {"method": "eq", "ref": 1200}}}]) == 1.0
    assert compare_table(got, rules=[{**cell, "props": {"value": {"method": "gt", "ref": 1200}}}]) == 0.0
    assert compare_table(got, rules=[{**cell, "coordinate": "B2",
                                      "props": {"value": {"method": "approx:0.01", "ref": 900}}}]) == 1.0
    assert compare_table(None, gold, **data) == 0.0
    (tmp_path / "bad.xlsx").write_text("not a zip")
    assert compare_table(str(tmp_path / "bad.xlsx"), gold, **data) == 0.0


def _docx(path: Path, paras: list[str]) -> docx.document.Document:
    d = docx.Document()
    for p in paras:
        d.add_paragraph(p)
    d.save(path)
    return d


def test_document_metrics_read_docx_and_odt(tmp_path: Path) -> None:
    one, two = tmp_path / "1.docx", tmp_path / "2.docx"
    _docx(one, ["Title", "Body  text."])
    _docx(two, ["Title", "Body text.", ""])
    assert compare_docx_files(str(one), str(two)) == 1.0  # ignore_blanks by default
    assert compare_docx_files(str(one), str(two), ignore_blanks=False) == 0.0
    assert compare_docx_files(str(one), str(two), ignore_blanks=False, delete_empty_lines=True) == 0.0  # "  "
    odt = OpenDocumentText()
    for text in ("Title", "Body text."):
        odt.text.addElement(P(text=text))
    odt.save(str(tmp_path / "3.odt"))
    assert compare_docx_files(str(tmp_path / "3.odt"), str(two)) == 1.0
    assert compare_docx_files(str(one), str(tmp_path / "3.odt"), content_only=True) == 1.0  # "  " collapses
    _docx(two, ["Title", "Body test."])
    assert 0.9 < compare_docx_files(str(one), str(two), content_only=True) < 1.0  # a similarity ratio
    assert compare_docx_files(str(one), None) == 0.0
    d = _docx(one, ["Annual Report", "Text."])
    assert is_first_line_centered(str(one)) == 0.0 and contains_page_break(str(one)) == 0.0
    d.paragraphs[0].alignment = WD_PARAGRAPH_ALIGNMENT.CENTER
    d.paragraphs[1].paragraph_format.page_break_before = True
    d.save(one)
    assert is_first_line_centered(str(one)) == 1.0 and contains_page_break(str(one)) == 1.0
    assert contains_page_break(str(one), {"page_break_count": 2}) == 0.0


ROWS = [{"tag": "push-button", "name": f"B{i}", "text": "t\tx\ny", "class": "Button", "description": "",
         "x": i, "y": 2 * i, "w": 10, "h": 5} for i in range(100)]


def test_linearize_is_a_table_capped_by_tokens() -> None:
    text = linearize(ROWS, max_tokens=10_000)
    lines = text.split("\n")
    assert lines[0] == "tag\tname\ttext\tclass\tdescription\tposition\tsize"
    assert lines[4] == "push-button\tB3\tt x y\tButton\t\t(3, 6)\t(10, 5)"
    assert len(lines) == 101
    capped = linearize(ROWS, max_tokens=100)
    assert approx_tokens(capped) <= 100 + 20  # the last "more rows" line is extra
    assert capped.split("\n")[-1].startswith("... (") and "more rows cut at 100 tokens" in capped


def test_linearize_replaces_unprintable_characters() -> None:
    row = {**ROWS[0], "name": "caf\u00e9\x00"}
    assert "caf??" in linearize([row])


def test_libreoffice_runs_with_its_own_profile(tmp_path: Path) -> None:
    profile = str(tmp_path / "profile")
    assert with_profile(["libreoffice", "--calc", "b.xlsx"], profile) == [
        "soffice", "--calc", "b.xlsx", "--norestore", "--nologo", "--nolockcheck", f"-env:UserInstallation=file://{profile}"]
    assert with_profile(["xterm", "-e", "sh"], profile) == ["xterm", "-e", "sh"]
    (tmp_path / "profile").mkdir()
    (tmp_path / "profile" / "stale").write_text("from the last episode")
    write_profile(profile)
    assert os.listdir(profile) == ["user"]
    items = ElementTree.parse(tmp_path / "profile" / "user" / "registrymodifications.xcu").getroot()
    settings = {(i.get("{http://openoffice.org/2001/registry}path"), i[0].get("{http://openoffice.org/2001/registry}name")):
                i[0][0].text for i in items}
    assert settings[("/org.openoffice.Office.Common/Save/Document", "WarnAlienFormat")] == "false"
    assert settings[("/org.openoffice.Office.Calc/Input", "AutoInput")] == "false"
