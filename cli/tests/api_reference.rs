//! docs/api-reference.md is what `verity openapi --markdown` prints for the current handlers.
//! After changing the API: `cargo run --bin verity -- openapi --markdown > docs/api-reference.md`.

#[test]
fn the_committed_api_reference_is_current() {
    let spec = verity_cli::commands::openapi::spec_json().unwrap();
    let generated = verity_server::api::reference::reference_markdown(&spec);
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/api-reference.md");
    let committed = std::fs::read_to_string(path).unwrap_or_default();
    assert!(
        committed == generated,
        "docs/api-reference.md is stale: regenerate it with `cargo run --bin verity -- openapi --markdown > docs/api-reference.md`"
    );
    for path in
        ["/v1/files", "/v1/fine_tuning/jobs", "/v1/fine_tuning/alpha/graders/run", "/v1/api_keys"]
    {
        assert!(generated.contains(&format!(" {path}`")), "{path} is in the reference");
    }
}
