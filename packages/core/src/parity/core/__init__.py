"""parity.core: Shared types, config loading, metrics and per-step timing."""
