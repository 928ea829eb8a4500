"""Chromium, Thunderbird, GIMP and VLC in the desktop: their command lines and the settings
that keep their first start free of dialogs and of the network.

Each keeps its settings where OSWorld's getters read them, in the home (which a reset
empties): Chromium's profile in ~/.config/chromium, Thunderbird's in
~/.thunderbird/parity.default, GIMP's in ~/.config/GIMP/2.10, VLC's in ~/.config/vlc/vlcrc.
A launch writes Thunderbird's and VLC's first settings there unless the task put its own there
first (a task may ship a mail folder or a vlcrc); Chromium and GIMP need none.

* Chromium runs its binary directly: Debian's /usr/bin/chromium wrapper reads /etc/chromium.d,
  which the local sandbox does not have. `--no-sandbox`: its own sandbox needs user
  namespaces or a setuid helper, which neither desktop sandbox gives (the desktop sandbox is
  the isolation); `--test-type` hides the warning bar that flag would show. Flags stand in for
  Chrome's policy files (/etc/chromium/policies is the host's, outside the sandbox): no
  first-run page, no default-browser question, no password keyring, no background network
  calls, and every request but file: and data: URLs goes to a proxy on a closed port.
* Thunderbird starts with its own profile (`--profile`: a newer Thunderbird ignores
  profiles.ini's default for a new installation) holding a "Local Folders" account, so no
  account wizard comes up, and prefs that switch off the start page, the default-client
  question, search indexing, updates and telemetry, with the same closed proxy and no DNS.
* VLC: its vlcrc says the privacy question was answered (metadata from the network off).
* GIMP: `--no-splash`; its first start copies /etc/gimp into the home (sandbox.py binds it).
"""

from __future__ import annotations

import json
import os

CHROMIUM = "/usr/lib/chromium/chromium"
CHROMIUM_FLAGS = (
    "--no-sandbox", "--test-type", "--no-first-run", "--no-default-browser-check", "--password-store=basic",
    "--disable-dev-shm-usage", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
    "--disable-sync", "--disable-breakpad", "--disable-features=Translate,MediaRouter,OptimizationHints",
    "--proxy-server=127.0.0.1:9", "--proxy-bypass-list=<-loopback>", "--force-renderer-accessibility",
)
"""Chromium's flags (see above); `--disable-dev-shm-usage`: /dev/shm is 64 MB on docker, so its
shared memory goes to /tmp instead."""
THUNDERBIRD_PROFILE = ".thunderbird/parity.default"
"""Thunderbird's profile, relative to the home; its mail is in `Mail/Local Folders`."""
_THUNDERBIRD_PREFS: dict[str, bool | int | str] = {
    "mail.accountmanager.accounts": "account1", "mail.accountmanager.localfoldersserver": "server1",
    "mail.account.account1.server": "server1", "mail.server.server1.type": "none",
    "mail.server.server1.hostname": "Local Folders", "mail.server.server1.name": "Local Folders",
    "mail.server.server1.userName": "nobody", "mail.server.server1.directory-rel": "[ProfD]Mail/Local Folders",
    "mail.provider.suppress_dialog_on_startup": True, "mailnews.start_page.enabled": False,
    "mailnews.start_page_override.mstone": "ignore", "mail.shell.checkDefaultClient": False,
    "mail.rights.version": 1, "app.donation.eoy.version.viewed": 999, "mail.spotlight.firstRunDone": True,
    "mailnews.database.global.indexer.enabled": False, "app.update.auto": False, "app.update.enabled": False,
    "extensions.update.enabled": False, "datareporting.policy.dataSubmissionEnabled": False,
    "datareporting.healthreport.uploadEnabled": False, "toolkit.telemetry.enabled": False,
    "network.proxy.type": 1, "network.proxy.socks": "127.0.0.1", "network.proxy.socks_port": 9,
    "network.proxy.http": "127.0.0.1", "network.proxy.http_port": 9, "network.proxy.ssl": "127.0.0.1",
    "network.proxy.ssl_port": 9, "network.proxy.no_proxies_on": "", "network.dns.disabled": True,
}
_VLCRC = "[qt]\nqt-privacy-ask=0\n[core]\nmetadata-network-access=0\n"
SLOW_STARTS = frozenset({"chromium", "thunderbird", "gimp"})
SLOW_START_S = 30.0
"""How long a launch of these waits for the first window (a Tk app's wait is 10 s): GIMP
queries its plug-ins in a new home, about 5 s on an idle core and more under load."""


def command(argv: list[str], home: str) -> list[str]:
    """A launch's command line for these programs (other command lines as they are); writes
    Thunderbird's or VLC's first settings into the home if they are not there yet."""
    name = os.path.basename(argv[0]) if argv else ""
    if name == "chromium":
        return [CHROMIUM, *CHROMIUM_FLAGS, *argv[1:]]
    if name == "thunderbird":
        profile = os.path.join(home, THUNDERBIRD_PROFILE)
        prefs = "".join(f"user_pref({json.dumps(k)}, {json.dumps(v)});\n" for k, v in _THUNDERBIRD_PREFS.items())
        _write_new(os.path.join(profile, "user.js"), prefs)
        return ["thunderbird", "--no-remote", "--profile", profile, *argv[1:]]
    if name == "vlc":
        _write_new(os.path.join(home, ".config", "vlc", "vlcrc"), _VLCRC)
    elif name == "gimp":
        return ["gimp", "--no-splash", *argv[1:]]
    return argv


def _write_new(path: str, text: str) -> None:
    if not os.path.exists(path):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
