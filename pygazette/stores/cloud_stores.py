"""Configuring cloud fragment stores from their URLs, as Gazette configures them.

- `s3://bucket/prefix/?endpoint=&region=&profile=&storageClass=&SSE=&SSEKMSKeyId=`.
  Credentials come from the environment (`AWS_ACCESS_KEY_ID`...), else from the shared
  credentials file (`AWS_SHARED_CREDENTIALS_FILE`, profile `AWS_PROFILE` or `default`), as
  Gazette's AWS SDK takes them, else container or instance credentials; or from a named
  profile of the shared AWS config files with `profile=` (through boto3, the `aws` extra). A custom
  `endpoint` (MinIO, Ceph, a local test server) gets path-style requests, and plain
  `http://` endpoints are allowed. `ACL=` is refused: canned ACLs are not supported by the
  object-store client, and S3 buckets now default to bucket-owner-enforced ownership.
  An endpoint without a scheme (`host:port`) is HTTPS, as Gazette's AWS SDK reads it.
- `gs://bucket/prefix/`: Google application default credentials
  (`GOOGLE_APPLICATION_CREDENTIALS`, or obstore's `GOOGLE_SERVICE_ACCOUNT`).
- `azure://container/prefix/`: shared-key auth from `AZURE_ACCOUNT_NAME` and
  `AZURE_ACCOUNT_KEY`, as Gazette reads them.
- `azure-ad://tenant/account/container/prefix/`: Azure AD client credentials from
  `AZURE_CLIENT_ID` and `AZURE_CLIENT_SECRET`.

Requests time out and retry on bounded schedules, so an unreachable store is reported in
seconds rather than minutes (the persister and the health checker retry on their own).
Streaming reads of objects go through a second client whose GETs have no short deadline
on the whole request (a reader may take an hour over a large fragment, the GET open all the
while), only one on stalls: STALL_TIMEOUT without a byte while one is being waited for.
"""

from __future__ import annotations

import configparser
import functools
import os
import re
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from obstore.exceptions import BaseError

from pygazette.stores import s3_listing
from pygazette.stores.interface import StoreError
from pygazette.stores.object_store import ObjectStore, describe
from pygazette.stores.store_url import StoreURL

if TYPE_CHECKING:
    from obstore.store import ClientConfig, RetryConfig

CONNECT_TIMEOUT = timedelta(seconds=5)
REQUEST_TIMEOUT = timedelta(seconds=120)
# Streaming reads: the whole GET may take this long (a slow reader of a large fragment)...
STREAM_TIMEOUT = timedelta(hours=24)
# ... but a wait for its next bytes no longer than this. The wait is counted while a chunk
# is being asked for only, not while the reader holds back (reqwest's read timeout).
STALL_TIMEOUT = timedelta(seconds=60)


def client_options(*, allow_http: bool = False, stream: bool = False) -> ClientConfig:
    opts: ClientConfig = {"connect_timeout": CONNECT_TIMEOUT, "timeout": REQUEST_TIMEOUT}
    if stream:
        opts["timeout"] = STREAM_TIMEOUT
        opts["read_timeout"] = STALL_TIMEOUT
    if allow_http:
        opts["allow_http"] = True
    return opts


def retry_config() -> RetryConfig:
    return {
        "max_retries": 3,
        "retry_timeout": timedelta(seconds=20),
        "backoff": {
            "init_backoff": timedelta(milliseconds=100),
            "max_backoff": timedelta(seconds=2),
            "base": 2,
        },
    }


def open_cloud_store(url: StoreURL) -> ObjectStore:
    """An ObjectStore for an s3, gs, azure or azure-ad URL; StoreError if misconfigured."""
    try:
        if url.scheme == "s3":
            return _open_s3(url)
        if url.scheme == "gs":
            return _open_gcs(url)
        if url.scheme in ("azure", "azure-ad"):
            return _open_azure(url)
    except (BaseError, ValueError, TypeError) as exc:
        raise StoreError(f"cannot configure fragment store {url.url}: {describe(exc)}") from exc
    raise StoreError(f"unsupported fragment store scheme {url.scheme!r} ({url.url})")


def _prefix(url: StoreURL) -> str | None:
    return url.prefix.rstrip("/") or None


def _open_s3(url: StoreURL) -> ObjectStore:
    from obstore.store import S3Store

    if url.arg("ACL"):
        raise StoreError(
            f"fragment store {url.url}: ACL= is not supported (canned ACLs cannot be set "
            "through the object-store client; use bucket-owner-enforced object ownership "
            "or a bucket policy)"
        )
    config: dict[str, Any] = {}
    credential_provider = None
    endpoint = url.arg("Endpoint")
    if endpoint and not re.match(r"[^:]+://", endpoint):
        endpoint = "https://" + endpoint  # As Gazette's AWS SDK takes `host[:port]`.
    if endpoint:
        # Bucket-named virtual hosts don't work with explicit endpoints: use path style.
        config["endpoint"] = endpoint
        config["virtual_hosted_style_request"] = False
    if url.arg("Profile"):
        credential_provider, profile_region = _profile_credentials(url)
        if profile_region and not url.arg("Region"):
            config["region"] = profile_region
    else:
        config.update(_shared_file_credentials(url))
    if url.arg("Region"):
        config["region"] = url.arg("Region")
    if url.arg("SSE"):
        config["server_side_encryption"] = url.arg("SSE")
    if url.arg("SSEKMSKeyId"):
        config["sse_kms_key_id"] = url.arg("SSEKMSKeyId")
    attributes = {}
    if url.arg("StorageClass"):
        attributes["Storage-Class"] = url.arg("StorageClass")

    def s3_store(stream: bool) -> S3Store:
        return S3Store(
            url.host,
            prefix=_prefix(url),
            config=config,  # type: ignore[arg-type]
            client_options=client_options(allow_http=endpoint.startswith("http://"), stream=stream),
            retry_config=retry_config(),
            credential_provider=credential_provider,  # type: ignore[arg-type]
        )

    return ObjectStore(
        url,
        s3_store(False),
        stream_store=s3_store(True),
        put_attributes=attributes,
        list_raw=functools.partial(
            s3_listing.stored_files,
            {**config, "bucket": url.host},
            _prefix(url) or "",
            provider=credential_provider,
        ),
    )


def _profile_credentials(url: StoreURL) -> tuple[Any, str]:
    """Credentials (and region) of a named profile of the shared AWS config files."""
    profile = url.arg("Profile")
    try:
        import boto3
        from obstore.auth.boto3 import Boto3CredentialProvider
    except ImportError:
        raise StoreError(
            f"fragment store {url.url}: profile= needs boto3 (pip install 'pygazette[aws]')"
        ) from None
    try:
        session = boto3.Session(profile_name=profile)
        provider = Boto3CredentialProvider(session)
    except Exception as exc:  # botocore's ProfileNotFound, NoCredentialsError, ...
        raise StoreError(
            f"fragment store {url.url}: no credentials for AWS profile {profile!r}: {exc}"
        ) from exc
    return provider, session.region_name or ""


def _shared_file_credentials(url: StoreURL) -> dict[str, str]:
    """The static keys of the shared credentials file, where Gazette's AWS SDK (v1) takes
    them without profile=: unless the environment holds keys (AWS_ACCESS_KEY_ID or
    AWS_ACCESS_KEY, with AWS_SECRET_ACCESS_KEY or AWS_SECRET_KEY) or a web identity token,
    profile $AWS_PROFILE (else 'default') of $AWS_SHARED_CREDENTIALS_FILE (else
    ~/.aws/credentials). obstore reads neither file; without them it goes on to container
    and instance credentials, as the SDK does. {} when the file gives no keys."""
    env = os.environ
    key_id = env.get("AWS_ACCESS_KEY_ID") or env.get("AWS_ACCESS_KEY", "")
    secret = env.get("AWS_SECRET_ACCESS_KEY") or env.get("AWS_SECRET_KEY", "")
    if key_id and secret:
        if "AWS_ACCESS_KEY_ID" in env and "AWS_SECRET_ACCESS_KEY" in env:
            return {}  # obstore reads them itself.
        return {"access_key_id": key_id, "secret_access_key": secret}  # The SDK's old names.
    if env.get("AWS_WEB_IDENTITY_TOKEN_FILE"):
        return {}
    path = env.get("AWS_SHARED_CREDENTIALS_FILE") or os.path.join(
        os.path.expanduser("~"), ".aws", "credentials"
    )
    profile = env.get("AWS_PROFILE") or "default"
    parser = configparser.RawConfigParser(strict=False, default_section="\0")
    try:
        with open(path, encoding="utf-8") as f:
            parser.read_file(f)
    except FileNotFoundError:
        return {}
    except (OSError, UnicodeDecodeError, configparser.Error) as exc:
        raise StoreError(
            f"fragment store {url.url}: cannot read the AWS shared credentials file {path}: "
            + (str(exc).splitlines() or [type(exc).__name__])[0]
        ) from exc
    if not parser.has_section(profile):
        return {}
    section = parser[profile]
    key_id = section.get("aws_access_key_id", "").strip()
    secret = section.get("aws_secret_access_key", "").strip()
    if not key_id or not secret:
        return {}
    out = {"access_key_id": key_id, "secret_access_key": secret}
    if token := section.get("aws_session_token", "").strip():
        out["session_token"] = token
    return out


def _open_gcs(url: StoreURL) -> ObjectStore:
    from obstore.store import GCSStore

    def gcs_store(stream: bool) -> GCSStore:
        return GCSStore(
            url.host,
            prefix=_prefix(url),
            client_options=client_options(stream=stream),
            retry_config=retry_config(),
        )

    return ObjectStore(url, gcs_store(False), stream_store=gcs_store(True))


def _open_azure(url: StoreURL) -> ObjectStore:
    from obstore.store import AzureStore

    config: dict[str, Any] = {}
    if url.scheme == "azure":
        container, prefix = url.host, _prefix(url)
        account = os.environ.get("AZURE_ACCOUNT_NAME", "")
        key = os.environ.get("AZURE_ACCOUNT_KEY", "")
        if not account or not key:
            raise StoreError(
                f"fragment store {url.url}: AZURE_ACCOUNT_NAME and AZURE_ACCOUNT_KEY must be set "
                "for azure:// stores"
            )
        config.update(account_name=account, account_key=key)
    else:  # azure-ad://tenant/account/container/prefix/
        segments = url.prefix.split("/")
        account, container = segments[0], segments[1]
        prefix = "/".join(s for s in segments[2:] if s) or None
        client_id = os.environ.get("AZURE_CLIENT_ID", "")
        secret = os.environ.get("AZURE_CLIENT_SECRET", "")
        if not client_id or not secret:
            raise StoreError(
                f"fragment store {url.url}: AZURE_CLIENT_ID and AZURE_CLIENT_SECRET must be set "
                "for azure-ad:// stores"
            )
        config.update(
            account_name=account, tenant_id=url.host, client_id=client_id, client_secret=secret
        )

    def azure_store(stream: bool) -> AzureStore:
        return AzureStore(
            container,
            prefix=prefix,
            config=config,  # type: ignore[arg-type]
            client_options=client_options(stream=stream),
            retry_config=retry_config(),
        )

    return ObjectStore(url, azure_store(False), stream_store=azure_store(True))
