"""parity.envs: The environment API, tool-call parsing, and the Python-tool, math and desktop environments."""
