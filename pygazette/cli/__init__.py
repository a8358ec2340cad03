"""The `pygazette` command line: `serve`, and gazctl-like `journals` commands."""

import os

# gRPC's C core logs each failed TLS handshake to stderr at INFO level unless told otherwise;
# a command's failure is one `error:` line, and a server's log is its own. Set before any
# module of the command imports grpc.
os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
