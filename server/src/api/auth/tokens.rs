//! JWT access tokens: HS256 only, issuer, audience and expiry pinned and required.

use jsonwebtoken::{decode, encode, Algorithm, DecodingKey, EncodingKey, Header, Validation};
use serde::{Deserialize, Serialize};
use std::time::Duration;
use uuid::Uuid;
use verity_core::tenancy::Role;

/// Settings of the token service.
#[derive(Debug, Clone)]
pub struct TokenSettings {
    /// HMAC secret (at least 32 bytes).
    pub secret: Vec<u8>,
    /// `iss` claim.
    pub issuer: String,
    /// `aud` claim.
    pub audience: String,
    /// Lifetime of minted tokens.
    pub ttl: Duration,
}

/// The claims of an access token.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Claims {
    /// User id.
    pub sub: Uuid,
    /// Org id.
    pub org: Uuid,
    /// Role.
    pub role: Role,
    /// Issuer.
    pub iss: String,
    /// Audience.
    pub aud: String,
    /// Issued at (Unix seconds).
    pub iat: i64,
    /// Expiry (Unix seconds).
    pub exp: i64,
}

/// Mints and checks access tokens.
pub struct TokenService {
    settings: TokenSettings,
    encoding: EncodingKey,
    decoding: DecodingKey,
    validation: Validation,
}

impl std::fmt::Debug for TokenService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenService")
            .field("issuer", &self.settings.issuer)
            .finish_non_exhaustive()
    }
}

/// Why a token was refused.
#[derive(Debug, thiserror::Error)]
#[error("invalid access token: {0}")]
pub struct TokenError(String);

impl TokenService {
    /// A service for `settings`.
    pub fn new(settings: TokenSettings) -> TokenService {
        let mut validation = Validation::new(Algorithm::HS256);
        validation.algorithms = vec![Algorithm::HS256];
        validation.set_issuer(&[settings.issuer.as_str()]);
        validation.set_audience(&[settings.audience.as_str()]);
        validation.set_required_spec_claims(&["exp", "iss", "aud", "sub"]);
        validation.leeway = 5;
        validation.validate_exp = true;
        TokenService {
            encoding: EncodingKey::from_secret(&settings.secret),
            decoding: DecodingKey::from_secret(&settings.secret),
            validation,
            settings,
        }
    }

    /// Token lifetime.
    pub fn ttl(&self) -> Duration {
        self.settings.ttl
    }

    /// A token for this user, valid for the configured lifetime.
    pub fn mint(&self, user_id: Uuid, org_id: Uuid, role: Role) -> Result<String, TokenError> {
        let now = chrono::Utc::now().timestamp();
        let ttl = i64::try_from(self.settings.ttl.as_secs()).unwrap_or(3600);
        self.mint_claims(&Claims {
            sub: user_id,
            org: org_id,
            role,
            iss: self.settings.issuer.clone(),
            aud: self.settings.audience.clone(),
            iat: now,
            exp: now + ttl,
        })
    }

    /// Signs arbitrary claims (tests use it to build expired tokens).
    pub fn mint_claims(&self, claims: &Claims) -> Result<String, TokenError> {
        encode(&Header::new(Algorithm::HS256), claims, &self.encoding)
            .map_err(|e| TokenError(e.to_string()))
    }

    /// The claims of a valid token.
    pub fn verify(&self, token: &str) -> Result<Claims, TokenError> {
        decode::<Claims>(token, &self.decoding, &self.validation)
            .map(|data| data.claims)
            .map_err(|e| TokenError(e.to_string()))
    }
}
