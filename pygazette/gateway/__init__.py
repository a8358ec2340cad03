"""A server's HTTP side: the journal gateway (GET/HEAD/PUT → Read/Append), Gazette's JSON API
(`POST /v1/journals/list|read`, `/v1/shards/list|stat`: `json_api`, `jsonpb`), Prometheus
`/metrics`, and the `/debug/ready` and `/debug/live` health endpoints."""
