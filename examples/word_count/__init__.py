"""Gazette's word-count example on pygazette: texts published as NGram deltas, counted by a
consumer into SQLite stores recorded to recovery logs, and queried with read-your-writes.
See README.md."""
