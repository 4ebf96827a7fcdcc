//! Entries written later than they are made: a connection's, recorded with its byte counts when it closes
//! however its task ends ([`PendingEntry`]), and the `open` entry of a long-lived one ([`Announcement`]).

use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use agenthold_core::policy::DenyReason;

use super::{LogEntry, Phase, RequestLog};

/// Bytes carried by a connection or request, readable while it runs and after it ends however it ended.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub(crate) up: std::sync::atomic::AtomicU64,
    pub(crate) down: std::sync::atomic::AtomicU64,
}

impl Counters {
    pub(crate) fn get(&self) -> (u64, u64) {
        use std::sync::atomic::Ordering::Relaxed;
        (self.up.load(Relaxed), self.down.load(Relaxed))
    }
}

/// An entry that is recorded, with its byte counts, when the guard is dropped: a connection logged when it
/// closes is logged however its task ends (finished, failed, cancelled by shutdown or detach).
#[derive(Debug)]
pub(crate) struct PendingEntry {
    log: Arc<RequestLog>,
    pub(crate) entry: LogEntry,
    pub(crate) counters: Arc<Counters>,
    discarded: bool,
    /// Set once the connection's `open` entry was written.
    announced: Option<Arc<AtomicBool>>,
}

impl PendingEntry {
    pub(crate) fn new(log: &Arc<RequestLog>, entry: LogEntry) -> Self {
        Self {
            log: Arc::clone(log),
            entry,
            counters: Arc::default(),
            discarded: false,
            announced: None,
        }
    }

    /// The `open` entry of the connection this entry logs (to be written once it is long-lived, see
    /// `crate::open`), and the flag that says it was: this entry is then recorded as the `closed` one.
    pub(crate) fn announcement(&mut self) -> Announcement {
        let mut entry = self.entry.clone();
        entry.phase = Some(Phase::Open);
        Announcement {
            log: Arc::clone(&self.log),
            entry,
            done: Arc::clone(self.announced.get_or_insert_with(Arc::default)),
        }
    }

    /// A policy change closed the connection (E21).
    pub(crate) fn revoked(&mut self) {
        self.entry.deny(DenyReason::Revoked);
    }

    /// Record nothing after all (the connection was handed on before anything crossed).
    pub(crate) fn discard(mut self) {
        self.discarded = true;
    }
}

/// The `open` entry of a long-lived connection, written once by the sweep of `crate::open`.
#[derive(Debug)]
pub(crate) struct Announcement {
    log: Arc<RequestLog>,
    entry: LogEntry,
    /// Set when it is written (before it is), so that the closing entry says `closed`.
    done: Arc<AtomicBool>,
}

impl Announcement {
    /// Say it is being written: from now on the closing entry says `closed`, whenever it comes.
    pub(crate) fn claim(&self) {
        self.done.store(true, std::sync::atomic::Ordering::Release);
    }

    /// Write the entry.
    pub(crate) fn write(self) {
        self.log.record(self.entry);
    }
}

impl Drop for PendingEntry {
    fn drop(&mut self) {
        if self.discarded {
            return;
        }
        if self
            .announced
            .as_ref()
            .is_some_and(|a| a.load(std::sync::atomic::Ordering::Acquire))
        {
            self.entry.phase = Some(Phase::Closed);
        }
        (self.entry.bytes_up, self.entry.bytes_down) = self.counters.get();
        // The guard is going away: hand the entry over instead of copying its strings.
        let empty = LogEntry::blank(&self.entry);
        self.log.record(std::mem::replace(&mut self.entry, empty));
    }
}
