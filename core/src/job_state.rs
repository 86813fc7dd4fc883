//! Job states and the control signals a running worker receives.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// Where a job is in its life; mirrors the `jobs.state` CHECK constraint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum JobState {
    /// Waiting for a worker.
    Queued,
    /// Held by a worker under a lease.
    Running,
    /// Stopped by the user; resumes from its last checkpoint.
    Paused,
    /// Finished successfully.
    Succeeded,
    /// Finished with an error after its retries.
    Failed,
    /// Cancelled by the user.
    Cancelled,
}

impl JobState {
    /// All states, in life order.
    pub const ALL: [JobState; 6] = [
        JobState::Queued,
        JobState::Running,
        JobState::Paused,
        JobState::Succeeded,
        JobState::Failed,
        JobState::Cancelled,
    ];

    /// The name stored in Postgres and shown in the API.
    pub fn as_str(self) -> &'static str {
        match self {
            JobState::Queued => "queued",
            JobState::Running => "running",
            JobState::Paused => "paused",
            JobState::Succeeded => "succeeded",
            JobState::Failed => "failed",
            JobState::Cancelled => "cancelled",
        }
    }

    /// True for states a job never leaves.
    pub fn is_terminal(self) -> bool {
        matches!(self, JobState::Succeeded | JobState::Failed | JobState::Cancelled)
    }
}

impl fmt::Display for JobState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A state name that is not one of [`JobState::ALL`].
#[derive(Debug, thiserror::Error)]
#[error("unknown job state {0:?}")]
pub struct UnknownState(pub String);

impl FromStr for JobState {
    type Err = UnknownState;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        JobState::ALL
            .into_iter()
            .find(|state| state.as_str() == s)
            .ok_or_else(|| UnknownState(s.to_string()))
    }
}

/// `jobs.state` is a `text` column: a state reads and writes as its name.
impl sqlx::Type<sqlx::Postgres> for JobState {
    fn type_info() -> sqlx::postgres::PgTypeInfo {
        <&str as sqlx::Type<sqlx::Postgres>>::type_info()
    }

    fn compatible(ty: &sqlx::postgres::PgTypeInfo) -> bool {
        <&str as sqlx::Type<sqlx::Postgres>>::compatible(ty)
    }
}

impl<'r> sqlx::Decode<'r, sqlx::Postgres> for JobState {
    fn decode(value: sqlx::postgres::PgValueRef<'r>) -> Result<Self, sqlx::error::BoxDynError> {
        let name = <&str as sqlx::Decode<sqlx::Postgres>>::decode(value)?;
        Ok(name.parse()?)
    }
}

impl sqlx::Encode<'_, sqlx::Postgres> for JobState {
    fn encode_by_ref(
        &self,
        buf: &mut sqlx::postgres::PgArgumentBuffer,
    ) -> Result<sqlx::encode::IsNull, sqlx::error::BoxDynError> {
        <&str as sqlx::Encode<sqlx::Postgres>>::encode(self.as_str(), buf)
    }
}

/// What a heartbeat tells the worker to do next.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ControlSignal {
    /// Keep going.
    Continue,
    /// Stop, and acknowledge with [`crate::queue::Lease::ack_cancel`].
    Cancel,
    /// Checkpoint, stop, and acknowledge with [`crate::queue::Lease::ack_pause`].
    Pause,
}

impl ControlSignal {
    /// Reads the `jobs.control` column.
    pub fn from_column(control: &str) -> ControlSignal {
        match control {
            "cancel" => ControlSignal::Cancel,
            "pause" => ControlSignal::Pause,
            _ => ControlSignal::Continue,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn states_round_trip_through_names() {
        for state in JobState::ALL {
            assert_eq!(state.as_str().parse::<JobState>().unwrap(), state);
            assert_eq!(serde_json::to_value(state).unwrap(), state.as_str());
        }
        assert!("bogus".parse::<JobState>().is_err());
    }
}
