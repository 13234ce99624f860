"""Bucket I/O: one interface for local directories and S3-compatible object stores.

`open_bucket(uri)` accepts `s3://bucket/prefix`, `file:///path` or a plain path. Both backends offer the
same small set of operations the sealer and the reader need, including `create_exclusive` (a
conditional create, `If-None-Match: *` on S3, `link(2)` on a local disk) which is what makes a batch
manifest appear at most once.

S3 settings come from the usual places, most specific first: keyword arguments, then the environment
(`AWS_ENDPOINT_URL` / `TRACEFLEET_S3_ENDPOINT`, `AWS_ACCESS_KEY_ID` / `AWS_SECRET_ACCESS_KEY`,
`AWS_PROFILE`, `AWS_DEFAULT_REGION`; a Kubernetes Secret is mounted as those env vars), then the shared
AWS config/credentials files. Path-style addressing and SigV4 are used because S3-compatible stores
(SeaweedFS, MinIO, Ceph) need them; retries use botocore's "standard" mode.

Errors are `BucketError` subclasses with a message that says what to check: `BucketNotFound` (the
bucket does not exist), `BucketUnreachable` (connection refused, DNS, timeout: the store is down or the
endpoint is wrong), `BucketAccessDenied` (credentials), `ObjectNotFound`.
"""

from __future__ import annotations

import os
import re
import tempfile
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlparse

from tracefleet.contract import environment


class BucketError(RuntimeError):
    """Any failure talking to a bucket; the message names the bucket and what to check."""


class BucketNotFound(BucketError):
    pass


class BucketUnreachable(BucketError):
    pass


class BucketUriError(BucketError):
    """The URI itself cannot name a bucket: the user's to fix, not the store's."""


class BucketAccessDenied(BucketError):
    pass


class ObjectNotFound(BucketError, KeyError):
    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0]) if self.args else ""


@dataclass(frozen=True)
class ObjectInfo:
    key: str  # relative to the bucket root (the URI's prefix is not part of it)
    size: int
    stamp: str = ""  # changes when the object does (its ETag on S3; inode, time and size in a folder)


class Bucket(Protocol):
    uri: str

    def put(self, key: str, data: bytes) -> None: ...
    def put_file(self, key: str, path: Path) -> None: ...
    def create_exclusive(self, key: str, data: bytes) -> bool: ...
    def get(self, key: str) -> bytes: ...
    def get_if_changed(self, key: str, stamp: str | None) -> tuple[bytes, str] | None: ...
    def exists(self, key: str) -> bool: ...
    def list(self, prefix: str = "") -> Iterator[ObjectInfo]: ...
    def list_dirs(self, prefix: str = "") -> list[str]: ...
    def delete(self, key: str) -> None: ...
    def check(self) -> None: ...


def _join(*parts: str) -> str:
    return "/".join(p.strip("/") for p in parts if p and p.strip("/"))


def _stamp(st: os.stat_result) -> str:
    """A file's stamp: a rename puts another inode there, a write changes its time or size."""
    return f"{st.st_ino}:{st.st_mtime_ns}:{st.st_size}"


class LocalBucket:
    """A directory used as a bucket. Writes are atomic (temp file + rename / link) so readers never see a
    partial object, matching what S3 gives."""

    def __init__(self, root: str | os.PathLike[str], *, create: bool = True) -> None:
        self.root = Path(root).expanduser().resolve()
        self.uri = str(self.root)
        if create:
            self.root.mkdir(parents=True, exist_ok=True)

    def _path(self, key: str) -> Path:
        key = key.strip("/")
        if not key or ".." in key.split("/"):
            raise BucketError(f"invalid object key {key!r}")
        return self.root / key

    def check(self) -> None:
        if not self.root.is_dir():
            raise BucketNotFound(f"bucket directory {self.root} does not exist")

    def _durable_tmp(self, path: Path, data: bytes) -> Path:
        """`data` written and fsync'd to a hidden sibling of `path`, ready to be renamed or linked in."""
        self.check()
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.parent / f".tmp-{uuid.uuid4().hex}-{path.name}"
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        return tmp

    def put(self, key: str, data: bytes) -> None:
        path = self._path(key)
        os.replace(self._durable_tmp(path, data), path)

    def put_file(self, key: str, path: Path) -> None:
        self.put(key, Path(path).read_bytes())

    def create_exclusive(self, key: str, data: bytes) -> bool:
        """Create `key` only if it does not exist; True if this call created it. link(2) is atomic and
        fails when the name exists, so of N racing writers exactly one wins and the content is complete."""
        path = self._path(key)
        tmp = self._durable_tmp(path, data)
        try:
            os.link(tmp, path)
            return True
        except FileExistsError:
            return False
        finally:
            tmp.unlink(missing_ok=True)

    def get(self, key: str) -> bytes:
        try:
            return self._path(key).read_bytes()
        except (FileNotFoundError, IsADirectoryError):
            self.check()
            raise ObjectNotFound(f"{self.root}/{key.strip('/')} does not exist") from None

    def get_if_changed(self, key: str, stamp: str | None) -> tuple[bytes, str] | None:
        """The object and its stamp, or None when its stamp is still `stamp` (nothing read): a reader that polls."""
        try:
            st = os.stat(self._path(key))
        except (FileNotFoundError, NotADirectoryError):
            self.check()
            raise ObjectNotFound(f"{self.root}/{key.strip('/')} does not exist") from None
        now = _stamp(st)
        return None if now == stamp else (self.get(key), now)

    def exists(self, key: str) -> bool:
        return self._path(key).is_file()

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        self.check()
        base = self.root / prefix.strip("/") if prefix.strip("/") else self.root
        if not base.is_dir():
            return
        for dirpath, dirnames, filenames in os.walk(base):
            dirnames.sort()
            rel = Path(dirpath).relative_to(self.root).as_posix()
            for name in sorted(filenames):
                if name.startswith(".tmp-"):
                    continue
                key = name if rel == "." else f"{rel}/{name}"
                try:
                    st = os.stat(os.path.join(dirpath, name))
                except FileNotFoundError:
                    continue
                yield ObjectInfo(key=key, size=st.st_size, stamp=_stamp(st))

    def list_dirs(self, prefix: str = "") -> list[str]:
        self.check()
        base = self.root / prefix.strip("/") if prefix.strip("/") else self.root
        if not base.is_dir():
            return []
        return sorted(p.name for p in base.iterdir() if p.is_dir())

    def delete(self, key: str) -> None:
        self._path(key).unlink(missing_ok=True)


# botocore's own service-specific variable: it names the endpoint when no endpoint_url is passed.
AWS_ENDPOINT_VARIABLES = ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3")


def endpoint_from_env(env: Mapping[str, str]) -> str | None:
    """The S3 endpoint a process with environment `env` reaches its bucket at (None: AWS's), by the one precedence
    every program of a job uses: TRACEFLEET_S3_ENDPOINT, then AWS_ENDPOINT_URL, then AWS_ENDPOINT_URL_S3."""
    return next((env[name] for name in (environment.S3_ENDPOINT, *AWS_ENDPOINT_VARIABLES) if env.get(name)), None)


class S3Bucket:
    """An S3 (or S3-compatible) bucket through boto3, optionally under a key prefix."""

    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        *,
        endpoint_url: str | None = None,
        access_key: str | None = None,
        secret_key: str | None = None,
        session_token: str | None = None,
        region: str | None = None,
        profile: str | None = None,
        max_attempts: int = 5,
        connect_timeout: float = 5.0,
        read_timeout: float = 60.0,
        max_pool_connections: int = 10,
        client: Any = None,
    ) -> None:
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.endpoint_url = endpoint_url or endpoint_from_env(os.environ)
        self.uri = f"s3://{_join(bucket, self.prefix)}"
        if client is None:
            import boto3
            from botocore.config import Config

            session = boto3.session.Session(profile_name=profile) if profile else boto3.session.Session()
            client = session.client(
                "s3",
                endpoint_url=self.endpoint_url,
                aws_access_key_id=access_key,
                aws_secret_access_key=secret_key,
                aws_session_token=session_token,
                region_name=region or session.region_name or "us-east-1",
                config=Config(
                    signature_version="s3v4",
                    s3={"addressing_style": "path"},
                    connect_timeout=connect_timeout,
                    read_timeout=read_timeout,
                    retries={"max_attempts": max_attempts, "mode": "standard"},
                    # as many as the caller's threads: a connection beyond the pool is opened and dropped per request
                    max_pool_connections=max_pool_connections,
                ),
            )
        self.client = client

    def _key(self, key: str) -> str:
        return _join(self.prefix, key)

    def _rel(self, full: str) -> str:
        return full[len(self.prefix) + 1 :] if self.prefix else full

    def _where(self) -> str:
        return f"{self.uri}" + (f" at {self.endpoint_url}" if self.endpoint_url else "")

    def _translate(self, exc: Exception, key: str | None = None) -> BucketError:
        import botocore.exceptions as bx

        if isinstance(exc, bx.ClientError):
            err = exc.response.get("Error", {})
            code = str(err.get("Code", ""))
            status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            if code == "NoSuchBucket" or (key is None and code in ("404", "NotFound")):
                return BucketNotFound(f"bucket {self.bucket!r} does not exist ({self._where()}); create it first")
            if code in ("NoSuchKey", "404", "NotFound"):
                return ObjectNotFound(f"{self.uri}/{key} does not exist")
            if code in ("AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "403") or status == 403:
                return BucketAccessDenied(
                    f"access denied to {self._where()} ({code}): check AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY or the profile"
                )
            return BucketError(f"{self._where()}: {code or status}: {err.get('Message', exc)}")
        if isinstance(exc, bx.EndpointConnectionError | bx.ConnectTimeoutError | bx.ReadTimeoutError | bx.ConnectionClosedError):
            return BucketUnreachable(f"cannot reach {self._where()}: {exc}; is the store up and the endpoint right?")
        if isinstance(exc, bx.NoCredentialsError):
            return BucketAccessDenied(f"no credentials for {self._where()}: set AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or AWS_PROFILE")
        if isinstance(exc, bx.BotoCoreError):
            return BucketUnreachable(f"{self._where()}: {exc}")
        return BucketError(f"{self._where()}: {exc}")

    def _call(self, op: str, key: str | None = None, **kwargs: Any) -> Any:
        import botocore.exceptions as bx

        try:
            return getattr(self.client, op)(Bucket=self.bucket, **kwargs)
        except (bx.BotoCoreError, bx.ClientError) as exc:
            raise self._translate(exc, key) from exc

    def check(self) -> None:
        self._call("head_bucket")

    def put(self, key: str, data: bytes) -> None:
        self._call("put_object", key, Key=self._key(key), Body=data)

    def put_file(self, key: str, path: Path) -> None:
        with open(path, "rb") as f:
            self._call("put_object", key, Key=self._key(key), Body=f)

    def create_exclusive(self, key: str, data: bytes) -> bool:
        import botocore.exceptions as bx

        try:
            self.client.put_object(Bucket=self.bucket, Key=self._key(key), Body=data, IfNoneMatch="*")
            return True
        except bx.ClientError as exc:
            code = str(exc.response.get("Error", {}).get("Code", ""))
            status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            # 412: the object exists. 409: a concurrent conditional write to the same key is in flight.
            if code in ("PreconditionFailed", "ConditionalRequestConflict") or status in (409, 412):
                return False
            raise self._translate(exc, key) from exc
        except bx.BotoCoreError as exc:
            raise self._translate(exc, key) from exc

    def get(self, key: str) -> bytes:
        return self._call("get_object", key, Key=self._key(key))["Body"].read()

    def get_if_changed(self, key: str, stamp: str | None) -> tuple[bytes, str] | None:
        """The object and its ETag, or None when its ETag is still `stamp` (a conditional GET: 304, no body)."""
        import botocore.exceptions as bx

        try:
            found = self.client.get_object(Bucket=self.bucket, Key=self._key(key), **({"IfNoneMatch": stamp} if stamp else {}))
        except bx.ClientError as exc:
            if exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") == 304:
                return None
            raise self._translate(exc, key) from exc
        except bx.BotoCoreError as exc:
            raise self._translate(exc, key) from exc
        return found["Body"].read(), found["ETag"]

    def exists(self, key: str) -> bool:
        try:
            self._call("head_object", key, Key=self._key(key))
            return True
        except ObjectNotFound:
            return False

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        # A prefix here names a folder (the local backend walks a directory), so it always ends with "/".
        full = (self.prefix + "/" if self.prefix else "") + prefix.strip("/")
        full = full if full.endswith("/") or not full else full + "/"
        token: str | None = None
        while True:
            kwargs: dict[str, Any] = {"Prefix": full}
            if token:
                kwargs["ContinuationToken"] = token
            page = self._call("list_objects_v2", **kwargs)
            for obj in page.get("Contents", []):
                yield ObjectInfo(key=self._rel(obj["Key"]), size=int(obj["Size"]), stamp=obj.get("ETag", ""))
            if not page.get("IsTruncated"):
                return
            token = page.get("NextContinuationToken")

    def list_dirs(self, prefix: str = "") -> list[str]:
        full = self._key(prefix)
        full = full + "/" if full else ""
        names: list[str] = []
        token: str | None = None
        while True:
            kwargs: dict[str, Any] = {"Prefix": full, "Delimiter": "/"}
            if token:
                kwargs["ContinuationToken"] = token
            page = self._call("list_objects_v2", **kwargs)
            names += [p["Prefix"][len(full) :].strip("/") for p in page.get("CommonPrefixes", [])]
            if not page.get("IsTruncated"):
                return sorted(names)
            token = page.get("NextContinuationToken")

    def delete(self, key: str) -> None:
        self._call("delete_object", key, Key=self._key(key))


# A URI scheme (RFC 3986) of two characters or more, at the start of a text: `s3:`, `file:`, `gs:`; one letter is a
# drive (`C:`), not a scheme.
URI_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]+:")


def uri_scheme(text: str | os.PathLike[str]) -> str | None:
    """The scheme `text` starts with (`s3` of `s3://b/p`, also of `s3:/b`), None for a path."""
    match = URI_SCHEME.match(os.fspath(text))
    return match.group(0)[:-1] if match else None


def malformed_uri(text: str | os.PathLike[str]) -> bool:
    """Whether `text` names a scheme without the `//` a bucket URI has after it (`s3:/b`, `s3:b`): a mistyped URI,
    which read as a path would be a folder named `s3:`."""
    text = os.fspath(text)
    scheme = uri_scheme(text)
    return scheme is not None and not text[len(scheme) + 1 :].startswith("//")


def open_bucket(uri: str | os.PathLike[str], **options: Any) -> LocalBucket | S3Bucket:
    """A bucket for `s3://bucket/prefix`, `file:///dir` or a directory path. S3 options: endpoint_url,
    access_key, secret_key, session_token, region, profile, max_attempts, connect_timeout, read_timeout,
    max_pool_connections."""
    text = os.fspath(uri)
    parsed = urlparse(text)
    if parsed.scheme == "s3":
        if not parsed.netloc:
            raise BucketUriError(f"{text!r}: an S3 URI needs a bucket name (s3://bucket/prefix)")
        return S3Bucket(parsed.netloc, parsed.path, **options)
    if parsed.scheme == "file":
        return LocalBucket(parsed.path, **{k: v for k, v in options.items() if k == "create"})
    if parsed.scheme and len(parsed.scheme) > 1:
        raise BucketError(f"unsupported bucket URI {text!r}: use s3://bucket/prefix or a directory")
    return LocalBucket(text, **{k: v for k, v in options.items() if k == "create"})


def spool_dir(default: str | os.PathLike[str] | None = None) -> Path:
    """Where data waits on local disk until its upload succeeds: `default`, else $TRACEFLEET_SPOOL, else
    $TRACEFLEET_CACHE/spool (~/.cache/tracefleet/spool), else a folder under the system temp dir."""
    candidates = [default, os.environ.get(environment.SPOOL)]
    candidates += [environment.cache_dir() / "spool", os.path.join(tempfile.gettempdir(), "tracefleet-spool")]
    last: OSError | None = None
    for base in candidates:
        if not base:
            continue
        path = Path(base)
        try:
            path.mkdir(parents=True, exist_ok=True)
            return path
        except OSError as exc:
            last = exc
            if base in (default, os.environ.get(environment.SPOOL)):
                raise  # an explicit choice that does not work is an error, not a silent fallback
    raise OSError(f"no writable spool directory: {last}")
