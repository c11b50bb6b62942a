"""credo: credit assignment for multi-turn LLM agents trained with RL."""

__version__ = "0.1.0"
