//! A small async mutex for the directory's read-check-write sequences (the last owner of a workspace, a
//! grant only for a member, one user per login subject). The store is opened by one process at a time, so
//! serialising those sequences inside the process keeps the invariants.
//!
//! On release every waiting task is woken and they race for the lock again: no fairness, but a waiter that
//! gives up (its future dropped) can never strand the others.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Mutex, PoisonError};
use std::task::{Context, Poll, Waker};

/// The lock. Hold its guard across the reads and the write of one change.
#[derive(Debug, Default)]
pub(crate) struct WriteLock {
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    held: bool,
    waiters: Vec<Waker>,
}

/// Held while alive.
#[derive(Debug)]
pub(crate) struct WriteGuard<'a> {
    lock: &'a WriteLock,
}

/// The future of [`WriteLock::acquire`].
struct Acquire<'a> {
    lock: &'a WriteLock,
}

impl WriteLock {
    /// Wait for the lock.
    pub(crate) async fn acquire(&self) -> WriteGuard<'_> {
        Acquire { lock: self }.await
    }
}

impl<'a> Future for Acquire<'a> {
    type Output = WriteGuard<'a>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<WriteGuard<'a>> {
        let lock = self.lock;
        let mut state = lock.state.lock().unwrap_or_else(PoisonError::into_inner);
        if state.held {
            if !state.waiters.iter().any(|w| w.will_wake(cx.waker())) {
                state.waiters.push(cx.waker().clone());
            }
            Poll::Pending
        } else {
            state.held = true;
            Poll::Ready(WriteGuard { lock })
        }
    }
}

impl Drop for WriteGuard<'_> {
    fn drop(&mut self) {
        let waiters = {
            let mut state = self.lock.state.lock().unwrap_or_else(PoisonError::into_inner);
            state.held = false;
            std::mem::take(&mut state.waiters)
        };
        for waker in waiters {
            waker.wake();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn holders_never_overlap_and_a_dropped_waiter_strands_nobody() {
        let lock = Arc::new(WriteLock::default());
        let inside = Arc::new(AtomicUsize::new(0));
        let overlaps = Arc::new(AtomicUsize::new(0));
        let mut tasks = Vec::new();
        for _ in 0..50 {
            let (lock, inside, overlaps) = (lock.clone(), inside.clone(), overlaps.clone());
            tasks.push(tokio::spawn(async move {
                let _guard = lock.acquire().await;
                if inside.fetch_add(1, Ordering::SeqCst) != 0 {
                    overlaps.fetch_add(1, Ordering::SeqCst);
                }
                tokio::task::yield_now().await;
                inside.fetch_sub(1, Ordering::SeqCst);
            }));
        }
        // A waiter that gives up while the lock is held.
        let held = lock.acquire().await;
        let gave_up = tokio::time::timeout(std::time::Duration::from_millis(10), lock.acquire()).await;
        assert!(gave_up.is_err());
        drop(held);
        for task in tasks {
            assert!(task.await.is_ok());
        }
        assert_eq!(overlaps.load(Ordering::SeqCst), 0);
        let again = tokio::time::timeout(std::time::Duration::from_secs(5), lock.acquire()).await;
        assert!(again.is_ok());
    }
}
