"""Firefox ESR in the desktop: its command line, a fresh profile that reaches no network, and
reading the browser's saved state (bookmarks, history) for evaluation.

The profile lives outside the home (in the run folder) and is written afresh at every reset.
Its prefs (user.js) send every non-file URL to a proxy on a closed local port with DNS off,
so only local pages (file://, about:) load even outside a network-less sandbox, and switch
off what would phone home or change the screen by itself (first-run pages, telemetry, update
and safe-browsing checks, suggestions while typing, animations, session restore). Downloads
go to ~/Downloads without asking.

`python3 -m guest.browser bookmarks|history` prints the saved bookmarks or visited pages as
JSON ([{"url", "title"}]), read from a copy of places.sqlite (Firefox keeps it locked).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sqlite3
import sys
import tempfile

PROFILE_ENV = "PARITY_BROWSER_PROFILE"
"""The environment variable that tells apps and the query command where the profile is."""

_PREFS: dict[str, bool | int | str] = {
    # only local pages: every proxied protocol goes to a closed port, no DNS, localhost too
    "network.proxy.type": 1, "network.proxy.http": "127.0.0.1", "network.proxy.http_port": 9,
    "network.proxy.ssl": "127.0.0.1", "network.proxy.ssl_port": 9, "network.proxy.socks": "127.0.0.1",
    "network.proxy.socks_port": 9, "network.proxy.no_proxies_on": "", "network.proxy.allow_hijacking_localhost": True,
    "network.dns.disabled": True, "network.prefetch-next": False, "network.predictor.enabled": False,
    "network.http.speculative-parallel-limit": 0, "network.captive-portal-service.enabled": False,
    "network.connectivity-service.enabled": False, "keyword.enabled": False, "browser.fixup.alternate.enabled": False,
    # nothing that calls home
    "app.update.auto": False, "app.normandy.enabled": False, "app.shield.optoutstudies.enabled": False,
    "datareporting.policy.dataSubmissionEnabled": False, "datareporting.healthreport.uploadEnabled": False,
    "toolkit.telemetry.enabled": False, "toolkit.telemetry.reportingpolicy.firstRun": False,
    "extensions.update.enabled": False, "extensions.getAddons.cache.enabled": False,
    "browser.safebrowsing.malware.enabled": False, "browser.safebrowsing.phishing.enabled": False,
    "browser.safebrowsing.downloads.enabled": False, "browser.region.update.enabled": False,
    "identity.fxaccounts.enabled": False, "extensions.pocket.enabled": False, "browser.translations.enable": False,
    "browser.search.suggest.enabled": False, "browser.ml.chat.enabled": False,
    # the same window at every start: no first-run or what's-new pages, a blank start page
    "browser.shell.checkDefaultBrowser": False, "browser.startup.homepage_override.mstone": "ignore",
    "browser.aboutwelcome.enabled": False, "startup.homepage_welcome_url": "",
    "startup.homepage_welcome_url.additional": "", "browser.startup.page": 0, "browser.newtabpage.enabled": False,
    "browser.newtab.preload": False, "browser.sessionstore.resume_from_crash": False,
    "browser.tabs.warnOnClose": False, "browser.warnOnQuit": False, "browser.aboutConfig.showWarning": False,
    "browser.uitour.enabled": False, "browser.discovery.enabled": False, "sidebar.revamp": False,
    "browser.toolbars.bookmarks.visibility": "never", "browser.tabs.firefox-view": False,
    "signon.rememberSignons": False, "browser.formfill.enable": False, "layout.spellcheckDefault": 0,
    # what is typed is what is loaded; the screen stays still when nothing happens
    "browser.urlbar.trimURLs": False, "browser.urlbar.suggest.history": False,
    "browser.urlbar.suggest.bookmark": False, "browser.urlbar.suggest.openpage": False,
    "browser.urlbar.suggest.topsites": False, "browser.urlbar.suggest.engines": False,
    "browser.urlbar.suggest.searches": False, "browser.urlbar.suggest.quicksuggest.sponsored": False,
    "browser.urlbar.suggest.quicksuggest.nonsponsored": False, "browser.urlbar.shortcuts.bookmarks": False,
    "toolkit.cosmeticAnimations.enabled": False, "ui.prefersReducedMotion": 1, "general.smoothScroll": False,
    # downloads go to ~/Downloads without a dialog or a panel popping up
    "browser.download.folderList": 2, "browser.download.useDownloadDir": True,
    "browser.download.always_ask_before_handling_new_types": False, "browser.download.alwaysOpenPanel": False,
    "browser.download.start_downloads_in_tmp_dir": False, "browser.download.manager.addToRecentDocs": False,
    "browser.helperApps.neverAsk.saveToDisk": "text/csv,text/plain,application/json,application/pdf,"
                                              "application/octet-stream,text/comma-separated-values",
    # as few processes as it runs with: the desktop has 1 CPU, 1 GB and 256 processes
    "dom.ipc.processCount": 1, "fission.autostart": False, "browser.tabs.unloadOnLowMemory": False,
    "dom.ipc.processPrelaunch.enabled": False,
    "extensions.webextensions.remote": False, "network.process.enabled": False, "media.rdd-process.enabled": False,
    "media.utility-process.enabled": False,
}



def command(profile: str) -> list[str]:
    """firefox-esr's command line with this profile, apart from any other Firefox running."""
    return ["firefox-esr", "--no-remote", "--new-instance", "--profile", profile]


def with_profile(argv: list[str], profile: str) -> list[str]:
    """A `firefox`/`firefox-esr` command line (as a task may launch it) with this profile;
    other command lines as they are."""
    if not argv or argv[0] not in ("firefox", "firefox-esr"):
        return argv
    return [*command(profile), *argv[1:]]


def write_profile(profile: str, home: str) -> None:
    """(Re)create the profile folder holding only user.js with the prefs above."""
    shutil.rmtree(profile, ignore_errors=True)
    os.makedirs(profile)
    prefs = {**_PREFS, "browser.download.dir": os.path.join(home, "Downloads")}
    with open(os.path.join(profile, "user.js"), "w", encoding="utf-8") as f:
        f.writelines(f"user_pref({json.dumps(k)}, {json.dumps(v)});\n" for k, v in prefs.items())


_QUERIES = {
    # folders and separators have no place (fk); Firefox's own default bookmarks are kept
    "bookmarks": "SELECT p.url, COALESCE(b.title, '') FROM moz_bookmarks b JOIN moz_places p ON p.id = b.fk "
                 "WHERE b.type = 1 ORDER BY b.id",
    "history": "SELECT p.url, COALESCE(p.title, '') FROM moz_places p "
               "WHERE EXISTS (SELECT 1 FROM moz_historyvisits v WHERE v.place_id = p.id) ORDER BY p.id",
}


def places(profile: str, what: str) -> list[dict[str, str]]:
    """The profile's bookmarks or visited pages, [{"url", "title"}]; [] before Firefox made the
    database. Read from a copy of the database and its write-ahead log: Firefox holds the
    original with an exclusive lock."""
    db = os.path.join(profile, "places.sqlite")
    if not os.path.exists(db):
        return []
    with tempfile.TemporaryDirectory() as tmp:
        for suffix in ("", "-wal"):
            if os.path.exists(db + suffix):
                shutil.copyfile(db + suffix, os.path.join(tmp, "places.sqlite" + suffix))
        with contextlib.closing(sqlite3.connect(os.path.join(tmp, "places.sqlite"))) as conn:
            return [{"url": url, "title": title} for url, title in conn.execute(_QUERIES[what])]


def main() -> None:
    if len(sys.argv) != 2 or sys.argv[1] not in _QUERIES:
        sys.exit(f"usage: python3 -m guest.browser {'|'.join(_QUERIES)}")
    print(json.dumps(places(os.environ[PROFILE_ENV], sys.argv[1])))


if __name__ == "__main__":
    main()
