"""The s3:// backend: boto3 with botocore's standard retries and multipart transfers."""

from __future__ import annotations

import hashlib
import os
import threading
from pathlib import Path
from typing import BinaryIO

from mass_jobs.config.run_spec import StoreSpec
from mass_jobs.store.base import MissingKey, Store, check_key, check_prefix, replace_atomically, sha256_stream

MiB = 1 << 20
S3_MIN_PART = 5 * MiB  # S3 rejects multipart parts below 5 MiB (except the last one)

# botocore's data files (the S3 service model, endpoints) are loaded once per process and shared:
# a new session loads them again, 180 ms of CPU per store against 30 ms with the loader shared.
# Each store still gets a session of its own, so credentials and settings are read from the
# environment as it is when the store is made. Made under a lock: sessions are not thread-safe.
_loader: list = []
_loader_lock = threading.Lock()


def _client(**kwargs):
    import boto3
    import botocore.session

    with _loader_lock:
        core = botocore.session.get_session()
        if not _loader:
            _loader.append(core.get_component("data_loader"))
        core.register_component("data_loader", _loader[0])
        return boto3.session.Session(botocore_session=core).client("s3", **kwargs)


class S3Store(Store):
    """An S3 bucket (AWS, MinIO, Ceph, moto) under an optional key prefix, via boto3.

    Transient errors (5xx, throttling, dropped connections) are retried by botocore's "standard"
    retry mode; files above `multipart_threshold` are uploaded in parts.
    """

    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        *,
        endpoint_url: str | None = None,
        region: str | None = None,
        multipart_threshold: int = 64 * MiB,
        max_attempts: int = 8,
        connect_timeout: float = 10,
        read_timeout: float = 60,
    ):
        from boto3.s3.transfer import TransferConfig
        from botocore.config import Config

        self.bucket, self.prefix = bucket, check_key(prefix, allow_empty=True)
        self.endpoint_url = endpoint_url or os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
        self.region = region or os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1"
        self.uri = f"s3://{bucket}/{self.prefix}" if self.prefix else f"s3://{bucket}"
        config = Config(
            retries={"mode": "standard", "total_max_attempts": max_attempts},  # first try included
            connect_timeout=connect_timeout,
            read_timeout=read_timeout,
            # Custom endpoints (MinIO, Ceph, an IP) rarely resolve bucket subdomains.
            s3={"addressing_style": "path" if self.endpoint_url else "auto"},
        )
        self.client = _client(endpoint_url=self.endpoint_url, region_name=self.region, config=config)
        part = max(multipart_threshold, S3_MIN_PART)
        self.transfer = TransferConfig(multipart_threshold=multipart_threshold, multipart_chunksize=part)

    @property
    def spec(self) -> StoreSpec:
        return StoreSpec(uri=self.uri, endpoint_url=self.endpoint_url, region=self.region)

    def _key(self, key: str) -> str:
        check_key(key)
        return f"{self.prefix}/{key}" if self.prefix else key

    def _missing(self, err: Exception) -> bool:
        code = getattr(err, "response", {}).get("Error", {}).get("Code")
        return code in ("404", "NoSuchKey", "NotFound")

    def put_bytes(self, key: str, data: bytes) -> str:
        self.client.put_object(Bucket=self.bucket, Key=self._key(key), Body=data)
        return hashlib.sha256(data).hexdigest()

    def get_bytes(self, key: str) -> bytes:
        with self.open_read(key) as body:
            return body.read()

    def put_if_absent(self, key: str, data: bytes) -> bool:
        from botocore.exceptions import ClientError

        try:  # S3 conditional writes (If-None-Match: *): one of two concurrent creators wins
            self.client.put_object(Bucket=self.bucket, Key=self._key(key), Body=data, IfNoneMatch="*")
            return True
        except ClientError as err:
            if err.response.get("Error", {}).get("Code") in ("PreconditionFailed", "ConditionalRequestConflict"):
                return False
            raise

    def put_file(self, key: str, path: str | os.PathLike) -> str:
        with open(path, "rb") as f:
            digest = sha256_stream(f)
        self.client.upload_file(str(path), self.bucket, self._key(key), Config=self.transfer)
        return digest

    def get_file(self, key: str, path: str | os.PathLike) -> Path:
        from botocore.exceptions import ClientError

        full = self._key(key)
        try:
            replace_atomically(
                Path(path), lambda tmp: self.client.download_file(self.bucket, full, str(tmp), Config=self.transfer)
            )
        except ClientError as err:
            if self._missing(err):
                raise MissingKey(f"{self.uri}: no object at key {key!r}") from err
            raise
        return Path(path)

    def open_read(self, key: str) -> BinaryIO:
        from botocore.exceptions import ClientError

        try:
            return self.client.get_object(Bucket=self.bucket, Key=self._key(key))["Body"]
        except ClientError as err:
            if self._missing(err):
                raise MissingKey(f"{self.uri}: no object at key {key!r}") from err
            raise

    def list(self, prefix: str = "") -> list[str]:
        check_prefix(prefix)
        full = f"{self.prefix}/{prefix}" if self.prefix else prefix
        strip = len(self.prefix) + 1 if self.prefix else 0
        keys = []
        for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=full):
            keys.extend(obj["Key"][strip:] for obj in page.get("Contents", []))
        return sorted(keys)

    def stat(self, key: str) -> tuple[int, str]:
        from botocore.exceptions import ClientError

        try:
            head = self.client.head_object(Bucket=self.bucket, Key=self._key(key))
        except ClientError as err:
            if self._missing(err):
                raise MissingKey(f"{self.uri}: no object at key {key!r}") from err
            raise
        return head["ContentLength"], head["ETag"]

    def exists(self, key: str) -> bool:
        from botocore.exceptions import ClientError

        try:
            self.client.head_object(Bucket=self.bucket, Key=self._key(key))
            return True
        except ClientError as err:
            if self._missing(err):
                self._check_bucket()
                return False
            raise

    def _check_bucket(self) -> None:
        """HEAD answers a bare 404 for a missing bucket as for a missing key: ask once, so a
        mistyped bucket is an error (NoSuchBucket) and not an empty store."""
        from botocore.exceptions import ClientError

        if getattr(self, "_bucket_seen", False):
            return
        try:
            self.client.head_bucket(Bucket=self.bucket)
        except ClientError as err:
            if self._missing(err):
                raise ClientError(
                    {
                        "Error": {
                            "Code": "NoSuchBucket",
                            "BucketName": self.bucket,
                            "Message": "The specified bucket does not exist",
                        }
                    },
                    "HeadBucket",
                ) from err
            raise
        self._bucket_seen = True

    def delete(self, key: str) -> None:
        self.client.delete_object(Bucket=self.bucket, Key=self._key(key))

    def delete_if_version(self, key: str, version: str) -> bool:
        from botocore.exceptions import ClientError

        try:  # S3 conditional delete (If-Match: the ETag stat gave)
            self.client.delete_object(Bucket=self.bucket, Key=self._key(key), IfMatch=version)
            return True
        except ClientError as err:
            code = err.response.get("Error", {}).get("Code")
            if code in ("PreconditionFailed", "ConditionalRequestConflict") or self._missing(err):
                return False
            if code == "NotImplemented":  # a server without conditional deletes: check, then delete
                return super().delete_if_version(key, version)
            raise
