//! `GET /v1/verity/loss_presets`: the loss family and the hyperparameters each preset sets,
//! derived from `verity_core::spec::Loss` (the dashboard's preset buttons read it).

use super::auth::Principal;
use super::error::{ApiError, ApiResult};
use super::state::AppState;
use axum::routing::get;
use axum::{Json, Router};
use serde::Serialize;
use serde_json::Value;
use utoipa::ToSchema;
use verity_core::spec::Loss;

/// Routes of this module.
pub fn router() -> Router<AppState> {
    Router::new().route("/v1/verity/loss_presets", get(list_loss_presets))
}

/// One loss and its preset.
#[derive(Debug, Serialize, ToSchema)]
pub struct LossPresetObject {
    /// The loss's spelling in `hyperparameters.loss` (`grpo`, `dapo`, `dr_grpo`, `gspo`, `cispo`).
    pub id: &'static str,
    /// Always `loss_preset`.
    pub object: &'static str,
    /// Its name as people read it (`Dr. GRPO`).
    pub label: &'static str,
    /// Hyperparameters the preset sets (`loss`, `epsilon_low`, `epsilon_high`, `scale_rewards`,
    /// `dynamic_sampling`, `beta`); merge them into a job's `hyperparameters`.
    #[schema(value_type = Object)]
    pub hyperparameters: Value,
}

/// The loss presets.
#[derive(Debug, Serialize, ToSchema)]
pub struct LossPresetList {
    /// Always `list`.
    pub object: &'static str,
    /// One preset per loss, in documentation order.
    pub data: Vec<LossPresetObject>,
}

/// Every policy loss Verity implements, with the hyperparameters its preset sets (its defaults
/// made explicit).
#[utoipa::path(get, path = "/v1/verity/loss_presets", tag = "fine_tuning",
    responses((status = 200, body = LossPresetList), (status = 401)))]
pub async fn list_loss_presets(_principal: Principal) -> ApiResult<Json<LossPresetList>> {
    let data = Loss::ALL
        .into_iter()
        .map(|loss| {
            let hyperparameters = serde_json::to_value(loss.preset())
                .map_err(|e| ApiError::internal("serialising a loss preset", e))?;
            Ok(LossPresetObject {
                id: loss.as_str(),
                object: "loss_preset",
                label: loss.label(),
                hyperparameters,
            })
        })
        .collect::<ApiResult<_>>()?;
    Ok(Json(LossPresetList { object: "list", data }))
}
