//! Verity core: domain types, the Postgres job queue, object storage and configuration.
