"""The `pygazette` command line: `serve`, and gazctl-like `journals` commands."""
