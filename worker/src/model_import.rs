//! A model folder (or GGUF file) checked, published to the object store and registered
//! (`verity models import`), and a hub model fetched then imported (`verity models pull`, and
//! the API's pulls a worker runs).

use crate::hub::{fetch, Fetched, Hub};
use anyhow::{bail, Context};
use std::path::Path;
use uuid::Uuid;
use verity_core::models::{check_model_name, model_by_id, HubIdSet};
use verity_core::storage::ObjectStore;

/// Checks that `path` loads as a model (`format` `hf`: a folder, `gguf`: a file), publishes it
/// under `models/{name}` and registers it as a base model of org `org_id` (`None`: shared with
/// every org). Returns its folder in the store.
pub async fn import_model(
    pool: &sqlx::PgPool,
    store: &dyn ObjectStore,
    org_id: Option<Uuid>,
    name: &str,
    path: &Path,
    format: &str,
) -> anyhow::Result<String> {
    if let Err(reason) = check_model_name(name) {
        bail!("invalid model name {name:?}: {reason}");
    }
    if model_by_id(pool, name).await?.is_some() {
        bail!("a model named {name:?} already exists");
    }
    match format {
        "hf" if !path.is_dir() => bail!("{} is not a folder", path.display()),
        "gguf" if !path.is_file() => bail!("{} is not a file", path.display()),
        _ => {}
    }
    let check = path.to_path_buf();
    let loaded = tokio::task::spawn_blocking(move || {
        crate::load_model(&check, &crate::parse_device("cpu")?).map(|m| m.model.config.clone())
    })
    .await?
    .with_context(|| format!("{} does not load as a model", path.display()))?;
    let prefix = verity_core::keys::model(name);
    if format == "gguf" {
        let staging = std::env::temp_dir().join(format!("verity-import-{}", Uuid::new_v4()));
        std::fs::create_dir_all(&staging)?;
        let file_name = path.file_name().map_or_else(|| "model.gguf".into(), |n| n.to_os_string());
        let staged = staging.join(file_name);
        let published = async {
            if std::fs::hard_link(path, &staged).is_err() {
                std::fs::copy(path, &staged)
                    .with_context(|| format!("copying {}", path.display()))?;
            }
            verity_core::storage::publish_folder(store, &staging, &prefix)
                .await
                .context("publishing the model")
        }
        .await;
        let _ = std::fs::remove_dir_all(&staging);
        published?;
    } else {
        verity_core::storage::publish_folder(store, path, &prefix)
            .await
            .context("publishing the model")?;
    }
    let config = serde_json::json!({
        "family": loaded.family.model_type(),
        "layers": loaded.num_hidden_layers,
        "hidden_size": loaded.hidden_size,
        "vocab_size": loaded.vocab_size,
    });
    if !verity_core::models::insert_base_model(pool, org_id, name, &prefix, format, &config).await?
    {
        bail!("a model named {name:?} already exists");
    }
    Ok(prefix)
}

/// Gives the registered model `name` its hub id (`verity models pull`, `import`/`share
/// --hub-id`, `hub-id`, the API's pulls): an error naming the model of its scope that already
/// has it.
pub async fn give_hub_id(pool: &sqlx::PgPool, name: &str, hub_id: &str) -> anyhow::Result<()> {
    match verity_core::models::set_hub_id(pool, name, hub_id).await? {
        HubIdSet::Set => Ok(()),
        HubIdSet::Taken(holder) => {
            bail!("the hub id {hub_id:?} already names the model {holder:?}")
        }
        HubIdSet::NoModel => bail!("no model named {name:?}"),
    }
}

/// A pulled model.
#[derive(Debug, Clone)]
pub struct Pulled {
    /// The name it is registered under.
    pub name: String,
    /// Its folder in the object store.
    pub prefix: String,
    /// What was fetched.
    pub fetched: Fetched,
    /// The hub id it answers to as well (`OWNER/NAME`); `None` when another model of its scope
    /// has it.
    pub hub_id: Option<String>,
}

/// Fetches `spec` (`OWNER/NAME[@REVISION]`) and imports it under `name` (default:
/// [`verity_core::models::default_pull_name`] of its id) for org `org_id` (`None`: shared), as
/// [`import_model`] does, with its hub id as a second name unless another model of the scope has
/// it (a warning, not an error: the pull is done).
pub async fn pull(
    pool: &sqlx::PgPool,
    store: &dyn ObjectStore,
    hub: &Hub,
    spec: &str,
    name: Option<&str>,
    org_id: Option<Uuid>,
) -> anyhow::Result<Pulled> {
    let (id, _) = crate::hub::parse_model_ref(spec)?;
    let name = name.map_or_else(|| verity_core::models::default_pull_name(&id), str::to_string);
    if let Err(reason) = check_model_name(&name) {
        bail!("invalid model name {name:?}: {reason}");
    }
    if model_by_id(pool, &name).await?.is_some() {
        bail!("a model named {name:?} already exists (give another with --name)");
    }
    let fetched = fetch(hub, spec).await?;
    let prefix = import_model(pool, store, org_id, &name, &fetched.dir, "hf").await?;
    let hub_id = match give_hub_id(pool, &name, &fetched.repo).await {
        Ok(()) => Some(fetched.repo.clone()),
        Err(e) => {
            tracing::warn!("{e:#}; jobs name the pulled model {name:?}");
            None
        }
    };
    Ok(Pulled { name, prefix, fetched, hub_id })
}
