"""`parity/Desktop-v0` end to end on the local (bubblewrap) backend: real Xvfb, openbox, apps."""

from __future__ import annotations

import json
import os
import signal
import struct
import threading
import time
import zlib
from collections.abc import Iterator
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
from desktop_support import check_solutions, guest_pid, needs_apps, needs_desktop, task_param

import parity.envs.desktop  # noqa: F401 - registers parity/Desktop-v0
from parity.envs.desktop.client import DesktopRequestError
from parity.envs.desktop.env import DesktopEnv
from parity.envs.desktop.getters import GETTERS, EvalContext
from parity.envs.desktop.sample import CI_SAMPLE
from parity.envs.desktop.sandbox import DesktopSandbox, pick_backend
from parity.envs.desktop.solutions import TARGET_WAIT_S, play, resolve_when_shown
from parity.envs.desktop.tasks import SolutionError, load_tasks

pytestmark = needs_desktop
TASKS = load_tasks()


@pytest.fixture(scope="module")
def screen_env() -> Iterator[DesktopEnv]:
    """Screenshots only: the scripted solutions read the tree where a step names a target,
    and no observation pays for a full tree read (a second or more per LibreOffice step)."""
    e = DesktopEnv(backend="local", obs_mode="screenshot")
    yield e
    e.close()


@pytest.mark.parametrize("task_id", [task_param(t) for t in TASKS if t.id in CI_SAMPLE])
def test_sample_oracle_scores_one_and_wrong_scores_zero(screen_env: DesktopEnv, task_id: str) -> None:
    """CI's sample (`sample.CI_SAMPLE`: every app, getter and metric at least once)."""
    check_solutions(screen_env, task_id)


@pytest.mark.desktop_full
@pytest.mark.parametrize("task_id", [task_param(t) for t in TASKS])
def test_every_oracle_scores_one_and_wrong_scores_zero(screen_env: DesktopEnv, task_id: str) -> None:
    """Every task (`pytest -m desktop_full`; not run by default, nor in CI)."""
    check_solutions(screen_env, task_id)


def test_a_target_not_shown_is_waited_for_then_named(screen_env: DesktopEnv) -> None:
    screen_env.reset(options={"task_id": "textedit-new-file"})
    step = {"action": {"action_type": "CLICK", "parameters": {}}, "target": {"name": "Save", "tag": "push-button"}}
    assert resolve_when_shown(screen_env, step)["parameters"].keys() == {"x", "y"}  # type: ignore[index]
    start = time.monotonic()
    with pytest.raises(SolutionError, match=r"target \{'name': 'Publish'\} not in the accessibility tree: \['Text Editor"):
        resolve_when_shown(screen_env, {**step, "target": {"name": "Publish"}})
    assert time.monotonic() - start >= TARGET_WAIT_S


def test_registration_and_the_tree_only_observation() -> None:
    """gymnasium's check_env runs on the registered env in envs/tests/test_envs_cli.py;
    here the a11y_tree mode's observation fits its space."""
    env = gym.make("parity/Desktop-v0", obs_mode="a11y_tree", backend="local").unwrapped
    assert isinstance(env, DesktopEnv) and env.sandbox is None  # nothing runs before reset
    try:
        obs, _ = env.reset(seed=0, options={"task_id": "terminal-write-answer"})
        assert set(obs) == {"instruction", "feedback", "accessibility_tree"}
        assert env.observation_space.contains(obs) and "xterm" in obs["accessibility_tree"]
    finally:
        env.close()


def test_observation_is_screen_and_tree(env: DesktopEnv) -> None:
    obs, _ = env.reset(options={"task_id": "textedit-new-file"})
    assert obs["screenshot"].shape == (768, 1024, 3) and obs["screenshot"].dtype == np.uint8
    assert obs["instruction"].startswith("In the text editor")
    lines = obs["accessibility_tree"].split("\n")
    assert lines[0] == "tag\tname\ttext\tclass\tdescription\tposition\tsize"
    assert lines[1].startswith("window\tText Editor - hello.txt\t\tWindow\tactive\t")
    assert "push-button\tSave\t" in obs["accessibility_tree"]
    before = obs["screenshot"]
    obs, *_ = env.step('{"action_type": "TYPING", "parameters": {"text": "abc"}}')
    assert (obs["screenshot"] != before).any()  # the step waited for the screen to change and settle
    assert "text\tDocument\tabc\tText\tfocused" in obs["accessibility_tree"]
    png = env.client.screenshot_png()  # type: ignore[union-attr]
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and struct.unpack(">II", png[16:24]) == (1024, 768)
    raw = zlib.decompress(png[png.index(b"IDAT") + 4 : png.index(b"IEND") - 8])
    rows = np.frombuffer(raw, np.uint8).reshape(768, 1 + 1024 * 3)[:, 1:].reshape(768, 1024, 3)
    assert (rows == env.client.screenshot()).all()  # type: ignore[union-attr]


def test_reset_gives_the_same_screen(env: DesktopEnv) -> None:
    first, _ = env.reset(options={"task_id": "settings-dark-mode"})
    env.step('{"action_type": "CLICK", "parameters": {"x": 40, "y": 35}}')
    second, _ = env.reset(options={"task_id": "settings-dark-mode"})
    assert (first["screenshot"] == second["screenshot"]).all()
    assert first["accessibility_tree"] == second["accessibility_tree"]


@pytest.mark.parametrize(("action", "message"), [
    ("{not json", "error: malformed JSON action"),
    ('{"action_type": "CLICK", "parameters": {"x": 99999, "y": 1}}', "error: coordinate x=99999 is off screen"),
    ("pyautogui.press('warp')", "error: unknown key name 'warp'"),
    ("import os; os.remove('x')", "error: only pyautogui.<function>(...) calls are allowed"),
])
def test_bad_actions_give_error_observations(env: DesktopEnv, action: str, message: str) -> None:
    env.reset(options={"task_id": "terminal-write-answer"})
    obs, reward, terminated, truncated, info = env.step(action)
    assert obs["feedback"].startswith(message) and info["error"] == obs["feedback"]
    assert (reward, terminated, truncated) == (0.0, False, False)
    obs, *_ = env.step('{"action_type": "TYPING", "parameters": {"text": "echo 42 > ~/answer.txt\\n"}}')
    assert obs["feedback"] == ""
    assert env.step("DONE")[1] == 1.0


def test_guest_refuses_what_the_parser_would_never_send(env: DesktopEnv) -> None:
    env.reset(options={"task_id": "terminal-write-answer"})
    for op, message in (({"op": "exec", "cmd": "id"}, "unknown operation 'exec'"),
                        ({"op": "click", "x": 5000, "y": 1}, "x=5000 is off screen"),
                        ({"op": "key", "keys": ["Return;id"]}, "is not an allowed key")):
        with pytest.raises(DesktopRequestError, match=message):
            env.client.action(op)  # type: ignore[union-attr]


def test_max_steps_truncates_and_evaluates() -> None:
    env = DesktopEnv(tasks=[t for t in load_tasks() if t.id == "terminal-write-answer"], backend="local",
                     max_steps=2)
    try:
        env.reset()
        assert env.step("WAIT")[2:4] == (False, False)
        _, reward, terminated, truncated, _ = env.step('{"action_type": "TYPING", "parameters": {"text": "echo 42 > ~/answer.txt\\n"}}')
        assert (reward, terminated, truncated) == (1.0, False, True)
        with pytest.raises(RuntimeError, match="call reset"):
            env.step("DONE")
    finally:
        env.close()


def test_fail_action_scores_zero_on_a_feasible_task(env: DesktopEnv) -> None:
    env.reset(options={"task_id": "terminal-write-answer"})
    env.step('{"action_type": "TYPING", "parameters": {"text": "echo 42 > ~/answer.txt\\n"}}')
    assert env.step("FAIL")[1:3] == (0.0, True)


def test_crashed_app_leaves_a_working_desktop(env: DesktopEnv) -> None:
    env.reset(options={"task_id": "files-new-folder"})
    os.kill(guest_pid(env.sandbox.guest.pid, "guest.apps.files"), signal.SIGKILL)  # type: ignore[union-attr]
    obs, _, terminated, _, info = env.step("WAIT")
    assert "error" not in info and not terminated
    assert "Files -" not in obs["accessibility_tree"]
    assert play(env, "files-new-folder", "oracle")[0] == 1.0


def test_hung_app_is_reported_not_waited_for(env: DesktopEnv) -> None:
    env.reset(options={"task_id": "settings-dark-mode"})
    pid = guest_pid(env.sandbox.guest.pid, "guest.apps.settings")  # type: ignore[union-attr]
    os.kill(pid, signal.SIGSTOP)
    try:
        obs, _, terminated, _, info = env.step('{"action_type": "CLICK", "parameters": {"x": 30, "y": 40}}')
        assert not terminated and "error" not in info
        assert "\tnot responding\t" in obs["accessibility_tree"]
    finally:
        os.kill(pid, signal.SIGCONT)
    assert play(env, "settings-dark-mode", "oracle")[0] == 1.0  # reset killed the hung app


def test_dead_x_server_ends_the_episode_and_the_next_starts_fresh() -> None:
    env = DesktopEnv(backend="local", obs_mode="screenshot_a11y_tree")
    try:
        env.reset(options={"task_id": "textedit-new-file"})
        old_socket = env.sandbox.socket  # type: ignore[union-attr]
        os.kill(guest_pid(env.sandbox.guest.pid, "Xvfb :0"), signal.SIGKILL)  # type: ignore[union-attr]
        obs, reward, terminated, truncated, info = env.step("pyautogui.write('x')")
        assert (reward, terminated, truncated) == (0.0, True, False)
        assert "X server exited" in info["failure"] and obs["feedback"].startswith("error: the desktop failed")
        assert env.sandbox is None and not os.path.exists(old_socket)
        assert play(env, "textedit-new-file", "oracle")[0] == 1.0
        assert env.sandbox.socket != old_socket  # type: ignore[union-attr]
    finally:
        env.close()


def test_killed_sandbox_is_replaced_on_reset() -> None:
    env = DesktopEnv(backend="local")
    try:
        env.reset(options={"task_id": "terminal-make-folder"})
        os.kill(env.sandbox.guest.pid, signal.SIGKILL)  # type: ignore[union-attr, arg-type]
        while env.sandbox.running():  # type: ignore[union-attr]
            time.sleep(0.01)
        _, reward, terminated, _, info = env.step("WAIT")
        assert terminated and reward == 0.0 and "failure" in info
        assert play(env, "terminal-make-folder", "oracle")[0] == 1.0
    finally:
        env.close()


def test_sandbox_is_isolated(env: DesktopEnv) -> None:
    env.reset(options={"task_id": "terminal-write-answer"})
    out = env.client.setup({"type": "execute", "parameters": {  # type: ignore[union-attr]
        "command": "id -u; ls /root; cat /etc/shadow; ls /work; cat /proc/net/dev | wc -l; ls /", "shell": True}})
    lines = out["stdout"].split("\n")
    assert lines[0] == "1000"
    assert "No such file" in out["stderr"] and "/etc/shadow" in out["stderr"] and "/work" in out["stderr"]
    assert lines[1] == "3"  # header lines + loopback only: no network interfaces
    assert "root" not in lines[2:] and "work" not in lines[2:]


def test_several_desktops_at_once() -> None:
    envs = [DesktopEnv(backend="local") for _ in range(3)]
    results: dict[int, float] = {}

    def run(i: int) -> None:
        results[i] = play(envs[i], ["textedit-new-file", "sheet-add-row", "files-rename"][i], "oracle")[0]

    try:
        threads = [threading.Thread(target=run, args=(i,)) for i in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert results == {0: 1.0, 1: 1.0, 2: 1.0}
        assert len({e.sandbox.socket for e in envs}) == 3  # type: ignore[union-attr]
    finally:
        for e in envs:
            e.close()


def test_timing_is_reported_per_step(env: DesktopEnv) -> None:
    env.reset(options={"task_id": "terminal-write-answer"})
    assert set(env.last_timing) == {"sandbox_s", "reset_s", "setup_s", "tree_s", "screenshot_s"}
    env.step("WAIT")
    t = env.last_timing
    assert t["action_s"] >= 1.0  # WAIT waits a second, then the screen settles
    assert t["step_s"] >= t["action_s"] + t["settle_s"]
    assert json.dumps(t)


def test_auto_backend_falls_back_to_local_without_an_engine(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-engine.sock")
    assert pick_backend("auto") == "local"
    assert pick_backend("local") == "local" and pick_backend("docker") == "docker"
    with pytest.raises(ValueError, match="backend must be 'local', 'docker' or 'auto', got 'vm'"):
        DesktopSandbox("vm")


def test_a_busy_app_does_not_stall_steps_and_reset_stops_it(env: DesktopEnv) -> None:
    env.reset(options={"task_id": "terminal-write-answer"})
    env.client.setup({"type": "launch", "parameters": {  # type: ignore[union-attr]
        "command": ["terminal", "-e", "sh", "-c", "while :; do date +%N; done"]}})
    done = env.client.action({"op": "move", "x": 5, "y": 5})  # type: ignore[union-attr]
    assert done["ok"] is True  # settling gave up at its bound (see test_desktop_screen.py)
    quiet = env.reset(options={"task_id": "terminal-write-answer"})  # reset kills the noisy app
    assert quiet[0]["accessibility_tree"].count("\nwindow\t") == 1


def test_broken_config_step_names_the_task_and_step(env: DesktopEnv) -> None:
    task = next(t for t in load_tasks() if t.id == "terminal-write-answer")
    broken = type(task)(**{**task.__dict__, "id": "broken", "config": [
        {"type": "launch", "parameters": {"command": ["/nonexistent/app"]}}]})
    env.tasks.append(broken)
    try:
        with pytest.raises(RuntimeError, match=r"task broken: config\[0\] \(launch\) failed: launch '/nonexistent/app'"):
            env.reset(options={"task_id": "broken"})
        assert play(env, "terminal-write-answer", "oracle")[0] == 1.0
    finally:
        env.tasks.remove(broken)


@pytest.mark.parametrize("task_id", [pytest.param("calc-total-row", marks=needs_apps(["libreoffice_calc"]))])
def test_a_real_app_is_fully_drawn_in_the_first_observation(env: DesktopEnv, task_id: str) -> None:
    obs, _ = env.reset(options={"task_id": task_id})
    assert obs["accessibility_tree"].split("\n")[1].startswith("window\tcalc-total-row.xlsx - LibreOffice Calc\t")
    time.sleep(1.5)
    assert (env.client.screenshot() == obs["screenshot"]).all()  # type: ignore[union-attr]  # nothing left to draw


def test_a_task_folder_with_an_app_that_fails_names_it_and_the_desktop_goes_on(tmp_path) -> None:
    (tmp_path / "bad.json").write_text(json.dumps({
        "id": "no-such-app", "instruction": "x", "config": [{"type": "launch", "parameters": {"command": ["no-such-app"]}}],
        "evaluator": {"func": "infeasible"}}))
    (tmp_path / "good.json").write_text(json.dumps({
        "id": "answer", "instruction": "x", "config": [{"type": "execute", "parameters": {"command": "echo 42 > a", "shell": True}}],
        "evaluator": {"func": "exact_match", "result": {"type": "vm_command_line", "command": ["cat", "a"]},
                      "expected": {"type": "rule", "rules": {"expected": "42\n"}}}}))
    env = DesktopEnv(backend="local", task_dir=tmp_path)
    try:
        with pytest.raises(RuntimeError, match=r"task no-such-app: config\[0\] \(launch\) failed: launch 'no-such-app': "
                                               r"\[Errno 2\] No such file or directory"):
            env.reset(options={"task_id": "no-such-app"})
        pid = env.sandbox.guest.pid  # type: ignore[union-attr]
        env.reset(options={"task_id": "answer"})
        assert env.sandbox.guest.pid == pid  # the same desktop, reset in place  # type: ignore[union-attr]
        assert env.step("DONE")[1] == 1.0
    finally:
        env.close()
    assert not os.path.exists(f"/proc/{pid}")  # nothing left behind


def _osworld_calc_task(folder, postconfig: list[dict]) -> None:
    """An OSWorld-shaped Calc task in `folder`: its files are the shipped calc-fix-cell ones."""
    shipped = load_tasks()[0].files_dir
    (folder / "files").mkdir()
    for name in ("calc-fix-cell.xlsx", "calc-fix-cell-gold.xlsx"):
        (folder / "files" / name).write_bytes((shipped / name).read_bytes())
    drive = "https://drive.usercontent.google.com/download?id={}&export=download"
    (folder / "fix.json").write_text(json.dumps({
        "id": "fix", "snapshot": "libreoffice_calc", "instruction": "Set B3 to 350.", "source": "test",
        "config": [{"type": "download", "parameters": {"files": [
                       {"url": drive.format("a"), "path": "/home/user/calc-fix-cell.xlsx"}]}},
                   {"type": "open", "parameters": {"path": "/home/user/calc-fix-cell.xlsx"}}],
        "evaluator": {"postconfig": postconfig, "func": "compare_table",
                      "result": {"type": "vm_file", "path": "/home/user/calc-fix-cell.xlsx", "dest": "calc-fix-cell.xlsx"},
                      "expected": {"type": "cloud_file", "path": drive.format("b"), "dest": "calc-fix-cell-gold.xlsx"},
                      "options": {"rules": [{"type": "sheet_data", "sheet_idx0": 0, "sheet_idx1": "EI0"}]}}}))


SAVE_SCRIPT = ("import pyautogui; import time; pyautogui.hotkey('ctrl', 's'); time.sleep(0.5); "
               "pyautogui.press('enter');")


@pytest.mark.parametrize(("script", "reward"), [
    pytest.param(SAVE_SCRIPT, 1.0, marks=needs_apps(["libreoffice_calc"]), id="postconfig-saves"),
    pytest.param("import pyautogui, os; os.system('rm calc-fix-cell.xlsx')", 0.0,
                 marks=needs_apps(["libreoffice_calc"]), id="other-python-is-refused"),
])
def test_osworld_postconfig_pyautogui_script_runs_as_actions(tmp_path, script: str, reward: float) -> None:
    _osworld_calc_task(tmp_path, [
        {"type": "activate_window", "parameters": {"window_name": "calc-fix-cell.xlsx - LibreOffice Calc", "strict": True}},
        {"type": "execute", "parameters": {"command": ["python", "-c", script]}}])
    env = DesktopEnv(backend="local", task_dir=tmp_path)
    try:
        env.reset(options={"task_id": "fix"})
        for action in ("pyautogui.hotkey('ctrl', 'home')", "pyautogui.press('down', presses=2)",
                       "pyautogui.press('right')", "pyautogui.typewrite('350')", "pyautogui.press('enter')"):
            assert "error" not in env.step(action)[4]
        assert env.step("DONE")[1] == reward  # the agent never saved: the postconfig does, or nothing
        assert env.client.file("~/calc-fix-cell.xlsx")["exists"] is True  # type: ignore[union-attr]
    finally:
        env.close()


@pytest.mark.parametrize("task_id", [pytest.param("pcmanfm-rename", marks=needs_apps(["pcmanfm", "atspi"]))])
def test_real_app_tree_comes_through_atspi(env: DesktopEnv, task_id: str) -> None:
    obs, _ = env.reset(options={"task_id": task_id})
    rows = env.rows()
    assert rows[0]["tag"] == "window" and rows[0]["name"] == "work" and rows[0]["description"] == "active"
    atspi = [r for r in rows if r["class"] == "atspi"]
    assert {("menu", "File"), ("menu", "Edit")} <= {(r["tag"], r["name"]) for r in atspi}
    assert all(r["w"] > 0 and r["h"] > 0 and 0 <= r["x"] < 1024 and 0 <= r["y"] < 768 for r in atspi)
    assert "\tdraft.txt\t" in obs["accessibility_tree"]  # the file in the folder view
    env.step("pyautogui.hotkey('ctrl', 'a')")
    assert [r["description"] for r in env.rows() if r["tag"] == "icon" and r["text"] == "draft.txt"] == ["selected"]


@pytest.mark.parametrize("task_id", [pytest.param("pcmanfm-rename", marks=needs_apps(["pcmanfm", "atspi"]))])
def test_a_desktop_that_lost_its_tree_is_replaced_at_reset(env: DesktopEnv, task_id: str) -> None:
    env.reset(options={"task_id": task_id})
    old = env.sandbox
    for bus in ("at-spi-bus-launcher", "accessibility.conf"):  # the AT-SPI bus and its launcher
        os.kill(guest_pid(old.guest.pid, bus), signal.SIGKILL)  # type: ignore[union-attr]
    obs, _ = env.reset(options={"task_id": task_id})
    assert env.sandbox is not old and not old.running()  # type: ignore[union-attr]
    assert env.last_timing["sandbox_s"] > 0
    assert "\tdraft.txt\t" in obs["accessibility_tree"]
    assert play(env, task_id, "oracle")[0] == 1.0


@pytest.mark.parametrize("task_id", [pytest.param("browser-follow-link", marks=needs_apps(["firefox", "atspi"]))])
def test_browser_shows_local_pages_only(env: DesktopEnv, task_id: str) -> None:
    obs, _ = env.reset(options={"task_id": task_id})
    assert env.client.windows()["active"] == "Corner shop — Mozilla Firefox"  # type: ignore[union-attr]
    assert "link\tOpening hours\tOpening hours\tatspi\t" in obs["accessibility_tree"]  # its AT-SPI tree
    ctx = EvalContext(env.client, Path("/tmp"), env.task.files_dir)  # type: ignore[arg-type, union-attr]
    env.step("pyautogui.hotkey('ctrl', 'l')")
    assert GETTERS["active_url_from_accessTree"](ctx, {}) is None  # the address bar is being edited
    env.step('{"action_type": "TYPING", "parameters": {"text": "http://example.com/"}}')
    env.step("pyautogui.press('enter')")
    assert env.client.windows()["active"] == "Problem loading page — Mozilla Firefox"  # type: ignore[union-attr]
    headings = [r["name"] for r in env.rows() if r["tag"] == "heading"]
    assert headings[0] == "The proxy server is refusing connections"  # the profile's proxy on a closed port
    assert GETTERS["active_url_from_accessTree"](ctx, {}) == "http://example.com/"
    assert GETTERS["browser_history"](ctx, {}) == ["file:///home/user/site/index.html"]


@pytest.mark.parametrize("task_id", [pytest.param("browser-bookmark-page", marks=needs_apps(["firefox", "atspi"]))])
def test_reset_observes_the_page_firefox_builds_its_tree_for_once_asked(env: DesktopEnv, task_id: str) -> None:
    """Firefox makes a page's accessible objects on the first AT-SPI read, after its screen went
    still: a reset reads until the tree holds still, so its first observation has the page and
    the same task gives the same observation (gymnasium's determinism check)."""
    trees = [env.reset(options={"task_id": task_id})[0]["accessibility_tree"] for _ in range(2)]
    assert "document-web\tRecipes\t" in trees[0]
    assert trees[0] == trees[1]


@pytest.mark.parametrize("task_id", [pytest.param("calc-max", marks=needs_apps(["libreoffice_calc", "atspi"]))])
def test_libreoffice_tree_comes_through_atspi(env: DesktopEnv, task_id: str) -> None:
    env.reset(options={"task_id": task_id})
    rows = env.rows()
    assert rows[0]["name"] == "calc-max.xlsx - LibreOffice Calc" and rows[0]["description"] == "active"
    atspi = {(r["tag"], r["name"]) for r in rows if r["class"] == "atspi"}
    assert {("menu", "File"), ("push-button", "Save"), ("toggle-button", "Bold")} <= atspi  # the GTK 3 plugin's tree
    name_box = [r["text"] for r in rows if r["tag"] == "text" and r["y"] < 200 and r["text"] in ("A1", "B5")]
    assert name_box == ["A1"]
    env.step("pyautogui.hotkey('ctrl', 'home')")
    env.step("pyautogui.press('right')")
    env.step("pyautogui.press('down', presses=4)")
    assert [r["text"] for r in env.rows() if r["tag"] == "text" and r["y"] < 200 and r["text"] in ("A1", "B5")] == ["B5"]


@pytest.mark.parametrize("tasks", [pytest.param(["files-rename", "mousepad-append-line"], marks=needs_apps(["mousepad"]))])
def test_bench_desktop_times_each_phase_per_app_and_each_concurrency_level(tasks: list[str]) -> None:
    from parity.envs.desktop.bench import PHASES, run_benchmark
    from parity.envs.desktop.cli import report

    r = run_benchmark("local", levels=(2,), office_levels=(), real_levels=(1,), task_ids=tasks)
    s = r["settle"]
    assert (s["episodes"], s["success_rate"], s["failed"], list(r["by_app"])) == (2, 1.0, [], ["files", "mousepad"])
    assert r["wrong"] == {"episodes": 2, "scored_above_zero": []}
    steps = sum(len(t.solutions["oracle"]) + 1 for t in load_tasks() if t.id in tasks)  # + DONE
    assert s["steps"] == steps and sum(s["breakdown_share"][p] for p in PHASES) == pytest.approx(1.0, abs=1e-9)
    assert all(a["reset_p50_s"] > 0 and a["breakdown_mean_s"]["settle_s"] > 0 for a in r["by_app"].values())
    assert r["fixed_sleep"]["tasks"] == ["files-rename"] and r["fixed_sleep"]["step_p50_s"] >= 2.0
    (light,) = r["concurrency"]
    assert (light["desktops"], light["success_rate"], r["office_concurrency"]) == (2, 1.0, [])
    assert r["real_concurrency"]["tasks"] == ["mousepad-append-line"]
    assert r["real_concurrency"]["levels"][0]["success_rate"] == 1.0 and r["errors"] == []
    fits = {k: r[f"max_concurrent{k}_desktops_within_budget"] for k in ("", "_office", "_real")}
    assert fits[""] in (0, 2) and fits["_office"] == 0 and fits["_real"] in (0, 1)
    line = f"  1 real-app desktops at once: step p50 {r['real_concurrency']['levels'][0]['step_p50_s'] * 1e3:.0f} ms, "
    assert sum(text.startswith(line) for text in report(r).split("\n")) == 1
    assert "  2 wrong-solution episodes, all scored 0" in report(r).split("\n")


def test_bench_desktop_names_the_tasks_that_scored_below_one() -> None:
    from parity.envs.desktop.bench import PHASES, RESET_PHASES, _summary
    from parity.envs.desktop.cli import _failed

    reset = {p: 0.1 for p in RESET_PHASES} | {"reset_s": 0.1, "setup_s": 0.1, "sandbox_s": 0.0}
    step = {p: 0.01 for p in PHASES} | {"step_s": 0.06}
    played = [("b-task", 0.0, [reset, step]), ("a-task", 1.0, [reset, step]), ("c-task", 0.0, [])]
    s = _summary(played)
    assert (s["episodes"], s["steps"], s["failed"]) == (3, 2, ["b-task", "c-task"])
    assert _failed(s) == " (scored below 1: b-task, c-task)" and _failed(_summary(played[1:2])) == ""
