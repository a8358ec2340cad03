"""Gazette-compatible authorization and transport security: capabilities and claims, signing
and verifying JWTs with `--auth-keys`, TLS credentials, and the gRPC server interceptors that
check every request before a handler runs."""
