"""A real S3-compatible server for the tests: moto's `ThreadedMotoServer` on 127.0.0.1, with signature
checking on (an IAM user's key is issued, then every request must be signed with it), so refused
credentials are refused by the server itself."""

from __future__ import annotations

import json
import logging
import uuid
from typing import Any

import httpx

REGION = "us-east-1"


class S3Server:
    """One moto server: `url`, a valid key pair, fresh buckets, and the objects a bucket holds."""

    def __init__(self) -> None:
        import boto3
        from moto.server import ThreadedMotoServer

        logging.getLogger("werkzeug").setLevel(logging.WARNING)  # a line per request, otherwise
        self._server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        self._server.start()
        host, port = self._server.get_host_and_port()
        self.url = f"http://{host}:{port}"
        bootstrap = {"aws_access_key_id": "bootstrap", "aws_secret_access_key": "bootstrap"}
        iam = boto3.client("iam", endpoint_url=self.url, region_name=REGION, **bootstrap)
        iam.create_user(UserName="imagebatch")
        allow = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}
        iam.put_user_policy(UserName="imagebatch", PolicyName="all", PolicyDocument=json.dumps(allow))
        key = iam.create_access_key(UserName="imagebatch")["AccessKey"]
        self.access_key, self.secret_key = str(key["AccessKeyId"]), str(key["SecretAccessKey"])
        httpx.post(f"{self.url}/moto-api/reset-auth", content=b"0").raise_for_status()  # signatures checked
        self.client: Any = boto3.client(
            "s3",
            endpoint_url=self.url,
            region_name=REGION,
            aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key,
        )

    def env(self, url: str | None = None) -> dict[str, str]:
        """The standard variables a run reads its store's address and credentials from."""
        return {
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_ENDPOINT_URL": url or self.url,
            "AWS_ALLOW_HTTP": "true",
            "AWS_REGION": REGION,
        }

    def bucket(self) -> str:
        name = f"ib-{uuid.uuid4().hex[:12]}"
        self.client.create_bucket(Bucket=name)
        return name

    def objects(self, bucket: str, prefix: str = "") -> dict[str, bytes]:
        """Every object under `prefix`, by key relative to it."""
        out: dict[str, bytes] = {}
        for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
            for item in page.get("Contents", []):
                body = self.client.get_object(Bucket=bucket, Key=item["Key"])["Body"].read()
                out[item["Key"].removeprefix(prefix).lstrip("/")] = body
        return out

    def stop(self) -> None:
        self._server.stop()
