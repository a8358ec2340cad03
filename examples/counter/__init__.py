"""The README's consumer example: a word counter in a SQLite store recorded to a recovery
log, publishing each word's new count exactly once. See README.md (Consumers)."""
