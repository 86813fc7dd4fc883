//! Argon2 work of sign-ins and key checks, off the async threads and at most
//! `VERITY_HASH_CONCURRENCY` at once (each hash holds ~19 MiB), so that a flood of attempts
//! waits briefly or gets 429 instead of growing the server's memory.

use super::keys;
use crate::api::error::ApiError;
use std::sync::{Arc, OnceLock};
use std::time::Duration;
use tokio::sync::Semaphore;

/// How long a check waits for a hashing slot before answering 429.
pub const HASH_WAIT: Duration = Duration::from_secs(2);

/// The slots of concurrent argon2 hashes.
#[derive(Debug, Clone)]
pub struct Hasher {
    /// The slots themselves: a held permit is a hash running.
    pub permits: Arc<Semaphore>,
    size: usize,
}

/// The 429 of a check that found every hashing slot taken for [`HASH_WAIT`].
fn busy() -> ApiError {
    ApiError {
        message: "too many sign-ins are being checked at once; retry shortly".into(),
        ..ApiError::rate_limited(1)
    }
}

/// A hash of a random secret, verified in place of a missing one so that an unknown e-mail
/// costs the same time as a wrong password.
fn dummy_hash() -> &'static str {
    static DUMMY: OnceLock<String> = OnceLock::new();
    DUMMY.get_or_init(|| {
        let secret = keys::generate_key().key;
        keys::hash_secret(&secret).unwrap_or_default()
    })
}

impl Hasher {
    /// `concurrency` slots (0: one per CPU core).
    pub fn new(concurrency: usize) -> Hasher {
        let size = match concurrency {
            0 => std::thread::available_parallelism().map_or(2, |n| n.get()),
            n => n,
        };
        Hasher { permits: Arc::new(Semaphore::new(size)), size }
    }

    /// Number of slots.
    pub fn size(&self) -> usize {
        self.size
    }

    async fn run<T: Send + 'static>(
        &self,
        work: impl FnOnce() -> T + Send + 'static,
    ) -> Result<T, ApiError> {
        let permit = tokio::time::timeout(HASH_WAIT, self.permits.clone().acquire_owned())
            .await
            .map_err(|_| busy())?
            .map_err(|e| ApiError::internal("hashing slots", e))?;
        let outcome = tokio::task::spawn_blocking(move || {
            let outcome = work();
            drop(permit);
            outcome
        })
        .await
        .map_err(|e| ApiError::internal("hashing", e))?;
        Ok(outcome)
    }

    /// True when `secret` matches the PHC string `hash`; `None` verifies against a dummy hash
    /// (same cost) and is false.
    pub async fn verify(&self, secret: String, hash: Option<String>) -> Result<bool, ApiError> {
        self.run(move || match hash {
            Some(hash) => keys::verify_secret(&secret, &hash),
            None => {
                keys::verify_secret(&secret, dummy_hash());
                false
            }
        })
        .await
    }

    /// The argon2id PHC string of `secret`.
    pub async fn hash(&self, secret: String) -> Result<String, ApiError> {
        self.run(move || keys::hash_secret(&secret))
            .await?
            .map_err(|e| ApiError::internal("hashing a secret", e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_full_hasher_answers_429_after_the_wait() {
        let hasher = Hasher::new(1);
        let hash = hasher.hash("password123".into()).await.unwrap();
        assert!(hasher.verify("password123".into(), Some(hash.clone())).await.unwrap());
        assert!(!hasher.verify("password123".into(), None).await.unwrap());
        let held = hasher.permits.clone().acquire_owned().await.unwrap();
        let refused = hasher.verify("password123".into(), Some(hash)).await.unwrap_err();
        assert_eq!(refused.status, axum::http::StatusCode::TOO_MANY_REQUESTS);
        drop(held);
    }
}
