"""Listing an S3 prefix over the S3 API itself (ListObjectsV2, SigV4-signed), for the
listings obstore refuses.

obstore (the Rust object_store crate) parses every key of a listing as one of its paths, and
fails the whole listing, page and all, on a key it refuses: an empty segment (`a//b`), a `.`
or `..` segment, an ASCII control character. S3 keys are any UTF-8 (Gazette's AWS SDK lists
them all, and its fragment listing then skips what is not a fragment), so one such object
beside a journal's fragments — written by some other tool — would hide every fragment of the
journal. `ObjectStore.list_files` lists such a prefix here instead: the keys as they are,
each then parsed (or skipped) by the listing's caller.

Credentials are those the store was configured with, or a credential provider's (profile=),
else the environment's static keys (AWS_ACCESS_KEY_ID...); instance and container
credentials, which obstore fetches for itself, are not at hand here (the listing then fails
as before, naming the key obstore refused).
"""

from __future__ import annotations

import datetime
import hashlib
import hmac
import os
import urllib.error
import urllib.parse
import urllib.request
import xml.etree.ElementTree as ET
from collections.abc import Callable, Mapping
from typing import Any

from pygazette.stores.interface import StoredFile, StoreError

_EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()
_NS = "{http://s3.amazonaws.com/doc/2006-03-01/}"
_TIMEOUT_SECONDS = 60.0


def _quote(text: str) -> str:
    """URI-encode as SigV4 canonical requests do (RFC 3986 unreserved characters kept)."""
    return urllib.parse.quote(text, safe="-_.~")


def _sign(key: bytes, msg: str) -> bytes:
    return hmac.new(key, msg.encode(), hashlib.sha256).digest()


def _credentials(
    config: Mapping[str, Any], provider: Callable[[], Any] | None
) -> tuple[str, str, str]:
    """(access key id, secret, session token) as the store uses them, where they can be had."""
    if provider is not None:
        creds = provider()
        if hasattr(creds, "__await__"):
            raise StoreError("an asynchronous credential provider cannot sign a raw listing")
        return creds["access_key_id"], creds["secret_access_key"], creds.get("token") or ""
    key_id = config.get("access_key_id") or os.environ.get("AWS_ACCESS_KEY_ID", "")
    secret = config.get("secret_access_key") or os.environ.get("AWS_SECRET_ACCESS_KEY", "")
    if config.get("access_key_id"):
        token = config.get("session_token") or config.get("token") or ""
    else:
        token = os.environ.get("AWS_SESSION_TOKEN", "")
    if not key_id or not secret:
        raise StoreError("no static credentials to list it with otherwise")
    return key_id, secret, token


def _environ(*names: str) -> str:
    """The first of these environment variables set (obstore's S3 settings from the
    environment: AWS_ENDPOINT or AWS_ENDPOINT_URL, AWS_REGION or AWS_DEFAULT_REGION)."""
    return next((os.environ[n] for n in names if os.environ.get(n)), "")


def list_objects(
    config: Mapping[str, Any],
    key_prefix: str,
    provider: Callable[[], Any] | None = None,
) -> list[tuple[str, int, int]]:
    """(key, size, mod time in Unix seconds) of every object under `key_prefix` (a full key
    prefix, the store's own prefix included) of the bucket `config` names."""
    bucket = str(config["bucket"])
    # Where obstore sends the store's requests: its config, else the environment's settings
    # it reads (every AWS_ variable), else AWS in us-east-1.
    region = str(
        config.get("region") or _environ("AWS_REGION", "AWS_DEFAULT_REGION") or "us-east-1"
    )
    endpoint = str(
        config.get("endpoint")
        or _environ("AWS_ENDPOINT", "AWS_ENDPOINT_URL")
        or f"https://s3.{region}.amazonaws.com"
    ).rstrip("/")
    virtual = (
        str(
            config["virtual_hosted_style_request"]
            if "virtual_hosted_style_request" in config
            else _environ("AWS_VIRTUAL_HOSTED_STYLE_REQUEST") or "false"
        ).lower()
        == "true"
    )
    split = urllib.parse.urlsplit(endpoint)
    if virtual:
        host, path = f"{bucket}.{split.netloc}", split.path + "/"
    else:
        host, path = split.netloc, f"{split.path}/{_quote(bucket)}"
    key_id, secret, token = _credentials(config, provider)

    out: list[tuple[str, int, int]] = []
    continuation = ""
    while True:
        params = {"list-type": "2", "prefix": key_prefix, "encoding-type": "url"}
        if continuation:
            params["continuation-token"] = continuation
        query = "&".join(f"{_quote(k)}={_quote(v)}" for k, v in sorted(params.items()))
        now = datetime.datetime.now(datetime.UTC)
        amz_date, day = now.strftime("%Y%m%dT%H%M%SZ"), now.strftime("%Y%m%d")
        headers = {"host": host, "x-amz-content-sha256": _EMPTY_SHA256, "x-amz-date": amz_date}
        if token:
            headers["x-amz-security-token"] = token
        signed = ";".join(sorted(headers))
        canonical = "\n".join(
            [
                "GET",
                path,
                query,
                "".join(f"{k}:{headers[k]}\n" for k in sorted(headers)),
                signed,
                _EMPTY_SHA256,
            ]
        )
        scope = f"{day}/{region}/s3/aws4_request"
        to_sign = "\n".join(
            ["AWS4-HMAC-SHA256", amz_date, scope, hashlib.sha256(canonical.encode()).hexdigest()]
        )
        key = _sign(_sign(_sign(f"AWS4{secret}".encode(), day), region), "s3")
        key = _sign(key, "aws4_request")
        signature = hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
        headers["authorization"] = (
            f"AWS4-HMAC-SHA256 Credential={key_id}/{scope}, SignedHeaders={signed}, "
            f"Signature={signature}"
        )
        del headers["host"]  # urllib sends it.
        url = f"{split.scheme}://{host}{path}?{query}"
        request = urllib.request.Request(url, headers=headers, method="GET")
        try:
            with urllib.request.urlopen(request, timeout=_TIMEOUT_SECONDS) as resp:
                body = resp.read()
        except urllib.error.HTTPError as exc:
            detail = exc.read()[:300].decode(errors="replace")
            raise StoreError(
                f"ListObjectsV2 answered {exc.code}: {' '.join(detail.split())}"
            ) from exc
        except OSError as exc:
            raise StoreError(f"ListObjectsV2 failed: {exc}") from exc
        try:
            root = ET.fromstring(body)
        except ET.ParseError as exc:
            raise StoreError(f"ListObjectsV2 answered no listing: {exc}") from exc
        # Keys are URL-encoded (so that XML can carry any of them) where the answer says so:
        # AWS does (a space as '+', as botocore decodes them), not every S3 server does.
        encoded = (root.findtext(f"{_NS}EncodingType") or "").lower() == "url"
        for item in root.iter(f"{_NS}Contents"):
            raw = item.findtext(f"{_NS}Key") or ""
            modified = item.findtext(f"{_NS}LastModified") or ""
            try:
                mod_time = int(datetime.datetime.fromisoformat(modified).timestamp())
            except ValueError:
                mod_time = 0
            out.append(
                (
                    urllib.parse.unquote_plus(raw) if encoded else raw,
                    int(item.findtext(f"{_NS}Size") or 0),
                    mod_time,
                )
            )
        continuation = root.findtext(f"{_NS}NextContinuationToken") or ""
        if (root.findtext(f"{_NS}IsTruncated") or "").lower() != "true" or not continuation:
            return out


def stored_files(
    config: Mapping[str, Any],
    store_prefix: str,
    key: str,
    provider: Callable[[], Any] | None = None,
) -> list[StoredFile]:
    """`ObjectStore.list_files` of `key` (relative to the store's prefix), listed here."""
    full = f"{store_prefix.rstrip('/')}/{key}" if store_prefix else key
    return [
        StoredFile(path=k[len(full) :], size=size, mod_time=mod_time)
        for k, size, mod_time in list_objects(config, full, provider)
        if k.startswith(full) and not k.endswith("/")  # Not directory markers.
    ]
