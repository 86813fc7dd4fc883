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

/// How the holder of a token signed in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TokenSource {
    /// E-mail and password.
    Password,
    /// An API key (named by the `kid` claim): the token dies with the key.
    ApiKey,
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
    /// How the holder signed in (required: tokens without it are refused).
    pub src: TokenSource,
    /// The API key the token was minted from (`src` = `api_key`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kid: Option<Uuid>,
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

    /// A token for this user, valid for the configured lifetime; `key_id` is the API key it is
    /// minted from (`None`: a password sign-in).
    pub fn mint(
        &self,
        user_id: Uuid,
        org_id: Uuid,
        role: Role,
        key_id: Option<Uuid>,
    ) -> Result<String, TokenError> {
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
            src: if key_id.is_some() { TokenSource::ApiKey } else { TokenSource::Password },
            kid: key_id,
        })
    }

    /// Signs arbitrary claims (tests use it to build expired tokens).
    pub fn mint_claims(&self, claims: &Claims) -> Result<String, TokenError> {
        encode(&Header::new(Algorithm::HS256), claims, &self.encoding)
            .map_err(|e| TokenError(e.to_string()))
    }

    /// The claims of a valid token (signature, issuer, audience, expiry, and a `kid` exactly
    /// when minted from a key); whether that key still stands is the caller's check.
    pub fn verify(&self, token: &str) -> Result<Claims, TokenError> {
        let claims = decode::<Claims>(token, &self.decoding, &self.validation)
            .map(|data| data.claims)
            .map_err(|e| TokenError(e.to_string()))?;
        if (claims.src == TokenSource::ApiKey) != claims.kid.is_some() {
            return Err(TokenError("kid must name the key of an api_key token".into()));
        }
        Ok(claims)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::state::ApiConfig;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct Flags {
        #[command(flatten)]
        api: ApiConfig,
    }

    #[test]
    fn token_lifetime_defaults_to_fifteen_minutes_and_is_configurable() {
        let parse = |args: &[&str]| {
            let mut all = vec!["verity", "--jwt-secret", "s"];
            all.extend_from_slice(args);
            Flags::try_parse_from(all).unwrap().api.token_ttl_seconds
        };
        if std::env::var_os("VERITY_TOKEN_TTL_SECONDS").is_none() {
            assert_eq!(parse(&[]), 900);
        }
        assert_eq!(parse(&["--token-ttl-seconds", "60"]), 60);
    }

    fn service() -> TokenService {
        TokenService::new(TokenSettings {
            secret: b"0123456789abcdef0123456789abcdef".to_vec(),
            issuer: "verity".into(),
            audience: "verity-api".into(),
            ttl: Duration::from_secs(60),
        })
    }

    #[test]
    fn tokens_name_their_key_and_claims_must_agree() {
        let tokens = service();
        let (user, org, key) = (Uuid::new_v4(), Uuid::new_v4(), Uuid::new_v4());
        let from_key = tokens.verify(&tokens.mint(user, org, Role::Admin, Some(key)).unwrap());
        let from_key = from_key.unwrap();
        assert_eq!((from_key.src, from_key.kid), (TokenSource::ApiKey, Some(key)));
        let by_password = tokens.verify(&tokens.mint(user, org, Role::Admin, None).unwrap());
        assert_eq!(by_password.unwrap().src, TokenSource::Password);

        let mut forged = from_key.clone();
        forged.kid = None;
        assert!(tokens.verify(&tokens.mint_claims(&forged).unwrap()).is_err(), "no kid");
        forged.src = TokenSource::Password;
        forged.kid = Some(key);
        assert!(tokens.verify(&tokens.mint_claims(&forged).unwrap()).is_err(), "stray kid");

        // A token without `src` (minted before it existed) is refused.
        let mut legacy = serde_json::to_value(&from_key).unwrap();
        legacy.as_object_mut().unwrap().remove("src");
        legacy.as_object_mut().unwrap().remove("kid");
        let legacy = encode(&Header::new(Algorithm::HS256), &legacy, &tokens.encoding).unwrap();
        assert!(tokens.verify(&legacy).is_err());
    }
}
