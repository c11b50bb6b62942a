"""The one error a config raises."""

from __future__ import annotations

__all__ = ["ConfigError"]


class ConfigError(ValueError):
    """A config value, key or name is wrong; the message says what is accepted."""
