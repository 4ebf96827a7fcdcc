//! The audit log of each workspace (P4): entries keyed by a sequence number that is monotonic per workspace,
//! read newest first by cursor.
//!
//! Sequence numbers come from an in-memory counter per workspace, loaded from the store's last key the first
//! time the workspace is audited (or read) in this process, so concurrent appends never share a number.
//! Keys are `ws/` + the number in 20 digits; a page reads the 1000-entry blocks that share their first 17
//! digits, newest block first, so a page costs a block or two whatever the log's length.
// enforces: P4

use std::sync::PoisonError;

use agenthold_core::{ErrorKind, WorkspaceId};

use super::{AUDIT, Directory, check_name, rfc3339};
use crate::error::{Error, Result};
use crate::model::{AuditEntry, NewAuditEntry};

/// Entries per key block (the numbers sharing all but their last 3 digits).
const BLOCK: u64 = 1000;
/// The most entries one page returns.
pub(crate) const MAX_PAGE: usize = 1000;
/// `target` and `reason` are cut to this many characters.
const TEXT_MAX: usize = 1000;
/// The accepted values of `result`.
const RESULTS: [&str; 3] = ["ok", "denied", "failed"];

impl Directory {
    /// Append an entry to its workspace's log; returns it with its id and time.
    ///
    /// Control characters in `target` and `reason` are replaced by U+FFFD and both are cut to 1000
    /// characters: an audit entry is recorded rather than refused over its free text.
    ///
    /// # Errors
    /// [`Error::BadInput`] for an `action` that is not 1 to 100 characters or has control characters, or a
    /// `result` other than `ok`, `denied`, `failed`; [`Error::NotFound`] when the workspace does not exist;
    /// [`Error::Store`].
    pub async fn audit(&self, entry: NewAuditEntry) -> Result<AuditEntry> {
        check_name("action", &entry.action)?;
        if !RESULTS.contains(&entry.result.as_str()) {
            return Err(Error::bad_input("result: must be ok, denied or failed"));
        }
        // A log only for workspaces that exist: deleting a workspace is what removes its log.
        self.require_workspace(&entry.workspace).await?;
        let seq = self.audit_seq(&entry.workspace, bump).await?;
        let stored = AuditEntry {
            id: format!("{seq:020}"),
            time: rfc3339(self.now()),
            workspace: entry.workspace,
            actor: entry.actor,
            credential: entry.credential,
            action: entry.action,
            target: sanitize(&entry.target),
            result: entry.result,
            reason: entry.reason.as_deref().map(sanitize),
        };
        let key = format!("{}/{}", stored.workspace, stored.id);
        self.put_json(AUDIT, &key, &stored).await?;
        Ok(stored)
    }

    /// A page of `ws`'s log, newest first: at most `limit` entries (clamped to 1..=1000) older than
    /// `cursor` (an entry id; `None` starts at the newest). The second value is the cursor of the next
    /// page: the last returned entry's id, or `None` when there is nothing older.
    ///
    /// # Errors
    /// [`Error::BadInput`] when `cursor` is not an entry id (20 digits); [`Error::NotFound`] when the
    /// workspace does not exist; [`Error::Store`].
    pub async fn audit_page(
        &self,
        ws: &WorkspaceId,
        cursor: Option<&str>,
        limit: usize,
    ) -> Result<(Vec<AuditEntry>, Option<String>)> {
        let limit = limit.clamp(1, MAX_PAGE);
        let cursor = cursor.map(parse_cursor).transpose()?;
        self.require_workspace(ws).await?;
        // Never start above the newest number handed out: a made-up cursor cannot make us walk empty blocks.
        let newest = self.audit_seq(ws, |seq| Some(*seq)).await?;
        let before = cursor.map_or(newest.saturating_add(1), |c| c.min(newest.saturating_add(1)));
        let mut page = Vec::with_capacity(limit + 1);
        if before > 0 {
            let mut block = (before - 1) / BLOCK;
            loop {
                let prefix = format!("{ws}/{block:017}");
                for (key, entry) in self
                    .scan_json::<AuditEntry>(AUDIT, &prefix)
                    .await?
                    .into_iter()
                    .rev()
                {
                    if stored_seq(&key)? < before {
                        page.push(entry);
                        if page.len() > limit {
                            break;
                        }
                    }
                }
                if page.len() > limit || block == 0 {
                    break;
                }
                block -= 1;
            }
        }
        let next = if page.len() > limit {
            page.truncate(limit);
            page.last().map(|e| e.id.clone())
        } else {
            None
        };
        Ok((page, next))
    }

    /// Apply `f` to `ws`'s counter (the last number handed out), loading it from the store first if this
    /// process has not seen the workspace yet.
    async fn audit_seq(&self, ws: &WorkspaceId, f: fn(&mut u64) -> Option<u64>) -> Result<u64> {
        let mut loaded = None;
        loop {
            {
                let mut counters = self.audit_seq.lock().unwrap_or_else(PoisonError::into_inner);
                if let Some(last) = loaded {
                    // Another task may have loaded it meanwhile (and handed out numbers): keep theirs.
                    counters.entry(ws.clone()).or_insert(last);
                }
                if let Some(seq) = counters.get_mut(ws) {
                    return f(seq).ok_or_else(|| {
                        Error::backend(
                            ErrorKind::Integrity,
                            format!("audit log of {ws}"),
                            "sequence numbers exhausted",
                        )
                    });
                }
            }
            loaded = Some(self.last_stored_audit_seq(ws).await?);
        }
    }

    /// The highest sequence number stored for `ws` (0 when none).
    async fn last_stored_audit_seq(&self, ws: &WorkspaceId) -> Result<u64> {
        match self.scan_keys(AUDIT, &format!("{ws}/")).await?.last() {
            Some(key) => stored_seq(key),
            None => Ok(0),
        }
    }

    /// Forget `ws`'s counter (its log was deleted with it).
    pub(super) fn forget_audit_seq(&self, ws: &WorkspaceId) {
        self.audit_seq
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(ws);
    }
}

/// The counter step of an append.
fn bump(seq: &mut u64) -> Option<u64> {
    *seq = seq.checked_add(1)?;
    Some(*seq)
}

/// The sequence number in a stored key `ws/<20 digits>`.
fn stored_seq(key: &str) -> Result<u64> {
    key.rsplit('/')
        .next()
        .filter(|digits| digits.len() == 20)
        .and_then(|digits| digits.parse().ok())
        .ok_or_else(|| {
            Error::backend(
                ErrorKind::Integrity,
                format!("stored key {AUDIT}/{key}"),
                "not a workspace id and a 20-digit sequence number",
            )
        })
}

/// A cursor: an entry id, 20 ASCII digits.
fn parse_cursor(cursor: &str) -> Result<u64> {
    Some(cursor)
        .filter(|c| c.len() == 20 && c.bytes().all(|b| b.is_ascii_digit()))
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| Error::bad_input("cursor: must be the id of an audit entry (20 digits)"))
}

/// Free text for the log: control characters replaced, at most [`TEXT_MAX`] characters.
fn sanitize(text: &str) -> String {
    text.chars()
        .take(TEXT_MAX)
        .map(|c| if c.is_control() { '\u{fffd}' } else { c })
        .collect()
}
