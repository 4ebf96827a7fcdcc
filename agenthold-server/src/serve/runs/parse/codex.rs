//! Codex's `exec --json` lines: one JSON object per line with a `type` of `thread.started` (`thread_id`, the
//! session), `turn.started`, `turn.completed` (`usage`), `turn.failed` (`error.message`), `error`
//! (`message`), and `item.started` / `item.updated` / `item.completed` with an `item` whose `type` is
//! `agent_message` or `reasoning` (`text`), `command_execution` (`command`, `aggregated_output`,
//! `exit_code`, `status`), `file_change` (`changes`), `mcp_tool_call` (`server`, `tool`, `arguments`,
//! `result`, `error`), `web_search` (`query`), `todo_list` (`items`) or `error` (`message`).
//!
//! Codex reports usage per turn and no cost: `usage` events carry the run's totals so far. Codex has no
//! final result line: at `turn.completed` the last agent message becomes the `result`. Fields are read
//! defensively; a line that is not such an object is `None` (the caller turns it into `raw`).
// enforces: P1

use std::collections::HashSet;

use serde_json::Value;

use super::super::events::EventKind;

/// Most tool call ids remembered (to pair `item.started` with `item.completed`).
const MAX_OPEN_CALLS: usize = 4096;

/// The state of one run's Codex parser.
#[derive(Debug, Default)]
pub(crate) struct Codex {
    thread: Option<String>,
    last_message: Option<String>,
    input_tokens: u64,
    output_tokens: u64,
    /// Items whose `tool_call` was sent at `item.started`.
    started: HashSet<String>,
}

fn str_of(v: &Value, key: &str) -> Option<String> {
    v.get(key).and_then(Value::as_str).map(str::to_owned)
}

fn u64_of(v: &Value, key: &str) -> u64 {
    v.get(key).and_then(Value::as_u64).unwrap_or(0)
}

/// A tool item's name and input, or `None` for items that are not tool calls.
fn tool(item: &Value, kind: &str) -> Option<(String, Value)> {
    let pick = |keys: &[&str]| {
        let mut input = serde_json::Map::new();
        for k in keys {
            if let Some(v) = item.get(*k) {
                input.insert((*k).to_owned(), v.clone());
            }
        }
        Value::Object(input)
    };
    Some(match kind {
        "command_execution" => ("command_execution".to_owned(), pick(&["command"])),
        "file_change" => ("file_change".to_owned(), pick(&["changes"])),
        "mcp_tool_call" => {
            let server = str_of(item, "server").unwrap_or_default();
            let name = str_of(item, "tool").unwrap_or_default();
            (format!("{server}.{name}"), pick(&["arguments"]))
        }
        "web_search" => ("web_search".to_owned(), pick(&["query"])),
        "todo_list" => ("todo_list".to_owned(), pick(&["items"])),
        _ => return None,
    })
}

/// A completed tool item's output and failure.
fn tool_output(item: &Value, kind: &str) -> (String, bool) {
    let failed_status = item
        .get("status")
        .and_then(Value::as_str)
        .is_some_and(|s| s == "failed" || s == "declined");
    match kind {
        "command_execution" => {
            let code = item.get("exit_code").and_then(Value::as_i64);
            (
                str_of(item, "aggregated_output").unwrap_or_default(),
                failed_status || code.is_some_and(|c| c != 0),
            )
        }
        "mcp_tool_call" => match item.get("error").filter(|e| !e.is_null()) {
            Some(e) => (str_of(e, "message").unwrap_or_else(|| e.to_string()), true),
            None => (
                item.get("result").map(Value::to_string).unwrap_or_default(),
                failed_status,
            ),
        },
        _ => (str_of(item, "status").unwrap_or_default(), failed_status),
    }
}

impl Codex {
    /// The events of `line`, or `None` when it is not a Codex line.
    pub(crate) fn line(&mut self, line: &str) -> Option<Vec<EventKind>> {
        let v: Value = serde_json::from_str(line.trim()).ok()?;
        let kind = v.get("type")?.as_str()?;
        let mut out = Vec::new();
        match kind {
            "thread.started" => {
                let id = str_of(&v, "thread_id")?;
                self.thread = Some(id.clone());
                out.push(EventKind::Session {
                    session_id: id,
                    model: None,
                });
            }
            "turn.started" => {}
            "turn.completed" => {
                if let Some(usage) = v.get("usage").filter(|u| u.is_object()) {
                    // `cached_input_tokens` are part of `input_tokens` in Codex's count.
                    self.input_tokens = self.input_tokens.saturating_add(u64_of(usage, "input_tokens"));
                    self.output_tokens = self.output_tokens.saturating_add(u64_of(usage, "output_tokens"));
                    out.push(EventKind::Usage {
                        input_tokens: self.input_tokens,
                        output_tokens: self.output_tokens,
                        cost_usd: None,
                    });
                }
                out.push(EventKind::Result {
                    text: self.last_message.clone(),
                    is_error: false,
                    session_id: self.thread.clone(),
                });
            }
            "turn.failed" | "error" => {
                let message = v
                    .get("error")
                    .and_then(|e| str_of(e, "message"))
                    .or_else(|| str_of(&v, "message"))
                    .unwrap_or_default();
                if kind == "turn.failed" {
                    out.push(EventKind::Result {
                        text: Some(message),
                        is_error: true,
                        session_id: self.thread.clone(),
                    });
                } else {
                    out.push(EventKind::Message {
                        role: "error".to_owned(),
                        text: message,
                    });
                }
            }
            "item.started" | "item.updated" | "item.completed" => {
                let item = v.get("item").filter(|i| i.is_object())?;
                let item_type = item.get("type")?.as_str()?;
                self.item(kind, item, item_type, &mut out);
            }
            _ => return None,
        }
        Some(out)
    }

    fn item(&mut self, phase: &str, item: &Value, item_type: &str, out: &mut Vec<EventKind>) {
        let id = str_of(item, "id");
        match (phase, item_type) {
            ("item.completed", "agent_message") => {
                if let Some(text) = str_of(item, "text") {
                    self.last_message = Some(text.clone());
                    out.push(EventKind::Message {
                        role: "assistant".to_owned(),
                        text,
                    });
                }
            }
            ("item.completed", "reasoning") => {
                if let Some(text) = str_of(item, "text") {
                    out.push(EventKind::Message {
                        role: "reasoning".to_owned(),
                        text,
                    });
                }
            }
            ("item.completed", "error") => out.push(EventKind::Message {
                role: "error".to_owned(),
                text: str_of(item, "message").unwrap_or_default(),
            }),
            ("item.started", t) => {
                if let Some((name, input)) = tool(item, t) {
                    if let Some(id) = &id
                        && self.started.len() < MAX_OPEN_CALLS
                    {
                        self.started.insert(id.clone());
                    }
                    out.push(EventKind::ToolCall { id, name, input });
                }
            }
            ("item.completed", t) => {
                let Some((name, input)) = tool(item, t) else {
                    return;
                };
                let announced = id.as_ref().is_some_and(|i| self.started.remove(i));
                if !announced {
                    out.push(EventKind::ToolCall {
                        id: id.clone(),
                        name,
                        input,
                    });
                }
                let (output, is_error) = tool_output(item, t);
                out.push(EventKind::ToolResult { id, output, is_error });
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // covers: P1
    #[test]
    fn real_shaped_lines_become_normalised_events() {
        let mut p = Codex::default();
        let lines = [
            r#"{"type":"thread.started","thread_id":"0199a213-81c0-7800-8aa1-bbab2a035a53"}"#,
            r#"{"type":"turn.started"}"#,
            r#"{"type":"item.completed","item":{"id":"item_0","type":"reasoning","text":"**Listing files**"}}"#,
            r#"{"type":"item.started","item":{"id":"item_1","type":"command_execution","command":"bash -lc ls","aggregated_output":"","exit_code":null,"status":"in_progress"}}"#,
            r#"{"type":"item.completed","item":{"id":"item_1","type":"command_execution","command":"bash -lc ls","aggregated_output":"a.txt\n","exit_code":0,"status":"completed"}}"#,
            r#"{"type":"item.completed","item":{"id":"item_2","type":"file_change","changes":[{"path":"/workspace/a.txt","kind":"update"}],"status":"completed"}}"#,
            r#"{"type":"item.completed","item":{"id":"item_3","type":"agent_message","text":"There is one file."}}"#,
            r#"{"type":"turn.completed","usage":{"input_tokens":24763,"cached_input_tokens":24448,"output_tokens":122}}"#,
        ];
        let events: Vec<EventKind> = lines.iter().flat_map(|l| p.line(l).unwrap()).collect();
        let names: Vec<_> = events.iter().map(EventKind::name).collect();
        assert_eq!(
            names,
            [
                "session",
                "message",
                "tool_call",
                "tool_result",
                "tool_call",
                "tool_result",
                "message",
                "usage",
                "result"
            ]
        );
        assert_eq!(
            events[2],
            EventKind::ToolCall {
                id: Some("item_1".into()),
                name: "command_execution".into(),
                input: serde_json::json!({"command": "bash -lc ls"})
            }
        );
        assert_eq!(
            events[3],
            EventKind::ToolResult {
                id: Some("item_1".into()),
                output: "a.txt\n".into(),
                is_error: false
            }
        );
        assert_eq!(
            events[8],
            EventKind::Result {
                text: Some("There is one file.".into()),
                is_error: false,
                session_id: Some("0199a213-81c0-7800-8aa1-bbab2a035a53".into())
            }
        );
        // A second turn: usage adds up.
        let more = p
            .line(r#"{"type":"turn.completed","usage":{"input_tokens":1,"output_tokens":2}}"#)
            .unwrap();
        assert_eq!(
            more[0],
            EventKind::Usage {
                input_tokens: 24764,
                output_tokens: 124,
                cost_usd: None
            }
        );
        let failed = p
            .line(r#"{"type":"turn.failed","error":{"message":"stream disconnected"}}"#)
            .unwrap();
        assert!(
            matches!(&failed[0], EventKind::Result { is_error: true, text: Some(t), .. } if t == "stream disconnected")
        );
        let cmd_failed = p.line(r#"{"type":"item.completed","item":{"id":"x","type":"command_execution","command":"false","aggregated_output":"","exit_code":1,"status":"failed"}}"#).unwrap();
        assert!(matches!(
            &cmd_failed[1],
            EventKind::ToolResult { is_error: true, .. }
        ));
    }

    // covers: P1
    #[test]
    fn garbage_is_not_a_codex_line_and_never_panics() {
        let mut p = Codex::default();
        for line in [
            "",
            "garbage",
            "{}",
            r#"{"type":null}"#,
            r#"{"type":"thread.started"}"#,
            r#"{"type":"item.completed"}"#,
            r#"{"type":"item.completed","item":[]}"#,
            r#"{"type":"item.completed","item":{"type":5}}"#,
            r#"{"type":"assistant","message":{}}"#,
            &"{\"a\":".repeat(5000),
        ] {
            assert_eq!(p.line(line), None, "{line:.40}");
        }
        // Known types with odd fields: no panic, no event for what cannot be read.
        for line in [
            r#"{"type":"item.completed","item":{"type":"agent_message","text":7}}"#,
            r#"{"type":"item.completed","item":{"type":"unknown_future_item"}}"#,
            r#"{"type":"item.completed","item":{"type":"mcp_tool_call","server":1,"error":{"message":"boom"}}}"#,
            r#"{"type":"turn.completed","usage":{"input_tokens":18446744073709551615,"output_tokens":-3}}"#,
            r#"{"type":"turn.completed","usage":{"input_tokens":18446744073709551615}}"#,
        ] {
            assert!(p.line(line).is_some(), "{line}");
        }
    }
}
