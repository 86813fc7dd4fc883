//! The API keys page: list the org's keys, create one with a role and an expiry (its secret
//! shown once), revoke one (after a confirmation that says when it is this browser's own key).

use super::jobs::{ConfirmForm, ConfirmPage};
use super::page::{render, Nav, WebResult, WebUser};
use crate::api::auth::api_keys::{new_key, org_keys, revoke, ApiKeyObject, CreateKeyRequest};
use crate::api::error::ApiError;
use crate::api::state::AppState;
use askama::Template;
use axum::extract::{Path, State};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use axum::{Form, Router};
use serde::Deserialize;

/// Routes of this module.
pub fn router() -> Router<AppState> {
    Router::new()
        .route("/keys", get(keys_page).post(create))
        .route("/keys/{key_id}/revoke", post(revoke_key))
}

/// A key row as shown.
struct KeyRow {
    key: ApiKeyObject,
    created: String,
    last_used: String,
    expires: String,
    /// The key this browser's session was signed in with.
    own: bool,
}

/// The keys page.
#[derive(Template)]
#[template(path = "keys.html")]
struct KeysPage {
    nav: Nav,
    keys: Vec<KeyRow>,
    admin: bool,
    secret: Option<String>,
    error: Option<String>,
    /// The form field the error names (`name`, `role`, `expires_days`), shown next to it.
    error_field: String,
    /// The name typed, kept after an error.
    name: String,
}

/// The create form's fields that show their own error.
const FORM_FIELDS: [&str; 3] = ["name", "role", "expires_days"];

impl KeysPage {
    /// The error to show next to form field `field`, when it names that field.
    fn field_error(&self, field: &str) -> Option<&str> {
        self.error.as_deref().filter(|_| self.error_field == field)
    }

    /// The error to show above the form: one naming none of its fields.
    fn form_error(&self) -> Option<&str> {
        self.error.as_deref().filter(|_| !FORM_FIELDS.contains(&self.error_field.as_str()))
    }
}

fn time(seconds: Option<i64>) -> String {
    seconds
        .and_then(|s| chrono::DateTime::from_timestamp(s, 0))
        .map(super::page::when)
        .unwrap_or_else(|| "never".to_string())
}

/// What the create form shows again after a refusal: the error, the field it names and the
/// name typed.
#[derive(Default)]
struct Refusal {
    error: Option<String>,
    field: String,
    name: String,
}

async fn page(
    state: &AppState,
    user: &WebUser,
    secret: Option<String>,
    refusal: Refusal,
) -> WebResult<Response> {
    let keys = org_keys(state, &user.0)
        .await?
        .into_iter()
        .map(|key| KeyRow {
            created: time(Some(key.created_at)),
            last_used: time(key.last_used_at),
            expires: time(key.expires_at),
            own: user.0.key_id == Some(key.id),
            key,
        })
        .collect();
    Ok(render(&KeysPage {
        nav: Nav::new("API keys", "keys"),
        keys,
        admin: user.is_admin(),
        secret,
        error: refusal.error,
        error_field: refusal.field,
        name: refusal.name,
    }))
}

async fn keys_page(State(state): State<AppState>, user: WebUser) -> WebResult<Response> {
    page(&state, &user, None, Refusal::default()).await
}

/// The create form.
#[derive(Debug, Deserialize)]
pub struct CreateForm {
    name: Option<String>,
    /// `admin` or `member`.
    role: Option<String>,
    /// Days until the key expires (empty: never).
    expires_days: Option<String>,
}

/// The longest expiry the form offers, in days.
const MAX_DAYS: i64 = 3650;

impl CreateForm {
    /// The API request this form stands for, or a 400 naming the field.
    fn request(&self) -> Result<CreateKeyRequest, ApiError> {
        let expires_at = match self.expires_days.as_deref().map(str::trim) {
            None | Some("") | Some("never") => None,
            Some(days) => {
                let days: i64 =
                    days.parse().ok().filter(|d| (1..=MAX_DAYS).contains(d)).ok_or_else(|| {
                        ApiError::invalid(
                            "expires_days",
                            format!("a whole number of days, 1 to {MAX_DAYS}"),
                        )
                    })?;
                Some(chrono::Utc::now().timestamp() + days * 86_400)
            }
        };
        Ok(CreateKeyRequest { name: self.name.clone(), role: self.role.clone(), expires_at })
    }
}

async fn create(
    State(state): State<AppState>,
    user: WebUser,
    Form(form): Form<CreateForm>,
) -> WebResult<Response> {
    let created = match form.request().and_then(|r| r.grant().map(|g| (r, g))) {
        Ok((request, grant)) => {
            new_key(&state, &user.0, request.name.as_deref().unwrap_or(""), grant).await
        }
        Err(error) => Err(error),
    };
    match created {
        Ok(created) => page(&state, &user, Some(created.secret), Refusal::default()).await,
        Err(error) if error.status.is_client_error() => {
            let status = error.status;
            let refusal = Refusal {
                field: error.param.clone().unwrap_or_default(),
                error: Some(error.message),
                name: form.name.clone().unwrap_or_default(),
            };
            let mut response = page(&state, &user, None, refusal).await?;
            *response.status_mut() = status;
            Ok(response)
        }
        Err(error) => Err(error.into()),
    }
}

async fn revoke_key(
    State(state): State<AppState>,
    user: WebUser,
    Path(id): Path<String>,
    Form(form): Form<ConfirmForm>,
) -> WebResult<Response> {
    let id = uuid::Uuid::parse_str(&id).map_err(|_| ApiError::not_found("api key", &id))?;
    if !form.confirmed() {
        let own = if user.0.key_id == Some(id) {
            " This is the key this browser is signed in with: you will be signed out."
        } else {
            ""
        };
        return Ok(render(&ConfirmPage {
            nav: Nav::new("Revoke key", "keys"),
            question: format!(
                "Revoke this API key? Everything using it stops working at once.{own}"
            ),
            action: format!("/keys/{id}/revoke"),
            button: "Revoke key".into(),
            back: "/keys".into(),
            affected: Vec::new(),
        }));
    }
    revoke(&state, &user.0, id).await?;
    Ok(Redirect::to("/keys").into_response())
}
