"""Code that runs inside the desktop sandbox: the control server, screen capture, input and apps.

Standard library only (it runs on the sandbox's /usr/bin/python3, not the project venv); the
host imports `keys` from here so both sides share one whitelist of key names.
"""
