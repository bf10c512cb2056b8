"""gitdrop: git-native coordination for teams of AI agents."""

__version__ = "0.1.0"
