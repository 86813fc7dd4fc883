//! What the end-to-end tests share, compiled once for all of them: an API over a fresh database
//! ([`api_support`]), a real inference worker ([`inference_support`]), the training jobs' set-up
//! ([`training_support`]) and the dashboard's browser tests ([`webdriver`]). Test support only:
//! nothing here ships in a binary (`verity` is built from `verity-cli`).

pub mod api_support;
pub mod inference_support;
pub mod training_support;

/// The WebDriver client of `verity_testkit`, and serving the app for a browser.
pub mod webdriver {
    pub use verity_testkit::webdriver::*;

    /// Serves the app on a free loopback port; its base URL.
    pub async fn serve(state: verity_server::api::state::AppState) -> String {
        verity_testkit::serve::spawn_app(verity_server::app::app(state)).await.unwrap()
    }
}
