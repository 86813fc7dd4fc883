//! The API keys page: list the org's keys, create one (its secret shown once), revoke one.

use super::page::{render, Nav, WebResult, WebUser};
use crate::api::auth::api_keys::{new_key, org_keys, revoke, ApiKeyObject};
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
}

fn time(seconds: Option<i64>) -> String {
    seconds
        .and_then(|s| chrono::DateTime::from_timestamp(s, 0))
        .map(super::page::when)
        .unwrap_or_else(|| "never".to_string())
}

async fn page(
    state: &AppState,
    user: &WebUser,
    secret: Option<String>,
    error: Option<String>,
) -> WebResult<Response> {
    let keys = org_keys(state, &user.0)
        .await?
        .into_iter()
        .map(|key| KeyRow {
            created: time(Some(key.created_at)),
            last_used: time(key.last_used_at),
            key,
        })
        .collect();
    Ok(render(&KeysPage {
        nav: Nav::new("API keys", "keys"),
        keys,
        admin: user.is_admin(),
        secret,
        error,
    }))
}

async fn keys_page(State(state): State<AppState>, user: WebUser) -> WebResult<Response> {
    page(&state, &user, None, None).await
}

/// The create form.
#[derive(Debug, Deserialize)]
pub struct CreateForm {
    name: Option<String>,
}

async fn create(
    State(state): State<AppState>,
    user: WebUser,
    Form(form): Form<CreateForm>,
) -> WebResult<Response> {
    match new_key(&state, &user.0, form.name.as_deref().unwrap_or("")).await {
        Ok(created) => page(&state, &user, Some(created.secret), None).await,
        Err(error) if error.status.is_client_error() => {
            let status = error.status;
            let mut response = page(&state, &user, None, Some(error.message)).await?;
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
) -> WebResult<Response> {
    let id = uuid::Uuid::parse_str(&id).map_err(|_| ApiError::not_found("api key", &id))?;
    revoke(&state, &user.0, id).await?;
    Ok(Redirect::to("/keys").into_response())
}
