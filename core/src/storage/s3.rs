//! The S3 backend (AWS S3 or any S3-protocol server: MinIO, Ceph, moto…) via aws-sdk-s3.
//! Large objects are uploaded in parts so memory stays bounded by one part; every request is
//! retried with backoff by the SDK's standard retry policy.

use super::{validate_key, ByteReader, ObjectMeta, ObjectStore, StorageError};
use async_trait::async_trait;
use aws_sdk_s3::config::retry::RetryConfig;
use aws_sdk_s3::config::{
    Credentials, Region, RequestChecksumCalculation, ResponseChecksumValidation,
};
use aws_sdk_s3::presigning::PresigningConfig;
use aws_sdk_s3::primitives::ByteStream;
use aws_sdk_s3::types::{CompletedMultipartUpload, CompletedPart};
use aws_sdk_s3::Client;
use aws_smithy_types::error::display::DisplayErrorContext;
use bytes::{Bytes, BytesMut};
use chrono::{DateTime, Utc};
use std::time::Duration;
use tokio::io::AsyncReadExt;

/// The smallest part S3 accepts (except the last).
const MIN_PART: u64 = 5 * 1024 * 1024;

/// How to reach a bucket.
#[derive(Debug, Clone)]
pub struct S3Options {
    /// Bucket name.
    pub bucket: String,
    /// Key prefix inside the bucket (no leading or trailing `/`), may be empty.
    pub prefix: String,
    /// Endpoint URL; `None` uses `AWS_ENDPOINT_URL` or AWS itself.
    pub endpoint: Option<String>,
    /// Region; `None` uses the standard chain, then `us-east-1`.
    pub region: Option<String>,
    /// Static credentials; `None` uses the standard chain (env, profile, IMDS, …).
    pub credentials: Option<(String, String)>,
    /// Path-style addressing (self-hosted servers).
    pub path_style: bool,
    /// Objects at least this large are uploaded in parts of this size (at least 5 MiB).
    pub multipart_threshold: u64,
    /// Attempts per request, including the first.
    pub max_attempts: u32,
}

impl Default for S3Options {
    fn default() -> Self {
        S3Options {
            bucket: String::new(),
            prefix: String::new(),
            endpoint: None,
            region: None,
            credentials: None,
            path_style: true,
            multipart_threshold: 16 * 1024 * 1024,
            max_attempts: 5,
        }
    }
}

/// Objects in an S3 bucket.
#[derive(Debug, Clone)]
pub struct S3Store {
    client: Client,
    bucket: String,
    prefix: String,
    part_size: u64,
}

fn s3_error(op: &'static str, key: &str, err: impl std::error::Error) -> StorageError {
    StorageError::S3 { op, key: key.to_string(), message: DisplayErrorContext(err).to_string() }
}

/// The HTTPS client of S3 and of the credential chain (instance metadata, STS): rustls on ring
/// with the platform's root certificates, as the SDK's default client but without aws-lc.
fn https_client() -> aws_sdk_s3::config::SharedHttpClient {
    aws_smithy_http_client::Builder::new()
        .tls_provider(aws_smithy_http_client::tls::Provider::Rustls(
            aws_smithy_http_client::tls::rustls_provider::CryptoMode::Ring,
        ))
        .build_https()
}

impl S3Store {
    /// Builds a client from `options` and the standard AWS configuration chain.
    pub async fn connect(options: S3Options) -> Result<S3Store, StorageError> {
        if options.bucket.is_empty() {
            return Err(StorageError::Config("S3 bucket name is empty".to_string()));
        }
        let mut loader =
            aws_config::defaults(aws_config::BehaviorVersion::latest()).http_client(https_client());
        if let Some(region) = &options.region {
            loader = loader.region(Region::new(region.clone()));
        }
        if let Some((id, secret)) = &options.credentials {
            loader = loader.credentials_provider(Credentials::new(
                id,
                secret,
                None,
                None,
                "verity-static",
            ));
        }
        let shared = loader.load().await;
        let mut builder = aws_sdk_s3::config::Builder::from(&shared)
            .force_path_style(options.path_style)
            .retry_config(RetryConfig::standard().with_max_attempts(options.max_attempts.max(1)))
            // Third-party S3 servers vary in checksum support: only send what the operation needs.
            .request_checksum_calculation(RequestChecksumCalculation::WhenRequired)
            .response_checksum_validation(ResponseChecksumValidation::WhenRequired);
        if let Some(endpoint) = &options.endpoint {
            builder = builder.endpoint_url(endpoint);
        }
        if shared.region().is_none() {
            builder = builder.region(Region::new("us-east-1"));
        }
        Ok(S3Store {
            client: Client::from_conf(builder.build()),
            bucket: options.bucket,
            prefix: options.prefix.trim_matches('/').to_string(),
            part_size: options.multipart_threshold.max(MIN_PART),
        })
    }

    /// Creates the bucket unless it exists (laptop mode and tests).
    pub async fn create_bucket_if_missing(&self) -> Result<(), StorageError> {
        if self.client.head_bucket().bucket(&self.bucket).send().await.is_ok() {
            return Ok(());
        }
        self.client
            .create_bucket()
            .bucket(&self.bucket)
            .send()
            .await
            .map_err(|e| s3_error("create_bucket", &self.bucket, e))?;
        Ok(())
    }

    fn full_key(&self, key: &str) -> Result<String, StorageError> {
        validate_key(key)?;
        Ok(if self.prefix.is_empty() { key.to_string() } else { format!("{}/{key}", self.prefix) })
    }

    async fn put_multipart(
        &self,
        key: &str,
        full: &str,
        first: Bytes,
        reader: &mut ByteReader,
    ) -> Result<u64, StorageError> {
        let created = self
            .client
            .create_multipart_upload()
            .bucket(&self.bucket)
            .key(full)
            .send()
            .await
            .map_err(|e| s3_error("create_multipart_upload", key, e))?;
        let upload_id = created
            .upload_id()
            .ok_or_else(|| StorageError::S3 {
                op: "create_multipart_upload",
                key: key.to_string(),
                message: "no upload id".into(),
            })?
            .to_string();
        let uploaded = self.upload_parts(key, full, &upload_id, first, reader).await;
        if uploaded.is_err() {
            let _ = self
                .client
                .abort_multipart_upload()
                .bucket(&self.bucket)
                .key(full)
                .upload_id(&upload_id)
                .send()
                .await;
        }
        uploaded
    }

    async fn upload_parts(
        &self,
        key: &str,
        full: &str,
        upload_id: &str,
        first: Bytes,
        reader: &mut ByteReader,
    ) -> Result<u64, StorageError> {
        let mut parts = Vec::new();
        let mut total = 0u64;
        let mut chunk = first;
        let mut number = 1i32;
        while !chunk.is_empty() {
            total += chunk.len() as u64;
            let part = self
                .client
                .upload_part()
                .bucket(&self.bucket)
                .key(full)
                .upload_id(upload_id)
                .part_number(number)
                .body(ByteStream::from(chunk))
                .send()
                .await
                .map_err(|e| s3_error("upload_part", key, e))?;
            parts.push(
                CompletedPart::builder()
                    .set_e_tag(part.e_tag().map(str::to_string))
                    .part_number(number)
                    .build(),
            );
            number += 1;
            chunk =
                read_chunk(reader, self.part_size).await.map_err(|e| StorageError::io(key, e))?;
        }
        self.client
            .complete_multipart_upload()
            .bucket(&self.bucket)
            .key(full)
            .upload_id(upload_id)
            .multipart_upload(CompletedMultipartUpload::builder().set_parts(Some(parts)).build())
            .send()
            .await
            .map_err(|e| s3_error("complete_multipart_upload", key, e))?;
        Ok(total)
    }
}

/// Reads up to `size` bytes, fewer only at end of stream.
async fn read_chunk(reader: &mut ByteReader, size: u64) -> std::io::Result<Bytes> {
    let mut buf =
        BytesMut::with_capacity(usize::try_from(size).unwrap_or(usize::MAX).min(64 * 1024 * 1024));
    let mut limited = reader.take(size);
    while (buf.len() as u64) < size {
        if limited.read_buf(&mut buf).await? == 0 {
            break;
        }
    }
    Ok(buf.freeze())
}

fn to_chrono(date: Option<&aws_smithy_types::DateTime>) -> Option<DateTime<Utc>> {
    date.and_then(|d| DateTime::from_timestamp(d.secs(), d.subsec_nanos()))
}

#[async_trait]
impl ObjectStore for S3Store {
    async fn put_reader(&self, key: &str, mut reader: ByteReader) -> Result<u64, StorageError> {
        let full = self.full_key(key)?;
        let first =
            read_chunk(&mut reader, self.part_size).await.map_err(|e| StorageError::io(key, e))?;
        if (first.len() as u64) < self.part_size {
            let size = first.len() as u64;
            self.client
                .put_object()
                .bucket(&self.bucket)
                .key(&full)
                .body(ByteStream::from(first))
                .send()
                .await
                .map_err(|e| s3_error("put_object", key, e))?;
            return Ok(size);
        }
        self.put_multipart(key, &full, first, &mut reader).await
    }

    async fn get_reader(&self, key: &str) -> Result<ByteReader, StorageError> {
        let full = self.full_key(key)?;
        match self.client.get_object().bucket(&self.bucket).key(&full).send().await {
            Ok(output) => Ok(Box::pin(output.body.into_async_read())),
            Err(err) if err.as_service_error().is_some_and(|e| e.is_no_such_key()) => {
                Err(StorageError::NotFound(key.to_string()))
            }
            Err(err) => Err(s3_error("get_object", key, err)),
        }
    }

    async fn head(&self, key: &str) -> Result<Option<ObjectMeta>, StorageError> {
        let full = self.full_key(key)?;
        match self.client.head_object().bucket(&self.bucket).key(&full).send().await {
            Ok(output) => Ok(Some(ObjectMeta {
                key: key.to_string(),
                size: output.content_length().unwrap_or(0).max(0) as u64,
                last_modified: to_chrono(output.last_modified()),
            })),
            Err(err) if err.as_service_error().is_some_and(|e| e.is_not_found()) => Ok(None),
            Err(err) => Err(s3_error("head_object", key, err)),
        }
    }

    async fn list(&self, prefix: &str) -> Result<Vec<ObjectMeta>, StorageError> {
        let full_prefix = if self.prefix.is_empty() {
            prefix.to_string()
        } else {
            format!("{}/{prefix}", self.prefix)
        };
        let strip = if self.prefix.is_empty() { 0 } else { self.prefix.len() + 1 };
        let mut pages = self
            .client
            .list_objects_v2()
            .bucket(&self.bucket)
            .prefix(&full_prefix)
            .into_paginator()
            .send();
        let mut objects = Vec::new();
        while let Some(page) = pages.next().await {
            let page = page.map_err(|e| s3_error("list_objects_v2", prefix, e))?;
            for object in page.contents() {
                let Some(key) = object.key() else { continue };
                objects.push(ObjectMeta {
                    key: key.get(strip..).unwrap_or(key).to_string(),
                    size: object.size().unwrap_or(0).max(0) as u64,
                    last_modified: to_chrono(object.last_modified()),
                });
            }
        }
        objects.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(objects)
    }

    async fn delete(&self, key: &str) -> Result<(), StorageError> {
        let full = self.full_key(key)?;
        self.client
            .delete_object()
            .bucket(&self.bucket)
            .key(&full)
            .send()
            .await
            .map_err(|e| s3_error("delete_object", key, e))?;
        Ok(())
    }

    async fn presign_get(&self, key: &str, expires_in: Duration) -> Result<String, StorageError> {
        let full = self.full_key(key)?;
        let config =
            PresigningConfig::expires_in(expires_in).map_err(|e| s3_error("presign", key, e))?;
        let request = self
            .client
            .get_object()
            .bucket(&self.bucket)
            .key(&full)
            .presigned(config)
            .await
            .map_err(|e| s3_error("presign", key, e))?;
        Ok(request.uri().to_string())
    }
}
