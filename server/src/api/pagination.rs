//! Cursor pagination shared by every list: `?after=<id>&limit=<n>` → `{object: "list", data, has_more}`.

use super::error::ApiError;
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

/// Default page size.
pub const DEFAULT_LIMIT: i64 = 20;
/// Largest page size.
pub const MAX_LIMIT: i64 = 100;

/// `after` and `limit` query parameters.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct PageQuery {
    /// Id of the last item of the previous page.
    pub after: Option<String>,
    /// Page size (1–100, default 20).
    pub limit: Option<i64>,
}

impl PageQuery {
    /// The page size, checked.
    pub fn limit(&self) -> Result<i64, ApiError> {
        page_limit(self.limit, MAX_LIMIT)
    }
}

/// Checks a page size against `1..=max`, defaulting to [`DEFAULT_LIMIT`].
pub fn page_limit(limit: Option<i64>, max: i64) -> Result<i64, ApiError> {
    match limit {
        None => Ok(DEFAULT_LIMIT.min(max)),
        Some(n) if (1..=max).contains(&n) => Ok(n),
        Some(n) => {
            Err(ApiError::invalid("limit", format!("limit must be between 1 and {max}, got {n}")))
        }
    }
}

/// One page of a list.
#[derive(Debug, Serialize, ToSchema)]
pub struct Page<T> {
    /// Always `list`.
    pub object: &'static str,
    /// The items.
    pub data: Vec<T>,
    /// True when more items follow.
    pub has_more: bool,
    /// Id of the first item.
    pub first_id: Option<String>,
    /// Id of the last item (pass as `after` for the next page).
    pub last_id: Option<String>,
}

impl<T> Page<T> {
    /// Builds a page from up to `limit + 1` fetched items (the extra one only signals more).
    pub fn from_fetched(mut items: Vec<T>, limit: i64, id_of: impl Fn(&T) -> String) -> Page<T> {
        let limit = usize::try_from(limit).unwrap_or(0);
        let has_more = items.len() > limit;
        items.truncate(limit);
        Page {
            object: "list",
            first_id: items.first().map(&id_of),
            last_id: items.last().map(&id_of),
            data: items,
            has_more,
        }
    }
}
