"""A server's HTTP side: the journal gateway (GET/HEAD/PUT → Read/Append), Prometheus
`/metrics`, and the `/debug/ready` and `/debug/live` health endpoints."""
