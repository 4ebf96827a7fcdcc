//! The Docker engine's event stream as a timeline, to say where the time of a sandbox start goes without
//! touching the code that starts it: the engine reports when each object it was asked for is made
//! (`network create`, `network connect`, `volume create`, `container create`, `extract-to-dir` for an
//! archive upload, `start`, `exec_create`, `exec_start`, `exec_die`, …) with nanosecond timestamps on the
//! host's clock, and the gaps between those events and the timestamps taken around the public calls are
//! the phases of the start.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bollard::Docker;
use futures_util::StreamExt;

/// One engine event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    /// When the engine emitted it, nanoseconds since the Unix epoch (host clock).
    pub at: i64,
    /// `container`, `network`, `volume`, `image`, …
    pub kind: String,
    /// `create`, `start`, `connect`, `exec_start: CMD`, …
    pub action: String,
    /// The object's id (a volume's name).
    pub id: String,
    /// The object's attributes (`name`, `container` for network connects, labels for containers).
    pub attributes: HashMap<String, String>,
}

impl Event {
    /// The `name` attribute (containers, networks), else the id (volumes are named by their id).
    pub fn name(&self) -> &str {
        self.attributes
            .get("name")
            .map_or(self.id.as_str(), String::as_str)
    }

    /// Whether the action is `action` or starts with `action:` (exec events carry the command).
    pub fn is(&self, kind: &str, action: &str) -> bool {
        self.kind == kind
            && (self.action == action
                || self
                    .action
                    .strip_prefix(action)
                    .is_some_and(|rest| rest.starts_with(':')))
    }
}

/// Now, in the events' time base.
pub fn now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
}

/// Nanoseconds as a [`Duration`] (negative ones as zero).
pub fn nanos(n: i64) -> Duration {
    Duration::from_nanos(u64::try_from(n).unwrap_or(0))
}

/// Records every event the engine emits from [`Recorder::start`] on, in a background task.
#[derive(Debug)]
pub struct Recorder {
    events: Arc<Mutex<Vec<Event>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Recorder {
    /// Subscribes to the engine's events (waits a moment so the subscription is live before returning).
    /// Must be called inside a tokio runtime.
    pub async fn start(docker: &Docker) -> Self {
        let events = Arc::new(Mutex::new(Vec::new()));
        let sink = Arc::clone(&events);
        let mut stream = Box::pin(docker.events(None::<bollard::query_parameters::EventsOptions>));
        let task = tokio::spawn(async move {
            while let Some(event) = stream.next().await {
                let Ok(event) = event else { continue };
                let actor = event.actor.unwrap_or_default();
                let kind = event
                    .typ
                    .and_then(|t| serde_json::to_value(t).ok())
                    .and_then(|v| v.as_str().map(str::to_owned))
                    .unwrap_or_default();
                let recorded = Event {
                    at: event.time_nano.unwrap_or_default(),
                    kind,
                    action: event.action.unwrap_or_default(),
                    id: actor.id.unwrap_or_default(),
                    attributes: actor.attributes.unwrap_or_default(),
                };
                sink.lock().unwrap_or_else(PoisonError::into_inner).push(recorded);
            }
        });
        // The request is sent when the task first polls the stream; give it a moment to be established.
        tokio::time::sleep(Duration::from_millis(300)).await;
        Self { events, task }
    }

    /// The events emitted in `[from, to]` (nanoseconds, see [`now`]), oldest first.
    pub fn between(&self, from: i64, to: i64) -> Vec<Event> {
        let mut events: Vec<Event> = self
            .events
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .filter(|e| (from..=to).contains(&e.at))
            .cloned()
            .collect();
        events.sort_by_key(|e| e.at);
        events
    }

    /// How many events have been recorded so far.
    pub fn len(&self) -> usize {
        self.events.lock().unwrap_or_else(PoisonError::into_inner).len()
    }

    /// Whether no event has been recorded yet.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Drop for Recorder {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A timeline: named instants (nanoseconds), in order. The phases are the gaps between consecutive
/// instants, each named after the instant that ends it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Timeline {
    /// `(name, at)`, oldest first.
    pub marks: Vec<(String, i64)>,
}

impl Timeline {
    /// Adds `name` at `at`.
    pub fn mark(&mut self, name: &str, at: i64) {
        self.marks.push((name.to_owned(), at));
    }

    /// Adds the first event in `events` that `pick` selects, as `name`; returns whether there was one.
    pub fn mark_first(&mut self, name: &str, events: &[Event], pick: impl Fn(&Event) -> bool) -> bool {
        match events.iter().find(|e| pick(e)) {
            Some(e) => {
                self.mark(name, e.at);
                true
            }
            None => false,
        }
    }

    /// The phases: `(name of the instant that ends it, duration)`, after sorting the instants by time.
    pub fn phases(&self) -> Vec<(String, Duration)> {
        let mut marks = self.marks.clone();
        marks.sort_by_key(|(_, at)| *at);
        marks
            .windows(2)
            .map(|w| (w[1].0.clone(), nanos(w[1].1 - w[0].1)))
            .collect()
    }

    /// From the first instant to the last.
    pub fn total(&self) -> Duration {
        let first = self.marks.iter().map(|(_, at)| *at).min().unwrap_or(0);
        let last = self.marks.iter().map(|(_, at)| *at).max().unwrap_or(0);
        nanos(last - first)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(at: i64, kind: &str, action: &str, name: &str) -> Event {
        Event {
            at,
            kind: kind.into(),
            action: action.into(),
            id: "id".into(),
            attributes: HashMap::from([("name".to_owned(), name.to_owned())]),
        }
    }

    #[test]
    fn phases_between_marks() {
        let events = [
            event(30, "container", "create", "c"),
            event(50, "container", "exec_start: sandboxd run -- true", "c"),
        ];
        let mut t = Timeline::default();
        t.mark("call", 10);
        assert!(t.mark_first("create", &events, |e| e.is("container", "create")));
        assert!(t.mark_first("exec", &events, |e| e.is("container", "exec_start")));
        assert!(!t.mark_first("die", &events, |e| e.is("container", "die")));
        t.mark("done", 80);
        let phases: Vec<(String, u64)> = t
            .phases()
            .into_iter()
            .map(|(n, d)| (n, d.as_nanos() as u64))
            .collect();
        assert_eq!(
            phases,
            [("create".into(), 20), ("exec".into(), 20), ("done".into(), 30)]
        );
        assert_eq!(t.total(), Duration::from_nanos(70));
        assert!(!events[1].is("container", "exec"));
    }
}
