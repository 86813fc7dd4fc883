//! `verity models convert` (a GGUF file to an HF folder that transformers loads unchanged),
//! `verity models import` (a checked model published to the store and registered) and `verity
//! models pull` (a model from a Hugging Face-compatible hub, then imported:
//! [`verity_worker::model_import::pull`]).

pub use verity_worker::model_import::{give_hub_id, import_model};
use verity_worker::{hub, model_import};

use anyhow::{bail, Context};
use clap::{Args, Subcommand};
use std::path::{Path, PathBuf};
use verity_core::config::{DatabaseConfig, StorageConfig};
use verity_core::storage::ObjectStore;

/// Model commands.
#[derive(Debug, Subcommand)]
pub enum ModelsCommand {
    /// Convert a GGUF file (dequantised; q/k un-permuted) into an HF folder: config.json,
    /// tokenizer.json, tokenizer_config.json (chat template), generation_config.json,
    /// model.safetensors.
    Convert(ConvertArgs),
    /// Check that an HF folder or a GGUF file loads (config, tokenizer, weights), publish it to the
    /// object store under `models/{name}` and register it as a base model every org can use
    /// (`--kind embedding`: a sentence-transformers folder for `cosine` graders).
    Import(ImportArgs),
    /// Fetch a model by its hub name (`Qwen/Qwen3-1.7B`, `OWNER/NAME@REVISION`) from a Hugging
    /// Face-compatible hub (`HF_ENDPOINT`, `HF_TOKEN`, the shared `HF_HOME` cache), check each
    /// file's SHA-256, and import it as `import --hf` does.
    Pull(PullArgs),
    /// Publish a model folder (or GGUF file) already in the object store as a shared base model
    /// every org can use: the operator's act, which the API refuses to org admins.
    Share(ShareArgs),
    /// Give a registered model the hub id it came from (`OWNER/NAME`), accepted wherever its
    /// name is (`pull` does this itself; for models pulled or imported before).
    HubId(HubIdArgs),
}

/// Options of `verity models hub-id`.
#[derive(Debug, Args)]
pub struct HubIdArgs {
    /// The model's name.
    pub name: String,
    /// Its hub id, `OWNER/NAME`.
    pub hub_id: String,
    /// Database.
    #[command(flatten)]
    pub db: DatabaseConfig,
}

/// Options of `verity models share`.
#[derive(Debug, Args)]
pub struct ShareArgs {
    /// Name jobs use as `model`.
    #[arg(long)]
    pub name: String,
    /// Where the model is in the object store (e.g. `models/qwen2.5-0.5b`).
    #[arg(long = "storage-prefix")]
    pub storage_prefix: String,
    /// `hf`, `gguf` or `peft`.
    #[arg(long, default_value = "hf", value_parser = ["hf", "gguf", "peft"])]
    pub format: String,
    /// The hub id the model came from (`OWNER/NAME`), accepted wherever its name is.
    #[arg(long)]
    pub hub_id: Option<String>,
    /// Database.
    #[command(flatten)]
    pub db: DatabaseConfig,
    /// Object storage.
    #[command(flatten)]
    pub storage: StorageConfig,
}

/// Options of `verity models pull`.
#[derive(Debug, Args)]
pub struct PullArgs {
    /// The hub's name of the model, `OWNER/NAME` or `OWNER/NAME@REVISION` (branch, tag or
    /// commit; default `main`).
    pub model: String,
    /// Name jobs use as `model` (default: the part after the `/`, e.g. `Qwen3-1.7B`).
    #[arg(long)]
    pub name: Option<String>,
    /// Database.
    #[command(flatten)]
    pub db: DatabaseConfig,
    /// Object storage.
    #[command(flatten)]
    pub storage: StorageConfig,
}

/// Options of `verity models import`.
#[derive(Debug, Args)]
pub struct ImportArgs {
    /// Name jobs use as `model`.
    #[arg(long)]
    pub name: String,
    /// An HF folder (config.json, tokenizer.json, *.safetensors).
    #[arg(long, conflicts_with = "gguf", required_unless_present = "gguf")]
    pub hf: Option<PathBuf>,
    /// A GGUF file.
    #[arg(long)]
    pub gguf: Option<PathBuf>,
    /// `base` (a language model to train, serve or judge with) or `embedding` (a
    /// sentence-transformers folder, given with `--hf`, that `cosine` graders name by id).
    #[arg(long, default_value = "base", value_parser = ["base", "embedding"])]
    pub kind: String,
    /// The hub id the folder came from (`OWNER/NAME`, e.g. `Qwen/Qwen3-1.7B`), accepted
    /// wherever the model's name is (`verity models pull` sets it itself).
    #[arg(long)]
    pub hub_id: Option<String>,
    /// Database.
    #[command(flatten)]
    pub db: DatabaseConfig,
    /// Object storage.
    #[command(flatten)]
    pub storage: StorageConfig,
}

/// Options of `verity models convert`.
#[derive(Debug, Args)]
pub struct ConvertArgs {
    /// The GGUF file.
    #[arg(long)]
    pub gguf: PathBuf,
    /// Output folder (created).
    #[arg(long)]
    pub out: PathBuf,
}

/// Checks a `--hub-id` before anything is registered: the hub's rules, and no model has it.
async fn check_free_hub_id(pool: &sqlx::PgPool, hub_id: Option<&str>) -> anyhow::Result<()> {
    let Some(hub_id) = hub_id else { return Ok(()) };
    verity_core::models::check_hub_id(hub_id)
        .map_err(|rule| anyhow::anyhow!("--hub-id {hub_id:?}: {rule}"))?;
    if let Some(holder) = verity_core::models::hub_id_holder(pool, None, hub_id).await? {
        bail!("--hub-id {hub_id:?} already names the model {holder:?}");
    }
    Ok(())
}

/// Runs a model subcommand.
pub async fn run(command: &ModelsCommand) -> anyhow::Result<()> {
    match command {
        ModelsCommand::Convert(args) => {
            let (gguf, out) = (args.gguf.clone(), args.out.clone());
            tokio::task::spawn_blocking(move || verity_worker::convert_gguf(&gguf, &out))
                .await?
                .with_context(|| format!("converting {}", args.gguf.display()))?;
            println!("{}", serde_json::json!({ "converted": args.gguf, "out": args.out }));
            Ok(())
        }
        ModelsCommand::Import(args) => {
            let (pool, store) = database_and_store(&args.db, &args.storage).await?;
            let (path, format) = match (&args.hf, &args.gguf) {
                (Some(dir), _) => (dir.as_path(), "hf"),
                (None, Some(file)) => (file.as_path(), "gguf"),
                (None, None) => bail!("give --hf DIR or --gguf FILE"),
            };
            check_free_hub_id(&pool, args.hub_id.as_deref()).await?;
            let prefix = match args.kind.as_str() {
                verity_core::models::EMBEDDING if format == "hf" => {
                    import_embedding_model(&pool, store.as_ref(), &args.name, path).await?
                }
                verity_core::models::EMBEDDING => bail!("an embedding model is an --hf folder"),
                _ => import_model(&pool, store.as_ref(), None, &args.name, path, format).await?,
            };
            if let Some(hub_id) = &args.hub_id {
                give_hub_id(&pool, &args.name, hub_id).await?;
            }
            println!(
                "{}",
                serde_json::json!({ "model": args.name, "kind": args.kind, "format": format,
                                    "storage_prefix": prefix, "hub_id": args.hub_id })
            );
            Ok(())
        }
        ModelsCommand::Pull(args) => {
            let (pool, store) = database_and_store(&args.db, &args.storage).await?;
            let hub = hub::Hub::from_env();
            let model_import::Pulled { name, prefix, fetched, hub_id } = model_import::pull(
                &pool,
                store.as_ref(),
                &hub,
                &args.model,
                args.name.as_deref(),
                None,
            )
            .await?;
            println!(
                "{}",
                serde_json::json!({ "model": name, "kind": "base", "format": "hf",
                    "storage_prefix": prefix, "hub_model": fetched.repo, "hub_id": hub_id,
                    "revision": fetched.revision, "commit": fetched.commit,
                    "cache": fetched.dir, "files": fetched.files, "downloaded": fetched.downloaded })
            );
            Ok(())
        }
        ModelsCommand::HubId(args) => {
            let pool = verity_core::db::connect(&args.db.database_url, 2).await?;
            verity_core::db::migrate(&pool).await.context("migrating the database")?;
            verity_core::models::check_hub_id(&args.hub_id)
                .map_err(|rule| anyhow::anyhow!("{:?}: {rule}", args.hub_id))?;
            give_hub_id(&pool, &args.name, &args.hub_id).await?;
            println!("{}", serde_json::json!({ "model": args.name, "hub_id": args.hub_id }));
            Ok(())
        }
        ModelsCommand::Share(args) => {
            let (pool, store) = database_and_store(&args.db, &args.storage).await?;
            check_free_hub_id(&pool, args.hub_id.as_deref()).await?;
            let prefix = share_model(&pool, store.as_ref(), args).await?;
            if let Some(hub_id) = &args.hub_id {
                give_hub_id(&pool, &args.name, hub_id).await?;
            }
            println!(
                "{}",
                serde_json::json!({ "model": args.name, "kind": "base", "format": args.format,
                                    "storage_prefix": prefix, "shared": true, "hub_id": args.hub_id })
            );
            Ok(())
        }
    }
}

/// The database (migrated) and the object store a command that registers models talks to.
async fn database_and_store(
    db: &DatabaseConfig,
    storage: &StorageConfig,
) -> anyhow::Result<(sqlx::PgPool, std::sync::Arc<dyn ObjectStore>)> {
    let pool = verity_core::db::connect(&db.database_url, 2).await?;
    verity_core::db::migrate(&pool).await.context("migrating the database")?;
    let store =
        verity_core::storage::open_store(storage).await.context("opening the object store")?;
    Ok((pool, store))
}

/// Registers the stored folder of `args` as a shared base model; returns its normalised prefix.
pub async fn share_model(
    pool: &sqlx::PgPool,
    store: &dyn ObjectStore,
    args: &ShareArgs,
) -> anyhow::Result<String> {
    verity_core::models::check_model_name(&args.name)
        .map_err(|reason| anyhow::anyhow!("--name: {reason}"))?;
    let prefix = verity_core::models::normalize_prefix(&args.storage_prefix)
        .with_context(|| format!("--storage-prefix {:?}", args.storage_prefix))?;
    let stored = store.head(&prefix).await?.is_some()
        || !store.list(&format!("{prefix}/")).await?.is_empty();
    if !stored {
        bail!("nothing is stored under {prefix:?}");
    }
    let inserted = verity_core::models::insert_base_model(
        pool,
        None,
        &args.name,
        &prefix,
        &args.format,
        &serde_json::json!({}),
    )
    .await?;
    if !inserted {
        bail!("a model named {:?} already exists", args.name);
    }
    Ok(prefix)
}

/// Checks that the sentence-transformers folder `dir` loads as an embedding model, publishes it
/// under `models/{name}` and registers it (kind `embedding`, every org sees it); returns the
/// storage prefix.
pub async fn import_embedding_model(
    pool: &sqlx::PgPool,
    store: &dyn ObjectStore,
    name: &str,
    dir: &Path,
) -> anyhow::Result<String> {
    if let Err(reason) = verity_core::models::check_model_name(name) {
        bail!("invalid model name {name:?}: {reason}");
    }
    if verity_core::models::model_by_id(pool, name).await?.is_some() {
        bail!("a model named {name:?} already exists");
    }
    if !dir.is_dir() {
        bail!("{} is not a folder", dir.display());
    }
    let check = dir.to_path_buf();
    let max_tokens = tokio::task::spawn_blocking(move || {
        verity_worker::embedding::BertEmbedder::load(&check).map(|m| m.max_tokens())
    })
    .await?
    .with_context(|| format!("{} does not load as an embedding model", dir.display()))?;
    let prefix = verity_core::keys::model(name);
    verity_core::storage::publish_folder(store, dir, &prefix)
        .await
        .context("publishing the model")?;
    let config = serde_json::json!({ "family": "bert", "max_tokens": max_tokens });
    let folder =
        verity_core::models::StoredModel { storage_prefix: &prefix, format: "hf", config: &config };
    let kind = verity_core::models::EMBEDDING;
    if !verity_core::models::insert_model(pool, None, kind, name, &folder).await? {
        bail!("a model named {name:?} already exists");
    }
    Ok(prefix)
}
