"""The `minio` and `mc` commands of the minio stand-in (Containerfile.minio): just enough of
them for deploy/docker-compose.yml, over moto's S3 server."""
import json
import os
import sys
import urllib.request
from pathlib import Path

ALIASES = Path(os.environ.get("HOME", "/root")) / ".mc-standin.json"


def minio(args):
    if not args or args[0] != "server":
        sys.exit(f"minio stand-in: only `server DIR …` is served, not {args}")
    os.execv("/opt/moto/bin/moto_server", ["moto_server", "-H", "0.0.0.0", "-p", "9000"])


def aliases():
    return json.loads(ALIASES.read_text()) if ALIASES.exists() else {}


def client(alias):
    import boto3

    url, key, secret = aliases().get(alias, ["http://127.0.0.1:9000", "minio", "minio"])
    return boto3.client("s3", endpoint_url=url, aws_access_key_id=key,
                        aws_secret_access_key=secret, region_name="us-east-1")


def mc(args):
    if args[:1] == ["ready"]:
        url = aliases().get(args[1], ["http://127.0.0.1:9000"])[0] if len(args) > 1 else "http://127.0.0.1:9000"
        urllib.request.urlopen(f"{url}/moto-api/", timeout=2)
    elif args[:2] == ["alias", "set"]:
        name, url, key, secret = args[2:6]
        ALIASES.write_text(json.dumps({**aliases(), name: [url, key, secret]}))
    elif args[:1] == ["mb"]:
        target = [a for a in args[1:] if not a.startswith("--")][0]
        alias, bucket = target.split("/", 1)
        s3 = client(alias)
        existing = [b["Name"] for b in s3.list_buckets().get("Buckets", [])]
        if bucket in existing:
            if "--ignore-existing" not in args:
                sys.exit(f"mc stand-in: bucket {bucket} exists")
        else:
            s3.create_bucket(Bucket=bucket)
    elif args[:2] == ["version", "enable"]:
        alias, bucket = args[2].split("/", 1)
        client(alias).put_bucket_versioning(
            Bucket=bucket, VersioningConfiguration={"Status": "Enabled"})
    else:
        sys.exit(f"mc stand-in: `{' '.join(args)}` is not served")


if __name__ == "__main__":
    {"minio": minio, "mc": mc}[sys.argv[1]](sys.argv[2:])
