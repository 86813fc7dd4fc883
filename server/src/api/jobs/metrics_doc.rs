//! A job's metrics rendered once as the whole list document, from which any `after_step` /
//! `limit` window is cut without a query or re-encoding; kept in a [`MetricsCache`] that the
//! job change feed invalidates (every write to a job's metrics rows announces the job).

use super::cache::ChangeCache;
use bytes::{BufMut, Bytes, BytesMut};
use std::ops::Range;
use std::sync::Arc;
use verity_core::jobs::MetricsWindow;

/// Jobs whose rendered metrics are kept (a 10,000-step job renders to about 7.5 MB).
const CACHED_JOBS: usize = 32;

/// The list document of every metrics row of one job, with where each row lies in it.
#[derive(Debug)]
pub struct JobMetrics {
    /// `{"object":"list","job_id":…,"data":[…],"has_more":false}`.
    whole: Bytes,
    /// Each row's step and byte range in `whole`, by step.
    rows: Vec<(i32, Range<usize>)>,
    /// Length of the document's opening up to and excluding the `[` of `data`.
    head_len: usize,
}

/// The opening of a list document of `job_id`, up to `"data":`.
fn document_head(job_id: &str) -> String {
    let job = serde_json::Value::String(job_id.to_string());
    format!("{{\"object\":\"list\",\"job_id\":{job},\"data\":")
}

/// The end of a list document, after its `data` array.
fn document_tail(has_more: bool) -> &'static [u8] {
    if has_more {
        b",\"has_more\":true}"
    } else {
        b",\"has_more\":false}"
    }
}

/// `head`, then the `data` array given in pieces, then the tail.
fn list_document(head: &[u8], array: &[&[u8]], has_more: bool) -> Bytes {
    let tail = document_tail(has_more);
    let size = head.len() + array.iter().map(|piece| piece.len()).sum::<usize>() + tail.len();
    let mut out = BytesMut::with_capacity(size);
    out.put_slice(head);
    for piece in array {
        out.put_slice(piece);
    }
    out.put_slice(tail);
    out.freeze()
}

/// The list document around a JSON array of rows.
pub fn metrics_document(job_id: &str, data: &str, has_more: bool) -> Bytes {
    list_document(document_head(job_id).as_bytes(), &[data.as_bytes()], has_more)
}

impl JobMetrics {
    /// Renders the document of `rows` (JSON object texts, by step).
    pub fn render(job_id: &str, rows: &[(i32, String)]) -> JobMetrics {
        let head = document_head(job_id);
        let size = head.len() + rows.iter().map(|(_, text)| text.len() + 1).sum::<usize>() + 20;
        let mut whole = BytesMut::with_capacity(size);
        whole.put_slice(head.as_bytes());
        whole.put_u8(b'[');
        let mut spans = Vec::with_capacity(rows.len());
        for (i, (step, text)) in rows.iter().enumerate() {
            if i > 0 {
                whole.put_u8(b',');
            }
            let start = whole.len();
            whole.put_slice(text.as_bytes());
            spans.push((*step, start..whole.len()));
        }
        whole.put_u8(b']');
        whole.put_slice(document_tail(false));
        JobMetrics { whole: whole.freeze(), rows: spans, head_len: head.len() }
    }

    /// The document of the rows in `window` (the whole job's document is shared, not copied).
    pub fn window(&self, window: MetricsWindow) -> Bytes {
        let first = self.rows.partition_point(|(step, _)| *step <= window.after_step);
        let available = self.rows.len() - first;
        let taken = usize::try_from(window.limit).map_or(available, |limit| limit.min(available));
        if first == 0 && taken == available {
            return self.whole.clone();
        }
        let has_more = taken < available;
        let data = match (self.rows.get(first), self.rows.get(first + taken.saturating_sub(1))) {
            (Some((_, start)), Some((_, end))) if taken > 0 => &self.whole[start.start..end.end],
            _ => &[][..],
        };
        list_document(&self.whole[..self.head_len], &[b"[", data, b"]"], has_more)
    }
}

/// Rendered metrics of recently read jobs, current while the change listener runs.
#[derive(Debug)]
pub struct MetricsCache {
    /// The documents, by job id.
    pub documents: ChangeCache<Arc<JobMetrics>>,
    /// Held while a document is read and rendered, so that many requests that miss together
    /// cost one read.
    loading: tokio::sync::Mutex<()>,
}

impl Default for MetricsCache {
    fn default() -> Self {
        MetricsCache {
            documents: ChangeCache::new(CACHED_JOBS),
            loading: tokio::sync::Mutex::new(()),
        }
    }
}

impl MetricsCache {
    /// The rendered metrics of job `job_id`, read and cached on a miss; `None` while nothing
    /// may be cached (no change listener), when the caller reads its window from the database.
    pub async fn document(
        &self,
        pool: &sqlx::PgPool,
        job_id: &str,
    ) -> Result<Option<Arc<JobMetrics>>, sqlx::Error> {
        if let Some(document) = self.documents.get(job_id) {
            return Ok(Some(document));
        }
        if self.documents.ticket().is_none() {
            return Ok(None);
        }
        let _loading = self.loading.lock().await;
        if let Some(document) = self.documents.get(job_id) {
            return Ok(Some(document));
        }
        let Some(ticket) = self.documents.ticket() else { return Ok(None) };
        let rows = verity_core::jobs::metrics_row_texts(pool, job_id).await?;
        let document = Arc::new(JobMetrics::render(job_id, &rows));
        self.documents.put(ticket, job_id, document.clone());
        Ok(Some(document))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

    fn rows(steps: &[i32]) -> Vec<(i32, String)> {
        steps
            .iter()
            .map(|s| (*s, json!({"step": s, "reward": f64::from(*s) / 10.0}).to_string()))
            .collect()
    }

    fn parse(bytes: Bytes) -> Value {
        serde_json::from_slice(&bytes).expect("valid JSON")
    }

    fn window(after_step: i32, limit: i64) -> MetricsWindow {
        MetricsWindow { after_step, limit }
    }

    #[test]
    fn windows_match_what_the_database_query_answers() {
        let doc = JobMetrics::render("ftjob-\"x\"", &rows(&[1, 2, 3, 5]));
        let whole = parse(doc.window(MetricsWindow::ALL));
        assert_eq!(whole["object"], "list");
        assert_eq!(whole["job_id"], "ftjob-\"x\"");
        assert_eq!(whole["has_more"], false);
        assert_eq!(whole["data"].as_array().map(Vec::len), Some(4));
        let page = parse(doc.window(window(1, 2)));
        assert_eq!(page["data"], json!([{"step": 2, "reward": 0.2}, {"step": 3, "reward": 0.3}]));
        assert_eq!(page["has_more"], true);
        let rest = parse(doc.window(window(3, i64::MAX)));
        assert_eq!(rest["data"], json!([{"step": 5, "reward": 0.5}]));
        assert_eq!(rest["has_more"], false);
        let between = parse(doc.window(window(4, 1)));
        assert_eq!(between["data"], json!([{"step": 5, "reward": 0.5}]));
        let none = parse(doc.window(window(5, 10)));
        assert_eq!((none["data"].clone(), none["has_more"].clone()), (json!([]), json!(false)));
    }

    #[test]
    fn a_job_without_metrics_is_an_empty_list() {
        let doc = JobMetrics::render("ftjob-a", &[]);
        assert_eq!(
            parse(doc.window(MetricsWindow::ALL)),
            json!({"object": "list", "job_id": "ftjob-a", "data": [], "has_more": false})
        );
        assert_eq!(parse(doc.window(window(3, 5)))["data"], json!([]));
    }
}
