//! Structured logging set-up (`RUST_LOG` filters; `--log-json` for machine-readable lines).

use tracing_subscriber::EnvFilter;

/// Installs the global subscriber; logs go to stderr so stdout stays clean for command output.
pub fn init(json: bool) {
    let filter = EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| EnvFilter::new("info,sqlx=warn,aws=warn"));
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    if json {
        builder.json().init();
    } else {
        builder.init();
    }
}
