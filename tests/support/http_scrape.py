"""Scraping a server's HTTP port in tests: `/metrics` parsed with prometheus-client's parser,
and waiting for an HTTP endpoint to answer a status."""

from __future__ import annotations

import time
import urllib.error
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def get(url: str, timeout: float = 5.0) -> tuple[int, bytes]:
    """Status and body of a GET (HTTP errors included, not raised)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def wait_status(url: str, status: int = 200, within: float = 30.0) -> None:
    deadline = time.monotonic() + within
    last: object = None
    while time.monotonic() < deadline:
        try:
            last = get(url, timeout=2.0)[0]
            if last == status:
                return
        except OSError as exc:
            last = exc
        time.sleep(0.05)
    raise TimeoutError(f"{url} did not answer {status} (last: {last})")


def scrape_text(base: str) -> str:
    status, body = get(base + "/metrics")
    assert status == 200, body
    return body.decode()


def scrape(base: str) -> Samples:
    """Every sample of `base`/metrics, by (sample name, labels)."""
    samples: Samples = {}
    for family in text_string_to_metric_families(scrape_text(base)):
        for s in family.samples:
            samples[(s.name, frozenset(s.labels.items()))] = s.value
    return samples


def value(samples: Samples, name: str, **labels: str) -> float:
    """A sample's value (0 if absent: a counter not yet moved)."""
    return samples.get((name, frozenset(labels.items())), 0.0)
